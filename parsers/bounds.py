"""What the stores can hold, checked where a line is read.

A record that a column (storage/migrations) could not take whole is a bad line of the
parser, never a failed write: one poison line must not stop a commit. The C scan
(parsers/_steady.c) refuses these values too and leaves them to the reference parser;
tests/test_poison_lines.py holds the constants to the reflected columns and to the C ones."""

from __future__ import annotations

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1  # INTEGER: steps, process index and count
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # BIGINT: total_weights, ts_ns
CE_RAW_MAX = 64  # loss_parts.ce_raw VARCHAR(64)
PROGRAM_MAX = 128  # required_rbf.program VARCHAR(128)
CONFIG_NAME_MAX = 256  # config.name VARCHAR(256)

# A kubelet timestamp this far from the line before it is not trusted to order lines (the
# dedupe cursor reads such a line as if stamped at the line before it). The scans refuse a
# block with such a step between two lines: the run model decides.
CLOCK_JUMP_NS = 3600 * 10**9


def int32(value: int) -> bool:
    return INT32_MIN <= value <= INT32_MAX


def int64(value: int) -> bool:
    return INT64_MIN <= value <= INT64_MAX


def has_nul(*texts: str) -> bool:
    """PostgreSQL text and JSONB cannot hold U+0000."""
    return any("\x00" in t for t in texts)
