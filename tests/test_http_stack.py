"""The environment's HTTP stack is plain urllib3: no urllib3-future, whose .pth file copies
itself over `urllib3` for every package (the kubernetes client included), and nothing that
brings it (niquests, grafana-client; dashboards/grafana_api.py does their job on aiohttp)."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import site
from importlib import metadata
from pathlib import Path

import pytest

FORK = ("urllib3-future", "niquests", "grafana-client")


@pytest.mark.parametrize("name", FORK)
def test_not_installed(name):
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version(name)


@pytest.mark.parametrize("module", ["urllib3_future", "niquests", "grafana_client"])
def test_not_importable(module):
    assert importlib.util.find_spec(module) is None


def test_no_pth_file_replaces_urllib3():
    for folder in {*site.getsitepackages(), site.getusersitepackages()}:
        for pth in Path(folder).glob("*.pth"):
            assert "urllib3" not in pth.read_text(errors="replace"), pth


def test_urllib3_is_the_real_one():
    import urllib3

    dist = metadata.distribution("urllib3")
    assert urllib3.__version__ == dist.version  # the fork's are 2.2x.9xx under urllib3's name
    init = Path(urllib3.__file__).resolve()
    assert "urllib3_future" not in str(init)
    assert not (init.parent / ".u3f_sync").exists()  # the fork's marker of a copy over urllib3
    # byte for byte the __init__.py that urllib3's wheel installed (its RECORD hash)
    record = next(f for f in dist.files if Path(dist.locate_file(f)).resolve() == init)
    digest = hashlib.new(record.hash.mode, init.read_bytes()).digest()
    assert base64.urlsafe_b64encode(digest).rstrip(b"=").decode() == record.hash.value
