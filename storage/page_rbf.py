"""A run's per-layer REQUIRED_RBF for the page's panel, asked only when the panel is opened:
steps `from`..`to` cut into at most `buckets` buckets, and per bucket each layer's largest
value (a layer's spike shows however wide the bucket) with the bucket's largest `max`.

The per-layer values are a JSON array per step, the bulk of a run's bytes, so the read is
bounded: at most ROWS_MAX rows are parsed. A wider range reads every `stride`-th step (said in
the answer, and by the page), which the page narrows by zooming."""

from __future__ import annotations

import orjson
import sqlalchemy as sa

ROWS_MAX = 20_000  # per-layer arrays parsed per answer (48 layers: about 6 MB of JSON read)
BUCKETS_MAX = 1000

_SPAN = sa.text("SELECT MIN(step), MAX(step) FROM required_rbf WHERE run = :run")
_ROWS = sa.text("""
SELECT incarnation, step, max, CAST(per_layer AS TEXT) FROM required_rbf
WHERE run = :run AND step >= :lo AND step <= :hi AND (step - :lo) % :stride = 0
ORDER BY incarnation, step
""")
COLUMNS = ("k", "n", "s0", "s1", "max", "layers")


def rbf_layers(conn: sa.Connection, run: str, buckets: int, lo: int | None = None, hi: int | None = None,
               rows_max: int = ROWS_MAX) -> dict:
    """{"from", "to", "width", "stride", "layers", "columns", "incarnations": [{"incarnation",
    "rows"}]}: each row [k, rows read, first step, last step, largest max, [largest value of
    each layer]]; `layers` the most layers a row held."""
    if lo is None or hi is None:
        first, last = conn.execute(_SPAN, {"run": run}).one()
        lo = first if lo is None else lo
        hi = last if hi is None else hi
    out = {"from": lo, "to": hi, "width": None, "stride": None, "layers": 0, "columns": list(COLUMNS),
           "incarnations": []}
    if lo is None or hi is None or lo > hi:
        return out
    span = hi - lo + 1
    stride = -(-span // rows_max)  # ceil: at most rows_max steps of each incarnation read
    # at most `buckets` buckets, each of whole strides: each holds the same number of rows read
    narrowest = -(-span // buckets)
    width = stride * -(-narrowest // stride)
    incs: dict[int, dict[int, list]] = {}
    layers = 0
    for inc, step, top, text in conn.execute(_ROWS, {"run": run, "lo": lo, "hi": hi, "stride": stride}):
        values = orjson.loads(text) if text else []
        layers = max(layers, len(values))
        k = (step - lo) // width
        b = incs.setdefault(inc, {}).get(k)
        if b is None:
            incs[inc][k] = [k, 1, step, step, top, list(values)]
            continue
        b[1] += 1
        b[3] = step
        if top is not None:
            b[4] = top if b[4] is None else max(b[4], top)
        kept = b[5]
        for j, v in enumerate(values):
            if j >= len(kept):
                kept.append(v)
            elif v is not None and (kept[j] is None or v > kept[j]):
                kept[j] = v
    out.update(width=width, stride=stride, layers=layers,
               incarnations=[{"incarnation": inc, "rows": [by_k[k] for k in sorted(by_k)]}
                             for inc, by_k in sorted(incs.items())])
    return out
