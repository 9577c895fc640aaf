"""A stored verdict is never silently replaced (issue 32 item 2), on SQLite and PostgreSQL, through
the real CLI: the HF reference CE given once is stored with the run (and its source) and used by
later `check`, `reparse`, `follow`, the API and the export; `check` with and without it, in
either order, keeps the critical step-1 gate; a finding a newer evaluation changes or no longer
raises is kept as superseded (when, by what, why); `check` twice with the same inputs writes
nothing.

The run: tests/samples/cp4-lb-nan.log (ici_context_parallelism=4, step-1 ce 3.782990); the
reference 3.392990 puts its step 1 off by +0.39, as in the demo's cp4 arm."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from steptail.cli import main
from steptail.runs.findings import CRITICAL, WARNING, Finding
from steptail.runs.reference import Reference
from steptail.storage.db import open_store
from steptail.storage.findings import load_engine, load_findings, save_findings
from steptail.storage.superseded import change

RUN = "cp4"
STEP1 = 3.782990
OFF = "3.39299"  # step 1 differs from it by +0.39: the gate is critical
GATE = "step1_ce_gate"
NO_REFERENCE = "no HF reference"


def cli(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def rows(db_url: str, sql: str, **params) -> list[tuple]:
    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(sql), params)]
    finally:
        engine.dispose()


def gate(db_url: str, run: str = RUN) -> tuple[str, str] | None:
    found = rows(db_url, "SELECT severity, detail FROM findings WHERE run = :r AND kind = :k", r=run, k=GATE)
    return found[0] if found else None


def superseded(db_url: str, run: str = RUN) -> list[tuple]:
    return rows(db_url, "SELECT kind, severity, detail, superseded_by, why FROM superseded_findings"
                        " WHERE run = :r ORDER BY id", r=run)


def verdict_tables(db_url: str, run: str = RUN) -> dict[str, list[tuple]]:
    """Every stored column of the run's findings, superseded findings and reference CE."""
    return {
        "findings": rows(db_url, "SELECT * FROM findings WHERE run = :r ORDER BY id", r=run),
        "superseded": rows(db_url, "SELECT * FROM superseded_findings WHERE run = :r ORDER BY id", r=run),
        "reference": rows(db_url, "SELECT * FROM reference_ce WHERE run = :r ORDER BY id", r=run),
    }


@pytest.fixture
def cp4(db_url, samples) -> str:
    """The cp4 run ingested without a reference: its gate is the not-evaluable warning."""
    r = cli("ingest", str(samples / "cp4-lb-nan.log"), "--run", RUN, "--db", db_url)
    assert r.exit_code == 0, r.output
    severity, detail = gate(db_url)
    assert severity == WARNING and NO_REFERENCE in detail
    return db_url


def check(db_url: str, *args: str):
    r = cli("check", RUN, "--db", db_url, "-o", "json", *args)
    assert r.exit_code in (0, 1), r.output
    return r.exit_code, json.loads(r.stdout)


def test_with_then_without_the_reference_the_critical_gate_stays(cp4):
    code, doc = check(cp4, "--reference-ce", OFF)
    assert code == 1
    (g,) = [f for f in doc["findings"] if f["kind"] == GATE]
    assert g["severity"] == CRITICAL and "+0.390000" in g["detail"]
    assert doc["reference_ce"] == {"ce": {"1": 3.39299}, "source": f"--reference-ce {OFF}"}
    code, doc = check(cp4)  # no reference given: the stored one is used
    assert code == 1
    (again,) = [f for f in doc["findings"] if f["kind"] == GATE]
    assert again == g
    assert gate(cp4) == (CRITICAL, g["detail"])
    # the reference stays as given once, by check, from the command line
    assert rows(cp4, "SELECT step, ce, source, given_by, superseded_ns FROM reference_ce WHERE run = :r",
                r=RUN) == [(1, 3.39299, f"--reference-ce {OFF}", "check", None)]
    # the text output says which reference the gate used
    r = cli("check", RUN, "--db", cp4)
    assert r.exit_code == 1 and f"HF reference stored with the run (from --reference-ce {OFF})" in r.output


