"""The cluster's runbook rules as data: a policy (YAML text: settings and CEL rules), compiled
once, evaluated over a JobSet (its manifest before submission, or the live object and its pods).

Pure: the caller reads the files (`steptail lint`: the packaged runbook.yaml and --policy) and
passes text and parsed dicts; nothing here touches a file, the network or a database.

    policy = load_policy([("runbook.yaml", default_text), ("mine.yaml", user_text)])
    findings = evaluate(policy, jobset, pods=None, facts={"control": {...}})

A rule is true when the JobSet keeps it (like a ValidatingAdmissionPolicy validation) and has a
scope: `jobset` (once), `pod` (each pod template, and each live pod given), `process0` (process
0's template, and the live process-0 pod given) or `volume` (each gcsfuse volume of each of
those). Format and variables: docs/runbook-rules.md."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import yaml

from steptail.runs import manifest
from steptail.runs.cel_engine import cel
from steptail.runs.findings import CRITICAL, INFO, WARNING

SEVERITIES = (WARNING, CRITICAL)  # a rule's own: a broken rule asks for a change
# A finding's: also INFO, a rule that is not evaluable for want of its input (`requires`).
FINDING_SEVERITIES = (CRITICAL, WARNING, INFO)
SCOPES = ("jobset", "pod", "process0", "volume")
# The CEL variables each scope's expressions may read.
VARIABLES = {
    "jobset": ("object", "jobset", "settings", "facts"),
    "pod": ("pod", "jobset", "settings", "facts"),
    "process0": ("pod", "jobset", "settings", "facts"),
    "volume": ("volume", "pod", "jobset", "settings", "facts"),
}
RULE_KEYS = {"name", "scope", "severity", "message", "messageExpression", "expression", "path",
             "enabled", "description", "requires", "live"}
REQUIRE_KEYS = {"field", "expression"}
REQUIRED = ("severity", "message", "expression")
TOP_KEYS = {"settings", "rules", "defaults"}
DEFAULTS_MODES = ("merge", "replace")
# CEL's standard functions (the macros has/all/exists/exists_one/map/filter are not calls).
FUNCTIONS = frozenset({
    "size", "contains", "startsWith", "endsWith", "matches", "int", "uint", "double", "string",
    "bytes", "type", "dyn", "duration", "timestamp", "getFullYear", "getMonth", "getDate",
    "getDayOfMonth", "getDayOfYear", "getDayOfWeek", "getHours", "getMinutes", "getSeconds",
    "getMilliseconds",
})
_NAME = re.compile(r"[a-z][a-z0-9_]*")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ITER_VAR = re.compile(r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(\s*([A-Za-z_]\w*)\s*,(?:\s*([A-Za-z_]\w*)\s*,)?")
_CEL_ERROR = re.compile(r"ERROR: <input>:(\d+):(\d+): ([^\n]*)")


class PolicyError(ValueError):
    """A policy that cannot be used: one line naming the file and the rule."""


@dataclass(frozen=True)
class Rule:
    name: str
    scope: str
    severity: str
    message: str
    expression: str
    source: str  # the file that last set it
    path: str = ""  # where in the object it points: "{pod}", "{trainer}", "{volume}" expand
    message_expression: str = ""
    description: str = ""
    program: object = field(default=None, compare=False, repr=False)
    message_program: object = field(default=None, compare=False, repr=False)
    # (field, compiled CEL) the rule needs: when one is false the rule is not evaluable (info)
    requires: tuple = field(default=(), compare=False, repr=False)
    live: bool = True  # false: checked before submission only (`lint`), not on a running JobSet


@dataclass(frozen=True)
class Policy:
    rules: tuple[Rule, ...]
    settings: dict
    sources: tuple[str, ...]

    def rule(self, name: str) -> Rule:
        return next(r for r in self.rules if r.name == name)


@dataclass(frozen=True)
class RuleFinding:
    """One broken rule at one place: what `lint` prints and what `follow` will raise."""

    rule: str
    severity: str
    message: str
    path: str  # in the JobSet (spec.replicatedJobs[0]…) or a live pod (pods/NAME.spec…)
    jobset: str
    namespace: str = ""
    error: bool = False  # the rule could not be evaluated here (the message says why)

    @property
    def evaluable(self) -> bool:
        """False for "not evaluable: … missing" (severity info): its input is absent."""
        return self.severity != INFO

    def to_dict(self) -> dict:
        return {"rule": self.rule, "severity": self.severity, "jobset": self.jobset,
                "namespace": self.namespace, "path": self.path, "message": self.message,
                "error": self.error, "evaluable": self.evaluable}


# -- loading ---------------------------------------------------------------------------------


def parse_policy(text: str, source: str) -> dict:
    """One policy file's YAML, its keys checked (not yet merged nor compiled)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise PolicyError(f"{source}: not YAML{where}: {problem}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise PolicyError(f"{source}: a policy is a mapping with `settings` and `rules`, not a {type(doc).__name__}")
    unknown = sorted(map(str, set(doc) - TOP_KEYS))
    if unknown:
        raise PolicyError(f"{source}: unknown key {unknown[0]!r} (a policy has {', '.join(sorted(TOP_KEYS))})")
    if doc.get("defaults", "merge") not in DEFAULTS_MODES:
        raise PolicyError(f"{source}: `defaults` is merge or replace, not {doc['defaults']!r}")
    if not isinstance(doc.get("settings") or {}, dict):
        raise PolicyError(f"{source}: `settings` must be a mapping")
    rules = doc.get("rules") or []
    if not isinstance(rules, list):
        raise PolicyError(f"{source}: `rules` must be a list")
    seen = set()
    for i, r in enumerate(rules):
        if not isinstance(r, dict):
            raise PolicyError(f"{source}: rule {i + 1}: a rule is a mapping, not a {type(r).__name__}")
        name = r.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise PolicyError(f"{source}: rule {i + 1}: `name` must be lower_snake_case, got {name!r}")
        if name in seen:
            raise PolicyError(f"{source}: rule {name!r}: defined twice")
        seen.add(name)
        bad = sorted(map(str, set(r) - RULE_KEYS))
        if bad:
            raise PolicyError(f"{source}: rule {name!r}: unknown key {bad[0]!r} "
                              f"(a rule has {', '.join(sorted(RULE_KEYS))})")
    return doc


