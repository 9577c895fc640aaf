"""The Python API's accessors for a run's timing, configuration, checkpoints and incarnations, and
`steps(run, lineage="final")`: each step once, from the execution that survived — checked against
the log lines they come from, on SQLite and on the real PostgreSQL."""

from __future__ import annotations

import re

import pytest
from findings_logs import LogBuilder, store_lines
from store_fixtures import ingest_sample

import steptail
from steptail.parsers import parse_rfc3339

TS = "datetime64[ns, UTC]"


def url_of(store) -> str:
    return store.engine.url.render_as_string(hide_password=False)


def three_incarnations() -> list[bytes]:
    """1: steps 1-100 (a save at 80); 2: restores 80, runs 81-150 (81-100 again); 3: restores 120,
    its first five steps never logged (a missing head), runs 126-170."""
    log = LogBuilder().start().steps(1, 100)
    log.add("I1130 checkpointing.py:401] Saved a checkpoint at step 80.")
    log.start(restore=80).steps(81, 150)
    log.start(restore=120).steps(126, 170)
    return log.lines


@pytest.fixture
def st(store):
    store_lines(store, "r", three_incarnations())
    with steptail.open(url_of(store)) as api:
        yield api


def test_final_lineage_takes_each_step_from_the_execution_that_survived(st):
    every = st.steps("r")
    assert len(every) == 100 + 70 + 45  # every execution, replays included
    final = st.steps("r", lineage="final")
    got = list(zip(final.incarnation, final.step, strict=True))
    # incarnation 2 redid 81-100 from the checkpoint of 80; incarnation 3 restored 120, so what
    # incarnation 2 ran from 121 was thrown away even though 3's head (121-125) was never read
    assert got == ([(1, s) for s in range(1, 81)] + [(2, s) for s in range(81, 121)]
                   + [(3, s) for s in range(126, 171)])
    assert final.step.is_monotonic_increasing and final.step.is_unique
    assert list(final.columns) == list(every.columns) and final.dtypes.equals(every.dtypes)
    rbf = st.rbf("r", lineage="final")
    assert list(zip(rbf.incarnation, rbf.step, strict=True)) == got


def test_lineage_is_checked(st):
    with pytest.raises(ValueError, match="lineage must be 'all' or 'final'"):
        st.steps("r", lineage="latest")


def test_incarnations_frame(st):
    inc = st.incarnations("r")
    assert list(inc.incarnation) == [1, 2, 3]
    assert list(inc.first_step) == [1, 81, 126]
    assert list(inc.last_step) == [100, 150, 170]
    assert inc.restored_from.isna().tolist() == [True, False, False]
    assert list(inc.restored_from.dropna()) == [80, 120]
    assert list(inc.process_count) == [32, 32, 32]
    assert str(inc.dtypes["started"]) == TS and str(inc.dtypes["saw_start"]) == "bool"
    assert inc.saw_start.all()


def sample_lines(samples, name: str, pattern: str) -> list[tuple]:
    text = (samples / f"{name}.log").read_text()
    return [(m.group(1), *m.groups()[1:]) for m in re.finditer(pattern, text, re.M)]


def test_step_times_equal_the_completed_step_lines(store, samples):
    ingest_sample(store, samples, "rg", "resume-gap")
    lines = sample_lines(samples, "resume-gap",
                         r"^(\S+) .*completed step: (\d+), seconds: ([\d.]+), TFLOP/s/device: ([\d.]+), "
                         r"Tokens/s/device: ([\d.]+), total_weights: (\d+), loss: ([\d.]+)")
    with steptail.open(url_of(store)) as st:
        times = st.step_times("rg")
        final = st.step_times("rg", lineage="final")
        steps_final = st.steps("rg", lineage="final")
    assert {k: str(v) for k, v in times.dtypes.items()} == {
        "incarnation": "int64", "step": "int64", "ts": TS, "seconds": "float64", "tflops_per_device": "float64",
        "tokens_per_s_device": "float64", "total_weights": "float64", "loss": "float64"}
    assert len(times) == len(lines) > 300
    # rows in (incarnation, step) order: the log's order, its incarnations one after the other
    assert [(r.step, r.ts.value, r.seconds, r.tflops_per_device, r.tokens_per_s_device, r.total_weights, r.loss)
            for r in times.itertuples()] == [
        (int(s), parse_rfc3339(ts), float(sec), float(tf), float(tok), float(w), float(loss))
        for ts, s, sec, tf, tok, w, loss in lines]
    # the final lineage of the step times is that of the LOSS-PARTS steps they belong to
    assert set(zip(final.incarnation, final.step, strict=True)) <= set(
        zip(steps_final.incarnation, steps_final.step, strict=True))
    assert final.step.is_unique


def test_config_and_checkpoints_equal_the_log(store, samples):
    ingest_sample(store, samples, "rg", "resume-gap")
    params = sample_lines(samples, "resume-gap", r"^(\S+) .*Config param (\S+): (.*)$")
    saves = sample_lines(samples, "resume-gap", r"^(\S+) .*Saved a checkpoint at step (\d+)\.")
    restores = sample_lines(samples, "resume-gap", r"^(\S+) .*Restoring checkpoint from step (\d+)\.")
    with steptail.open(url_of(store)) as st:
        config = st.config("rg")
        first = st.config("rg", incarnation=1)
        ckpt = st.checkpoints("rg")
        incs = st.incarnations("rg")
    assert {k: str(v) for k, v in config.dtypes.items()} == {"incarnation": "int64", "name": "string",
                                                             "value": "string"}
    assert dict(zip(first.name, first.value, strict=True)) == {
        name: value for _, name, value in params[:len(first)]}
    assert set(config.incarnation) == set(incs.incarnation)
    saved = ckpt[ckpt.kind == "save"]
    assert sorted((int(s), parse_rfc3339(ts)) for ts, s in saves) == sorted(
        zip(saved.step, (t.value for t in saved.ts), strict=True))
    restored = ckpt[ckpt.kind == "restore"]
    assert [int(s) for _, s in restores] == list(restored.step)
    assert list(incs.restored_from.dropna()) == [int(s) for _, s in restores]


def test_accessors_of_an_unknown_run_raise(st):
    for accessor in (st.step_times, st.config, st.checkpoints, st.incarnations):
        with pytest.raises(steptail.api.UnknownRun):
            accessor("nope")
