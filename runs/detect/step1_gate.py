"""step1_ce_gate: step 1's CE against the HF reference (critical beyond --gate-tolerance); a
warning when it cannot run — no reference with context parallelism on, or step 1 never read."""

from __future__ import annotations

from dataclasses import dataclass

from steptail.runs.detect.base import CP_PARAM, Detector, IncView, context_parallelism, fmt_ce
from steptail.runs.evaluable import mark as mark_not_evaluable
from steptail.runs.findings import CRITICAL, STEP1_CE_GATE, WARNING, knob
from steptail.runs.gaps import StepGap


@dataclass
class GateSettings:
    gate_tolerance: float = knob(1e-3, "--gate-tolerance", "Step-1 CE gate: largest allowed |ce - reference|.")


class Step1Gate(Detector):
    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.seen = False  # step 1 was recorded

    def step_one(self, inc: IncView, ce: float | None, raw: str) -> None:
        self.seen = True
        e = self.engine
        cp = context_parallelism(e, inc)
        ref = e.reference_ce.get(1)
        tolerance = e.settings.gate_tolerance
        if ref is not None:
            if ce is not None and abs(ce - ref) <= tolerance:
                return
            diff = f"by {ce - ref:+.6f}" if ce is not None else "(not finite)"
            e.emit(STEP1_CE_GATE, inc.number, 1, 1,
                   f"step-1 ce {fmt_ce(ce, raw)} differs from the HF reference {ref:.6f} {diff} "
                   f"(tolerance {tolerance:g}; {CP_PARAM}={cp})", CRITICAL)
        elif cp is not None and cp > 1:
            mark_not_evaluable(e.emit(  # never replaces a stored gate evaluated with a reference
                STEP1_CE_GATE, inc.number, 1, 1,
                f"step-1 CE gate cannot run: no HF reference CE for step 1 ({CP_PARAM}={cp}, "
                f"step-1 ce {fmt_ce(ce, raw)}); give one with --reference-ce VALUE or FILE",
                WARNING,
            ))

    def unread_head(self, inc: IncView, gap: StepGap, step: int, head: str) -> None:
        """Not when the config read rules it out (no context parallelism and no reference)."""
        cp = context_parallelism(self.engine, inc)
        if gap.first_step == 1 and not self.seen and (1 in self.engine.reference_ce or cp is None or cp > 1):
            known = f"{CP_PARAM}={cp}" if cp is not None else f"{CP_PARAM} unknown"
            self.engine.emit(STEP1_CE_GATE, inc.number, 1, 1,
                             f"step-1 CE gate could not run: step 1 was never read ({head}; {known})", WARNING)

    def finish(self) -> None:
        e = self.engine
        needed = 1 in e.reference_ce or (e.cp is not None and e.cp > 1)
        incs = e.incarnations()
        if needed and not self.seen and incs:
            e.emit(STEP1_CE_GATE, min(incs), 1, 1,
                   f"step-1 CE gate could not run: step 1 was never recorded ({CP_PARAM}={e.cp})", WARNING)
