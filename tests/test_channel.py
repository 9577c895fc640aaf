"""The live path's one event channel (collector.notify.channel): each event told once, where
it happens, to whoever subscribed to its type; a listener that fails costs only its own output."""

from __future__ import annotations

import logging

from steptail.collector.live.follower import RunStatus
from steptail.collector.notify.channel import (
    Channel,
    FindingsCommitted,
    GapsCommitted,
    StateChanged,
)
from steptail.collector.notify.events import attach


def test_events_reach_the_listeners_of_their_type_and_a_failing_one_costs_only_itself(caplog):
    channel, got, gaps = Channel(), [], []

    def broken(event):
        raise RuntimeError("listener bug")

    channel.subscribe(StateChanged, broken)
    channel.subscribe(StateChanged, got.append)
    channel.subscribe(GapsCommitted, gaps.append)
    assert channel.listens(StateChanged) and not channel.listens(FindingsCommitted)
    with caplog.at_level(logging.WARNING, "steptail.follow"):
        channel.emit(StateChanged("r", "following", "p-0"))
        channel.emit(FindingsCommitted("r", []))  # nobody listens: nothing happens
    assert got == [StateChanged("r", "following", "p-0")] and gaps == []
    assert "StateChanged listener failed: listener bug" in caplog.text


def test_a_run_s_state_is_told_once_per_change_whoever_sets_it():
    """The follower (with the pod) and the supervisor (restarting it, pod unchanged) set the
    same RunStatus: each change is one event, a repeat none."""
    channel, lines = Channel(), []
    attach(channel, lines.append)  # what follow -o ndjson writes
    status = RunStatus("r", "js", channel=channel)
    status.set_state("following", "r-0-abc")  # the follower
    status.set_state("following", "r-0-abc")  # again: no change
    status.set_state("restarting after an error")  # the supervisor: the pod stays
    status.set_state("following", "r-0-def")  # a new pod
    assert [(e["event"], e["state"], e["pod"]) for e in lines] == [
        ("state", "following", "r-0-abc"), ("state", "restarting after an error", "r-0-abc"),
        ("state", "following", "r-0-def")]
    assert (status.state, status.pod) == ("following", "r-0-def")
