"""`steptail lint JOBSET.yaml`: the runbook's rules checked from a JobSet manifest, before it
is submitted. Offline: reads files only (and the store, for --control).

Exit 0 when every JobSet keeps every rule it can be checked on (a rule "not evaluable" for want
of its input is info), 1 when a rule is broken (warning or critical), 2 on error."""

from __future__ import annotations

import sys
from importlib.resources import files
from pathlib import Path

import click

from steptail.commands._common import count, db_option, fail
from steptail.output import Column, Output, output_option
from steptail.runs import manifest
from steptail.runs.findings import CRITICAL, INFO, actionable
from steptail.runs.names import printed
from steptail.runs.runbook import Policy, PolicyError, RuleFinding, evaluate, load_policy

DEFAULT_POLICY = "runbook.yaml"  # package data of steptail.runs


def default_policy_text() -> str:
    return files("steptail.runs").joinpath(DEFAULT_POLICY).read_text(encoding="utf-8")


MAX_INPUT_BYTES = 16 << 20  # a JobSet is a few KB; a List of a whole namespace's, a few MB


def read_text(path: str, what: str) -> str:
    """The file (or stdin) as text, read no further than MAX_INPUT_BYTES: CI feeds lint
    untrusted input, so memory is bounded before YAML sees it."""
    try:
        if path == "-":
            data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        else:
            with Path(path).open("rb") as fh:
                data = fh.read(MAX_INPUT_BYTES + 1)
        if len(data) > MAX_INPUT_BYTES:
            fail(f"cannot read {what} {printed(path)}: larger than {MAX_INPUT_BYTES >> 20} MiB")
        return data.decode("utf-8")
    except UnicodeDecodeError:
        fail(f"cannot read {what} {printed(path)}: not UTF-8 text")
    except OSError as exc:
        fail(f"cannot read {what} {printed(path)}: {exc.strerror or exc}")


def policy_from(policy_file: str | None) -> Policy:
    layers = [(f"steptail.runs/{DEFAULT_POLICY} (defaults)", default_policy_text())]
    if policy_file is not None:
        layers.append((policy_file, read_text(policy_file, "policy file")))
    try:
        return load_policy(layers)
    except PolicyError as exc:
        fail(f"bad policy: {exc}")


def jobsets_in(path: str) -> tuple[list[manifest.Document], list[str]]:
    source = "<stdin>" if path == "-" else path
    try:
        jobsets, notes = manifest.split_manifest(read_text(path, "manifest"), source)
    except manifest.ManifestError as exc:
        fail(f"bad manifest: {exc}")
    if not jobsets:
        fail(f"no JobSet in {source}" + (f" ({count(len(notes), 'other object')} ignored)" if notes else ""))
    return jobsets, notes


def control_facts(run: str | None, control_manifest: str | None, db: str | None) -> dict | None:
    """The control's slice shape: topology and host count from --control-manifest, the host
    count from the store (process_count) and the topology follow recorded, for --control RUN."""
    if run is None and control_manifest is None:
        return None
    control = {"run": run or "", "topology": "", "hosts": 0, "from": []}
    if control_manifest is not None:
        docs, _ = jobsets_in(control_manifest)
        if len(docs) > 1:
            fail(f"--control-manifest {control_manifest} holds {len(docs)} JobSets; give the control's alone")
        shape = manifest.shape(manifest.templates(docs[0].body))
        control.update(topology=shape["topology"], hosts=shape["hosts"], run=run or docs[0].name)
        control["from"].append(control_manifest)
    if run is not None:
        hosts, topology = recorded_shape(run, db)
        if hosts is None:
            what = "only --control-manifest's shape is compared" if control_manifest else "nothing is compared"
            _note(f"the store has no process_count for run {run} (no JAX start-up line): {what}")
        else:
            if control["hosts"] and control["hosts"] != hosts:
                _note(f"--control-manifest says {control['hosts']} hosts, run {run} recorded {hosts} processes: "
                      "the recorded count is compared")
            control["hosts"] = hosts
            control["from"].append(f"run {run}")
        if topology:  # recorded by follow off the process-0 pod
            control["topology"] = topology
        elif control_manifest is None:
            _note(f"run {run} has no recorded slice topology (not followed live): only the host count is "
                  "compared (--control-manifest FILE adds the control's topology)")
    return control


def recorded_shape(run: str, db: str | None) -> tuple[int | None, str]:
    """The control's host count (JAX's process_count, else the JobSet's as follow recorded it)
    and its topology (follow reads it off the process-0 pod; "" for runs ingested from files)."""
    import sqlalchemy as sa

    from steptail.commands._common import store_or_exit  # the store only for --control
    from steptail.storage.compare import slice_shape
    from steptail.storage.reads import UnknownRun, known_run

    store = store_or_exit(db, create=False)
    try:
        known_run(store, run)
        with store.engine.connect() as conn:
            counts = {c for c in slice_shape(conn, run) if c is not None}
            recorded = conn.execute(sa.text(
                "SELECT DISTINCT topology, hosts FROM incarnations WHERE run = :run"
                " AND (topology IS NOT NULL OR hosts IS NOT NULL)"), {"run": run}).all()
    except UnknownRun as exc:
        fail(str(exc))
    finally:
        store.dispose()
    if not counts:
        counts = {h for _, h in recorded if h is not None}
    topologies = {t for t, _ in recorded if t}
    if len(counts) > 1:
        fail(f"control {run} ran on several slice shapes (process counts {sorted(counts)})")
    if len(topologies) > 1:
        fail(f"control {run} ran on several slice topologies ({', '.join(sorted(topologies))})")
    return (counts.pop() if counts else None), (topologies.pop() if topologies else "")