def _merge_settings(base: dict, over: dict) -> dict:
    """Mappings merge key by key; anything else (lists too) is replaced."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge_settings(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def merge(layers: list[tuple[str, dict]]) -> tuple[dict, list[tuple[dict, str]]]:
    """Settings and rules of the files in order: each one's settings merged over the ones
    before, its rules replacing the fields they name of a rule of the same name (or added);
    `defaults: replace` starts again from nothing."""
    settings: dict = {}
    rules: dict[str, tuple[dict, str]] = {}
    for source, doc in layers:
        if doc.get("defaults") == "replace":
            settings, rules = {}, {}
        settings = _merge_settings(settings, doc.get("settings") or {})
        for r in doc.get("rules") or []:
            old = rules.get(r["name"], ({}, source))[0]
            rules[r["name"]] = ({**old, **r}, source)
    return settings, list(rules.values())


def load_policy(files: list[tuple[str, str]]) -> Policy:
    """(source, text) of each policy file, the defaults first; compiled, or PolicyError."""
    settings, raw_rules = merge([(source, parse_policy(text, source)) for source, text in files])
    rules = []
    for r, source in raw_rules:
        if r.get("enabled", True) is False:
            continue
        rules.append(compile_rule(r, source))
    return Policy(tuple(rules), settings, tuple(s for s, _ in files))


def compile_rule(r: dict, source: str) -> Rule:
    name = r["name"]

    def bad(what: str) -> PolicyError:
        return PolicyError(f"{source}: rule {name!r}: {what}")

    for key in REQUIRED:
        if key not in r:
            raise bad(f"no `{key}`")
    if r["severity"] not in SEVERITIES:
        raise bad(f"severity must be {' or '.join(SEVERITIES)}, not {r['severity']!r}")
    scope = r.get("scope", "jobset")
    if scope not in SCOPES:
        raise bad(f"scope must be one of {', '.join(SCOPES)}, not {scope!r}")
    for key in ("enabled", "live"):
        if not isinstance(r.get(key, True), bool):
            raise bad(f"`{key}` must be true or false")
    for key in ("message", "expression", "messageExpression", "path", "description"):
        if key in r and not isinstance(r[key], str):
            raise bad(f"`{key}` must be a string")
    if not r["expression"].strip():
        raise bad("`expression` is empty")
    path = r.get("path", "")
    try:
        path.format_map(_Paths())
    except (KeyError, ValueError, IndexError, AttributeError) as exc:
        raise bad(f"`path` {path!r}: {exc} (placeholders: {{pod}}, {{trainer}}, {{volume}})") from None
    program = _compile(r["expression"], scope, bad, "expression")
    message_program = None
    if r.get("messageExpression", "").strip():
        message_program = _compile(r["messageExpression"], scope, bad, "messageExpression")
    requires = tuple((field_, _compile(expr, scope, bad, f"requires[{i}].expression"))
                     for i, (field_, expr) in enumerate(_requirements(r.get("requires"), bad)))
    return Rule(name, scope, r["severity"], " ".join(r["message"].split()), r["expression"], source,
                path, r.get("messageExpression", ""), r.get("description", ""), program, message_program,
                requires, r.get("live", True))


def _requirements(raw, bad) -> list[tuple[str, str]]:
    """`requires`: a list of {field: what the input is called, expression: CEL, true when the
    input is there}."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise bad("`requires` must be a list of {field, expression}")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or set(item) != REQUIRE_KEYS:
            raise bad(f"requires[{i}] must be a mapping with exactly `field` and `expression`")
        if not all(isinstance(item[k], str) and item[k].strip() for k in REQUIRE_KEYS):
            raise bad(f"requires[{i}]: `field` and `expression` must be non-empty strings")
        out.append((" ".join(item["field"].split()), item["expression"]))
    return out


