"""ParquetError alone, without pyarrow: callers that only catch it (an ingest without
--parquet) do not pay pyarrow's import (~0.13 s) to name it."""

from __future__ import annotations


class ParquetError(OSError):
    """Writing Parquet failed (a full disk, no permission); the message is one line naming the
    directory and the reason."""
