"""Ledger export on SQLite and on the real PostgreSQL: Parquet read back equals the store,
checksums verify, the PNG decodes, refusal without --force, nothing partial on failure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from PIL import Image
from store_fixtures import ingest_sample

import steptail
import steptail.storage.export as export_mod
from steptail.storage.export import ExportError, export_run, verify

STEPTAIL = str(Path(sys.executable).parent / "steptail")
NS = 1_000_000_000


@pytest.fixture
def loaded(store, samples):
    ingest_sample(store, samples, "rg", "resume-gap")
    ingest_sample(store, samples, "nan", "cp4-lb-nan")
    with store.engine.begin() as conn:
        # ingest stored the findings (gap 60-63 and missing REQUIRED_RBF 90-91 for rg); a
        # fixed detection time makes the exported values predictable
        conn.execute(sa.text("UPDATE findings SET detected_ns = :t"), {"t": 1_800_000_000 * NS})
        conn.execute(sa.text("UPDATE runs SET jobset = 'olmo3-sft', namespace = 'team-a' WHERE run = 'rg'"))
    return store


def _store_rows(store, sql, run):
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql), {"run": run})]


def _j(v):
    return json.loads(v) if isinstance(v, str) else v


def test_parquet_reads_back_equal_to_the_store(loaded, tmp_path):
    out = tmp_path / "rg"
    export_run(loaded, "rg", out)
    lp = pq.read_table(out / "loss_parts.parquet").to_pylist()
    want = _store_rows(loaded, "SELECT incarnation, step, ts_ns, ce, ce_raw, parts FROM loss_parts"
                               " WHERE run = :run ORDER BY incarnation, step", "rg")
    assert [(r["incarnation"], r["step"], r["ts"].value if hasattr(r["ts"], "value") else None,
             r["ce"], r["ce_raw"], json.loads(r["parts"])) for r in
            pq.read_table(out / "loss_parts.parquet").to_pandas().to_dict("records")] == \
           [(i, s, t, c, raw, _j(p)) for i, s, t, c, raw, p in want]
    assert len(lp) == 426
    rbf = pq.read_table(out / "required_rbf.parquet").to_pylist()
    want = _store_rows(loaded, "SELECT incarnation, step, max, per_layer, program FROM required_rbf"
                               " WHERE run = :run ORDER BY incarnation, step", "rg")
    assert [(r["incarnation"], r["step"], r["max"], r["per_layer"], r["program"]) for r in rbf] == \
           [(i, s, m, _j(p), prog) for i, s, m, p, prog in want]
    pm = pq.read_table(out / "pod_metrics.parquet").to_pylist()
    want = _store_rows(loaded, "SELECT incarnation, step, seconds, tokens_per_s, total_weights, loss"
                               " FROM pod_metrics WHERE run = :run ORDER BY incarnation, step", "rg")
    assert [(r["incarnation"], r["step"], r["seconds"], r["tokens_per_s"], r["total_weights"], r["loss"])
            for r in pm] == want
    f = pq.read_table(out / "findings.parquet").to_pylist()
    assert sorted((r["kind"], r["first_step"], r["last_step"], r["severity"]) for r in f) == [
        ("gap", 60, 63, "warning"), ("missing_rbf", 90, 91, "warning")]
    assert all(r["detected"].timestamp() == 1_800_000_000 for r in f)


def test_nonfinite_ce_and_untimestamped_lines(loaded, tmp_path):
    export_run(loaded, "nan", tmp_path / "nan")
    rows = pq.read_table(tmp_path / "nan" / "loss_parts.parquet").to_pylist()
    at77 = next(r for r in rows if r["step"] == 77)
    assert at77["ce"] is None and at77["ce_raw"] == "nan"
    assert all(r["ts"] is None for r in rows)


def test_manifest_describes_the_run(loaded, tmp_path, samples):
    truth = json.loads((samples / "resume-gap.truth.json").read_text())
    m = export_run(loaded, "rg", tmp_path / "rg")
    assert m == json.loads((tmp_path / "rg" / "manifest.json").read_text())
    assert (m["run"], m["jobset"], m["namespace"]) == ("rg", "olmo3-sft", "team-a")
    assert [(i["incarnation"], i["first_step"], i["last_step"], i["restored_from"]) for i in m["incarnations"]] == [
        (1, 1, 180, None), (2, 151, 400, 150)]
    assert m["step_range"] == {"first": 1, "last": 400}
    assert [(g["first_step"], g["last_step"]) for g in m["gaps"]["steps"]] == [tuple(g) for g in truth["gaps"]]
    assert m["counts"]["loss_parts"] == len(truth["loss_parts"])
    assert m["counts"]["required_rbf"] == len(truth["required_rbf"])
    assert m["counts"]["incarnations"] == truth["incarnations"] and m["counts"]["findings"] == 2
    assert m["findings"]["by_kind"] == {"gap": 1, "missing_rbf": 1}
    assert m["config"]["2"]["run_name"] == "olmo3-7b-sft"
    assert m["steptail_version"] == steptail.__version__ and m["schema_version"]
    names = {p.name for p in (tmp_path / "rg").iterdir()} - {"manifest.json"}
    assert set(m["files"]) == names == {"loss_parts.parquet", "required_rbf.parquet",
                                        "pod_metrics.parquet", "findings.parquet", "ce.png"}


def test_checksums_verify_and_catch_tampering(loaded, tmp_path):
    out = tmp_path / "rg"
    export_run(loaded, "rg", out)
    assert verify(out) == []
    data = bytearray((out / "findings.parquet").read_bytes())
    data[100] ^= 0xFF
    (out / "findings.parquet").write_bytes(bytes(data))
    assert verify(out) == ["findings.parquet"]


def test_png_decodes_and_is_not_blank(loaded, tmp_path):
    export_run(loaded, "rg", tmp_path / "rg")
    with Image.open(tmp_path / "rg" / "ce.png") as img:
        img.load()
        assert img.format == "PNG" and img.size[0] >= 600 and img.size[1] >= 300
        rgb = img.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 20)
    assert len(colours) > 20  # lines, shaded gap, text: not an empty canvas
    # the shaded gap is red-ish: some pixels have far more red than blue
    assert any(r > 200 and b < 200 and g < 200 for _, (r, g, b) in colours)


def _cli(*args):
    return subprocess.run([STEPTAIL, *args], capture_output=True, text=True, timeout=120)


def test_cli_refuses_to_overwrite_without_force(loaded, tmp_path):
    url = loaded.engine.url.render_as_string(hide_password=False)
    out = tmp_path / "bundle"
    res = _cli("export", "rg", "--out", str(out), "--db", url, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["manifest"]["run"] == "rg"
    (out / "marker").write_text("mine")
    res = _cli("export", "rg", "--out", str(out), "--db", url)
    assert res.returncode == 2 and "--force" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert (out / "marker").read_text() == "mine"
    res = _cli("export", "rg", "--out", str(out), "--db", url, "--force")
    assert res.returncode == 0, res.stderr
    assert not (out / "marker").exists() and verify(out) == []
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith("steptail.db")] == ["bundle"]
    res = _cli("export", "nope", "--out", str(tmp_path / "x"), "--db", url)
    assert res.returncode == 2 and "no run 'nope'" in res.stderr and not (tmp_path / "x").exists()


@pytest.mark.parametrize("existing", [False, True])
def test_no_partial_directory_after_a_failure(loaded, tmp_path, monkeypatch, existing):
    out = tmp_path / "exports" / "rg"
    out.parent.mkdir()
    if existing:
        export_run(loaded, "rg", out)
        before = {p.name: p.read_bytes() for p in out.iterdir()}

    def boom(*_a, **_k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(export_mod, "plot_ce", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        export_run(loaded, "rg", out, force=True)
    assert [p.name for p in out.parent.iterdir()] == (["rg"] if existing else [])
    if existing:
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_missing_parent_is_refused(loaded, tmp_path):
    with pytest.raises(ExportError, match="does not exist"):
        export_run(loaded, "rg", tmp_path / "no" / "such")


def test_export_reports_its_stages(loaded, tmp_path):
    ticks = []
    export_run(loaded, "rg", tmp_path / "b", progress=lambda done, total: ticks.append((done, total)))
    total = ticks[0][1]
    assert total > 5 and {t for _, t in ticks} == {total}
    assert [d for d, _ in ticks] == list(range(total + 1))  # every stage once, in order, to the end


def test_export_draws_a_bar_on_a_terminal_only(loaded, tmp_path):
    """A command that can run for seconds shows progress on a terminal (transient, on stderr);
    piped, as in test_cli_refuses_to_overwrite_without_force, stderr stays empty."""
    from test_terminal import on_terminal

    url = loaded.engine.url.render_as_string(hide_password=False)
    code, text = on_terminal([STEPTAIL, "export", "rg", "--out", str(tmp_path / "t"), "--db", url])
    assert code == 0, text
    assert "export rg" in text and "exported rg to" in text
    piped = _cli("export", "rg", "--out", str(tmp_path / "p"), "--db", url)
    assert piped.returncode == 0 and piped.stderr == "" and "export rg" not in piped.stdout
