"""Poison lines in a live stream (real kubectl, simulated cluster, SQLite and PostgreSQL):
values no column can hold, a NUL, an absurd step — each costs only itself; every good step
is stored once, later commits are not blocked, and no false incarnation is opened."""

from __future__ import annotations

import pytest
from test_follow_support import assert_exactly_once, findings, follow_sim, rows, scenario

pytestmark = pytest.mark.timeout(120)

PREFIX = "I1130 04:00:11.726981 140233 train_sft.py:301] "
POISON = [
    PREFIX + "LOSS-PARTS step=99999999999999999999 ce=2.5",  # beyond BIGINT
    PREFIX + "LOSS-PARTS step=3000000000 ce=2.5",  # beyond PostgreSQL's INTEGER
    PREFIX + "LOSS-PARTS step=41 ce=1." + "7" * 70,  # ce_raw longer than its column
    PREFIX + "REQUIRED_RBF step=41 max=1.5 per_layer=[1.5] program=" + "p" * 300,
    PREFIX + "LOSS-PARTS step=41 ce=2.5 note=a\x00b",  # a NUL in a value
    PREFIX + "LOSS-PARTS step=1000000000 ce=2.5",  # an absurd jump, not a new incarnation
]


@pytest.fixture(autouse=True)
def _account_env(monkeypatch):
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "placeholder@example.invalid")


def test_poison_lines_in_a_followed_stream_cost_only_themselves(make_simcluster, db_url):
    sim = make_simcluster(scenario({"action": "write_lines", "at_step": 40, "lines": POISON},
                                   jobsets=[{"name": "olmo3-sft", "hosts": 1,
                                             "trainer": {"steps": 120, "checkpoint_period": 1000}}]))
    sup = follow_sim(sim, db_url)
    r = assert_exactly_once(sim, db_url, "r")
    assert len(r["got"]) == 120 and not r["gaps"]  # every good step, after the poison too
    assert rows(db_url, "SELECT COUNT(*) FROM incarnations WHERE run = :r", "r") == [(1,)]
    assert "step_jump" in {kind for kind, _ in findings(db_url, "r")}
    st = sup.status["r"]
    assert st.done and st.last_step == 120 and st.failures == 0, st.errors  # no commit refused


@pytest.mark.parametrize(("at_step", "line", "odd"), [
    (40, "LOSS-PARTS step=5000 ce=2.5", 5000),  # ahead, printed with step 40: no run steps so fast
    (120, "LOSS-PARTS step=60 ce=9.5", 60),  # back, and the log ends: no step goes on from it
], ids=["ahead", "back at the end"])
def test_one_odd_loss_line_forks_nothing_on_the_live_path(make_simcluster, db_url, at_step, line, odd):
    """Before: the line ahead opened a false incarnation at step 41 (and a 4959-step gap); the
    line going back at the end was held for a next step that never came, and dropped unflagged."""
    sim = make_simcluster(scenario({"action": "write_lines", "at_step": at_step, "lines": [PREFIX + line]},
                                   jobsets=[{"name": "olmo3-sft", "hosts": 1,
                                             "trainer": {"steps": 120, "checkpoint_period": 1000}}]))
    follow_sim(sim, db_url)
    r = assert_exactly_once(sim, db_url, "r")
    assert len(r["got"]) == 120 and not r["gaps"]
    assert rows(db_url, "SELECT COUNT(*) FROM incarnations WHERE run = :r", "r") == [(1,)]
    assert [d for k, d in findings(db_url, "r") if k == "step_jump"][0].startswith(f"step {odd} after step ")
    assert "gap" not in {kind for kind, _ in findings(db_url, "r")}
    assert rows(db_url, "SELECT kind, step FROM quarantine WHERE run = :r", "r") == [("loss_parts", odd)]
