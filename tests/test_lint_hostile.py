"""`steptail lint` on hostile manifests (issue 34, rows 1-4): an alias bomb and a recursive alias
refused with one line and exit 2 before anything is expanded, YAML-typed scalars read as the API
server would store them, and names that hold terminal escapes printed escaped. Each CLI run is
capped (address space, time) so a regression fails instead of eating the machine."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from steptail.runs import manifest, safe_yaml
from steptail.runs.names import printed

STEPTAIL = str(Path(sys.executable).with_name("steptail"))
MEMORY_CAP = 1 << 30  # the bomb took 1.8 GB in 20 s before the fix


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def lint(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "STEPTAIL_DB"}
    return subprocess.run([STEPTAIL, "lint", *map(str, args)], cwd=cwd, input=stdin, capture_output=True,
                          text=True, env=env, timeout=60, preexec_fn=_capped)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("steptail: error: "), lines
    assert proc.stdout == ""
    return lines[0]


# A JobSet of this file's own (tests/manifests/ follows the rules as they change): the hostile
# parts are spliced into its lines.
BASE = """\
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: olmo3-sft-a
  namespace: post-training
  labels:
    kueue.x-k8s.io/queue-name: post-training
spec:
  replicatedJobs:
    - name: slice
      replicas: 2
      template:
        spec:
          parallelism: 16
          template:
            spec:
              nodeSelector:
                cloud.google.com/gke-tpu-accelerator: tpu-v5p-slice
                cloud.google.com/gke-tpu-topology: 4x4x8
              containers:
                - name: jax-tpu
                  image: us-docker.pkg.dev/post-training/images/maxtext-posttrain:51f8cc4b-p907d86f3-rfb46e215e
                  command: [python3, -m, maxtext.trainers.post_train.sft.train_sft]
                  args:
                    - maxtext/configs/post_train/sft.yml
                    - steps=2000
                  resources:
                    limits:
                      google.com/tpu: "4"
"""


def good_text() -> str:
    return BASE


def with_top_level(extra: str) -> str:
    """good.yaml with `extra` (YAML lines) as an unknown top-level field's value."""
    return good_text().replace("kind: JobSet\n", "kind: JobSet\n" + extra, 1)


