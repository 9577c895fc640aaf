"""The fast /steps path (storage.api_reads) over real HTTP, on SQLite and PostgreSQL: every page
JSON-equal to reads.iter_steps, whatever the run holds (non-finite CE, restarts, REQUIRED_RBF
per-layer arrays, REQUIRED_RBF rows without LOSS-PARTS, JSON text json.loads alone reads)."""

from __future__ import annotations

import json
import math

import pytest
import sqlalchemy as sa
from store_fixtures import ingest_sample
from test_serve import _get, running

from steptail.jsonsafe import strict
from steptail.storage import api_reads
from steptail.storage.reads import iter_steps


@pytest.fixture
def loaded(store, samples):
    for run, name in (("nan", "cp4-lb-nan"), ("rg", "resume-gap"), ("clean", "clean-300")):
        ingest_sample(store, samples, run, name)
    return store


def _reference(store, run, **kw) -> list:
    """What the API answered before the fast path: iter_steps through json.dumps, nan as null."""
    return json.loads(json.dumps(strict(list(iter_steps(store, run, **kw))), allow_nan=False))


async def _walk(http, path: str) -> tuple[list, int]:
    rows, pages = [], 0
    while path:
        status, headers, body = await _get(http, path)
        assert status == 200 and headers["Content-Type"] == "application/json; charset=utf-8"
        page = json.loads(body)
        assert page["count"] == len(page["steps"])
        rows += page["steps"]
        path, pages = page["next"], pages + 1
    return rows, pages


@pytest.mark.parametrize("run", ["nan", "rg", "clean"])
async def test_pages_equal_iter_steps(loaded, run):
    want = _reference(loaded, run)
    async with running(loaded) as http:
        got, pages = await _walk(http, f"/api/runs/{run}/steps?limit=37")
        assert got == want and pages == math.ceil(len(want) / 37) + (len(want) % 37 == 0)
        one, _ = await _walk(http, f"/api/runs/{run}/steps")
        assert one == want


async def test_non_finite_ce_is_null_and_rbf_arrays_are_kept(loaded):
    async with running(loaded) as http:
        rows, _ = await _walk(http, "/api/runs/nan/steps")
    bad = [r for r in rows if r["ce_raw"] in ("nan", "inf", "-inf")]
    assert bad and all(r["ce"] is None for r in bad)
    rbf = [r for r in rows if r["rbf_per_layer"] is not None]
    assert rbf and all(isinstance(v, float) for r in rbf for v in r["rbf_per_layer"])


async def test_pages_cross_incarnations_keyset_and_window(loaded):
    """resume-gap restarts: a page holds the end of one incarnation and the start of the next,
    and its next link resumes behind the last row as before."""
    want = _reference(loaded, "rg")
    cut = next(i for i in range(1, len(want)) if want[i]["incarnation"] != want[i - 1]["incarnation"])
    after = want[cut - 5]
    async with running(loaded) as http:
        status, _, body = await _get(http, f"/api/runs/rg/steps?after={after['incarnation']}:{after['step']}&limit=10")
        page = json.loads(body)
        assert status == 200 and page["steps"] == want[cut - 4:cut + 6]
        assert {r["incarnation"] for r in page["steps"]} == {1, 2}
        last = want[cut + 5]
        assert page["next"] == f"/api/runs/rg/steps?after={last['incarnation']}%3A{last['step']}&limit=10"
        got, _ = await _walk(http, "/api/runs/rg/steps?from=150&to=160&limit=7")
        assert got == _reference(loaded, "rg", lo=150, hi=160)
        status, _, body = await _get(http, "/api/runs/rg/steps?offset=395&limit=20")
        assert json.loads(body)["steps"] == _reference(loaded, "rg", offset=395, limit=20)


