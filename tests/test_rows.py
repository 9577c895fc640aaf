"""The model's row tuples against their column names (runs.rows): every producer puts each
value where the names say, on every path (general parser, fast path, steady blocks), and
the timestamp a caller read once is the one the rows carry."""

from __future__ import annotations

import pytest

from steptail.collector.offline.ingest import apply_parsed
from steptail.parsers.block import parse_block
from steptail.parsers.fast import line_ts, ts_of
from steptail.parsers.records import BlockKind
from steptail.parsers.timestamps import split_timestamp
from steptail.runs.model import RunModel, quarantine_row
from steptail.runs.rows import (
    COLUMNS,
    FLAGS,
    INCARNATIONS,
    LOSS_PARTS,
    QUARANTINE,
    TABLES,
    Columns,
)

T0 = "2026-11-30T04:00:0{}.5Z"
LOG = [
    "I1130 max_utils.py:290] Jax distributed system initialized! process_index=0 process_count=32",
    "I1130 pyconfig.py:584] Config param steps: 300",
    "I1130 checkpointing.py:613] Restoring checkpoint from step 4.",
    "I1130 train_sft.py:301] LOSS-PARTS step=5 ce=3.5 z_loss=0.25",
    "I1130 metric_logger.py:210] completed step: 5, seconds: 11.5, TFLOP/s/device: 170.5, "
    "Tokens/s/device: 4000.5, total_weights: 1048576, loss: 5.25",
    "I1130 train.py:1333] REQUIRED_RBF step=5 max=1.5 per_layer=[1.25,1.5] program=p0",
    "I1130 checkpointing.py:700] Saved a checkpoint at step 5.",
]


def _lines(steps: int = 1) -> list[bytes]:
    """LOG with step 5's lines repeated for steps 5..5+steps-1, one second per line."""
    body = LOG[:3] + [text.replace("step=5", f"step={s}").replace("step: 5", f"step: {s}")
                      .replace("step 5.", f"step {s}.") for s in range(5, 5 + steps) for text in LOG[3:]]
    return [f"2026-11-30T04:{n // 60:02d}:{n % 60:02d}.5Z {text}\n".encode() for n, text in enumerate(body)]


def _named(table: str, row: tuple) -> dict:
    return dict(zip(TABLES[table], row, strict=True))


def _expect_step_5(batch, ts_of_line, last_step: int = 5) -> None:
    loss = _named("loss_parts", batch.loss_parts[0])
    assert loss == {"run": "r", "incarnation": 1, "step": 5, "ts_ns": ts_of_line("LOSS-PARTS"), "ce": 3.5,
                    "ce_raw": "3.5", "parts": '{"z_loss":0.25}'}
    rbf = _named("required_rbf", batch.required_rbf[0])
    assert rbf == {"run": "r", "incarnation": 1, "step": 5, "ts_ns": ts_of_line("REQUIRED_RBF"), "max": 1.5,
                   "per_layer": "[1.25,1.5]", "program": "p0"}
    pod = _named("pod_metrics", batch.pod_metrics[0])
    assert pod == {"run": "r", "incarnation": 1, "step": 5, "ts_ns": ts_of_line("completed step"),
                   "seconds": 11.5, "tflops": 170.5, "tokens_per_s": 4000.5, "total_weights": 1048576,
                   "loss": 5.25, "extra": "{}"}
    assert [_named("checkpoints", r) for r in batch.checkpoints[:2]] == [
        {"run": "r", "incarnation": 1, "kind": "restore", "step": 4, "ts_ns": ts_of_line("Restoring")},
        {"run": "r", "incarnation": 1, "kind": "save", "step": 5, "ts_ns": ts_of_line("Saved")},
    ]
    assert _named("config", batch.config[0]) == {"run": "r", "incarnation": 1, "name": "steps", "value": "300"}
    inc = _named("incarnations", batch.incarnations[1])
    assert (inc["run"], inc["incarnation"], inc["saw_start"], inc["first_step"], inc["last_step"],
            inc["restored_from"], inc["process_index"], inc["process_count"]) == ("r", 1, True, 5, last_step, 4, 0, 32)