@pytest.mark.parametrize("by_key", [16, 0], ids=["looked-up-by-key", "read-whole"])
def test_without_then_with_the_reference_the_warning_is_superseded(cp4, by_key, monkeypatch):
    monkeypatch.setattr("steptail.storage.findings._BY_KEY", by_key)  # both ways save_findings reads
    code, doc = check(cp4)
    assert code == 1 and doc["reference_ce"] is None and doc["superseded"] == []
    assert gate(cp4)[0] == WARNING and superseded(cp4) == []
    code, doc = check(cp4, "--reference-ce", OFF)
    assert code == 1
    assert gate(cp4)[0] == CRITICAL
    ((kind, severity, detail, by, why),) = superseded(cp4)
    assert (kind, severity, by) == (GATE, WARNING, "check") and NO_REFERENCE in detail
    assert why.startswith("severity warning -> critical: step-1 ce 3.782990 differs")
    assert f"from --reference-ce {OFF}" in why
    # check -o json lists it, readable
    (s,) = doc["superseded"]
    assert s["kind"] == GATE and s["severity"] == WARNING and s["superseded_by"] == "check"
    assert s["superseded_at"].endswith("Z") and s["why"] == why
    # and then without again: still critical, nothing more superseded
    code, _ = check(cp4)
    assert code == 1 and gate(cp4)[0] == CRITICAL and len(superseded(cp4)) == 1
    r = cli("check", RUN, "--db", cp4)
    assert r.exit_code == 1 and f"1 superseded finding kept: steptail check {RUN} -o json" in r.output


def test_check_twice_with_the_same_inputs_writes_nothing(cp4):
    check(cp4)
    before = verdict_tables(cp4)
    check(cp4)
    assert verdict_tables(cp4) == before
    check(cp4, "--reference-ce", OFF)
    before = verdict_tables(cp4)
    assert len(before["superseded"]) == 1 and len(before["reference"]) == 1
    for args in (("--reference-ce", OFF), (), ("--reference-ce", OFF)):
        check(cp4, *args)
        assert verdict_tables(cp4) == before, args


def test_a_reference_that_passes_the_gate_keeps_the_old_critical_as_superseded(cp4, tmp_path):
    check(cp4, "--reference-ce", OFF)
    ref = tmp_path / "hf.json"
    ref.write_text(json.dumps({"1": STEP1}))
    code, doc = check(cp4, "--reference-ce", str(ref))
    assert code == 1  # load balancing and the NaN at step 77 are still critical
    assert gate(cp4) is None and GATE not in {f["kind"] for f in doc["findings"]}
    kinds = [(k, s, by) for k, s, _, by, _ in superseded(cp4)]
    assert kinds == [(GATE, WARNING, "check"), (GATE, CRITICAL, "check")]
    why = superseded(cp4)[-1][4]
    assert why == f"no longer raised by check with the HF reference CE step 1: {STEP1:.6f} (from {ref.resolve()})"
    # the old reference is kept, marked superseded by the check that replaced it
    refs = rows(cp4, "SELECT ce, source, superseded_by FROM reference_ce WHERE run = :r ORDER BY id", r=RUN)
    assert refs == [(3.39299, f"--reference-ce {OFF}", "check"), (STEP1, str(ref.resolve()), None)]
    # without a reference now: the new stored one, the gate still passes
    check(cp4)
    assert gate(cp4) is None and len(superseded(cp4)) == 2


def test_an_evaluated_gate_is_never_replaced_by_a_not_evaluable_one(cp4):
    check(cp4, "--reference-ce", OFF)
    critical = gate(cp4)
    # a store whose reference is gone (or a gate stored before references were): the
    # not-evaluable warning of a check without one must not replace the evaluated critical
    engine = sa.create_engine(cp4)
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM reference_ce"))
    engine.dispose()
    code, doc = check(cp4)
    assert code == 1 and gate(cp4) == critical and len(superseded(cp4)) == 1
    assert doc["reference_ce"] is None
    # the live path (follow's save_findings) keeps it too
    store = open_store(cp4)
    try:
        with store.engine.begin() as conn:
            (old,) = [f for f in load_findings(conn, RUN) if f.kind == GATE]
            flagged = Finding(GATE, RUN, old.incarnation, 1, 1, "step-1 CE gate cannot run: no HF reference CE",
                              WARNING, old.detected_ns + 1, {"not_evaluable": True})
            assert save_findings(conn, [flagged]) == 0
    finally:
        store.dispose()
    assert gate(cp4) == critical and len(superseded(cp4)) == 1


