"""A failure is told once, where it happens (collector.notify.health.Health.fail): the run's
status keeps it as its last error, and whatever else must know subscribes to the source."""

from __future__ import annotations

from steptail.collector.live.follower import RunStatus
from steptail.collector.notify.health import Health


def test_a_failure_is_told_once_and_heard_by_each_subscriber():
    status = RunStatus("r", "js")
    health = Health("follower", "r", status=status)
    each, starts = [], []
    health.subscribe("cause", lambda kind, reason: each.append(kind))
    health.subscribe("detectors", lambda kind, reason: starts.append(kind), each=False)
    health.fail("auth", "401")
    health.fail("auth", "401 again")
    health.fail("network", "connection reset")
    assert each == ["auth", "auth", "network"]
    assert starts == ["auth", "network"]  # a spell starting or changing kind only
    assert status.last_error == "network: connection reset" and status.failures == 3
    assert status.errors == {"auth": 2, "network": 1}


def test_a_follower_built_again_replaces_its_own_subscription():
    health = Health("follower", "r")
    heard = []
    health.subscribe("follower", lambda kind, reason: heard.append(("old", kind)))
    health.subscribe("follower", lambda kind, reason: heard.append(("new", kind)))
    health.fail("auth", "401")
    health.ok()
    health.fail("auth", "401")
    assert heard == [("new", "auth"), ("new", "auth")]
