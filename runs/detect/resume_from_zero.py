"""resume_from_zero (critical): an incarnation starts again at step 1 after the run had gone
further, no checkpoint restored — the steps before were thrown away."""

from __future__ import annotations

from steptail.runs.detect.base import Detector, IncView
from steptail.runs.findings import CRITICAL, RESUME_FROM_ZERO


class ResumeFromZero(Detector):
    def first_step(self, inc: IncView, step: int) -> None:
        e = self.engine
        top = e.max_step
        earlier = [i for i in e.incarnations().values() if i.number < inc.number and i.last_step is not None]
        if not earlier or step > 1 or top is None or top <= 1:
            return
        saved = max((i.saved for i in earlier if i.saved is not None), default=None)
        ckpt = f"; a checkpoint had been saved at step {saved}" if saved is not None else ""
        e.emit(RESUME_FROM_ZERO, inc.number, step, step,
               f"incarnation {inc.number} restarted at step {step} after the run had reached step "
               f"{top}{ckpt} (no checkpoint restored)", CRITICAL)
