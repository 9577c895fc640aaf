"""Detectors as plug-ins (runs/detect): a rule is a module the engine asks in turn; a new one
needs no change to the engine, on the per-row path and the bulk (steady) path alike."""

from __future__ import annotations

from findings_logs import LogBuilder, feed_engine

from steptail.runs.detect import DETECTORS, Detector
from steptail.runs.findings import KINDS, WARNING


class OddWarmup(Detector):
    """A toy rule: a `warmup_steps` config value that is odd, and each incarnation's first step
    above 10 (to see the hooks' order and inputs)."""

    def config(self, inc, name, value):
        if name == "warmup_steps" and int(value) % 2:
            self.engine.emit("odd_warmup", inc.number, -1, -1, f"warmup_steps {value} is odd", WARNING)

    def first_step(self, inc, step):
        if step > 10:
            self.engine.emit("late_first", inc.number, step, step, f"first step {step}", WARNING)

    def finish(self):
        self.engine.emit("finished", 0, -1, -1, f"{len(self.engine.incarnations())} incarnations", WARNING)


def _log() -> list[bytes]:
    b = LogBuilder(step_seconds=1.0).start(warmup_steps=7)
    for s in range(1, 201):  # long enough for the steady path to take most of it
        b.step(s, 2.0 - s / 1000)
    b.start(restore=150, warmup_steps=8)
    for s in range(151, 181):
        b.step(s, 2.0 - s / 1000)
    return b.lines


def test_a_new_rule_is_one_module_the_engine_asks_on_every_path():
    for every in (1, 10_000):  # a line at a time, and one batch (the bulk path)
        engine, _ = feed_engine("p", _log(), every=every, detectors=(*DETECTORS, OddWarmup))
        mine = sorted((f.kind, f.incarnation, f.first_step, f.detail) for f in engine.findings.values()
                      if f.kind not in KINDS)
        assert mine == [("finished", 0, -1, "2 incarnations"), ("late_first", 2, 151, "first step 151"),
                        ("odd_warmup", 1, -1, "warmup_steps 7 is odd")]


def test_the_built_in_rules_are_plug_ins_too():
    """Without them the engine still finds the gaps between steps, and no rule."""
    lines = LogBuilder(step_seconds=1.0).start(ici_context_parallelism=4, context_parallel_load_balance="true")
    for s in (1, 2, 3, 5):
        lines.step(s, 2.0)
    with_all, _ = feed_engine("b", lines.lines)
    bare, _ = feed_engine("b", lines.lines, detectors=())
    assert {f.kind for f in with_all.findings.values()} == {"gap", "rule:load_balance", "step1_ce_gate"}
    assert {f.kind for f in bare.findings.values()} == {"gap"}
