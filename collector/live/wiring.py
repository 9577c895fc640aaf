"""`follow`, wired: the metrics (and their HTTP server), the alerter and its webhook
deliveries, the Supervisor (discovery, and one path per run: collector.live.assemble), the
live view; and their shutdown in reverse."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from rich.console import Console
from rich.live import Live

from steptail.collector.cluster import kubectl
from steptail.collector.live.supervisor import Plan, Supervisor
from steptail.collector.notify.alerts import Alerter
from steptail.collector.notify.metrics import Metrics, MetricsServer
from steptail.storage.db import Store

log = logging.getLogger("steptail.follow")


async def follow(store: Store, plan: Plan, *, view: bool = False, webhooks: tuple[str, ...] = (),
                 metrics_port: int | None = None, metrics_host: str = "127.0.0.1", duration: float | None = None,
                 console: Console | None = None, on_start=None, render=None) -> Supervisor:
    """Follow until every run is done (--until-done), a signal, or `duration` seconds.
    `view`: rich's Live shows `render(statuses, discovery_health)` (the CLI's table)."""
    metrics = Metrics(replicas=not store.is_sqlite)
    server = None
    sup: Supervisor | None = None
    if metrics_port is not None:  # /healthz: ready once discovery has listed pods (the readiness probe)
        server = MetricsServer(metrics, port=metrics_port, host=metrics_host,
                               ready=lambda: sup is not None and sup.discovery.listed,
                               events=lambda: sup.collector_events.open_events() if sup is not None else [])
        port = await server.start()
        log.info("metrics on http://%s:%d/metrics", metrics_host, port)
    plan.metrics = metrics
    plan.alerts = Alerter(webhooks, metrics, store=store)  # the store keeps the deliveries (outbox)
    plan.alerts.start()
    sup = Supervisor(store, plan)
    try:
        task = asyncio.create_task(sup.run())
        if on_start is not None:
            on_start(sup, server.url if server is not None else None)
        timer = None
        if duration is not None:
            timer = asyncio.get_running_loop().call_later(duration, sup.stop)
        view = view and render is not None
        live = Live(render(sup.status, sup.discovery.health), console=console, refresh_per_second=4,
                    transient=False) if view else contextlib.nullcontext()
        with live:
            while not task.done():
                await asyncio.wait([task], timeout=0.25)
                if view:
                    live.update(render(sup.status, sup.discovery.health))
        if timer is not None:
            timer.cancel()
        await task
    finally:
        kubectl.kill_all()
        await plan.alerts.close(timeout=5.0)
        if server is not None:
            await server.stop()
    return sup
