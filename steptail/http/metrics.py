"""/metrics: the store's gauges (read at scrape time, bounded to recent runs), the lanes' load and
the body cache, in Prometheus' text format."""

from __future__ import annotations

import time

from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from steptail.http.keys import READS, REGISTRY
from steptail.storage.db import Store
from steptail.storage.status import run_gauges

RECENT_DAYS = 7.0  # per-run series for runs updated this recently
MAX_RUN_SERIES = 1000  # … and at most this many of them (the most recently updated)


class StoreCollector:
    """Store-derived gauges, read at scrape time; the same names as `follow`'s for the same facts
    (steptail_last_step, steptail_last_step_timestamp_seconds). Bounded: per-run series only
    for the `max_runs` runs most recently updated within `recent_days` (steptail_runs counts
    them all), so a store of years of runs stays a few series per live run."""

    def __init__(self, store: Store, recent_days: float = RECENT_DAYS, max_runs: int = MAX_RUN_SERIES) -> None:
        from steptail.storage.goodput import GoodputCache

        self.store, self.recent_days, self.max_runs = store, recent_days, max_runs
        self.goodput = GoodputCache(store)

    def collect(self):
        runs = GaugeMetricFamily("steptail_runs", "Runs in the store")
        recent = GaugeMetricFamily("steptail_recent_runs", f"Runs with per-run series: updated in the last "
                                   f"{self.recent_days:g} days, at most {self.max_runs}")
        last_step = GaugeMetricFamily("steptail_last_step", "Last recorded step of the run's latest incarnation",
                                      labels=["run"])
        last_ts = GaugeMetricFamily("steptail_last_step_timestamp_seconds",
                                    "Unix time of the run's latest recorded step (kubelet timestamp)", labels=["run"])
        steps = GaugeMetricFamily("steptail_stored_steps", "LOSS-PARTS rows in the store", labels=["run"])
        findings = GaugeMetricFamily("steptail_stored_findings", "Findings in the store", labels=["run"])
        goodput = GaugeMetricFamily("steptail_run_goodput", "Productive step time / wall time (docs/goodput.md)",
                                    labels=["run"])
        step_s = GaugeMetricFamily("steptail_run_median_step_seconds",
                                   "Median step time of the run's latest incarnation", labels=["run"])
        since_ns = time.time_ns() - int(self.recent_days * 86400e9)
        total, rows = run_gauges(self.store, since_ns, self.max_runs)
        runs.add_metric([], total)
        recent.add_metric([], len(rows))
        for run, last, ts_ns, n_steps, n_findings in rows:
            if last is not None:
                last_step.add_metric([run], last)
            if ts_ns is not None:
                last_ts.add_metric([run], ts_ns / 1e9)
            steps.add_metric([run], n_steps or 0)
            findings.add_metric([run], n_findings or 0)
            if n_steps:
                report = self.goodput.get(run, (n_steps, ts_ns, last))
                if report["goodput"] is not None:
                    goodput.add_metric([run], report["goodput"])
                latest = report["incarnations"][-1]["median_step_s"] if report["incarnations"] else None
                if latest is not None:
                    step_s.add_metric([run], latest)
        self.goodput.keep({row[0] for row in rows})
        yield from (runs, recent, last_step, last_ts, steps, findings, goodput, step_s)




async def metrics(request: web.Request) -> web.Response:
    body = await request.app[READS].run(generate_latest, request.app[REGISTRY])
    resp = web.Response(body=body)
    resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return resp
