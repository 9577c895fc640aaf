"""`steptail follow`: stream process 0 of live JobSets into the store."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import click

from steptail.commands._common import count, db_option, fail
from steptail.commands._detect_options import Detection, detector_options
from steptail.commands._preflight import checked_store, cluster_target
from steptail.commands._webhooks import read_webhooks, webhook_file_option
from steptail.commands.lake import PARQUET_HELP, close, open_lake, table_location
from steptail.event_stream import EventStream
from steptail.output import Output, output_option

log = logging.getLogger("steptail.follow")


@click.command()
@click.option("--jobset", "jobsets", multiple=True, metavar="NAME", help="JobSet to follow (repeatable).")
@click.option("-n", "--namespace", default="default", show_default=True)
@click.option("--kubeconfig", type=click.Path(dir_okay=False), help="Passed to kubectl and the API client.")
@click.option("--context", help="kubeconfig context.")
@click.option("--account", help="Service account for kubectl's auth plugin (else $CLOUDSDK_CORE_ACCOUNT).")
@click.option("--run", "run_name", help="Run name (one --jobset only; default: the JobSet name).")
@db_option
@click.option("--parquet", metavar="DIR|URL", help=PARQUET_HELP)
@click.option("--raw", metavar="DIR", type=click.Path(file_okay=False),
              help="Keep every line read (as kubectl printed it) in gzip segments under DIR/<run>/, each "
                   "made durable before the rows it yields commit (for audits and `steptail reparse`).")
@click.option("--until-done", is_flag=True, help="Stop when process 0 of every run completed.")
@click.option("--all", "follow_all", is_flag=True, help="Follow every JobSet in the namespace (see --selector).")
@click.option("--selector", help="With --all: label selector on the JobSets' pods.")
@click.option("--silence", type=float, default=30.0, show_default=True,
              help="Longest a quiet stream goes unchecked. No tuning needed: a stream quieter than its "
                   "own pace (max 2 s, 1.5x its usual interval) is checked against the pod's newest "
                   "line and re-opened only when that line was not delivered (a rotation hang); the "
                   "checks back off up to this while the container stays quiet.")
@click.option("--parquet-every", type=float, default=30.0, show_default=True,
              help="Seconds between Parquet flushes (and at shutdown).")
@click.option("--alert-webhook", "webhooks", multiple=True, metavar="URL",
              help="POST findings here (repeatable). Visible in `ps`: prefer --alert-webhook-file.")
@webhook_file_option
@click.option("--metrics-port", type=int, help="Serve Prometheus metrics on PORT.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="Address of the metrics server.")
@click.option("--duration", type=float, help="Stop after this many seconds.")
@click.option("--no-view", is_flag=True, help="No live table (default when stdout is not a terminal).")
@click.option("--append", is_flag=True,
              help="Follow into a run that holds data of another source (e.g. this run's saved logs, "
                   "ingested earlier) as the same run. Without it such a run is refused: --jobset exits 2, "
                   "--all skips that run.")
@click.option("--give-up", type=float, default=30.0, show_default=True,
              help="Seconds the pod list may be refused (401/403) or the API unreachable from start-up "
                   "before follow exits 2 (a configuration error). Later failures are retried, never fatal.")
@click.option("--max-runs", type=click.IntRange(min=1), default=100, show_default=True,
              help="With --all: most runs this collector follows; JobSets found beyond are not followed "
                   "(one log line, counted in steptail_errors_total{reason=\"max_runs\"}).")
@click.option("--list-page-size", type=click.IntRange(min=1, max=10_000), default=500, show_default=True,
              help="Pods read per list request (the API's limit/continue): memory stays flat in namespace size.")
@click.option("--policy", "policy_file", metavar="FILE",
              help="Runbook rules merged over the defaults (as `lint --policy`), checked on each live "
                   "JobSet, its process-0 pods and its Kueue Workload; each broken rule a finding.")
@click.option("--no-rules", is_flag=True,
              help="Do not check the runbook's rules live (nor read JobSets and Workloads: for a role "
                   "that grants pods only).")
@click.option("--archive", "archive_dir", metavar="DIR", type=click.Path(file_okay=False),
              help="When a followed JobSet fails, save every pod log under DIR/<jobset>/ (as `archive`) "
                   "before anyone deletes it. A failed JobSet deleted unsaved is a finding either way.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="stderr as text, or one JSON object per line with `severity` (for Cloud Logging).")
@detector_options
@output_option()
def command(output: Output, **options) -> None:
    """Follow JAX process 0 of JobSets with kubectl (a follow read of the pod's log), surviving rotation hangs, EOFs,
    JobSet and container restarts and auth lapses; rows committed within ~0.1 s, stream gaps
    and findings recorded. SIGTERM/SIGINT: flush, commit, stop every kubectl.

    -o ndjson streams one JSON object per line as it happens: each committed step (and
    REQUIRED_RBF row), stream gap and finding, each follower state change, and the summary
    last (`event`: step, rbf, gap, finding, state, summary).

    --parquet URL (s3://, gs://, file://): the lake, Iceberg tables with their catalog in
    --db, one commit per table every --parquet-every seconds; credentials from the
    environment (AWS_*, Application Default Credentials / GKE Workload Identity).

    
    Examples:
      steptail follow --jobset sft-7 -n post-training --parquet parquet
      steptail follow --all -n post-training --parquet gs://my-bucket/steptail --db postgresql://steptail@db/steptail"""
    follow = Follow(output=output, **options)  # complete
    follow.validate()
    sup = follow.run()
    follow.report(sup)
    follow.unseen(sup)


def _writable_dir(path: str, what: str) -> None:
    """`path` made and writable, or one line and exit 2 before anything starts."""
    try:
        os.makedirs(path, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as exc:
        fail(f"cannot write {what} under {path}: {exc.strerror or exc}")


@dataclass
class Follow:
    """`follow` in three steps, as stern's Complete/Validate/Run: the options completed into
    this object, validated (the first bad one is one line and exit 2, nothing started), run."""

    output: Output
    jobsets: tuple[str, ...]
    namespace: str
    kubeconfig: str | None
    context: str | None
    account: str | None
    run_name: str | None
    db: str | None
    parquet: str | None
    raw: str | None
    until_done: bool
    follow_all: bool
    selector: str | None
    silence: float
    parquet_every: float
    webhooks: tuple[str, ...]
    webhook_file: Path | None
    metrics_port: int | None
    metrics_host: str
    duration: float | None
    no_view: bool
    append: bool
    give_up: float
    max_runs: int
    list_page_size: int
    policy_file: str | None
    no_rules: bool
    archive_dir: str | None
    log_format: str
    detection: Detection
    settings: object = None  # validated: runs.detect.Settings
    reference: object = None  # validated: the reference CE (per run, or a folder of them)
    target: object = None  # validated: the KubeTarget
    policy: object = None  # validated: the runbook's rules (runs.runbook.Policy), None with --no-rules
    lake: bool = False  # validated: --parquet names a table location (the lake)

    def validate(self) -> None:
        from steptail import logs

        logs.configure(self.log_format)  # first: every line after this one is in that format
        if not self.jobsets and not self.follow_all:
            fail("give --jobset NAME (repeatable) or --all")
        if self.jobsets and self.follow_all:
            fail("--jobset and --all exclude each other")
        if self.selector and not self.follow_all:
            fail("--selector needs --all")
        if self.run_name and len(self.jobsets) != 1:
            fail("--run needs exactly one --jobset")
        if self.silence <= 0 or self.parquet_every <= 0:
            fail("--silence and --parquet-every must be positive")
        self.lake = table_location(self.parquet)  # a bad URL: one line now (a folder is made when written)
        self.webhooks = read_webhooks(self.webhooks, self.webhook_file)
        if self.give_up <= 0:
            fail("--give-up must be positive")
        self.settings, self.reference = self.detection.resolve()
        if self.raw is not None:  # a directory the segments cannot go to: one line now, not a retried outage
            _writable_dir(self.raw, "the raw log")
        if self.no_rules and (self.policy_file or self.archive_dir):
            fail("--no-rules excludes --policy and --archive (they read the JobSets)")
        if not self.no_rules:
            from steptail.commands.lint import policy_from
            self.policy = policy_from(self.policy_file)
        if self.archive_dir is not None:
            _writable_dir(self.archive_dir, "archives")
        self.target = cluster_target(self.namespace, self.kubeconfig, self.context, self.account,
                                     (self.run_name, *self.jobsets))

    def runs(self) -> dict[str, str]:
        """JobSet -> run, of the JobSets named (--all finds its own)."""
        return {j: (self.run_name or j) for j in self.jobsets}

    def run(self):
        """The Supervisor, once every run stopped (exit 2 on a fatal error)."""
        from steptail.collector.live.follower import FollowConfig
        from steptail.collector.live.supervisor import Plan
        from steptail.collector.live.wiring import follow
        from steptail.storage.replicas import SqliteFollowLock, StoreBusy

        store = checked_store(self.db, self.namespace, {r: j for j, r in self.runs().items()}, self.append)
        if self.lake:
            close(open_lake(store, self.parquet))  # its catalog opens and its tables are there, else exit 2 now
        database = store.engine.url.database
        single = SqliteFollowLock(database) if store.is_sqlite and database not in (None, "", ":memory:") else None
        try:  # SQLite has one writer: a second follow of the same file is refused (replicas: PostgreSQL)
            if single is not None:
                single.acquire()
        except StoreBusy as exc:
            store.dispose()
            fail(str(exc))
        output, started = self.output, []  # the Supervisor and its loop, once running

        def reader_gone() -> None:  # the reader went away (jq quit): stop as on SIGTERM
            if started:
                sup, loop = started[0]
                with contextlib.suppress(RuntimeError):  # the loop already ended
                    loop.call_soon_threadsafe(sup.stop)

        events = EventStream(output.event, lambda: output.closed, reader_gone) \
            if output.format == "ndjson" else None

        plan = Plan(
            self.target, jobsets=self.runs(), follow_all=self.follow_all, selector=self.selector,
            parquet=self.parquet, settings=self.settings, reference_ce=self.reference, append=self.append,
            config=FollowConfig(silence=self.silence, until_done=self.until_done,
                                parquet_every=self.parquet_every, raw=self.raw),
            give_up=self.give_up, max_runs=self.max_runs, page_size=self.list_page_size,
            policy=self.policy, archive=self._archiver(store) if self.archive_dir else None,
        )
        if events is not None:  # every event of the live path's channel, as an ndjson line
            from steptail.collector.notify.events import attach
            attach(plan.channel, events.put)
        view = output.console.is_terminal and not self.no_view and not output.machine
        from steptail.live_view import table
        try:
            sup = asyncio.run(follow(store, plan, view=view, webhooks=self.webhooks, metrics_port=self.metrics_port,
                                     metrics_host=self.metrics_host, duration=self.duration,
                                     console=output.console,
                                     on_start=lambda s, _url: started.append((s, asyncio.get_running_loop())),
                                     render=table))
        except OSError as exc:
            fail(f"cannot start: {exc}")
        finally:
            if events is not None:
                events.close()  # every event written before the summary
            store.dispose()
            if single is not None:
                single.release()
        if sup.fatal:
            fail(sup.fatal)
        return sup

    def unseen(self, sup) -> None:
        """After the report: a named JobSet that never showed a process-0 pod is an error."""
        if sup.unseen:
            fail("; ".join(sup.unseen.values()))

    def _archiver(self, store):
        """follow --archive: a failed JobSet's pod logs saved (as `archive`, without ingesting:
        follow reads process 0 itself) and the manifest recorded for the run."""
        from steptail.collector.archive.ingest import record_manifest
        from steptail.collector.archive.job import archive

        out, target = Path(self.archive_dir), self.target

        async def save(jobset: str, run: str) -> bool:
            result = await archive(target, jobset, out)
            await asyncio.to_thread(record_manifest, store, run, result)
            if result.errors:
                log.error("%s: archived JobSet %s to %s with %d logs unread: %s", run, jobset, result.folder,
                          len(result.errors), "; ".join(f"{e['pod']}: {e['reason']}" for e in result.errors[:3]))
                return False
            log.warning("%s: archived failed JobSet %s: %d logs in %s", run, jobset,
                        len(result.manifest.files), result.folder)
            return True

        return save

    def report(self, sup) -> None:
        from steptail.collector.live.view import by_kind, severity_text, short, summary

        output = self.output
        report = summary(sup.status, sup.discovery.health, sup.ownership_health, sup.collector_events)
        # what the cluster sent that was not followed: unsafe names (never a run), JobSets over --max-runs
        report["discovery"] |= {"refused": [{"name": k, "reason": v} for k, v in sup.discovery.refused.items()],
                                "refused_count": sup.discovery.refused_count,
                                "over_max_runs": sup.over_max_runs, "unseen": sorted(sup.unseen)}
        if output.format == "ndjson":
            output.event({"event": "summary", **report})
            return
        if output.machine:
            output.data(report, report["runs"])
            return
        for r in report["runs"]:
            output.print(f"[bold]{r['run']}[/]: {r['run_state']} ({r['state']}), last step {r['last_step']}, "
                         f"{count(r['steps'], 'step')} recorded, findings: {severity_text(r['findings_by_severity'])}; "
                         f"{count(r['reconnects'], 'reconnect')}, {count(r['gaps'], 'stream gap')}, "
                         f"{count(r['failures'], 'failure')}"
                         + (f" ({by_kind(r['errors'])})" if r["errors"] else "")
                         + (f" (last: {r['last_error']})" if r["last_error"] else ""), highlight=False,
                         soft_wrap=True)
            for f in r["findings"]:
                steps = f" {f['steps']}" if f["steps"] else ""
                output.print(f"  {f['severity']} {f['kind']}{steps}: {short(f['detail'])}", highlight=False,
                             soft_wrap=True, markup=False)
            self._events(r["collector_events"])
        d = report["discovery"]
        if d["refused_count"] or d["over_max_runs"]:
            output.print(f"[bold]pod discovery[/]: {count(d['refused_count'], 'name')} refused (unsafe), "
                         f"{count(d['over_max_runs'], 'JobSet')} over --max-runs={self.max_runs}: not followed",
                         highlight=False, soft_wrap=True)
        for key, name in (("discovery", "pod discovery"), ("ownership", "ownership connection")):
            d = report.get(key)
            if d and d["failures"]:
                output.print(f"[bold]{name}[/]: {d['state']}, {count(d['failures'], 'failure')} ({by_kind(d['errors'])}) "
                             f"(last: {d['last_error']})", highlight=False, soft_wrap=True)
        self._events(report["discovery"]["collector_events"])

    def _events(self, events: list[dict]) -> None:
        """The collector's own faults (health, not findings of the run): one line each."""
        for e in events:
            until = f"cleared {e['cleared']}" if e["cleared"] else "still open"
            lost = "steps lost (named on the gap finding)" if e["lost_steps"] else "nothing lost"
            where = f"{e['source']} of {e['run']}" if e["run"] else e["source"]
            self.output.print(f"  collector event {e['kind']} ({where}): {e['started']}, {until}, "
                              f"{e['failures']} failures, {lost}: {e['reason']}", highlight=False,
                              soft_wrap=True, markup=False)
