"""Stores for tests: a fresh SQLite file and a fresh database on the machine's real PostgreSQL."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from storage.db import open_store

PG_ADMIN = os.environ.get("STEPTAIL_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def samples_dir() -> Path:
    for base in (Path(__file__).resolve().parents[1], *Path(__file__).resolve().parents[1].parents):
        cand = base / "shared" / "samples"
        if cand.is_dir():
            return cand
    raise RuntimeError("shared/samples not found next to the checkout")


def make_pg_database() -> tuple[str, callable]:
    """Create an empty PostgreSQL database; returns its URL and a function that drops it."""
    name = f"steptail_test_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return url, drop


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path) -> str:
    """A URL of an empty store, once for SQLite and once for the real PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'steptail.db'}"
        return
    url, drop = make_pg_database()
    yield url
    drop()


@pytest.fixture
def store(db_url):
    s = open_store(db_url)
    yield s
    s.dispose()


@pytest.fixture(scope="session")
def samples() -> Path:
    return samples_dir()