def _note(text: str) -> None:
    click.echo(f"steptail: note: {text}", err=True)


EXAMPLES = """
\b
Examples:
  steptail lint olmo3-sft-a.yaml                       # exit 0 clean, 1 flagged, 2 error
  kubectl get jobset olmo3-sft-a -n post-training -o yaml | steptail lint -
  steptail lint arms.yaml --control-manifest base.yaml # several JobSets, one control's shape
  steptail lint olmo3-sft-b.yaml --control olmo3-sft-base --db postgresql://steptail@db/steptail
  steptail lint olmo3-sft-a.yaml --policy our-rules.yaml -o json | jq '.jobsets[].findings'
"""


@click.command(epilog=EXAMPLES)
@click.argument("manifests", nargs=-1, required=True, metavar="JOBSET.yaml...")
@click.option("--policy", "policy_file", metavar="FILE",
              help="Rules and settings merged over the defaults (`defaults: replace` in it drops "
                   "them); format: docs/runbook-rules.md.")
@click.option("--control", metavar="RUN",
              help="The control run: its recorded host count (process_count) must be the JobSet's.")
@click.option("--control-manifest", metavar="FILE",
              help="The control's JobSet manifest: its topology and host count must be the JobSet's.")
@db_option
@output_option()
def command(manifests: tuple[str, ...], policy_file: str | None, control: str | None,
            control_manifest: str | None, db: str | None, output: Output) -> None:
    """Check the JobSets in JOBSET.yaml ('-': stdin; several documents and `kind: List` too,
    other kinds ignored with a note) against the runbook's rules: the Kueue queue, the
    restore-fix image, the slice topology, the load-balance rule, gcsfuse mounts that hold
    checkpoints, the slice's hosts (parallelism = the topology's chips / chips per host), one
    slice shape per experiment (with --control/--control-manifest) and spec.suspend. A rule
    whose input the JobSet lacks is "not evaluable" (info; exit 0 if nothing else). Offline:
    nothing is submitted or read from a cluster."""
    if list(manifests).count("-") > 1 or (control_manifest == "-" and "-" in manifests):
        fail("stdin ('-') can be read once")
    policy = policy_from(policy_file)
    parsed = [(path, *jobsets_in(path)) for path in manifests]  # every file checked before output
    facts = control_facts(control, control_manifest, db)
    notes = [n for _, _, ns in parsed for n in ns]
    for n in notes:
        _note(n)
    results = []
    for path, docs, _ in parsed:
        for doc in docs:
            found = evaluate(policy, doc.body, facts={"control": facts} if facts else None)
            namespace = str((doc.body.get("metadata") or {}).get("namespace") or "")
            results.append({"file": "<stdin>" if path == "-" else path, "document": doc.index + 1,
                            "jobset": doc.name, "namespace": namespace, "clean": not actionable(found),
                            "findings": found})
    total = sum(len(r["findings"]) for r in results)
    broken = any(not r["clean"] for r in results)
    if output.machine:
        records = [_record(r, f) for r in results for f in r["findings"]]
        output.data({
            "policy": list(policy.sources), "rules": [r.name for r in policy.rules],
            "control": facts,
            "jobsets": [{**r, "findings": [f.to_dict() for f in r["findings"]]} for r in results],
            "ignored": notes, "findings": total,
            "critical": sum(f["severity"] == CRITICAL for f in records),
            "not_evaluable": sum(f["severity"] == INFO for f in records),
        }, records)
    else:
        _print(output, results, facts)
    sys.exit(1 if broken else 0)


def _record(result: dict, f: RuleFinding) -> dict:
    return {"file": result["file"], "document": result["document"], **f.to_dict()}


COLUMNS = [
    Column("severity", "severity", style=lambda r: {CRITICAL: "bold red", INFO: "dim"}.get(r["severity"], "yellow")),
    Column("rule", "rule"),
    Column("jobset", "jobset"),
    Column("message", "message"),
    Column("path", "path", wide=True),
    Column("file", lambda r: f"{r['file']}#{r['document']}", wide=True),
]


def _print(output: Output, results: list[dict], facts: dict | None) -> None:
    # names, paths and messages carry the manifest's text: escaped on a terminal (-o json escapes)
    rows = [{k: printed(v) if isinstance(v, str) else v for k, v in _record(r, f).items()}
            for r in results for f in r["findings"]]
    if facts:
        shape = f"{facts['topology'] or '?'} x {facts['hosts'] or '?'} hosts"
        output.line(f"control {facts['run'] or '?'}: {shape} (from {', '.join(facts['from']) or 'nothing'})",
                    markup=False)
    if rows:
        output.table(COLUMNS, rows)
    for r in results:
        if r["clean"]:
            info = len(r["findings"])
            output.line(f"JobSet {printed(r['jobset'])} ({printed(r['file'])}#{r['document']}): clean"
                        + (f" ({count(info, 'rule')} not evaluable)" if info else ""), markup=False)
    critical = sum(r["severity"] == CRITICAL for r in rows)
    info = sum(r["severity"] == INFO for r in rows)
    if rows:
        output.line(f"{count(len(results), 'JobSet')}: {count(len(rows), 'finding')}, {critical} critical"
                    + (f", {info} not evaluable" if info else ""), markup=False)
