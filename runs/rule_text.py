"""The runbook rules' own wording where a rule is seen broken outside a JobSet: the load-balance
rule in the config lines a trainer prints (runs/detectors.py). Rendered from the packaged
runbook.yaml's messageExpression, so `lint`, `follow`, `check`, the page, alerts and webhooks
print one text for one cause. And how a finding cites where its cause was seen."""

from __future__ import annotations

import logging
import re
from functools import lru_cache
from importlib.resources import files

from steptail.runs.runbook import Policy, load_policy, render_message

DEFAULT_POLICY = "runbook.yaml"  # package data of steptail.runs
LOAD_BALANCE = "load_balance"
_CITED = re.compile(r"(.*) \(seen in (.*)\)", re.S)
_AND = " and in "
log = logging.getLogger("steptail.runbook")


@lru_cache(maxsize=1)
def default_policy() -> Policy:
    text = files("steptail.runs").joinpath(DEFAULT_POLICY).read_text(encoding="utf-8")
    return load_policy([(f"steptail.runs/{DEFAULT_POLICY}", text)])


def load_balance_text(cp: int, lb: str) -> str:
    """What the load-balance rule says of `ici_context_parallelism=cp` with
    `context_parallel_load_balance=lb`: its messageExpression over those arguments."""
    overrides = {"ici_context_parallelism": str(cp), "context_parallel_load_balance": str(lb)}
    pod = {"trainer": {"overrides": overrides, "image": "", "args": [], "name": "", "path": ""}}
    try:
        return render_message(default_policy(), LOAD_BALANCE, {"pod": pod, "settings": {}, "facts": {}})
    except Exception as exc:  # noqa: BLE001 - the packaged policy is tested; its words never cost a finding
        log.warning("the packaged runbook's load_balance message could not be rendered (%s): its fallback is used",
                    exc)
        return (f"ici_context_parallelism={cp} with context_parallel_load_balance={lb}: the runbook forbids "
                "load balancing with context parallelism; set context_parallel_load_balance=False")


def cite(text: str, seen: list[str]) -> str:
    """`text (seen in A and in B)`: the rule's words, then every place its cause was seen."""
    return f"{text} (seen in {_AND.join(seen)})" if seen else text


def citing(detail: str) -> tuple[str, list[str]]:
    """cite()'s inverse: the text and the places (none when the detail cites nothing)."""
    m = _CITED.fullmatch(detail)
    return (m[1], m[2].split(_AND)) if m else (detail, [])