class _Paths(dict):
    """Checks a rule's path template: only the known placeholders."""

    def __missing__(self, key):
        if key in ("pod", "trainer", "volume"):
            return ""
        raise KeyError(f"unknown placeholder {{{key}}}")


def _compile(expression: str, scope: str, bad, what: str):
    try:
        program = cel.compile(expression)
    except (ValueError, RuntimeError, TypeError) as exc:
        raise bad(f"{what} does not compile: {cel_error(str(exc))}") from None
    refs = program.references()
    iter_vars = {v for m in _ITER_VAR.finditer(expression) for v in m.groups() if v}
    allowed = VARIABLES[scope]
    for var in refs.get("variables", []):
        if var not in allowed and var not in iter_vars:
            raise bad(f"{what}: unknown variable {var!r} (scope {scope} has {', '.join(allowed)})")
    for fn in refs.get("functions", []):
        if _IDENT.fullmatch(fn) and fn not in FUNCTIONS:
            raise bad(f"{what}: unknown function {fn!r}")
    return program


def cel_error(text: str) -> str:
    """The CEL library's multi-line parse error as one line: where, and what."""
    m = _CEL_ERROR.search(text)
    if m:
        return f"line {m[1]}, column {m[2]}: {m[3].strip()}"  # both from 1
    lines = [s.strip() for s in text.splitlines() if s.strip()]
    return lines[0] if lines else "unknown error"


# -- evaluating ------------------------------------------------------------------------------


@dataclass
class _Target:
    scope: str
    paths: dict
    variables: dict
    context: object = None

    def ctx(self):
        if self.context is None:  # converted to CEL once, shared by every rule of the scope
            self.context = cel.Context(variables=self.variables)
        return self.context


