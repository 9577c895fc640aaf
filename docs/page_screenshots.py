"""Regenerate the page's screenshots in docs/img/ (referenced from docs/page.md): the runs
table, a compare of three runs, and a resume from zero on the wall-clock axis, from the sample
logs in tests/samples/, served by `steptail serve` and drawn by headless Chromium.

    .venv/bin/python docs/page_screenshots.py [--out docs/img]

Each PNG is cut to the page's content and reduced to a palette of 96 colours (charts and text
need no more), so that each stays well under 200 KB in the repository."""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

STEPTAIL = str(Path(sys.executable).parent / "steptail")
CHROMIUM = "/usr/bin/chromium"
SAMPLES = ROOT / "tests" / "samples"
WIDTH, HEIGHT = 1280, 900
# (file, path, what must be drawn first, the height to keep: None for the whole view)
SHOTS = (
    ("page-overview.png", "/", "window.steptailState.ready && document.querySelectorAll('svg.spark').length >= 5",
     None),
    ("page-compare.png", "/?runs=resume-mismatch,resume-gap&control=clean-300&tolerance=0.05",
     "window.steptailState.ready && document.querySelectorAll('#delta-chart .trace').length > 0", None),
    ("page-resume-from-zero-time.png", "/?run=resume-from-zero&x=time",
     "window.steptailState.ready && window.steptailState.aids && window.steptailState.aids.timed", 700),
)


def _steptail(*args: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "STEPTAIL_DB"}
    subprocess.run([STEPTAIL, *args], check=True, capture_output=True, env=env, timeout=300)


def _serve(url: str, err: Path) -> tuple[subprocess.Popen, str]:
    env = {k: v for k, v in os.environ.items() if k != "STEPTAIL_DB"}
    with err.open("wb") as out:
        proc = subprocess.Popen([STEPTAIL, "serve", "--port", "0", "--db", url], stderr=out,
                                stdout=subprocess.DEVNULL, env=env)
    for _ in range(600):
        text = err.read_text()
        if " on http://" in text:
            return proc, text.split(" on ")[1].split(" ")[0]
        if proc.poll() is not None:
            raise SystemExit(f"steptail serve exited: {text}")
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("steptail serve did not start")


def _chromium(profile: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--mute-audio", "--hide-scrollbars",
         "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", f"--user-data-dir={profile}",
         f"--window-size={WIDTH},{HEIGHT}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    active = Path(profile) / "DevToolsActivePort"
    for _ in range(600):
        if active.exists() and len(active.read_text().splitlines()) >= 2:
            return proc, int(active.read_text().split()[0])
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("chromium did not start")


def _small(png: bytes) -> bytes:
    from PIL import Image  # matplotlib's dependency

    image = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=96, method=Image.Quantize.MEDIANCUT)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


async def _shoot(port: int, base: str, out: Path) -> None:
    from test_page import tab

    async with tab(port) as page:
        for name, path, drawn, keep in SHOTS:
            await page.goto(base + path)
            await page.until(drawn)
            await asyncio.sleep(1.0)  # plotly's last relayout (legend, annotations) settled
            # the view's own bottom: the document is at least as tall as the window
            height = keep or int(await page.eval(
                "Math.ceil(document.querySelector('main:not([hidden])').getBoundingClientRect().bottom)"))
            # the whole of it in one capture: the viewport as tall as what is kept
            await page.send("Emulation.setDeviceMetricsOverride", width=WIDTH, height=max(height, 200),
                            deviceScaleFactor=1, mobile=False)
            await asyncio.sleep(0.5)
            shot = await page.send("Page.captureScreenshot", format="png",
                                   clip={"x": 0, "y": 0, "width": WIDTH, "height": height, "scale": 1})
            data = _small(base64.b64decode(shot["data"]))
            (out / name).write_bytes(data)
            print(f"{out / name}: {len(data) // 1024} kB")
            await page.send("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT,
                            deviceScaleFactor=1, mobile=False)
        if page.errors:
            raise SystemExit(f"page errors: {page.errors}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="steptail-shots-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'steptail.db'}"
        for log in sorted(SAMPLES.glob("*.log")):
            _steptail("ingest", str(log), "--run", log.stem, "--db", url)
        server, base = _serve(url, Path(tmp) / "serve.err")
        browser, port = _chromium(str(Path(tmp) / "chromium"))
        try:
            asyncio.run(_shoot(port, base, args.out))
        finally:
            browser.terminate()
            browser.wait()
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
