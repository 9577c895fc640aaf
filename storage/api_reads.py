"""The HTTP API's hot reads: a run's state (what its ETag is made of) and a page of its steps
as JSON bytes, built without SQLAlchemy rows, per-row dicts of parsed JSON or json.dumps.

A page is the same rows as reads.iter_steps (its `after`, `from`/`to`, `offset`, `limit`) and
JSON-equal to them: the stored JSON columns (parts, per_layer) go into the body as the store
holds them (orjson.Fragment), numbers through orjson (shortest round-trip, as json.dumps;
only the spelling of exponents and non-ASCII text may differ), non-finite floats as null."""

from __future__ import annotations

import functools
import json
from datetime import UTC, datetime

import orjson
import sqlalchemy as sa

from steptail.storage import step_columns as sc

KEYS = sc.KEYS  # incarnation, step, ts, then each declared column of LOSS-PARTS and REQUIRED_RBF
_BIG = 2**31 - 1

# A run's state: every commit that adds or changes its steps moves one of these. An ingest
# (and a reparse, which ingests) touches runs.updated_ns; follow touches it once, then the
# cursors of the streams it read at every commit; the last keys catch rows added by anything
# else. NULL row: no such run.
_STATE = """
SELECT r.updated_ns,
  (SELECT MAX(c.updated_ns) FROM cursors c WHERE c.run = r.run),
  (SELECT l.incarnation * 4294967296 + l.step FROM loss_parts l WHERE l.run = r.run
     ORDER BY l.incarnation DESC, l.step DESC LIMIT 1),
  (SELECT q.incarnation * 4294967296 + q.step FROM required_rbf q WHERE q.run = r.run
     ORDER BY q.incarnation DESC, q.step DESC LIMIT 1)
FROM runs r WHERE r.run = :run
"""

# Both halves walk the primary key (run, incarnation, step) from `after` and stop at their
# LIMIT; a row comparison is what lets the index start there (an OR of two ranges scanned
# the whole run). They are joined here, not in SQL: two range scans cost a fraction of a
# thousand index probes for the join and as many for the REQUIRED_RBF-only rows.
_LOSS = f"""
SELECT incarnation, step, ts_ns, {sc.columns(sc.LOSS_COLS, json_text=True)} FROM loss_parts
WHERE run = :run AND (incarnation, step) > (:ai, :as_) AND +step >= :lo AND +step <= :hi
ORDER BY incarnation, step LIMIT :n
"""
_RBF = f"""
SELECT incarnation, step, ts_ns, {sc.columns(sc.RBF_COLS, json_text=True)} FROM required_rbf
WHERE run = :run AND (incarnation, step) > (:ai, :as_) AND +step >= :lo AND +step <= :hi{{bound}}
ORDER BY incarnation, step LIMIT :m
"""
_BOUND = " AND (incarnation, step) <= (:bi, :bs)"
# With an offset (rare: keyset paging is the way) the store skips the rows, not Python.
_OFFSET = f"""
SELECT l.incarnation, l.step, l.ts_ns, {sc.columns(sc.LOSS_COLS, "l", json_text=True)},
       {sc.columns(sc.RBF_COLS, "r", json_text=True)}
FROM loss_parts l LEFT JOIN required_rbf r
  ON r.run = l.run AND r.incarnation = l.incarnation AND r.step = l.step
WHERE l.run = :run AND (l.incarnation, l.step) > (:ai, :as_) AND l.step >= :lo AND l.step <= :hi
UNION ALL
SELECT r.incarnation, r.step, r.ts_ns, {sc.nulls(sc.LOSS_COLS)}, {sc.columns(sc.RBF_COLS, "r", json_text=True)}
FROM required_rbf r
WHERE r.run = :run AND (r.incarnation, r.step) > (:ai, :as_) AND r.step >= :lo AND r.step <= :hi
  AND NOT EXISTS (SELECT 1 FROM loss_parts l
                  WHERE l.run = r.run AND l.incarnation = r.incarnation AND l.step = r.step)
ORDER BY 1, 2 LIMIT :limit OFFSET :offset
"""
# A token json.loads reads but no JSON has (SQLite's TEXT holds what it was given): such a
# page is parsed, and its non-finite numbers become null as everywhere else.
_NOT_JSON = ("NaN", "Infinity")
_NO_LOSS = (None,) * len(sc.LOSS_COLS)
_NO_RBF = (None,) * len(sc.RBF_COLS)
# Made once: a TextClause parses its SQL for bind names when built, ~10 µs a statement.
_STATE_SQL = sa.text(_STATE)
# Each JSON field: its place in a row, and its column as the selects spell it (bare, or of l. or r.)
_JSON_FIELDS = tuple((i, name, col.name) for i, (name, col) in enumerate(sc.FIELDS, start=3)
                     if col.type in sc.JSON_TYPES)
_JSON_AT = tuple(i for i, _, _ in _JSON_FIELDS)


