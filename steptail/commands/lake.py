"""`steptail lake`: the Iceberg tables a table location holds (storage.lake) brought up to date
from SQL, and the objects under it no snapshot refers to, reported (never deleted).

Also what the commands taking `--parquet` share about it: the option's help, and the check
that tells a table location (a URL) from a local dataset folder, one line and exit 2 when it
is bad (before anything is read or written)."""

from __future__ import annotations

import os
import re

import click

from steptail.commands._common import count, db_option, fail, store_or_exit
from steptail.output import Column, Output, output_option

LOCATION = ("DIR or s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, file:///DIR (an Iceberg table; "
            "the catalog in --db)")
PARQUET_HELP = (f"Also write Parquet: {LOCATION}. A DIR is a local dataset: "
                "DIR/<table>/run=<run>/part-*.parquet.")
# what parse_location reads as a scheme: such a value is a URL, never a folder's name
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def table_location(text: str | None, option: str = "--parquet") -> bool:
    """Whether `text` names a table location (a URL: the lake) rather than a local dataset
    folder. A URL that cannot be one (an unknown scheme, a bad bucket name, half a pair of
    S3 keys in the environment) is one line and exit 2; nothing is read or written."""
    if text is None:
        return False
    if "://" not in text and not (_SCHEME.match(text) and not text.startswith(("./", "/"))):
        return False
    from steptail.storage.object_store import io_properties, parse_location

    try:
        io_properties(parse_location(text), os.environ)
    except ValueError as exc:
        fail(f"{option} {text}: {exc}")
    return True


def open_lake(store, url: str):
    """The Lake at `url` with its catalog in `store`'s database, the catalog opened (one line
    and exit 2 when it cannot be)."""
    from steptail.collector.offline.ingest import check_lake
    from steptail.storage.lake import Lake, LakeError

    try:
        lake = Lake(url, store.catalog_url())
        check_lake(lake)  # opens the catalog: one no command can use fails here
        lake.check_bucket()  # a bucket that is not there: here, not at the first write
    except LakeError as exc:
        store.dispose()
        fail(str(exc))
    return lake


def check_target(db: str | None, url: str) -> None:
    """Before an ingest into the lake at `url`: the store opens, the catalog in it opens and
    its tables are at `url` (else one line and exit 2, nothing written)."""
    store = store_or_exit(db)
    try:
        close(open_lake(store, url))
    finally:
        store.dispose()


def close(lake) -> None:
    """Let go of the connections the lake's catalog holds (a check done, the Lake dropped)."""
    engine = getattr(lake.catalog, "engine", None)
    if engine is not None:
        engine.dispose()


def lake_runs(lake) -> list[str]:
    """Every run some table of the lake holds (the partition of each live data file, from the
    manifests: no data read)."""
    from steptail.storage.lake import TABLES

    runs: set = set()
    for name in TABLES:
        tbl = lake.table(name, create=False)
        if tbl is None:
            continue
        tbl.refresh()
        if tbl.metadata.current_snapshot_id is None:
            continue
        runs.update(task.file.partition[0] for task in tbl.scan().plan_files())
    return sorted(runs)


def store_runs(store) -> list[str]:
    import sqlalchemy as sa

    with store.engine.connect() as conn:
        return [r[0] for r in conn.execute(sa.text("SELECT run FROM runs ORDER BY run"))]


@click.group(name="lake")
def command() -> None:
    """The lake: Iceberg tables at a table location (s3://BUCKET/PREFIX, gs://BUCKET/PREFIX,
    file:///DIR) with their catalog in the store's database (--db).

    Nothing here deletes an object: the bucket rule is "delete nothing" (docs/lake.md)."""


@command.command(name="catch-up")
@click.argument("url", metavar="URL")
@click.argument("run", required=False)
@db_option
@output_option()
def catch_up(url: str, run: str | None, db: str | None, output: Output) -> None:
    """Bring the tables at URL up to date from SQL: every row the store holds for RUN (or for
    every run) whose key a table lacks is appended, exactly once (running it again adds
    nothing); each run's findings, stream gaps and reconnects replace the table's.

    \b
    Example:
      steptail lake catch-up gs://my-bucket/steptail --db postgresql://steptail@db/steptail
      steptail lake catch-up file:///data/lake clean-300
    """
    from steptail.runs.names import RunNameError, check_run_name
    from steptail.storage.catchup import catch_up_lake
    from steptail.storage.lake import LakeError

    if not table_location(url, "URL"):
        fail(f"URL {url}: give s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or file:///DIR")
    if run is not None:
        try:
            check_run_name(run)
        except RunNameError as exc:
            fail(str(exc))
    store = store_or_exit(db, create=False)
    try:
        runs = store_runs(store)
        if run is not None:
            if run not in runs:
                fail(f"no run {run!r} in {store.describe()}")
            runs = [run]
        lake = open_lake(store, url)
        done = []
        for name in runs:
            try:
                added = catch_up_lake(store, name, lake)
            except LakeError as exc:
                fail(f"{name}: {exc}")
            done.append({"run": name, "rows_added": added})
            if not output.machine:
                output.line(f"{name}: {count(added, 'row')} added", markup=False)
    finally:
        store.dispose()
    if output.machine:
        output.data(done)
    elif not done:
        output.line("no run in the store", markup=False)


@command.command(name="orphans")
@click.argument("url", metavar="URL")
@db_option
@output_option()
def orphans(url: str, db: str | None, output: Output) -> None:
    """Report the objects under URL that no snapshot of any table refers to, with their count
    and bytes. A report only: it deletes nothing. The bucket rule is "delete nothing", and an
    orphan is harmless (files of a commit that failed or raced another, metadata files older
    than the log a table keeps): readers go through the tables' metadata, never a listing.

    \b
    Example:
      steptail lake orphans s3://my-bucket/steptail -o json
    """
    from steptail.storage.lake import LakeError
    from steptail.storage.object_store import list_objects

    if not table_location(url, "URL"):
        fail(f"URL {url}: give s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or file:///DIR")
    store = store_or_exit(db, create=False)
    try:
        lake = open_lake(store, url)
        try:
            referenced = set().union(*lake.files().values())
            objects = list_objects(lake.location, lake.props)
        except (LakeError, OSError) as exc:
            fail(f"cannot list {url}: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}")
    finally:
        store.dispose()
    found = [{"uri": uri, "bytes": size} for uri, size in objects if uri not in referenced]
    total = sum(o["bytes"] for o in found)
    if output.machine:
        output.data({"location": lake.location.uri, "objects": len(objects), "orphans": found,
                     "count": len(found), "bytes": total, "deleted": 0}, found, ["uri", "bytes"])
        return
    if found:
        output.table([Column("OBJECT", "uri", keep=True), Column("BYTES", "bytes")], found)
    output.line(f"{count(len(found), 'orphan')} ({count(total, 'byte')}) of {count(len(objects), 'object')} "
                f"under {lake.location.uri}; nothing deleted", markup=False)