def _targets(policy: Policy, jobset: dict, pods: list[dict] | None, facts: dict | None) -> dict[str, list[_Target]]:
    trainer_name = str(policy.settings.get("trainer_container") or "")
    templates = manifest.templates(jobset, trainer_name)
    live = [manifest.live_pod(p, templates, trainer_name) for p in pods or [] if isinstance(p, dict)]
    view = manifest.jobset_view(jobset, templates)
    common = {"jobset": view, "settings": policy.settings, "facts": facts or {}}
    wanted = {r.scope for r in policy.rules}
    out: dict[str, list[_Target]] = {s: [] for s in SCOPES}
    if "jobset" in wanted:
        out["jobset"].append(_Target("jobset", {"pod": "", "trainer": "", "volume": ""},
                                     {**common, "object": jobset}))
    for p in [*templates, *live]:
        paths = {"pod": p["path"], "trainer": p["trainer"]["path"], "volume": ""}
        target = _Target("pod", paths, {**common, "pod": p})
        if "pod" in wanted:
            out["pod"].append(target)
        if p["process0"] and "process0" in wanted:
            out["process0"].append(target)  # one CEL context for both scopes
        if "volume" in wanted:
            for v in p["volumes"]:
                out["volume"].append(_Target("volume", {**paths, "volume": v["path"]},
                                             {**common, "pod": p, "volume": v}))
    return out


def evaluate(policy: Policy, jobset: dict, pods: list[dict] | None = None,
             facts: dict | None = None, *, live: bool = False) -> list[RuleFinding]:
    """The rules `jobset` breaks, and those not evaluable for want of their input (severity
    info). `pods`: its live pods, when known (`follow`): pod-scope rules run on each of them
    too (Kueue and webhooks change a template on admission). `facts`: what the JobSet alone
    cannot tell, e.g. {"control": {"run", "topology", "hosts"}}. `live`: the JobSet is running
    (`follow`): rules checked before submission only (`live: false`, the slice's shape: a
    running JobSet was scheduled) are skipped."""
    meta = jobset.get("metadata") or {}
    name, namespace = str(meta.get("name") or ""), str(meta.get("namespace") or "")
    findings = []
    targets = _targets(policy, jobset, pods, facts)
    for rule in policy.rules:
        if live and not rule.live:
            continue
        for t in targets[rule.scope]:
            ctx = t.ctx()
            path = rule.path.format_map(t.paths) if rule.path else (t.paths["volume"] or t.paths["pod"])
            missing = _missing(rule, ctx)
            if missing is not None:
                findings.append(RuleFinding(rule.name, INFO, f"not evaluable: {missing} missing",
                                            path, name, namespace))
                continue
            try:
                kept = rule.program.execute(ctx)
            except Exception as exc:  # any CEL runtime error is the rule's, not ours
                findings.append(RuleFinding(rule.name, rule.severity, f"cannot evaluate: {_runtime(exc)}",
                                            path, name, namespace, error=True))
                continue
            if kept is True:
                continue
            if kept is not False:
                findings.append(RuleFinding(rule.name, rule.severity,
                                            f"cannot evaluate: the expression gave {kept!r}, not true or false",
                                            path, name, namespace, error=True))
                continue
            findings.append(RuleFinding(rule.name, rule.severity, _message(rule, ctx), path, name, namespace))
    return findings


def _missing(rule: Rule, ctx) -> str | None:
    """The first input the rule requires that is absent (a requirement that cannot be
    evaluated counts as absent: never a breach for want of data)."""
    for field_, program in rule.requires:
        try:
            present = program.execute(ctx)
        except Exception:  # noqa: BLE001 - e.g. a key the object lacks: the input is not there
            present = False
        if present is not True:
            return field_
    return None


def render_message(policy: Policy, rule_name: str, variables: dict) -> str:
    """A rule's message over the given variables (a detector that saw the rule broken
    elsewhere than in a JobSet: runs/rule_text.py)."""
    return _message(policy.rule(rule_name), cel.Context(variables=variables))


def _message(rule: Rule, ctx) -> str:
    if rule.message_program is not None:
        try:
            text = rule.message_program.execute(ctx)
        except Exception:  # as Kubernetes does: fall back to the message
            text = None
        if isinstance(text, str) and text.strip():
            return " ".join(text.split())
    return rule.message


def _runtime(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    if isinstance(exc, KeyError):
        return f"no such key {text[0] if text else ''}"
    return text[0] if text else type(exc).__name__
