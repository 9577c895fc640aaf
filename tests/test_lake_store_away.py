"""The object store away for ~10 s under a lake write (issue 34, row 10): the store's client
retries in silence, so the write is said while it runs long (one warning line), and its end
(done, the store answers again; or failed, why) one more; the rows land exactly once after.
A real moto S3 server of the test's own, stopped (SIGSTOP: connections hang, as a store that is
away) and continued 10 s later; the catalog in both stores."""

from __future__ import annotations

import logging
import os
import signal
import threading

import pytest
from lake_support import keys, steps
from object_store_support import running_moto_s3, unique_prefix

from steptail.storage.lake import Lake, LakeError
from steptail.storage.slow_writes import SLOW_S

pytestmark = pytest.mark.timeout(180)
AWAY_S = 10.0


def test_a_store_away_under_a_write_is_said_when_it_starts_and_ends(store, tmp_path, no_metadata_servers,
                                                                    caplog):
    caplog.set_level(logging.INFO, logger="steptail.lake")
    (tmp_path / "moto").mkdir()
    with running_moto_s3(tmp_path / "moto", no_metadata_servers) as emulator:
        url = emulator.url(unique_prefix("away"))
        lake = Lake(url, store.catalog_url(), env=emulator.env)
        lake.append("loss_parts", {"a": steps("a", 1, 11)})  # the table made, the store healthy
        assert not [r for r in caplog.records if "object store" in r.getMessage()]

        os.kill(emulator.process.pid, signal.SIGSTOP)
        back = threading.Timer(AWAY_S, os.kill, (emulator.process.pid, signal.SIGCONT))
        back.start()
        try:
            try:
                lake.append("loss_parts", {"a": steps("a", 11, 21)})
                ended = "done"
            except LakeError:
                ended = "failed"
        finally:
            back.join()
            os.kill(emulator.process.pid, signal.SIGCONT)
        said = [r.getMessage() for r in caplog.records if r.name == "steptail.lake" and "append to loss_parts" in
                r.getMessage()]
        assert len(said) == 2, said
        assert f"still running after {SLOW_S:.0f} s: the object store is away or slow" in said[0]
        assert f"{ended} after" in said[1], said
        assert lake.slow.spells == 1
        # after: the rows land once, whichever way the write under the outage ended
        lake.append("loss_parts", {"a": steps("a", 11, 21)})
        assert keys(Lake(url, store.catalog_url(), env=emulator.env), "a") == [("a", 1, s) for s in range(1, 21)]
