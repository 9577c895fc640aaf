"""The alert outbox: one row per (finding, webhook) waiting to be POSTed, kept in the store's
`alert_outbox` table (SqlOutbox, migration 0004) or, without a store, in memory (MemoryOutbox).

Rows are added in the transaction that stores their findings (SqlOutbox.add), so no delivery
is lost between that commit and the POST. The delivery worker (steptail.collector.notify.webhooks)
claims rows under a lease (two collectors sharing a store never send one row at once; a
killed collector's lease simply expires) and marks each delivered, rejected, or still pending.

A webhook is stored by the SHA-256 of its URL (`webhook_key`: the URL's path or query often
carries a secret) and shown only redacted (`redact`: scheme://host[:port])."""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit

import sqlalchemy as sa

PENDING, DELIVERED, REJECTED = "pending", "delivered", "rejected"
HOST_MAX = 300  # alert_outbox.webhook_host


def redact(url: str) -> str:
    """scheme://host[:port] of a webhook URL: its path and query often carry the secret."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or '?'}{f':{parts.port}' if parts.port else ''}"


def webhook_key(url: str) -> str:
    """What the outbox stores for a webhook: its URL's path or query often holds a secret."""
    return hashlib.sha256(url.encode()).hexdigest()


@dataclass(frozen=True)
class Delivery:
    id: int
    finding_id: str
    payload: str  # JSON text, POSTed as is


# An outbox row to add: (finding_id, webhook key, webhook host, run, payload, created_ns).
Row = tuple[str, str, str, str, str, int]


class SqlOutbox:
    """The `alert_outbox` table of a store (migration 0004)."""

    durable = True

    def __init__(self, store) -> None:
        self.store = store

    @staticmethod
    def add(conn: sa.Connection, rows: list[Row]) -> None:
        """In the caller's transaction; a (finding, webhook) already there is left alone."""
        if not rows:
            return
        ph = "?" if conn.dialect.paramstyle == "qmark" else "%s"
        conn.exec_driver_sql(
            "INSERT INTO alert_outbox (finding_id, webhook, webhook_host, run, payload, created_ns)"
            f" VALUES ({', '.join([ph] * 6)}) ON CONFLICT (finding_id, webhook) DO NOTHING", rows)

    def add_now(self, rows: list[Row]) -> None:
        with self.store.engine.begin() as conn:
            self.add(conn, rows)

    def claim(self, webhook: str, limit: int, now_ns: int, lease_until_ns: int) -> list[Delivery]:
        """Up to `limit` pending rows of `webhook`, oldest first, leased to this process."""
        with self.store.engine.connect() as conn:
            found = conn.execute(sa.text(
                "SELECT id, finding_id, payload FROM alert_outbox WHERE webhook = :w AND state = 'pending'"
                " AND (lease_ns IS NULL OR lease_ns < :now) ORDER BY id LIMIT :n"),
                {"w": webhook, "now": now_ns, "n": limit}).all()
        if not found:
            return []
        claimed = []
        # A separate write transaction: on SQLite a read upgraded to a write can fail at once
        # instead of waiting for the busy timeout. The conditional UPDATE is the claim.
        with self.store.engine.begin() as conn:
            for row_id, finding_id, payload in found:
                res = conn.execute(sa.text(
                    "UPDATE alert_outbox SET lease_ns = :until WHERE id = :id AND state = 'pending'"
                    " AND (lease_ns IS NULL OR lease_ns < :now)"),
                    {"until": lease_until_ns, "id": row_id, "now": now_ns})
                if res.rowcount == 1:
                    claimed.append(Delivery(row_id, finding_id, payload))
        return claimed

    def done(self, row_id: int, state: str, now_ns: int, error: str | None = None) -> None:
        """One attempt ended: delivered, rejected, or still pending (failed, to be retried)."""
        delivered = ", delivered_ns = :now" if state == DELIVERED else ""
        with self.store.engine.begin() as conn:
            conn.execute(sa.text(
                "UPDATE alert_outbox SET state = :state, attempts = attempts + 1, last_attempt_ns = :now,"
                f" last_error = :error, lease_ns = NULL{delivered} WHERE id = :id"),
                {"state": state, "now": now_ns, "error": error[:200] if error else None, "id": row_id})

    def release(self, row_ids: list[int]) -> None:
        """Rows whose attempt was cut short (shutdown): free for the next collector at once."""
        if not row_ids:
            return
        with self.store.engine.begin() as conn:
            conn.execute(sa.text("UPDATE alert_outbox SET lease_ns = NULL WHERE id IN :ids AND state = 'pending'")
                         .bindparams(sa.bindparam("ids", expanding=True)), {"ids": row_ids})

    def pending(self) -> dict[str, int]:
        """Pending rows per webhook key."""
        with self.store.engine.connect() as conn:
            return {w: n for w, n in conn.execute(sa.text(
                "SELECT webhook, COUNT(*) FROM alert_outbox WHERE state = 'pending' GROUP BY webhook"))}


class MemoryOutbox:
    """The same, for an Alerter without a store: lost at exit."""

    durable = False

    def __init__(self) -> None:
        self._rows: dict[int, dict] = {}
        self._keys: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def add(self, _conn, rows: list[Row]) -> None:
        with self._lock:
            for finding_id, webhook, _host, _run, payload, _created in rows:
                if (finding_id, webhook) not in self._keys:
                    self._keys.add((finding_id, webhook))
                    self._rows[len(self._keys)] = {"finding_id": finding_id, "webhook": webhook,
                                                   "payload": payload, "state": PENDING, "lease_ns": None}

    def add_now(self, rows: list[Row]) -> None:
        self.add(None, rows)

    def claim(self, webhook: str, limit: int, now_ns: int, lease_until_ns: int) -> list[Delivery]:
        out = []
        with self._lock:
            for row_id, r in self._rows.items():
                if len(out) >= limit:
                    break
                if r["webhook"] == webhook and r["state"] == PENDING and (r["lease_ns"] or 0) < now_ns:
                    r["lease_ns"] = lease_until_ns
                    out.append(Delivery(row_id, r["finding_id"], r["payload"]))
        return out

    def done(self, row_id: int, state: str, now_ns: int, error: str | None = None) -> None:
        with self._lock:
            r = self._rows[row_id]
            r["state"], r["lease_ns"] = state, None
            if state != PENDING:
                r["payload"] = ""  # only the key is needed now, to send a finding once

    def release(self, row_ids: list[int]) -> None:
        with self._lock:
            for row_id in row_ids:
                self._rows[row_id]["lease_ns"] = None

    def pending(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        with self._lock:
            for r in self._rows.values():
                if r["state"] == PENDING:
                    counts[r["webhook"]] = counts.get(r["webhook"], 0) + 1
        return counts