@functools.cache
def _statement(sql: str, unwanted: frozenset[str]) -> sa.TextClause:
    """`sql` as a statement, with NULL for the JSON fields not wanted: the widest of a row,
    and on SQLite most of its reading."""
    for _, name, column in _JSON_FIELDS:
        if name in unwanted:
            for alias in ("", "l.", "r."):
                sql = sql.replace(f"CAST({alias}{column} AS TEXT)", "NULL")
    return sa.text(sql)


def run_state(conn: sa.Connection, run: str) -> tuple | None:
    """What the run's ETag is made of; None when there is no such run."""
    row = conn.execute(_STATE_SQL, {"run": run}).first()
    return None if row is None else tuple(row)


def step_rows(conn: sa.Connection, run: str, lo: int | None, hi: int | None, offset: int,
              limit: int, after: tuple[int, int] | None, fields: tuple[str, ...] | None = None) -> list[tuple]:
    """The rows of iter_steps(run, lo, hi, offset, limit, after) in KEYS' order, but ts_ns
    for ts and the JSON columns as the store's text (None when not among `fields`)."""
    unwanted = frozenset() if fields is None else frozenset(n for _, n, _ in _JSON_FIELDS if n not in fields)
    ai, as_ = after if after is not None else (-1, -1)
    params = {"run": run, "lo": -1 if lo is None else lo, "hi": _BIG if hi is None else hi,
              "ai": ai, "as_": as_, "n": limit}
    if offset:
        return [tuple(r) for r in conn.execute(_statement(_OFFSET, unwanted), params | {"limit": limit, "offset": offset})]
    loss = conn.execute(_statement(_LOSS, unwanted), params).all()
    # The page's REQUIRED_RBF rows are at most one per LOSS-PARTS row plus `limit` alone,
    # and none lies beyond the last row of a full page.
    bound = _BOUND if len(loss) == limit else ""
    if bound:
        params |= {"bi": loss[-1][0], "bs": loss[-1][1]}
    rbf = conn.execute(_statement(_RBF.format(bound=bound), unwanted), params | {"m": limit + len(loss)}).all()
    return _joined(loss, rbf, limit)


def _joined(loss: list, rbf: list, limit: int) -> list[tuple]:
    """LOSS-PARTS rows with their REQUIRED_RBF, and REQUIRED_RBF rows alone, in key order."""
    by_key = {(r[0], r[1]): r for r in rbf}
    rows = [(*row, *(r[3:] if (r := by_key.pop((row[0], row[1]), None)) else _NO_RBF)) for row in loss]
    if not by_key:  # the usual page: every probe row has its LOSS-PARTS row
        return rows
    rows += [(*r[:3], *_NO_LOSS, *r[3:]) for r in by_key.values()]
    rows.sort(key=lambda r: (r[0], r[1]))
    return rows[:limit]


def steps_json(rows: list[tuple], fields: tuple[str, ...] | None = None) -> bytes:
    """The JSON array of step_rows' rows, as reads.iter_steps' dicts would print; only `fields`
    of each (in KEYS' order) when given: the others are not made (a timestamp costs 2 µs a row)."""
    texts = "\0".join(t for r in rows for i in _JSON_AT if (t := r[i]) is not None)
    as_json = json.loads if any(word in texts for word in _NOT_JSON) else orjson.Fragment
    made = [(k, _FIELD[k]) for k in fields or KEYS]
    return orjson.dumps([{k: make(row, as_json) for k, make in made} for row in rows])


def _field(i: int, name: str, col) -> object:
    """How field `name` (at `i` of a step_rows row) is made, with its page's JSON reader."""
    if col.type in sc.JSON_TYPES:  # (an empty map shared by the rows of a page: dumped, never kept)
        absent = sc.absent(col)
        return lambda r, as_json: absent if r[i] is None else as_json(r[i])
    return lambda r, _: r[i]


_FIELD = {  # each field of a step, from a step_rows row and the JSON reader of its page
    "incarnation": lambda r, _: r[0], "step": lambda r, _: r[1], "ts": lambda r, _: _ts(r[2]),
    **{name: _field(i, name, col) for i, (name, col) in enumerate(sc.FIELDS, start=3)},
}
assert tuple(_FIELD) == KEYS


def _ts(ns: int | None) -> str | None:
    """parsers.format_ns, with the date and time to the minute made once a minute."""
    if ns is None:
        return None
    secs, frac = divmod(ns, 1_000_000_000)
    minute, sec = divmod(secs, 60)
    whole = _minute(minute) + _SECONDS[sec]
    return f"{whole}.{frac:09d}".rstrip("0") + "Z" if frac else whole + "Z"


_SECONDS = tuple(f"{s:02d}" for s in range(60))


@functools.lru_cache(maxsize=1 << 14)
def _minute(minute: int) -> str:
    return datetime.fromtimestamp(minute * 60, UTC).strftime("%Y-%m-%dT%H:%M:")