def test_the_live_path_keeps_what_a_changed_severity_replaces(cp4):
    """save_findings (follow): a new severity under the same key is a new verdict; the old one
    is kept as superseded by follow, and the row's detection time is the new verdict's."""
    store = open_store(cp4)
    try:
        with store.engine.begin() as conn:
            (old,) = [f for f in load_findings(conn, RUN) if f.kind == "nonfinite_ce"]
            new = Finding(old.kind, RUN, old.incarnation, old.first_step, old.last_step, old.detail,
                          WARNING, old.detected_ns + 5)
            assert save_findings(conn, [new]) == 1
            (now,) = [f for f in load_findings(conn, RUN) if f.kind == "nonfinite_ce"]
    finally:
        store.dispose()
    assert now.severity == WARNING and now.detected_ns == old.detected_ns + 5
    ((kind, severity, _, by, why),) = superseded(cp4)
    assert (kind, severity, by) == ("nonfinite_ce", CRITICAL, "follow")
    assert why.startswith("severity critical -> warning")


def test_a_range_that_grows_or_new_words_are_not_a_supersession():
    old = Finding("missing_rbf", "r", 1, 90, 91, "REQUIRED_RBF missing at steps 90–91", WARNING, 1)
    grown = Finding("missing_rbf", "r", 1, 90, 95, "REQUIRED_RBF missing at steps 90–95", WARNING, 2)
    assert change(old, old) is None and change(old, grown) is None
    assert change(grown, old) == "steps 90–95 -> steps 90–91: REQUIRED_RBF missing at steps 90–91"
    assert change(old, Finding("missing_rbf", "r", 1, 90, 91, "other words", WARNING, 2)) is None
    assert change(old, Finding("missing_rbf", "r", 1, 90, 91, old.detail, CRITICAL, 2)).startswith(
        "severity warning -> critical")
    # a finding the follower saw more evidence of (the load-balance rule in the JobSet's args,
    # then in the config lines) is the same verdict; a new severity is not
    rule = Finding("rule:load_balance", "r", 1, -1, -1, "… (seen in the JobSet's args)", CRITICAL, 1)
    both = Finding("rule:load_balance", "r", 1, -1, -1, "… (seen in the JobSet's args and the config)", CRITICAL, 2)
    assert change(rule, both) is None
    assert change(rule, Finding("rule:load_balance", "r", 1, -1, -1, "not evaluable: …", "info", 2)) is not None


def test_ingest_stores_the_reference_file_and_export_carries_it(db_url, samples, tmp_path):
    ref = tmp_path / "ref.csv"
    ref.write_text(f"step,ce\n1,{OFF}\n")
    r = cli("ingest", str(samples / "cp4-lb-nan.log"), "--run", RUN, "--db", db_url, "--reference-ce", str(ref))
    assert r.exit_code == 0, r.output
    assert gate(db_url)[0] == CRITICAL
    assert rows(db_url, "SELECT ce, source, given_by FROM reference_ce WHERE run = :r", r=RUN) == [
        (3.39299, str(ref.resolve()), "ingest")]
    assert check(db_url)[1]["reference_ce"]["source"] == str(ref.resolve())
    check(db_url, "--reference-ce", str(STEP1))  # passes: the critical is superseded
    out = tmp_path / "bundle"
    r = cli("export", RUN, "--db", db_url, "--out", str(out))
    assert r.exit_code == 0, r.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["reference_ce"] == {"ce": {"1": STEP1}, "source": f"--reference-ce {STEP1}"}
    (s,) = manifest["superseded_findings"]
    assert (s["kind"], s["severity"], s["superseded_by"]) == (GATE, CRITICAL, "check")
    assert GATE not in pq.read_table(out / "findings.parquet").column("kind").to_pylist()