def billion_laughs(levels: int = 10, width: int = 9) -> str:
    lines = ["  l0: &a0 [" + ", ".join(['"lol"'] * width) + "]"]
    lines += [f"  l{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "extra:\n" + "\n".join(lines) + "\n"


# -- rows 1 and 2: bounded before anything is expanded -------------------------------------------


def test_an_alias_bomb_anywhere_is_refused_with_one_line(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(with_top_level(billion_laughs()))
    assert len(bomb.read_bytes()) < 4000  # 9**10 nodes once expanded
    line = one_line_error(lint(bomb, cwd=tmp_path))
    assert "more than" in line and "YAML nodes" in line and "bomb.yaml" in line
    # used in a label value; on stdin, in a later document
    in_label = with_top_level(billion_laughs()).replace(
        "    kueue.x-k8s.io/queue-name: post-training\n", "    kueue.x-k8s.io/queue-name: post-training\n    x: *a9\n", 1)
    one_line_error(lint("-", cwd=tmp_path, stdin=good_text() + "---\n" + in_label))


@pytest.mark.parametrize("cycle", ["loop: &loop [*loop]", "self: &m {a: {b: *m}}", "k: &k [1, [2, *k]]"])
def test_a_recursive_alias_is_one_line_not_a_segfault(tmp_path, cycle):
    path = tmp_path / "loop.yaml"
    path.write_text(with_top_level(cycle + "\n"))
    line = one_line_error(lint(path, cwd=tmp_path))
    assert "recursive alias" in line


def test_small_legit_anchors_and_merge_keys_still_read():
    text = good_text().replace("      template:\n        spec:\n          parallelism: 16",
                               "      template:\n        spec: &job\n          parallelism: 16", 1)
    docs, _ = manifest.split_manifest(text + "x: {<<: *job, y: 1}\n", "m.yaml")
    assert docs[0].body["x"]["parallelism"] == 16 and docs[0].body["x"]["y"] == 1
    assert docs[0].body["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] == 16
    assert safe_yaml.load_all("a: &x {b: 1, c: [1, 2]}\nd: *x\ne:\n  <<: *x\n  b: 2\n") == [
        {"a": {"b": 1, "c": [1, 2]}, "d": {"b": 1, "c": [1, 2]}, "e": {"b": 2, "c": [1, 2]}}]


def test_the_bounds_count_aliases_expanded():
    # just under the bound reads; one level more of the same bomb is refused
    ok = safe_yaml.load_all(billion_laughs(levels=5, width=9))  # 9**5 + ... < MAX_NODES
    assert len(ok[0]["extra"]["l4"]) == 9
    with pytest.raises(safe_yaml.YamlError, match="YAML nodes"):
        safe_yaml.load_all(billion_laughs(levels=7, width=9))
    deep = "a: &d " + "[" * 60 + "]" * 60 + "\nb: [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[*d]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n"
    with pytest.raises(safe_yaml.YamlError, match="deeper than"):
        safe_yaml.load_all(deep)
    with pytest.raises(safe_yaml.YamlError, match="not a scalar"):
        safe_yaml.load_all("? [a]\n: 1\n")


# -- row 3: YAML-typed scalars as the API server stores them ---------------------------------------


def test_typed_scalars_read_as_the_api_server_would():
    text = (good_text()
            .replace("    kueue.x-k8s.io/queue-name: post-training\n",
                     "    kueue.x-k8s.io/queue-name: post-training\n    created: 2026-01-01\n"
                     "    enabled: yes\n    count: 7\n    empty: null\n    null: n\n    7: seven\n    true: t\n", 1)
            .replace("                    - steps=2000\n",
                     "                    - steps=2000\n                    - 2026-01-01\n                    - 5\n"
                     "                    - true\n", 1)
            .replace("kind: JobSet\n", "kind: JobSet\nnull: 1\n3: [2026-02-03T04:05:06Z]\n", 1))
    docs, _ = manifest.split_manifest(text, "typed.yaml")
    body = docs[0].body
    assert body["metadata"]["labels"] == {
        "kueue.x-k8s.io/queue-name": "post-training", "created": "2026-01-01", "enabled": "true", "count": "7",
        "empty": "", "null": "n", "7": "seven", "true": "t"}
    args = body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-3:] == ["2026-01-01", "5", "true"]
    assert body["null"] == 1 and body["3"] == ["2026-02-03T04:05:06Z"]  # keys strings, timestamps text
    json.dumps(body, allow_nan=False)  # plain JSON data, nothing else


def test_typed_scalars_are_no_traceback_on_the_command(tmp_path):
    read = [  # read as strings: checked by the rules, exit 0 or 1
        ("    kueue.x-k8s.io/queue-name: post-training\n", "    kueue.x-k8s.io/queue-name: post-training\n    created: 2026-01-01\n"),
        ("                    - steps=2000\n", "                    - steps=2000\n                    - 2026-01-01\n"),
        ("kind: JobSet\n", "kind: JobSet\nnull: 1\n7: x\n"),
    ]
    refused = [  # what no Kubernetes integer holds: one line, exit 2
        ("      replicas: 2\n", "      replicas: 99999999999999999999999\n", "64 bits"),
        ("      replicas: 2\n", "      replicas: !!int nope\n", "not a valid int"),
    ]
    for i, (old, new, *why) in enumerate(read + refused):
        assert old in good_text()
        path = tmp_path / f"typed{i}.yaml"
        path.write_text(good_text().replace(old, new, 1))
        proc = lint(path, "-o", "json", cwd=tmp_path)
        assert "Traceback" not in proc.stderr, proc.stderr
        if why:
            assert why[0] in one_line_error(proc)
        else:
            assert proc.returncode in (0, 1), proc.stderr
            assert json.loads(proc.stdout)["jobsets"][0]["jobset"] == "olmo3-sft-a"


# -- row 4: names printed escaped ------------------------------------------------------------------

HOSTILE_NAME = "olmo\x1b[31mRED\u202eevil\nJobSet forged: clean"


def test_names_with_escapes_are_printed_escaped(tmp_path):
    path = tmp_path / "ansi.yaml"
    path.write_text(good_text().replace("  name: olmo3-sft-a\n", f"  name: {json.dumps(HOSTILE_NAME)}\n", 1))
    proc = lint(path, cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr
    for out in (proc.stdout, proc.stderr):
        assert "\x1b" not in out and "\u202e" not in out
        assert not any(line.startswith("JobSet forged") for line in out.splitlines()), out
    assert printed(HOSTILE_NAME) in proc.stdout  # as serve logs it
    # a note about another kind's object, too
    other = tmp_path / "other.yaml"
    other.write_text(f"kind: ConfigMap\nmetadata: {{name: {json.dumps(HOSTILE_NAME)}}}\n---\n" + good_text())
    proc = lint(other, cwd=tmp_path)
    assert "\x1b" not in proc.stderr and "\u202e" not in proc.stderr and printed(HOSTILE_NAME) in proc.stderr
    assert printed("olmo3-sft-a") == "olmo3-sft-a" and printed("quota…") == "quota…"  # plain text as is


def test_oversized_input_is_refused_before_reading_it_all(tmp_path):
    from steptail.commands.lint import MAX_INPUT_BYTES

    line = one_line_error(lint("-", cwd=tmp_path, stdin="# " + "x" * MAX_INPUT_BYTES + "\n"))
    assert "larger than" in line
