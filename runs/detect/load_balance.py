"""The runbook's load-balance rule (rule:load_balance, critical): context parallelism above 1
with context_parallel_load_balance on. Seen in the config lines of an incarnation or, live, in
the JobSet's or a pod's trainer args: one finding per cause citing every place; "not
evaluable" (info) when the config lines were never read."""

from __future__ import annotations

from dataclasses import replace

from steptail.runs.detect.base import (
    CP_PARAM,
    LB_PARAM,
    Detector,
    IncView,
    as_int,
    context_parallelism,
    truthy,
)
from steptail.runs.findings import (
    CRITICAL,
    INFO,
    LOAD_BALANCE_RULE,
    NO_INCARNATION,
    NO_STEP,
    Finding,
)
from steptail.runs.gaps import StepGap
from steptail.runs.rule_text import cite, citing, load_balance_text


class LoadBalanceRule(Detector):
    def config(self, inc: IncView, name: str, value: str) -> None:
        cp, lb = as_int(inc.config.get(CP_PARAM)), inc.config.get(LB_PARAM)
        if inc.lb_checked or cp is None or lb is None:
            return
        inc.lb_checked = True
        if inc.first_read is not None:  # "not evaluable" at its unread head: it now is
            self.engine.findings.pop((self.engine.run, LOAD_BALANCE_RULE, inc.number, inc.first_read), None)
        if cp > 1 and truthy(lb):
            self._evidence(inc.number, load_balance_text(cp, lb), f"the config lines of incarnation {inc.number}",
                           CRITICAL)

    def unread_head(self, inc: IncView, gap: StepGap, step: int, head: str) -> None:
        """Not when an earlier incarnation's start-up (where the config is printed) was read,
        nor when the config read rules it out (no context parallelism)."""
        cp = context_parallelism(self.engine, inc)
        unread = [p for p in (CP_PARAM, LB_PARAM) if p not in inc.config]
        read_before = any(i.lb_checked or i.saw_start for i in self.engine.incarnations().values() if i is not inc)
        if unread and (cp is None or cp > 1) and not read_before:
            # keyed at the first step read, not NO_STEP: the rule's own finding, should the config
            # still come, is another one (and alerted). Info: absent input is never a breach.
            inc.first_read = step
            known = f"{CP_PARAM}={cp}" if cp is not None else f"{CP_PARAM} unknown"
            self.engine.emit(LOAD_BALANCE_RULE, inc.number, step, step,
                             f"not evaluable: the config lines of {' and '.join(unread)} missing ({head}; "
                             f"{known})", INFO)

    def cluster(self, f: Finding) -> bool:
        """The rule seen in the JobSet's args joins the one seen in the config lines."""
        if f.kind != LOAD_BALANCE_RULE or f.first_step != NO_STEP:
            return False
        text, seen = citing(f.detail)
        for where in seen or ["the JobSet"]:
            self._evidence(f.incarnation, text, where, f.severity, f.detected_ns)
        return True

    def remember(self, stored: list[Finding]) -> None:
        """The evidence the log cannot give again (the JobSet's args, seen live) stays cited,
        and a check that only reads the config lines changes nothing."""
        for f in stored:
            if f.kind == LOAD_BALANCE_RULE and f.first_step == NO_STEP:
                self.engine.findings.setdefault(f.key, replace(f, extra={}))

    def _evidence(self, number: int, text: str, where: str, severity: str, now_ns: int | None = None) -> None:
        """The rule seen in one more place: it joins the finding of this incarnation, or the one
        of the JobSet as submitted (incarnation 0, before its pods ran); a not-evaluable one
        (info) gives way to a verdict."""
        e = self.engine
        cands = [f for f in e.findings.values() if f.kind == LOAD_BALANCE_RULE and f.first_step == NO_STEP
                 and (f.incarnation in (number, NO_INCARNATION) or number == NO_INCARNATION)]
        if not cands:
            e.emit(LOAD_BALANCE_RULE, number, NO_STEP, NO_STEP, cite(text, [where]), severity, now_ns)
            return
        f = min(cands, key=lambda c: (c.incarnation != number, c.incarnation))
        old_text, seen = citing(f.detail)
        if severity == INFO:
            return  # not evaluable from here: what was found stands
        if f.severity == INFO:  # evaluated now: the verdict replaces "not evaluable"
            f.severity, detail = severity, cite(text, [where])
        elif where in seen:
            return
        else:
            detail = cite(old_text, [*seen, where])
        if detail != f.detail:
            f.detail = detail
            e.changed(f)
