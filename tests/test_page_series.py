"""/api/runs/<run>/series (storage/page_series.py), on SQLite and PostgreSQL: the page's
downsampled CE. Each bucket's count, step span, min, max, last and first NaN checked against
the stored rows; one step per bucket once the buckets outnumber the steps; a gap is no bucket;
from/to; `rbf=0` (no REQUIRED_RBF counts, the rest the same); ETag; every bad parameter a JSON
400. /api/runs/<run>/rbf-layers (storage/page_rbf.py): each layer's largest value per bucket,
checked against the stored arrays, whole and read every `stride`-th step."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from store_fixtures import ingest_sample
from test_serve import running


@pytest.fixture
def loaded(store, samples):
    for run, name in (("rg", "resume-gap"), ("nan", "cp4-lb-nan")):
        ingest_sample(store, samples, run, name)
    return store


async def _series(http, query: str, **headers):
    async with http.get(f"/api/runs/{query}", headers=headers) as resp:
        return resp.status, resp.headers, json.loads(await resp.read() or b"null")


def _stored(store, run: str) -> dict[int, list[tuple]]:
    with store.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT incarnation, step, ce, ce_raw FROM loss_parts WHERE run = :run"
                                    " ORDER BY incarnation, step"), {"run": run}).all()
    out: dict[int, list[tuple]] = {}
    for inc, step, ce, raw in rows:
        out.setdefault(inc, []).append((step, ce, raw))
    return out


def _buckets(answer: dict) -> dict[int, list[dict]]:
    cols = answer["columns"]
    return {i["incarnation"]: [dict(zip(cols, r, strict=True)) for r in i["rows"]] for i in answer["incarnations"]}


@pytest.mark.parametrize("run", ["rg", "nan"])
@pytest.mark.parametrize("buckets", [7, 40])  # 7: from loss_rollup's blocks; 40: from the rows (width < 16)
async def test_buckets_hold_min_max_last_and_nan_of_their_rows(loaded, run, buckets):
    stored = _stored(loaded, run)
    async with running(loaded) as http:
        status, _, answer = await _series(http, f"{run}/series?buckets={buckets}")
        assert status == 200 and answer["run"] == run
        got = _buckets(answer)
        assert set(got) == set(stored)
        lo, hi, width = answer["from"], answer["to"], answer["width"]
        first = min(s for rows in stored.values() for s, _, _ in rows)
        last = max(s for rows in stored.values() for s, _, _ in rows)
        # wide buckets are made of loss_rollup's blocks of 16: from a block's start, whole blocks
        if width >= 16:
            assert lo <= first < lo + 16 and lo % 16 == 0 and width % 16 == 0 and hi >= last
        else:
            assert (lo, hi) == (first, last)
        assert width * buckets >= hi - lo + 1
        for inc, cut in got.items():
            assert len(cut) <= buckets
            for b in cut:
                rows = [r for r in stored[inc] if lo + b["k"] * width <= r[0] < lo + (b["k"] + 1) * width]
                finite = [ce for _, ce, _ in rows if ce is not None]
                assert (b["n"], b["s0"], b["s1"]) == (len(rows), rows[0][0], rows[-1][0])
                assert (b["ce_min"], b["ce_max"]) == (min(finite, default=None), max(finite, default=None))
                assert (b["ce_last"], b["ce_last_raw"]) == (rows[-1][1], rows[-1][2])
                assert b["nan_step"] == next((s for s, ce, _ in rows if ce is None), None)
            assert sum(b["n"] for b in cut) == len(stored[inc])
        if run == "nan":  # the sample's NaNs are in some bucket
            assert any(b["nan_step"] is not None for bs in got.values() for b in bs)


async def test_one_step_per_bucket_a_gap_is_no_bucket_and_a_range(loaded):
    stored = _stored(loaded, "rg")
    async with running(loaded) as http:
        _, _, answer = await _series(http, "rg/series?buckets=4000")
        assert answer["width"] == 1
        got = _buckets(answer)
        for inc, buckets in got.items():
            assert [(b["s0"], b["ce_last_raw"], b["n"]) for b in buckets] == [(s, raw, 1) for s, _, raw in stored[inc]]
        assert not [b for b in got[1] if 60 <= b["s0"] <= 63]  # the sample's gap: steps 60-63 missing
        assert sum(b["rbf"] for bs in got.values() for b in bs) == 174 + 250  # REQUIRED_RBF rows (outline)
        # a zoomed range: only its steps, at full detail
        _, _, answer = await _series(http, "rg/series?buckets=100&from=140&to=160")
        got = _buckets(answer)
        assert (answer["from"], answer["to"], answer["width"]) == (140, 160, 1)
        assert [b["s0"] for b in got[1]] == list(range(140, 161))
        assert [b["s0"] for b in got[2]] == list(range(151, 161))


async def test_without_rbf_counts_the_rest_is_the_same(loaded):
    async with running(loaded) as http:
        for query in ("buckets=7", "buckets=40", "buckets=100&from=140&to=160"):
            _, with_headers, full = await _series(http, f"rg/series?{query}")
            _, headers, bare = await _series(http, f"rg/series?{query}&rbf=0")
            rbf = full["columns"].index("rbf")
            assert any(r[rbf] for i in full["incarnations"] for r in i["rows"])
            assert all(r[rbf] is None for i in bare["incarnations"] for r in i["rows"])
            for i in (*full["incarnations"], *bare["incarnations"]):
                for r in i["rows"]:
                    r[rbf] = None
            assert bare == full, query
            assert headers["ETag"] != with_headers["ETag"]
        status, _, body = await _series(http, "rg/series?rbf=2")
        assert status == 400 and body["error"]


def _stored_layers(store, run: str) -> list[tuple]:
    with store.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT incarnation, step, max, CAST(per_layer AS TEXT) FROM required_rbf"
                                    " WHERE run = :run ORDER BY incarnation, step"), {"run": run}).all()
    return [(inc, step, top, json.loads(layers)) for inc, step, top, layers in rows]


@pytest.mark.parametrize("query", ["buckets=7", "buckets=1000", "buckets=20&from=140&to=170"])
async def test_rbf_layers_hold_each_layers_largest_value(loaded, query):
    stored = _stored_layers(loaded, "rg")
    async with running(loaded) as http:
        status, headers, answer = await _series(http, f"rg/rbf-layers?{query}")
        assert status == 200 and answer["stride"] == 1
        lo, hi, width = answer["from"], answer["to"], answer["width"]
        assert answer["layers"] == max(len(v) for *_, v in stored)
        got = _buckets(answer)
        assert set(got) == {r[0] for r in stored if lo <= r[1] <= hi}
        for inc, cut in got.items():
            for b in cut:
                rows = [r for r in stored if r[0] == inc and lo + b["k"] * width <= r[1] < lo + (b["k"] + 1) * width
                        and r[1] <= hi]
                assert (b["n"], b["s0"], b["s1"]) == (len(rows), rows[0][1], rows[-1][1])
                assert b["max"] == max(r[2] for r in rows)
                assert b["layers"] == [max(r[3][j] for r in rows) for j in range(len(rows[0][3]))]
            assert sum(b["n"] for b in cut) == sum(1 for r in stored if r[0] == inc and lo <= r[1] <= hi)
        assert (await _series(http, f"rg/rbf-layers?{query}", **{"If-None-Match": headers["ETag"]}))[0] == 304
        for bad in ("buckets=0", "buckets=1001", "from=9&to=8", "from=x"):
            status, _, body = await _series(http, f"rg/rbf-layers?{bad}")
            assert status == 400 and body["error"], bad
        assert (await _series(http, "nope/rbf-layers"))[0] == 404


async def test_rbf_layers_of_a_wide_range_read_every_strideth_step(loaded):
    from steptail.storage.page_rbf import rbf_layers

    stored = _stored_layers(loaded, "rg")
    with loaded.engine.connect() as conn:  # a wide range, from the sample's 400 steps
        answer = rbf_layers(conn, "rg", 1000, rows_max=100)
    lo, stride = answer["from"], answer["stride"]
    assert stride == 4 and answer["width"] % stride == 0
    read = [r for r in stored if (r[1] - lo) % stride == 0]
    got = _buckets(answer)
    assert sum(b["n"] for bs in got.values() for b in bs) == len(read)
    assert [(inc, b["s0"]) for inc, bs in got.items() for b in bs] == [(r[0], r[1]) for r in read]


async def test_tagged_and_refused(loaded):
    async with running(loaded) as http:
        status, headers, _ = await _series(http, "rg/series?buckets=50")
        assert status == 200 and headers["Cache-Control"] == "no-cache"
        tag = headers["ETag"]
        assert (await _series(http, "rg/series?buckets=50", **{"If-None-Match": tag}))[0] == 304
        assert (await _series(http, "rg/series?buckets=51", **{"If-None-Match": tag}))[0] == 200
        with loaded.engine.begin() as conn:  # a commit to the run: a new tag
            conn.execute(sa.text("UPDATE runs SET updated_ns = updated_ns + 1 WHERE run = 'rg'"))
        assert (await _series(http, "rg/series?buckets=50", **{"If-None-Match": tag}))[0] == 200
        for query in ("buckets=0", "buckets=4001", "buckets=x", "buckets=1.5", "from=9&to=8", "from=-2",
                      "to=99999999999"):
            status, _, body = await _series(http, f"rg/series?{query}")
            assert status == 400 and body["status"] == 400 and body["error"], query
        status, _, body = await _series(http, "nope/series")
        assert status == 404 and "no run 'nope'" in body["error"]


async def test_step_times_by_incarnation_in_buckets(loaded):
    with loaded.engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT incarnation, step, seconds, tokens_per_s FROM pod_metrics"
                                      " WHERE run = 'rg' ORDER BY incarnation, step")).all()
    assert stored
    async with running(loaded) as http:
        _, _, answer = await _series(http, "rg/step-times?buckets=4000")
        got = _buckets(answer)
        assert answer["width"] == 1
        assert [(inc, b["s0"], b["seconds"], b["tokens_per_s"]) for inc, bs in got.items() for b in bs] == [
            (inc, step, pytest.approx(sec), pytest.approx(tok)) for inc, step, sec, tok in stored]
        _, headers, answer = await _series(http, "rg/step-times?buckets=5")
        lo, width = answer["from"], answer["width"]
        for inc, buckets in _buckets(answer).items():
            assert len(buckets) <= 5
            for b in buckets:
                rows = [r for r in stored if r[0] == inc and lo + b["k"] * width <= r[1] < lo + (b["k"] + 1) * width]
                assert b["n"] == len(rows) and b["seconds_max"] == max(r[2] for r in rows)
                assert b["seconds_min"] == min(r[2] for r in rows)
                assert b["seconds"] == pytest.approx(sum(r[2] for r in rows) / len(rows))
        assert (await _series(http, "rg/step-times?buckets=5", **{"If-None-Match": headers["ETag"]}))[0] == 304
        for query in ("buckets=0", "buckets=y"):
            status, _, body = await _series(http, f"rg/step-times?{query}")
            assert status == 400 and body["status"] == 400, query
        assert (await _series(http, "nope/step-times"))[0] == 404
