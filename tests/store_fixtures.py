"""Stores for tests: a fresh SQLite file and a fresh database on the machine's real PostgreSQL."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import pytest

from steptail.storage.db import open_store
from steptail.storage.scratch import scratch_database

PG_ADMIN = os.environ.get("STEPTAIL_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def ingest_sample(store, samples: Path, run: str, name: str) -> None:
    """Ingest tests/samples/<name>.log into `run` (findings stored with the rows)."""
    from steptail.collector.offline.files import open_source
    from steptail.collector.offline.ingest import ingest

    src = open_source(str(samples / f"{name}.log"))
    try:
        ingest(store, run, [src])
    finally:
        src.close()


def samples_dir() -> Path:
    """The sample logs and their ground truth, kept in the repository (tests/samples)."""
    return Path(__file__).resolve().parent / "samples"


@contextmanager
def at_revision(db_url: str, revision: str):
    """A connection (one transaction) to the store at `db_url`, migrated to `revision` only:
    a database left by an earlier release, for the rows its schema held."""
    import sqlalchemy as sa
    from alembic import command
    from alembic.config import Config

    from steptail.storage.db import MIGRATIONS, _engine

    engine = _engine(sa.make_url(db_url))
    try:
        with engine.begin() as conn:
            cfg = Config()
            cfg.set_main_option("script_location", str(MIGRATIONS))
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
            yield conn
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path) -> str:
    """A URL of an empty store, once for SQLite and once for the real PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'steptail.db'}"
        return
    with scratch_database(PG_ADMIN, "steptail_test") as url:
        yield url


@pytest.fixture
def store(db_url):
    s = open_store(db_url)
    yield s
    s.dispose()


@pytest.fixture(scope="session")
def samples() -> Path:
    return samples_dir()
