"""`steptail archive`: every pod log of a JobSet saved before it is deleted.

The pods are listed once (collector.archive.pods); each container instance's log is read
with the real kubectl (the raw read of pods/log, as `kubectl logs POD -c C --timestamps
[--previous]`, read-only), a few
at once, gzipped on worker threads into DIR/<jobset>/<pod>/<container>[.previous].log.gz
under a temporary name and renamed when complete (collector.archive.files); manifest.json
lists pods and files (collector.archive.manifest). A second archive reads only what is not
final and verified, and rewrites nothing whose content did not change."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from steptail.collector.archive.files import GzipLog, LogStats, remove_stale
from steptail.collector.archive.manifest import NAME, FileEntry, Manifest, load
from steptail.collector.archive.pods import LogTask, list_pods, log_tasks, unsafe
from steptail.collector.cluster import kubectl
from steptail.collector.cluster.kubectl import KubeTarget
from steptail.runs.names import shown
from steptail.storage.paths import UnsafePath, inside, relative_inside

CHUNK = 1 << 20
IDLE_TIMEOUT = 120.0  # a kubectl that sends nothing for this long is given up on


class ArchiveError(Exception):
    """Nothing to archive or nowhere to put it; one line."""


@dataclass
class ArchiveResult:
    folder: Path
    manifest: Manifest
    manifest_sha256: str = ""
    manifest_bytes: int = 0
    listed: int = 0  # pods listed now
    read: int = 0  # logs read this time
    written: int = 0  # files (re)written
    unchanged: int = 0  # read again, same content: not rewritten
    skipped: int = 0  # final and verified: not read
    no_log: int = 0  # containers that had not started after all
    bytes: int = 0  # uncompressed bytes read
    bytes_compressed: int = 0  # of the files written
    errors: list[dict] = field(default_factory=list)

    @property
    def manifest_path(self) -> Path:
        return self.folder / NAME

    def failed_pods(self) -> list[str]:
        return sorted({e["pod"] for e in self.errors})

    def summary(self) -> dict:
        return {"jobset": self.manifest.jobset, "namespace": self.manifest.namespace, "out": str(self.folder),
                "manifest": str(self.manifest_path), "manifest_sha256": self.manifest_sha256,
                "pods": self.listed, "files": len(self.manifest.files), "read": self.read,
                "written": self.written, "unchanged": self.unchanged, "skipped": self.skipped,
                "bytes": self.bytes, "bytes_compressed": self.bytes_compressed, "errors": self.errors}


@dataclass
class Progress:
    """Callbacks for a progress bar: the number of logs to read, then bytes and logs done."""

    start: Callable[[int], None] = lambda total: None
    bytes: Callable[[int], None] = lambda n: None
    done: Callable[[], None] = lambda: None


async def _read(target: KubeTarget, task: LogTask, final: Path, pool: ThreadPoolExecutor,
                on_bytes: Callable[[int], None]) -> tuple[GzipLog | None, tuple[str, str] | None]:
    """(the finished log under its temporary name, None) or (None, (kind, reason))."""
    loop = asyncio.get_running_loop()
    argv = target.logs_argv(task.pod.name, task.container, previous=task.previous)
    proc = await kubectl.spawn(argv, target.env())
    err = asyncio.create_task(proc.stderr.read())
    log = None
    try:
        log = await loop.run_in_executor(pool, GzipLog, final)
        while True:
            try:
                async with asyncio.timeout(IDLE_TIMEOUT):  # not wait_for: on 3.11 it can swallow a cancel
                    chunk = await proc.stdout.read(CHUNK)
            except TimeoutError:
                log.abort()
                return None, ("timeout", f"kubectl sent nothing for {IDLE_TIMEOUT:.0f} s")
            if not chunk:
                break
            await loop.run_in_executor(pool, log.add, chunk)
            on_bytes(len(chunk))
        code = await proc.wait()
        stderr = (await err).decode("utf-8", "replace")
        if code != 0:
            log.abort()
            return None, kubectl.classify(stderr)
        await loop.run_in_executor(pool, log.finish)
        return log, None
    except BaseException:
        if log is not None:
            log.abort()
        raise
    finally:
        await kubectl.stop(proc)
        if not err.done():
            err.cancel()


def _keep_other_instance(folder: Path, manifest: Manifest, task: LogTask) -> None:
    """The file at the task's path is the whole log of an earlier instance (the container
    restarted twice since): keep it under `<container>.restart-<N>.log.gz`."""
    old = manifest.files.get(task.path)
    if old is None or old.same_instance(task) or not old.final or not relative_inside(folder, old.path).exists():
        return
    kept = f"{task.pod.name}/{task.container}.restart-{old.restart_count}.log.gz"
    os.replace(relative_inside(folder, old.path), relative_inside(folder, kept))
    manifest.files[kept] = replace(old, path=kept)
    del manifest.files[task.path]


def _commit(folder: Path, manifest: Manifest, task: LogTask, log: GzipLog, result: ArchiveResult,
            lock: threading.Lock) -> None:
    """Runs on a worker thread: the file into place unless its content is there already."""
    stats: LogStats = log.stats
    same = manifest.unchanged(folder, task, stats)
    with lock:  # the manifest and the counts are shared by the worker threads
        if same:
            log.abort()
            manifest.files[task.path] = replace(manifest.files[task.path], final=task.final)
            result.unchanged += 1
            return
        _keep_other_instance(folder, manifest, task)
        log.commit()
        manifest.files[task.path] = FileEntry.of(task, stats)
        result.written += 1
        result.bytes_compressed += stats.bytes_compressed


async def archive(target: KubeTarget, jobset: str, out: Path, *, parallel: int = 8,
                  progress: Progress | None = None) -> ArchiveResult:
    """Archive every pod log of `jobset`; raises ArchiveError, archive_pods.ListError,
    archive_manifest.ManifestError (nothing read) or OSError (a full disk: the files
    completed so far are in the manifest, no temporary file is left)."""
    progress = progress or Progress()
    try:
        inside(out, jobset)
        folder = out / jobset  # as given (relative stays relative): the paths recorded keep their form
    except UnsafePath as exc:
        raise ArchiveError(f"cannot archive JobSet {shown(jobset)}: {exc}") from None
    manifest = load(folder, jobset, target.namespace)
    listed = await asyncio.to_thread(list_pods, target, jobset)
    # a pod whose names would name files outside the folder (a hostile API) is not archived
    refused = [(p, why) for p in listed if (why := unsafe(p)) is not None]
    pods = [p for p in listed if unsafe(p) is None]
    if not listed and not manifest.pods:
        raise ArchiveError(f"no pods of JobSet {jobset} in namespace {target.namespace}: nothing archived")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArchiveError(f"cannot create {folder}: {exc.strerror or exc}") from None
    await asyncio.to_thread(remove_stale, folder)
    result = ArchiveResult(folder, manifest, listed=len(pods))
    manifest.listed = {p.name for p in pods}
    # a log that could not be read of a pod gone since is lost for good: still an error
    result.errors = [e for e in manifest.errors if e["pod"] not in manifest.listed]
    result.errors += [{"pod": shown(p.name), "container": "", "previous": False, "kind": "unsafe_name",
                       "reason": why} for p, why in refused]
    manifest.pods.update({p.name: p for p in pods})
    tasks = [t for p in pods for t in log_tasks(p)]
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(max_workers=max(2, parallel), thread_name_prefix="steptail-archive") as pool:
        done = await asyncio.gather(*(loop.run_in_executor(pool, manifest.verified, folder, t) for t in tasks))
        todo = [t for t, entry in zip(tasks, done, strict=True) if entry is None]
        result.skipped = len(tasks) - len(todo)
        progress.start(len(todo))
        gate = asyncio.Semaphore(parallel)
        lock = threading.Lock()

        def counted(n: int) -> None:
            result.bytes += n
            progress.bytes(n)

        async def one(task: LogTask) -> None:
            async with gate:
                log, failure = await _read(target, task, relative_inside(folder, task.path), pool, counted)
            result.read += 1
            if log is not None:
                await loop.run_in_executor(pool, _commit, folder, manifest, task, log, result, lock)
            elif failure[0] == kubectl.CONTAINER_CREATING:
                result.no_log += 1  # listed as started, is not (yet): nothing to save
            else:
                result.errors.append({"pod": task.pod.name, "container": task.container,
                                      "previous": task.previous, "kind": failure[0], "reason": failure[1]})
            progress.done()

        failure: BaseException | None = None
        try:
            try:
                async with asyncio.TaskGroup() as group:
                    for t in todo:
                        group.create_task(one(t))
            except BaseExceptionGroup as group_exc:
                failure = first_failure(group_exc)  # the cause itself, not "unhandled errors in a TaskGroup"
        finally:
            manifest.errors = sorted(result.errors, key=lambda e: (e["pod"], e["container"], e["previous"]))
            try:
                result.manifest_sha256, result.manifest_bytes = await loop.run_in_executor(pool, manifest.save,
                                                                                           folder)
            except OSError:
                if failure is None:
                    raise  # else the disk that filled up under a log fails the manifest too: the log's said
    # Out of the pool: its threads are done. A read cancelled while a worker thread was creating
    # its temporary file never saw the file; swept here so a failed archive leaves none.
    if failure is not None:
        await asyncio.to_thread(remove_stale, folder)
        raise failure
    return result


def first_failure(group: BaseExceptionGroup) -> BaseException:
    """The error to say of a failed group of reads: the first OSError (a full disk: its
    errno, strerror and file), else the first error."""
    leaves, todo = [], [group]
    while todo:
        exc = todo.pop(0)
        if isinstance(exc, BaseExceptionGroup):
            todo[:0] = exc.exceptions
        else:
            leaves.append(exc)
    return next((e for e in leaves if isinstance(e, OSError)), leaves[0])
