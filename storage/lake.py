"""The Parquet dataset as Apache Iceberg tables ("the lake"): a local folder, `s3://` or
`gs://`, with the catalog in SQL (the store's own database unless told otherwise: the
PostgreSQL the replicas share, or the embedded SQLite file).

Why a table format (docs/lake.md): an object store has no rename and no lock, and the bucket's
rule is to delete nothing. An Iceberg commit writes new objects only (data files, manifests,
a new metadata file) and swings the catalog's pointer with one SQL UPDATE; readers see a
commit whole or not at all. Nothing here deletes or overwrites an object: the FileIO's delete
does nothing (storage.object_store.NoDeleteFileIO), snapshots are never expired; files of a
failed attempt stay as harmless orphans (`steptail lake orphans` lists them).

Exactly once per (run, table, key): every append re-reads the table's state, drops the rows
whose keys the table already holds for that run, and commits against that state with the
format's own retries off, so a commit that raced another (a replica's handover) fails and is
redone from the table's new state. A commit that raised otherwise is "maybe committed": it
carries a batch id in its snapshot summary, looked for before anything is redone. The keys held
are cached per run and re-read only when another writer's snapshot touched that run.

Per-step tables are keyed by (incarnation, step); config by (incarnation, name); checkpoints
by (incarnation, kind, step). Findings, stream gaps and reconnects are replaced per run.
Timestamps are microseconds (Iceberg v2's precision)."""

from __future__ import annotations

import logging
import os
import time
import uuid
import warnings
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from steptail.storage.parquet import SCHEMAS, SNAPSHOT_SCHEMAS
from steptail.storage.row_keys import KEYS, HeldKeys
from steptail.storage.slow_writes import SlowWrites

if TYPE_CHECKING:
    from steptail.storage.object_store import Location

log = logging.getLogger("steptail.lake")

NAMESPACE = "steptail"
TABLES = (*SCHEMAS, *SNAPSHOT_SCHEMAS)
_US = pa.timestamp("us", tz="UTC")
# Conflicts are ours to handle (the idempotency check must run again before a retry), and
# manifests are merged so planning a scan does not grow with every commit.
TABLE_PROPERTIES = {
    "commit.retry.num-retries": "0",
    "commit.manifest-merge.enabled": "true",
    "write.parquet.compression-codec": "zstd",
    "write.metadata.delete-after-commit.enabled": "false",
}
ATTEMPTS = 20  # commits lost to other writers before giving up (then the run is "behind")
BATCH_KEY = "steptail.batch"
RUNS_KEY = "steptail.runs"
WRITER_KEY = "steptail.writer"


class LakeError(OSError):
    """The lake could not be read or written; the message is one line."""


def is_lake(target: str | os.PathLike | None) -> bool:
    """Whether a --parquet value names a table location (a URL) rather than a local dataset folder."""
    return isinstance(target, str) and target.startswith(("s3://", "gs://", "file://"))


def lake_schema(table: str) -> pa.Schema:
    """The table's schema as stored: `run` first, timestamps in microseconds."""
    schema = SCHEMAS.get(table) or SNAPSHOT_SCHEMAS[table]
    fields = [pa.field("run", pa.string())]
    fields += [pa.field(f.name, _US) if pa.types.is_timestamp(f.type) else f for f in schema]
    return pa.schema(fields)


def as_lake_rows(table: str, run: str, data: pa.Table) -> pa.Table:
    """A table of the dataset's schema (storage.parquet) for one run -> the lake's schema."""
    schema = lake_schema(table)
    cols = [pa.array([run] * data.num_rows, pa.string())]
    for f in schema:
        if f.name == "run":
            continue
        col = data.column(f.name)
        cols.append(col.cast(f.type, safe=False) if pa.types.is_timestamp(f.type) else col)
    return pa.Table.from_arrays(cols, schema=schema)


