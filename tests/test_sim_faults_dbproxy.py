"""The database proxy (simcluster/dbproxy.py) against the real PostgreSQL: a cut breaks a live
connection and refuses or blackholes new ones, restore lets them in; the scenario fault
`db_outage` does the same on a schedule. The server itself is never touched."""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pytest
import sqlalchemy as sa
from store_fixtures import PG_ADMIN

from steptail.simcluster.dbproxy import DbProxy

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def proxy():
    url = sa.engine.make_url(PG_ADMIN)
    p = DbProxy(url.host or "127.0.0.1", url.port or 5432)
    p.start()
    yield p
    p.stop()


def connect(proxy: DbProxy, timeout: float = 3) -> psycopg.Connection:
    url = sa.engine.make_url(PG_ADMIN)
    return psycopg.connect(host=proxy.host, port=proxy.port, user=url.username, dbname=url.database,
                           password=url.password, connect_timeout=timeout, autocommit=True)


def one(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT 1").fetchone()[0]


def test_refuse_resets_live_connection_and_refuses_new_ones(proxy):
    conn = connect(proxy)
    assert one(conn) == 1 and proxy.connections == 1
    proxy.cut("refuse")
    with pytest.raises(psycopg.OperationalError):
        one(conn)
    with pytest.raises(psycopg.OperationalError, match="refused"):
        connect(proxy)
    assert proxy.connections == 0
    proxy.restore()
    again = connect(proxy)
    assert one(again) == 1
    again.close()
    conn.close()
    [o] = proxy.outages
    assert o.mode == "refuse" and o.to_ns is not None and o.to_ns > o.from_ns


def test_blackhole_new_connections_hang_then_resume(proxy):
    conn = connect(proxy)
    proxy.cut("blackhole")
    with pytest.raises(psycopg.OperationalError):
        one(conn)  # live connections reset by default
    t0 = time.monotonic()
    with pytest.raises(psycopg.OperationalError):
        connect(proxy, timeout=1)  # accepted by the kernel, never answered
    assert time.monotonic() - t0 >= 0.9  # it waited out its connect_timeout: nothing answered
    # a connection attempt made during the outage goes through once the network is back
    got: list = []
    t = threading.Thread(target=lambda: got.append(one(connect(proxy, timeout=20))))
    t.start()
    time.sleep(0.5)
    assert not got
    proxy.restore()
    t.join(20)
    assert got == [1]


def test_stall_hangs_a_live_connection_until_restore(proxy):
    conn = connect(proxy)
    assert one(conn) == 1
    proxy.cut("blackhole", existing="stall")
    got: list = []
    t = threading.Thread(target=lambda: got.append(one(conn)))
    t.start()
    t.join(1.0)
    assert t.is_alive() and not got  # the query hangs: a partition, not a reset
    proxy.restore()
    t.join(10)
    assert got == [1]
    conn.close()


def test_sqlalchemy_engine_through_the_proxy(proxy):
    engine = sa.create_engine(proxy.url(PG_ADMIN), pool_pre_ping=True,
                              connect_args={"connect_timeout": 2})
    try:
        with engine.connect() as c:
            assert c.execute(sa.text("SELECT 1")).scalar() == 1
        proxy.cut("refuse")
        with pytest.raises(sa.exc.OperationalError), engine.connect() as c:
            c.execute(sa.text("SELECT 1"))
        proxy.restore()
        with engine.connect() as c:  # the pool's dead connection is replaced
            assert c.execute(sa.text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()


def test_db_outage_scenario_fault(make_simcluster, proxy):
    sim = make_simcluster({"rate": 20, "jobsets": [{"name": "olmo3-sft", "hosts": 1, "trainer": {"steps": 1000}}],
                           "faults": [{"at": 0.5, "action": "db_outage", "seconds": 1.5, "mode": "refuse"}]},
                          db_proxy=proxy)
    conn = connect(proxy)
    assert one(conn) == 1
    deadline = time.monotonic() + 10
    while not proxy.outages and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proxy.outages and proxy.outages[0].mode == "refuse"
    with pytest.raises(psycopg.OperationalError):
        one(conn)
    while proxy.outages[0].to_ns is None and time.monotonic() < deadline:
        time.sleep(0.02)
    o = proxy.outages[0]
    assert o.to_ns is not None and o.to_ns - o.from_ns >= 1.5e9
    assert one(connect(proxy)) == 1
    # a restart: every connection reset, new ones welcome at once
    conn = connect(proxy)
    sim.db_outage(seconds=0)
    with pytest.raises(psycopg.OperationalError):
        one(conn)
    assert one(connect(proxy)) == 1
    assert sim.last_step() > 0  # the cluster ran on meanwhile


def test_a_cut_closes_the_server_side_sessions_too(proxy):
    url = sa.engine.make_url(PG_ADMIN)
    app = f"dbproxy-test-{uuid.uuid4().hex[:8]}"
    conns = [psycopg.connect(host=proxy.host, port=proxy.port, user=url.username, dbname=url.database,
                             password=url.password, application_name=app, autocommit=True) for _ in range(3)]
    direct = psycopg.connect(host=url.host, port=url.port or 5432, user=url.username, dbname=url.database,
                             password=url.password, autocommit=True)  # not through the proxy

    def sessions() -> int:
        return direct.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)).fetchone()[0]

    try:
        assert sessions() == 3
        proxy.cut("blackhole")
        deadline = time.monotonic() + 10
        while sessions() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sessions() == 0  # the backends saw their client go: nothing lingers on the server
    finally:
        direct.close()
        for c in conns:
            c.close()