def _ts_by_tag(lines: list[bytes]):
    return lambda tag: next(line_ts(x) for x in lines if tag.encode() in x)


def test_columns_name_positions():
    assert LOSS_PARTS.STEP == LOSS_PARTS.index("step") == 2
    assert all(getattr(cols, name.upper()) == i for cols in TABLES.values() for i, name in enumerate(cols))
    assert isinstance(COLUMNS["loss_parts"], tuple) and Columns("a", "b").B == 1


def test_rows_line_by_line_match_their_column_names():
    model, lines = RunModel("r"), _lines()
    for line in lines:
        model.feed(line)
    _expect_step_5(model.take(), _ts_by_tag(lines))


def test_rows_of_a_steady_block_match_their_column_names():
    model, lines = RunModel("r"), _lines(steps=40)
    head, rest = lines[:4], b"".join(lines[4:])  # step 5's LOSS-PARTS line opens the incarnation
    for line in head:
        model.feed(line)
    parsed = parse_block(rest)
    assert parsed[0] == BlockKind.STEADY
    apply_parsed(model, parsed, lambda a, b: rest[a:b])
    batch = model.take()
    assert len(batch.loss_parts) == len(batch.required_rbf) == len(batch.pod_metrics) == 40
    _expect_step_5(batch, _ts_by_tag(lines), last_step=44)
    assert _named("pod_metrics", batch.pod_metrics[-1])["step"] == 44


def test_flag_and_quarantine_rows_match_their_column_names():
    model = RunModel("r")
    for line in _lines()[:4]:
        model.feed(line)
    model.feed(b"2026-11-30T04:01:00Z LOSS-PARTS step=900000000 ce=1.0\n")  # past the configured 300 steps
    batch = model.take()
    flag = dict(zip(FLAGS, batch.flags[0], strict=True))
    assert (flag["run"], flag["kind"], flag["incarnation"], flag["first_step"], flag["last_step"],
            flag["severity"]) == ("r", "step_jump", 1, 900000000, 900000000, "warning")
    kept = dict(zip(QUARANTINE, batch.quarantine[0], strict=True))
    assert (kept["run"], kept["kind"], kept["incarnation"], kept["step"], kept["ts_ns"]) == (
        "r", "loss_parts", 1, 900000000, line_ts(b"2026-11-30T04:01:00Z "))
    refused = dict(zip(QUARANTINE, quarantine_row("checkpoints", ("r", 2, "save", 7, 99), "why"), strict=True))
    assert (refused["incarnation"], refused["step"], refused["ts_ns"], refused["reason"]) == (2, 7, 99, "why")
    assert INCARNATIONS.SAW_START == 3


def test_feed_stamped_uses_the_timestamp_given():
    """The follower reads a line's timestamp once; the model takes it as given, on the fast
    path and the general one alike."""
    model = RunModel("r")
    for n, text in enumerate(LOG):
        model.feed_stamped(f"2026-11-30T04:00:00Z {text}\n".encode(), 1000 + n)
    batch = model.take()
    assert [row[LOSS_PARTS.TS_NS] for row in batch.loss_parts] == [1003]
    assert [_named("checkpoints", r)["ts_ns"] for r in batch.checkpoints] == [1002, 1006]
    assert _named("incarnations", batch.incarnations[1])["started_ns"] == 1000


@pytest.mark.parametrize("line", [
    b"2026-11-30T04:00:00.002052886Z x\n", b"2026-11-30T04:00:00Z x", b"2026-11-30T04:00:00.5Z \r\n",
    b"2026-11-30T04:00:00.5+01:00 x", b"2026-02-30T04:00:00Z x", b"1969-12-31T23:59:59Z x",
    b"2026-11-30T04:00:00Z", b"no timestamp", b"", b"2026-11-30T25:00:00Z x", b"2026-11-30T04:00:00.1234567890Z x",
])
def test_line_ts_is_the_reference_reading(line):
    assert line_ts(line) == split_timestamp(line.rstrip(b"\r\n"))[0]
    if ts_of(line) is not False:
        assert line_ts(line) == ts_of(line)  # no second reading where the fast one vouches
