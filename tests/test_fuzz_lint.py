"""`lint` fuzzed with hypothesis (issue 34): generated YAML documents, anchors and aliases
included (recursive ones too), typed scalars and explicit tags, spliced into a JobSet where the
rules read (labels, args, replicas, an unknown field), and free byte strings. Every case ends as
checked results or one ManifestError line: never another exception, and never more than
safe_yaml's node bound built. A few byte strings go through the real command, capped in memory
and time. Sized to cost seconds (deadline off: timing is not the property)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from steptail.commands.lint import default_policy_text
from steptail.runs import manifest, safe_yaml
from steptail.runs.runbook import evaluate, load_policy

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
STEPTAIL = str(Path(sys.executable).with_name("steptail"))
MEMORY_CAP = 1 << 30
POLICY = None

BASE = """\
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: fuzz
  labels:
    kueue.x-k8s.io/queue-name: post-training
    x: @LABEL@
extra: @EXTRA@
spec:
  replicatedJobs:
    - name: slice
      replicas: @REPLICAS@
      template:
        spec:
          parallelism: 4
          template:
            spec:
              nodeSelector: {cloud.google.com/gke-tpu-topology: 2x2x4}
              containers:
                - name: jax-tpu
                  image: maxtext-posttrain:x
                  args: [sft.yml, @ARG@]
                  resources: {limits: {google.com/tpu: 4}}
"""

SCALARS = ["a", "''", '"q\\u202e\\x1b[31m"', "2026-01-01", "2026-01-01T00:00:00Z", "null", "~", "yes", "no",
           "on", "0x1f", "0o17", "1e999", "-.inf", ".nan", "!!binary aGk=", "!!str 5", "!!float 1", "!foo bar",
           "=", "1_000", "12:30:00", "!!timestamp x", "-1", "3"]
REFUSED = ["99999999999999999999", "!!int x", "!!bool maybe"]  # rarer: each refuses the whole file


@st.composite
def flow_node(draw, depth: int = 0, anchors: tuple = ()) -> str:
    """A YAML flow node: scalars, [lists], {maps}, with &anchors and *aliases (any name, so
    aliases to open anchors - recursion - and to no anchor come up)."""
    names = ["a", "b", "c"]
    anchor = f"&{draw(st.sampled_from(names))} " if draw(st.integers(0, 3)) == 0 else ""
    choice = draw(st.integers(0, 11 if depth < 4 else 6))
    if choice <= 5:
        return anchor + draw(st.sampled_from(REFUSED if draw(st.integers(0, 30)) == 0 else SCALARS))
    if choice == 6:
        return f"*{draw(st.sampled_from(names))}"
    items = draw(st.lists(flow_node(depth + 1), max_size=5))
    if choice <= 8:
        return anchor + "[" + ", ".join(items) + "]"
    keys = draw(st.lists(st.sampled_from([*SCALARS, "<<", "[k]"]), min_size=len(items), max_size=len(items)))
    return anchor + "{" + ", ".join(f"{k}: {v}" for k, v in zip(keys, items, strict=True)) + "}"


def bomb(levels: int) -> str:
    return "{" + ", ".join(f"l{i}: &w{i} [{', '.join([f'*w{i - 1}'] * 9) if i else 'x'}]"
                           for i in range(levels)) + "}"


def policy():
    global POLICY
    if POLICY is None:
        POLICY = load_policy([("runbook.yaml", default_policy_text())])
    return POLICY


def lint_in_process(text: str) -> None:
    """What `steptail lint` does with the text, in this process: results or one ManifestError."""
    try:
        docs, _ = manifest.split_manifest(text, "fuzz.yaml")
    except manifest.ManifestError as exc:
        assert "\n" not in str(exc), str(exc)
        return
    for doc in docs:
        json.dumps(doc.body, allow_nan=False)  # plain data, finite, not cyclic
        assert _nodes(doc.body) <= safe_yaml.MAX_NODES
        evaluate(policy(), doc.body)


def _nodes(value) -> int:
    stack, n = [value], 0
    while stack:
        v = stack.pop()
        n += 1
        stack.extend(v.values() if isinstance(v, dict) else v if isinstance(v, list) else ())
    return n


@FUZZ
@given(label=flow_node(), extra=flow_node(), replicas=st.just("2") | flow_node(), arg=flow_node(),
       prefix=flow_node())
def test_generated_yaml_in_a_jobset_is_results_or_one_line(label, extra, replicas, arg, prefix):
    text = (BASE.replace("@LABEL@", label).replace("@EXTRA@", extra).replace("@REPLICAS@", replicas)
            .replace("@ARG@", arg))
    lint_in_process(text)
    lint_in_process(f"pre: {prefix}\n---\n" + text)


@FUZZ
@given(st.integers(1, 12), st.sampled_from(["@EXTRA@", "@LABEL@", "@ARG@"]))
def test_alias_bombs_of_any_size_anywhere_are_bounded(levels, where):
    text = BASE.replace(where, bomb(levels))
    for key in ("@LABEL@", "@EXTRA@", "@REPLICAS@", "@ARG@"):
        text = text.replace(key, "1")
    lint_in_process(text)


@FUZZ
@given(st.binary(max_size=2000) | st.text(max_size=500).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_byte_strings_are_results_or_one_line(data):
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return  # lint refuses it before YAML (tested on the command below)
    lint_in_process(text)


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=3000))
def test_byte_strings_on_the_command(data):
    env = {k: v for k, v in os.environ.items() if k != "STEPTAIL_DB"}
    proc = subprocess.run([STEPTAIL, "lint", "-"], input=data, capture_output=True, env=env, timeout=60,
                          preexec_fn=_capped)
    assert proc.returncode in (0, 1, 2), proc.stderr
    assert b"Traceback" not in proc.stderr, proc.stderr
    if proc.returncode == 2:
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