class Lake:
    """The tables at one location. One per process; not thread-safe (callers serialise)."""

    def __init__(self, target: str, catalog_url: str, env: Mapping[str, str] | None = None,
                 writer: str | None = None) -> None:
        # pyiceberg (through object_store) costs ~1 s of import: only when a lake is used
        from steptail.storage.object_store import io_properties, parse_location

        try:
            self.location: Location = parse_location(target)
        except ValueError as exc:
            raise LakeError(f"bad table location {target!r}: {exc}") from None
        env = os.environ if env is None else env
        self.props = io_properties(self.location, env)
        self.writer = writer or f"{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._catalog_url = catalog_url
        self._catalog = None
        self._tables: dict = {}
        self._held: dict[tuple[str, str], HeldKeys] = {}
        self.commits = 0
        self.conflicts = 0
        self.slow = SlowWrites(f"lake {self.location.uri}", log)  # a store away is said, not retried in silence

    def __repr__(self) -> str:
        from steptail.storage.object_store import describe

        return f"Lake({describe(self.location, self.props)})"

    # --- catalog and tables

    @property
    def catalog(self):
        if self._catalog is None:
            from pyiceberg.catalog.sql import SqlCatalog  # 0.6 s: only when a lake is used

            try:
                # its tables are created on first use: a second process doing the same at once
                # loses that race ("already exists") and then finds them
                catalog = _created_or_raced(
                    lambda: SqlCatalog(NAMESPACE, uri=self._catalog_url, warehouse=self.location.uri, **self.props),
                    lambda: SqlCatalog(NAMESPACE, uri=self._catalog_url, warehouse=self.location.uri, **self.props))
                _created_or_raced(lambda: catalog.create_namespace_if_not_exists(NAMESPACE),
                                  lambda: catalog.namespace_exists(NAMESPACE))
            except Exception as exc:
                raise LakeError(f"cannot open the lake's catalog: {_reason(exc)}") from exc
            self._catalog = catalog
        return self._catalog

    def check_bucket(self) -> None:
        """Raise LakeError unless the lake's bucket exists: checked at start (one request), as
        pyiceberg would only find out at the first write, and steptail makes tables, never
        buckets. A file:// lake needs nothing: its folders are made as it writes."""
        if self.location.scheme == "file":
            return
        from steptail.storage.object_store import bucket_exists

        bucket = f"{self.location.scheme}://{self.location.bucket}"
        try:
            found = bucket_exists(self.location, self.props)
        except Exception as exc:
            raise LakeError(f"cannot reach the lake's bucket {bucket}: {_reason(exc)}") from exc
        if not found:
            raise LakeError(f"the lake's bucket {bucket} does not exist (steptail creates tables, not buckets)")

    def table(self, name: str, create: bool = True):
        """The Iceberg table `name` (created, partitioned by run, when missing and `create`)."""
        if name not in self._tables:
            from pyiceberg.catalog import Catalog
            from pyiceberg.exceptions import NoSuchTableError
            from pyiceberg.partitioning import PartitionField, PartitionSpec
            from pyiceberg.schema import assign_fresh_schema_ids
            from pyiceberg.transforms import IdentityTransform

            ident = f"{NAMESPACE}.{name}"
            try:
                self._tables[name] = self._evolved(self._here(self.catalog.load_table(ident)), name, ident)
            except NoSuchTableError:
                if not create:
                    return None
                schema = assign_fresh_schema_ids(Catalog._convert_schema_if_needed(lake_schema(name)))
                spec = PartitionSpec(PartitionField(source_id=schema.find_field("run").field_id, field_id=1000,
                                                    transform=IdentityTransform(), name="run"))
                try:
                    self._tables[name] = _created_or_raced(
                        lambda: self.catalog.create_table_if_not_exists(
                            ident, schema=schema, partition_spec=spec, properties=TABLE_PROPERTIES),
                        lambda: self.catalog.load_table(ident))
                except Exception as exc:
                    raise LakeError(f"cannot create lake table {name}: {_reason(exc)}") from exc
            except LakeError:
                raise
            except Exception as exc:
                raise LakeError(f"cannot open lake table {name}: {_reason(exc)}") from exc
        return self._tables[name]

    def _evolved(self, tbl, name: str, ident: str):
        """A table made before a column was declared (runs/tables.py) gains it, optional, by
        name: its rows written before read it as NULL. A writer evolving it at the same moment
        wins or loses the commit; the loser finds the columns there."""
        from pyiceberg.exceptions import CommitFailedException

        for attempt in range(3):
            have = {f.name for f in tbl.schema().fields}
            missing = [f.with_nullable(True) for f in lake_schema(name) if f.name not in have]
            if not missing:
                return tbl
            try:
                with tbl.update_schema() as update:
                    update.union_by_name(pa.schema(missing))
            except CommitFailedException:
                if attempt == 2:
                    raise
                tbl = self.catalog.load_table(ident)
                continue
            log.info("lake table %s: column%s %s added (the rows before read them as NULL)", name,
                     "s" if len(missing) > 1 else "", ", ".join(f.name for f in missing))
            return self.catalog.load_table(ident)
        return tbl

    def _here(self, tbl):
        """A store's catalog holds one lake: a table found elsewhere than this location is
        refused, not silently written where it is."""
        where = tbl.metadata.location.rstrip("/")
        if not where.startswith(self.location.uri.rstrip("/") + "/"):
            raise LakeError(f"this store's lake is at {where.rsplit('/', 2)[0]}, not {self.location.uri}")
        return tbl

    # --- reading

    def read(self, name: str, run: str | None = None, columns: Iterable[str] | None = None) -> pa.Table:
        """One table (all runs, or one) through the table's current snapshot."""
        from pyiceberg.expressions import AlwaysTrue, EqualTo

        tbl = self.table(name, create=False)
        schema = lake_schema(name)
        if columns is not None:
            schema = pa.schema([schema.field(c) for c in columns])
        if tbl is None:
            return schema.empty_table()
        try:
            tbl.refresh()
            scan = tbl.scan(row_filter=EqualTo("run", run) if run is not None else AlwaysTrue(),
                            selected_fields=tuple(schema.names))
            data = scan.to_arrow()
        except Exception as exc:
            raise LakeError(f"cannot read lake table {name}: {_reason(exc)}") from exc
        return data.select(schema.names).cast(schema) if data.num_rows else schema.empty_table()

    def held(self, name: str, run: str) -> HeldKeys:
        """The keys the table holds for `run`, as of the table's current snapshot (cached; re-read
        only when another writer's snapshot since the cached one touched this run)."""
        tbl = self.table(name)
        current = tbl.metadata.current_snapshot_id
        cached = self._held.get((name, run))
        if cached is not None and cached.snapshot == current:
            return cached
        if cached is not None and not self._touched_by_others(tbl, cached.snapshot, run):
            cached.snapshot = current
            return cached
        keys = self.read(name, run, KEYS[name]) if current is not None else None
        held = HeldKeys.of(name, keys, current)
        self._held[(name, run)] = held
        return held

    def _touched_by_others(self, tbl, since: int | None, run: str) -> bool:
        """Whether a snapshot after `since` was written by another writer for `run` (or by
        anything that does not say: a compaction elsewhere, a foreign tool)."""
        for snap in _snapshots_after(tbl, since):
            props = snap.summary.additional_properties if snap.summary else {}
            if props.get(WRITER_KEY) == self.writer:
                continue
            runs = props.get(RUNS_KEY)
            if runs is None or run in runs.split("\n"):
                return True
        return False

    # --- writing

    def append(self, name: str, by_run: Mapping[str, pa.Table]) -> int:
        """Append each run's rows (lake schema) that the table does not hold yet, in one
        commit. Returns rows added. Exactly once across retries, crashes and other writers."""
        with self.slow.watch(f"append to {name}"):  # every request to the store in it, reads too
            return self._append(name, by_run)

    def _append(self, name: str, by_run: Mapping[str, pa.Table]) -> int:
        batch = uuid.uuid4().hex
        tbl = self.table(name)
        self._refresh(tbl)
        for attempt in range(ATTEMPTS):
            base = tbl.metadata.current_snapshot_id
            fresh = {run: self.held(name, run).new(name, data) for run, data in by_run.items()}
            fresh = {run: data for run, data in fresh.items() if data.num_rows}
            if not fresh:
                return 0
            rows = pa.concat_tables(list(fresh.values())).combine_chunks()  # one block: pyiceberg filters it per run
            try:
                tbl.append(rows, snapshot_properties=self._summary(batch, fresh))
            except Exception as exc:  # noqa: BLE001 - sorted out below
                if not self._landed(tbl, base, batch, exc, attempt):
                    continue
            self.commits += 1
            for run, data in fresh.items():
                held = self._held[(name, run)]
                held.add(name, data)
                held.snapshot = tbl.metadata.current_snapshot_id
            return rows.num_rows
        raise LakeError(f"lake table {name}: {ATTEMPTS} commits lost to other writers in a row")

    def replace(self, name: str, by_run: Mapping[str, pa.Table]) -> None:
        """Each run's rows of a snapshot table (findings…) replace the ones it had: one commit.
        Files replaced are only marked removed in the new snapshot, never deleted."""
        with self.slow.watch(f"replace in {name}"):  # every request to the store in it, reads too
            return self._replace(name, by_run)

    def _replace(self, name: str, by_run: Mapping[str, pa.Table]) -> None:
        from pyiceberg.expressions import In

        batch = uuid.uuid4().hex
        tbl = self.table(name)
        rows = (pa.concat_tables([by_run[r] for r in by_run]).combine_chunks() if by_run
                else lake_schema(name).empty_table())
        self._refresh(tbl)
        for attempt in range(ATTEMPTS):
            base = tbl.metadata.current_snapshot_id
            try:
                with warnings.catch_warnings():  # "did not match any records": a run's first snapshot
                    warnings.simplefilter("ignore", UserWarning)
                    tbl.overwrite(rows, overwrite_filter=In("run", list(by_run)),
                                  snapshot_properties=self._summary(batch, by_run))
            except Exception as exc:  # noqa: BLE001
                if not self._landed(tbl, base, batch, exc, attempt):
                    continue
            self.commits += 1
            return
        raise LakeError(f"lake table {name}: {ATTEMPTS} commits lost to other writers in a row")

    def compact(self, name: str, run: str) -> tuple[int, int]:
        """Rewrite one run's files of a table as one file: a commit that adds the new file and
        marks the old ones removed (they stay on the bucket). Refused, not retried, when another
        commit lands in between: the next compaction does it. Returns (files before, after)."""
        with self.slow.watch(f"compaction of {name}"):  # every request to the store in it, reads too
            return self._compact(name, run)

    def _compact(self, name: str, run: str) -> tuple[int, int]:
        from pyiceberg.expressions import EqualTo

        tbl = self.table(name, create=False)
        if tbl is None:
            return 0, 0
        tbl.refresh()
        files = [t for t in tbl.scan(row_filter=EqualTo("run", run)).plan_files()]
        if len(files) <= 1:
            return len(files), len(files)
        data = self.read(name, run)
        sort = [(k, "ascending") for k in KEYS.get(name, ())]
        if sort:
            data = data.take(pc.sort_indices(data, sort_keys=sort))
        batch = uuid.uuid4().hex
        base = tbl.metadata.current_snapshot_id
        try:
            tbl.overwrite(data, overwrite_filter=EqualTo("run", run),
                          snapshot_properties=self._summary(batch, {run: data}) | {"steptail.compaction": "1"})
        except Exception as exc:  # noqa: BLE001
            if not self._landed(tbl, base, batch, exc, ATTEMPTS - 1, retry=False):
                return len(files), len(files)
        self.commits += 1
        held = self._held.get((name, run))
        if held is not None:
            held.snapshot = tbl.metadata.current_snapshot_id
        return len(files), 1

    @staticmethod
    def _refresh(tbl) -> None:
        try:
            tbl.refresh()
        except Exception as exc:
            raise LakeError(f"cannot read the lake's catalog: {_reason(exc)}") from exc

    def _summary(self, batch: str, by_run: Mapping[str, object]) -> dict[str, str]:
        return {BATCH_KEY: batch, WRITER_KEY: self.writer, RUNS_KEY: "\n".join(sorted(by_run))}

    def _landed(self, tbl, base: int | None, batch: str, exc: Exception, attempt: int,
                retry: bool = True) -> bool:
        """After a commit raised: True if it landed anyway (its batch id is in a snapshot since
        `base`); False to try again (a conflict); raises LakeError when it did not land and
        cannot be retried."""
        from pyiceberg.exceptions import CommitFailedException

        try:
            tbl.refresh()
        except Exception as again:  # noqa: BLE001
            raise LakeError(f"lake commit maybe not done, and the table cannot be read: {_reason(again)}") from exc
        for snap in _snapshots_after(tbl, base):
            if (snap.summary.additional_properties if snap.summary else {}).get(BATCH_KEY) == batch:
                log.info("a lake commit that raised (%s) had landed", _reason(exc))
                return True
        conflict = isinstance(exc, CommitFailedException) or type(exc).__name__ == "ValidationException"
        if conflict and retry:
            self.conflicts += 1
            time.sleep(min(0.05 * (attempt + 1), 0.5))
            return False
        raise LakeError(f"lake commit failed: {_reason(exc)}") from exc

    # --- reports

    def files(self) -> dict[str, set[str]]:
        """Every object any snapshot of each table refers to (data, manifests, metadata)."""
        out: dict[str, set[str]] = {}
        for name in TABLES:
            tbl = self.table(name, create=False)
            if tbl is None:
                continue
            tbl.refresh()
            refs = {tbl.metadata_location, *(m.metadata_file for m in tbl.metadata.metadata_log)}
            for snap in tbl.metadata.snapshots:
                refs.add(snap.manifest_list)
                for manifest in snap.manifests(tbl.io):
                    refs.add(manifest.manifest_path)
                    for entry in manifest.fetch_manifest_entry(tbl.io, discard_deleted=False):
                        refs.add(entry.data_file.file_path)
            out[name] = refs
        return out


def _created_or_raced(create, existing):
    """Create something in the catalog; when another process created it first (its insert
    won: a unique violation or "already exists"), what it made."""
    try:
        return create()
    except Exception as exc:  # noqa: BLE001 - a lost race looks like this
        try:
            found = existing()
        except Exception:  # noqa: BLE001 - not a race: the first error is the one to say
            raise exc from None
        if found is False:
            raise
        return found


def _snapshots_after(tbl, since: int | None) -> list:
    """Snapshots committed after `since` on the main branch, oldest first."""
    chain = []
    snap = tbl.metadata.current_snapshot()
    while snap is not None and snap.snapshot_id != since:
        chain.append(snap)
        snap = tbl.metadata.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id else None
    return chain[::-1]


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0][:300] if text else type(exc).__name__)