async def test_rbf_rows_without_loss_parts_and_json_only_python_reads(loaded):
    """A REQUIRED_RBF row with no LOSS-PARTS row is a row of its own (between and after the
    others), and a stored NaN token (SQLite keeps any text) is null as json.dumps made it."""
    with loaded.engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM loss_parts WHERE run = 'clean' AND step IN (10, 11, 300)"))
        if loaded.is_sqlite:
            conn.execute(sa.text("UPDATE required_rbf SET per_layer = '[1.5, NaN, Infinity]'"
                                 " WHERE run = 'clean' AND step = 12"))
    want = _reference(loaded, "clean")
    assert [r["step"] for r in want if r["ce_raw"] is None] == [10, 11, 300]
    async with running(loaded) as http:
        for limit in (1, 2, 3, 11, 1000):
            got, _ = await _walk(http, f"/api/runs/clean/steps?limit={limit}")
            assert got == want, limit
    if loaded.is_sqlite:
        assert want[11]["rbf_per_layer"] == [1.5, None, None]


def test_steps_json_equals_json_dumps_for_awkward_values():
    """orjson spells some floats and characters otherwise than json.dumps; the values are the same."""
    rows = [(1, 2, 1_795_000_000_123_456_789, 1e-05, "1e-05", '{"a":3.3e-06,"b":"\\u00e9\\u007f"}',
             1e16, "[1e-7, 5e-324]", "pr\u00e9\x7f"),
            (1, 3, None, float("nan"), "nan", None, None, None, None)]
    got = json.loads(api_reads.steps_json(rows))
    assert got[0] == {"incarnation": 1, "step": 2, "ts": "2026-11-18T11:06:40.123456789Z", "ce": 1e-05,
                      "ce_raw": "1e-05", "parts": {"a": 3.3e-06, "b": "\u00e9\x7f"}, "rbf_max": 1e16,
                      "rbf_per_layer": [1e-7, 5e-324], "rbf_program": "pr\u00e9\x7f"}
    assert got[1]["ts"] is None and got[1]["ce"] is None and got[1]["parts"] == {}


@pytest.mark.parametrize("ns", [0, 1, 999_999_999, 1_795_000_000 * 10**9 + 120, 86_399 * 10**9, -1, 253402300799 * 10**9])
def test_ts_is_format_ns(ns):
    from steptail.parsers import format_ns

    assert api_reads._ts(ns) == format_ns(ns)


@pytest.mark.parametrize("run", ["nan", "rg"])
async def test_fields_narrow_every_page_to_those_and_the_key(loaded, run):
    want = _reference(loaded, run)
    async with running(loaded) as http:
        got, _ = await _walk(http, f"/api/runs/{run}/steps?limit=50&fields=ce,rbf_per_layer")
        assert got == [{k: r[k] for k in ("incarnation", "step", "ce", "rbf_per_layer")} for r in want]
        assert [list(r) for r in got[:1]] == [["incarnation", "step", "ce", "rbf_per_layer"]]
        parts, _ = await _walk(http, f"/api/runs/{run}/steps?limit=50&fields=ts,parts")
        assert parts == [{k: r[k] for k in ("incarnation", "step", "ts", "parts")} for r in want]
        _, _, body = await _get(http, f"/api/runs/{run}/steps?offset=7&limit=20&fields=rbf_max")
        assert json.loads(body)["steps"] == [{k: r[k] for k in ("incarnation", "step", "rbf_max")}
                                             for r in want[7:27]]
        _, _, body = await _get(http, f"/api/runs/{run}/steps?limit=50&fields=ce")
        assert json.loads(body)["next"].endswith("&limit=50&fields=incarnation,step,ce")
        status, _, body = await _get(http, f"/api/runs/{run}/steps?fields=ce,loss")
        assert status == 400 and "no field 'loss'" in json.loads(body)["error"]
        tags = {(await _get(http, f"/api/runs/{run}/steps?{q}"))[1]["ETag"] for q in ("fields=ce", "fields=ts", "")}
        assert len(tags) == 3  # a narrowed page is not the whole one to a cache
