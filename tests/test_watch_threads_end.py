"""The list/watch threads of pod discovery and of the runbook's JobSets and Workloads end
when they are closed, before the interpreter does: they are daemons, and a daemon still inside
the kubernetes client at finalization can take the process down with it (a CI run saw
`follow --give-up 3` under a lapsed login exit on SIGABRT after its last line).

A watch waits up to WATCH_SECONDS for its next event, longer than close() waits (JOIN_SECONDS):
these threads end only because close() cuts the open watch, not because it timed out on them."""

from __future__ import annotations

import asyncio

import pytest
from sim_fixtures import FAST, make_simcluster  # noqa: F401

from steptail.collector.cluster.discovery import JOIN_SECONDS, WATCH_SECONDS, Discovery
from steptail.collector.cluster.jobsets import ClusterObjects
from steptail.collector.cluster.kubectl import KubeTarget

pytestmark = pytest.mark.timeout(60)
assert JOIN_SECONDS < WATCH_SECONDS  # else an idle watch could end by its own timeout


def _target(sim) -> KubeTarget:
    return KubeTarget(sim.scenario.namespace, sim.account, str(sim.kubeconfig_path))


async def _watched_then_closed(watcher, ready) -> list:
    await watcher.start()
    for _ in range(200):  # listed, and its watch open and idle for a moment
        if ready(watcher):
            break
        await asyncio.sleep(0.05)
    assert ready(watcher)
    await asyncio.sleep(0.5)
    threads = list(watcher._threads)
    assert threads and all(t.is_alive() for t in threads)
    await watcher.close()
    return threads


def test_closing_discovery_ends_its_idle_watch_at_once(make_simcluster):  # noqa: F811
    sim = make_simcluster({**FAST, "rate": 1})  # a slow trainer: the pod watch sees no event
    threads = asyncio.run(_watched_then_closed(Discovery(_target(sim)), lambda d: d.listed and d.pods))
    assert not [t.name for t in threads if t.is_alive()]


def test_closing_the_runbook_watches_ends_them_at_once(make_simcluster):  # noqa: F811
    sim = make_simcluster({**FAST, "rate": 1})
    threads = asyncio.run(_watched_then_closed(ClusterObjects(_target(sim)), lambda o: all(o.listed.values())))
    assert len(threads) == 2 and not [t.name for t in threads if t.is_alive()]


def test_closing_discovery_under_a_lapsed_login_ends_its_retries(make_simcluster):  # noqa: F811
    sim = make_simcluster({**FAST, "rate": 1})
    sim.auth_lapse(120)  # every connect runs the credential plugin, which fails: retried

    async def main() -> list:
        d = Discovery(_target(sim))
        await d.start()
        for _ in range(200):
            if d.health.failing is not None:
                break
            await asyncio.sleep(0.05)
        assert d.health.failing is not None and d.health.failing[0] == "auth", d.health.failing
        threads = list(d._threads)
        await d.close()
        return threads

    threads = asyncio.run(main())
    assert not [t.name for t in threads if t.is_alive()]
