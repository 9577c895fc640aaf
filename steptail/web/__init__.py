"""The web page of `steptail serve` (docs/page.md): its static files, kept in this folder as
they are served (no build step), and plotly.js, read from the installed `plotly` package (a
dependency) so that the page needs no CDN and no download at run time.

An asset is read once and kept in memory with its gzip form and ETag; steptail/http/routes/page.py answers with it.
Nothing here comes from the store: the page reads the JSON API."""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
CHART_LIBRARY = "plotly.min.js"
# name -> content type; only these are served
TYPES = {
    "index.html": "text/html",
    "page.js": "text/javascript",
    "page.css": "text/css",
    CHART_LIBRARY: "text/javascript",
}
# The page runs only its own scripts (no inline script, no eval) and talks to its own origin.
# plotly.js sets inline styles, hence style-src 'unsafe-inline'; it draws with SVG and canvas.
PAGE_HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                                "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; "
                                "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"),
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


class Asset(NamedTuple):
    body: bytes
    gzipped: bytes
    etag: str
    content_type: str


class MissingLibrary(LookupError):
    """The charting library's package is not installed."""


def chart_library() -> Path:
    """plotly.min.js of the installed `plotly` package (found without importing plotly)."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise MissingLibrary("the plotly package is not installed (pip install plotly)")
    path = Path(next(iter(spec.submodule_search_locations))) / "package_data" / CHART_LIBRARY
    if not path.is_file():
        raise MissingLibrary(f"{path} is missing: reinstall plotly")
    return path


def path_of(name: str) -> Path | None:
    """The file behind an asset name, None for any name not served."""
    if name not in TYPES:
        return None
    return chart_library() if name == CHART_LIBRARY else HERE / name


@functools.cache
def asset(name: str) -> Asset | None:
    """The asset `name` (read and compressed on first use), None for any name not served."""
    path = path_of(name)
    if path is None:
        return None
    body = path.read_bytes()
    tag = '"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"'
    return Asset(body, gzip.compress(body, compresslevel=6, mtime=0), tag, TYPES[name])
