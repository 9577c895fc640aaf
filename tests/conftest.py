import os
import tempfile

import pytest

# ---- object stores: moto's S3 server and fake-gcs-server, one each per session (per xdist worker) ----
from object_store_support import fake_gcs, moto_s3, no_metadata_servers  # noqa: F401

# ---- simulated cluster fixtures (simcluster/) ----
from sim_fixtures import make_simcluster, simcluster  # noqa: F401

# ---- stores: fresh SQLite and fresh real PostgreSQL databases; the sample logs (tests/samples) ----
from store_fixtures import db_url, samples, store  # noqa: F401


# ---- parallel runs (pytest-xdist): each worker its own temporary directory ----
@pytest.fixture(scope="session", autouse=True)
def _worker_tmpdir(tmp_path_factory):
    """Under xdist, TMPDIR (and tempfile's default) is a folder of this worker's own, inside its
    pytest basetemp: what one test makes in the temporary directory (or checks is not there) is
    never another worker's. Ports are ephemeral (0), databases uniquely named (scratch_database),
    the rest under tmp_path. A serial run (-n 0, -p no:xdist) keeps the usual TMPDIR."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    tmp = tmp_path_factory.mktemp("tmp", numbered=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TMPDIR", str(tmp))
        mp.setattr(tempfile, "tempdir", str(tmp))
        yield


# ---- `make quick`: the tests marked `slow` (and `image`) are left out of the inner loop ----
# Modules whose every test is slow (long follow scenarios on the simulated clock, seeded chaos,
# soak, the demo), measured with `pytest --durations` on 2 busy cores; a module here is marked
# from outside (its own pytestmark untouched).
SLOW = {
    "test_chaos.py", "test_follow_soak.py", "test_demo.py",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SLOW:
            item.add_marker(pytest.mark.slow)
