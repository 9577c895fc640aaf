"""`steptail reparse RUN --raw DIR`: a run's rows rebuilt from its raw process-0 log."""

from __future__ import annotations

import click

from steptail.commands._common import count, db_option, fail, store_or_exit
from steptail.commands._detect_options import Detection, detector_options
from steptail.commands._progress import progress_bar, wanted
from steptail.output import Column, Output, output_option

COLUMNS = [
    Column("kind", "kind"),
    Column("before", "before"),
    Column("after", "after"),
    Column("added", "added"),
    Column("removed", "removed"),
    Column("changed", "changed"),
]


@click.command()
@click.argument("run")
@click.option("--raw", "raw", required=True, metavar="DIR", type=click.Path(file_okay=False),
              help="The directory `follow --raw DIR` wrote (segments under DIR/<run>/).")
@click.option("--into", metavar="NEW", help="Name of the rebuilt run (default: RUN-reparse; must not exist).")
@click.option("--replace", is_flag=True, help="Rebuild RUN in place: its old rows go and the new ones come in one"
                                               " transaction.")
@click.option("--examples", type=click.IntRange(0, 100), default=3, show_default=True,
              help="Rows shown per kind and change.")
@db_option
@detector_options
@output_option()
def command(run: str, raw: str, into: str | None, replace: bool, examples: int, db: str | None,
            detection: Detection, output: Output) -> None:
    """Rebuild RUN's rows from the raw segments `follow --raw` kept, with the current parsers,
    through the path `ingest` takes (run model, dedupe cursors, detectors): into a new run,
    or in place with --replace. Reports what changed by record kind (rows added, removed,
    changed, with examples). Parquet is not rewritten."""
    from steptail.collector.offline.ingest import IngestError, NoRecords
    from steptail.collector.offline.reparse import reparse
    from steptail.runs.names import RunNameError, check_run_name
    from steptail.storage.reads import UnknownRun

    try:
        for name in (run, into):
            if name:
                check_run_name(name)
    except RunNameError as exc:
        fail(str(exc))
    if into and replace:
        fail("--into and --replace exclude each other")
    settings, reference = detection.resolve(run)
    store = store_or_exit(db, create=False)
    try:
        with progress_bar(f"reparse {run}", wanted(output.machine)) as progress:
            result = reparse(store, run, raw, into=into, replace=replace, settings=settings,
                             reference_ce=reference, examples=examples, progress=progress)
    except NoRecords:
        fail(f"no record line in the raw log of run {run}: nothing written")
    except (IngestError, UnknownRun, RunNameError, OSError) as exc:
        fail(str(exc) if not isinstance(exc, OSError) else f"cannot read the raw log: {exc}")
    finally:
        store.dispose()
    doc = result.document()
    rows = [{"kind": k, **{f: c[f] for f in ("before", "after", "added", "removed", "changed")}}
            for k, c in doc["changes"].items()]
    if output.machine:
        output.data(doc, rows)
        return
    where = f"{run} in place" if replace else f"{run} into {result.into}"
    output.line(f"reparsed {where}: {count(doc['lines'], 'line')} from {count(doc['segments'], 'segment')} of"
                f" {count(doc['streams'], 'stream')}" + (f" ({len(doc['truncated'])} cut-off tails left out)"
                                                if doc["truncated"] else ""))
    output.table(COLUMNS, rows)
    for kind, c in doc["changes"].items():
        for ex in c["examples"]:
            output.line(f"  {kind} {ex['change']}: {_brief(ex)}", markup=False)
    if not doc["changed"]:
        output.line("no row changed")


def _brief(example: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in example.items() if k != "change")