def test_follow_stores_the_reference_and_resumes_with_the_stored_one(cp4):
    store = open_store(cp4)
    try:
        engine = load_engine(store, RUN, reference_ce=Reference({1: 3.39299}, "/refs/cp4.json"))
        assert engine.reference_ce == {1: 3.39299}
        resumed = load_engine(store, RUN)  # a collector restarted without --reference-ce
        assert resumed.reference_ce == {1: 3.39299}
        (g,) = [f for f in resumed.findings.values() if f.kind == GATE]
        assert g.severity == CRITICAL
    finally:
        store.dispose()
    assert rows(cp4, "SELECT ce, source, given_by FROM reference_ce WHERE run = :r", r=RUN) == [
        (3.39299, "/refs/cp4.json", "follow")]
    code, doc = check(cp4)  # check uses what follow stored
    assert gate(cp4)[0] == CRITICAL and doc["reference_ce"]["source"] == "/refs/cp4.json"


async def test_the_api_shows_superseded_findings_on_request(cp4):
    from test_serve import running

    check(cp4, "--reference-ce", OFF)
    store = open_store(cp4)
    try:
        async with running(store) as http:
            async with http.get(f"/api/runs/{RUN}/findings") as resp:
                plain = await resp.json()
            assert resp.status == 200 and "superseded" not in plain
            assert [f["severity"] for f in plain["findings"] if f["kind"] == GATE] == [CRITICAL]
            async with http.get(f"/api/runs/{RUN}/findings?superseded=1") as resp:
                doc = await resp.json()
            assert resp.status == 200 and doc["findings"] == plain["findings"]
            (s,) = doc["superseded"]
            assert (s["kind"], s["severity"], s["superseded_by"]) == (GATE, WARNING, "check")
            assert doc["reference_ce"] == {"ce": {"1": 3.39299}, "source": f"--reference-ce {OFF}"}
            (h,) = doc["reference_ce_history"]
            assert h["given_by"] == "check" and h["superseded_at"] is None
            async with http.get(f"/api/runs/{RUN}/findings?superseded=yes") as resp:
                assert resp.status == 400
    finally:
        store.dispose()
    # and the Python API
    import steptail

    with steptail.open(cp4) as st:
        frame = st.superseded(RUN)
    assert list(frame["kind"]) == [GATE] and list(frame["superseded_by"]) == ["check"]


@pytest.mark.timeout(150)
def test_reparse_uses_the_stored_reference(make_simcluster, tmp_path, db_url, monkeypatch):
    """A followed run with its raw log: reparse (into a new run, then in place) evaluates its gate
    with the reference check stored; a reparse with one that passes supersedes the critical."""
    from test_follow_support import follow_sim, scenario

    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "placeholder@example.invalid")
    sim = make_simcluster(scenario())
    raw = tmp_path / "raw"
    follow_sim(sim, db_url, raw=str(raw))
    ((ce1,),) = rows(db_url, "SELECT ce FROM loss_parts WHERE run = 'r' AND step = 1")
    off = f"{ce1 - 0.39:.6f}"
    r = cli("check", "r", "--db", db_url, "--reference-ce", off)
    assert r.exit_code == 1 and gate(db_url, "r")[0] == CRITICAL
    r = cli("reparse", "r", "--raw", str(raw), "--db", db_url, "--into", "r2")
    assert r.exit_code == 0, r.output
    assert gate(db_url, "r2") == gate(db_url, "r")
    assert rows(db_url, "SELECT ce, source FROM reference_ce WHERE run = 'r2'") == [(float(off), f"--reference-ce {off}")]
    r = cli("reparse", "r", "--raw", str(raw), "--db", db_url, "--replace")
    assert r.exit_code == 0, r.output
    assert gate(db_url, "r")[0] == CRITICAL and superseded(db_url, "r") == []
    r = cli("reparse", "r", "--raw", str(raw), "--db", db_url, "--replace", "--reference-ce", repr(ce1))
    assert r.exit_code == 0, r.output
    assert gate(db_url, "r") is None
    ((kind, severity, _, by, why),) = superseded(db_url, "r")
    assert (kind, severity, by) == (GATE, CRITICAL, "reparse")
    assert why.startswith("no longer raised by reparse with the HF reference CE")
