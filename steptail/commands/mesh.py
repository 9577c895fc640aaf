"""`steptail mesh`: the measured mesh table, per slice shape and mesh configuration."""

from __future__ import annotations

import click

from steptail.commands._common import db_option, fail, store_or_exit
from steptail.output import Column, output_option
from steptail.storage.mesh import iso_ns, mesh_table


def _num(key: str, fmt: str):
    return lambda r: None if r.get(key) is None else fmt.format(r[key])


COLUMNS = [
    Column("topology", lambda r: r["topology"] or "?", keep=True),
    Column("hosts", lambda r: r["hosts"] if r["hosts"] is not None else "?"),
    Column("mesh", lambda r: " ".join(f"{k}={v}" for k, v in r["mesh"].items()) or "(no config lines)", keep=True),
    Column("runs", lambda r: len(r["runs"])),
    Column("median step s", _num("median_step_s", "{:.3f}"), keep=True),
    Column("tokens/s/device", _num("tokens_per_s_device", "{:.1f}")),
    Column("tflop/s/device", _num("tflops_per_device", "{:.2f}")),
    Column("goodput", lambda r: None if r["goodput"] is None else f"{100 * r['goodput']:.1f}%"),
    Column("control", lambda r: "?" if r["control"] is None else ("yes" if r["control"] else "no")),
    Column("run names", lambda r: ", ".join(r["runs"]), wide=True),
]


def _time(value: str | None, option: str) -> int | None:
    if value is None:
        return None
    try:
        return iso_ns(value)
    except ValueError:
        fail(f"{option}: not an ISO 8601 time: {value!r} (e.g. 2026-11-30 or 2026-11-30T04:00:00Z)")


@click.command()
@click.option("--run", "pattern", metavar="PATTERN", help="Only runs whose name matches this shell glob (qwen3-*).")
@click.option("--since", metavar="TIME", help="Only runs with steps at or after TIME (ISO 8601, UTC unless given).")
@click.option("--until", metavar="TIME", help="Only runs with steps at or before TIME.")
@db_option
@output_option()
def command(pattern: str | None, since: str | None, until: str | None, db: str | None, output) -> None:
    """The measured mesh table: per slice topology and host count and per mesh configuration
    (ici_*/dcn_* parallelism, per_device_batch_size, max_target_length from the Config param
    lines), the runs, their median step time, tokens/s/device, TFLOP/s/device and goodput, and
    whether a same-shape control exists (another mesh measured on the same slice).
    Topology and hosts are known for followed runs ("?" for saved logs, and so is the control).

    \b
    Examples:
      steptail mesh
      steptail mesh --run 'qwen3-*' --since 2026-11-30 -o json
    """
    since_ns, until_ns = _time(since, "--since"), _time(until, "--until")
    store = store_or_exit(db, create=False)
    rows = mesh_table(store, pattern, since_ns, until_ns)
    if output.machine:
        output.data(rows)
    elif rows or output.piped:
        output.table(COLUMNS, rows)
    else:
        output.line("no run with a measured step time matches")
