"""Hostile input: never a crash, the right records, the right bad-line count."""

from __future__ import annotations

import math

from steptail.collector.offline.files import open_source
from steptail.collector.offline.ingest import ingest
from steptail.parsers import LossParts, Malformed, RequiredRbf, parse_line
from steptail.storage.reads import iter_steps

TS = b"2026-11-30T04:00:0%dZ "


def test_crlf_ansi_reordered_unknown_and_special_floats():
    rec = parse_line(TS % 1 + b"I1130 train.py:1] LOSS-PARTS step=1 ce=3.5 z_loss=1e-05\r\n").record
    assert rec == LossParts.make(1, 3.5, "3.5", {"z_loss": 1e-05})
    rec = parse_line(b"\x1b[32mLOSS-PARTS\x1b[0m step=2 ce=1e-05 mode=word\x1b[0m\r\n").record
    assert rec == LossParts.make(2, 1e-05, "1e-05", {"mode": "word"})
    rec = parse_line(b"LOSS-PARTS weights=7 ce=-inf new_key=0.5 step=3 total=nan").record
    assert rec.step == 3 and rec.ce == -math.inf and rec.parts["weights"] == 7
    assert rec.parts["new_key"] == 0.5 and math.isnan(rec.parts["total"])
    rbf = parse_line(b"x REQUIRED_RBF step=0 max=3.2500 per_layer=[1.5000,3.2500] program=first_phase").record
    assert rbf == RequiredRbf.make(0, 3.25, (1.5, 3.25), "first_phase")


def test_malformed_records_are_reported_not_raised():
    for line in (
        b"LOSS-PARTS step=x ce=1",
        b"LOSS-PARTS step=1",
        b"LOSS-PARTS step=1 ce=oops",
        b"LOSS-PARTS step=1 ce=1 ce=2",
        b"LOSS-PARTS step=1 ce=\xff\xfe",
        b"REQUIRED_RBF step=1 max=1 per_layer=[1.0,x] program=p",
        b"REQUIRED_RBF step=1 max=1",
        b"completed step: nope, seconds: 1",
    ):
        assert isinstance(parse_line(line).record, Malformed), line
    for line in (b"", b"\x00\xff\xfe\x80", b"NO-LOSS-PARTSX step=1", b"2026-13-45T99:99:99Z x"):
        assert parse_line(line).record is None


def _ingest(store, run, path):
    source = open_source(str(path))
    try:
        return ingest(store, run, [source])
    finally:
        source.close()


def test_hostile_file(store, tmp_path):
    big_untagged = b"y" * (5 << 20) + b"\n"
    body = b"".join([
        TS % 1 + b"I1130 train.py:1] LOSS-PARTS step=1 ce=3.5 z_loss=1e-05\r\n",
        b"\x00\xff\xfe binary \x80\x81 garbage\n",
        TS % 2 + b"\x1b[32mLOSS-PARTS\x1b[0m step=2 ce=1e-05 mode=word\r\n",
        big_untagged,
        TS % 3 + b"LOSS-PARTS weights=7 ce=inf new_key=0.5 step=3\n",
        TS % 3 + b"REQUIRED_RBF step=3 max=1.5 per_layer=[1.5,1.0] program=normal\n",
        TS % 4 + b"LOSS-PARTS step=4 ce=oops\n",  # bad 1
        TS % 5 + b"LOSS-PARTS step=5 ce=\xff\xfe\n",  # bad 2
        TS % 6 + b"LOSS-PARTS step=6 ce=2.5\n",
        TS % 7 + b"LOSS-PARTS step=7 ce=" + b"1" * (5 << 20) + b"\n",  # bad 3: over-long tagged line
        TS % 8 + b"LOSS-PARTS step=8 ce=2.25\n",
        TS % 9 + b"LOSS-PARTS step=9 ce=2.",  # bad 4: cut off mid-number, no newline
    ])
    path = tmp_path / "hostile.log"
    path.write_bytes(body)
    result = _ingest(store, "h", path)
    assert result.bad_lines == 4
    assert result.lines == 12
    rows = list(iter_steps(store, "h"))
    assert [(r["step"], r["ce_raw"]) for r in rows] == [
        (1, "3.5"), (2, "1e-05"), (3, "inf"), (6, "2.5"), (8, "2.25"),
    ]
    assert rows[1]["ce"] == 1e-05 and rows[2]["ce"] is None
    assert rows[2]["parts"] == {"weights": 7, "new_key": 0.5} and rows[2]["rbf_max"] == 1.5


def test_five_mib_tagged_line_without_newline(store, tmp_path):
    path = tmp_path / "long.log"
    path.write_bytes(b"LOSS-PARTS step=1 ce=1.0\nLOSS-PARTS step=2 ce=" + b"9" * (5 << 20))
    result = _ingest(store, "long", path)
    assert (result.loss_parts, result.bad_lines, result.lines) == (1, 1, 2)
