"""storage.object_store: locations, FileIO properties from the environment, and real pyiceberg
round trips on a local folder, moto's S3 server and fake-gcs-server. Nothing is ever deleted in
a bucket, not even the manifests of a commit that lost a conflict."""

from __future__ import annotations

import logging

import pyarrow as pa
import pytest
from object_store_support import (  # noqa: F401
    fake_gcs,
    moto_s3,
    no_metadata_servers,
    running_fake_gcs,
    running_moto_s3,
    unique_prefix,
)
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import DoubleType, LongType, NestedField, StringType

from steptail.storage.object_store import (
    NO_DELETE_FILE_IO,
    Location,
    NoDeleteFileIO,
    describe,
    io_properties,
    list_objects,
    parse_location,
)

# ---- parse_location ----


@pytest.mark.parametrize(
    "text, expected",
    [
        ("s3://bkt/some/prefix", Location("s3", "bkt", "some/prefix", "s3://bkt/some/prefix")),
        ("s3://bkt/some/prefix/", Location("s3", "bkt", "some/prefix", "s3://bkt/some/prefix")),
        ("S3://my.bucket-1/p", Location("s3", "my.bucket-1", "p", "s3://my.bucket-1/p")),
        ("s3://bkt", Location("s3", "bkt", "", "s3://bkt")),
        ("gs://my_bucket/a/b", Location("gs", "my_bucket", "a/b", "gs://my_bucket/a/b")),
        ("file:///srv/iceberg", Location("file", "", "/srv/iceberg", "file:///srv/iceberg")),
        ("file://localhost/srv/ice", Location("file", "", "/srv/ice", "file:///srv/ice")),
        ("file:///srv/a%20b", Location("file", "", "/srv/a b", "file:///srv/a b")),
        ("/srv/iceberg/", Location("file", "", "/srv/iceberg", "file:///srv/iceberg")),
    ],
)
def test_parse_location_accepts(text, expected):
    assert parse_location(text) == expected


def test_parse_location_makes_a_relative_path_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    loc = parse_location("warehouse/ice")
    assert loc == Location("file", "", f"{tmp_path}/warehouse/ice", f"file://{tmp_path}/warehouse/ice")


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "empty"),
        ("   ", "empty"),
        ("http://example.com/x", "scheme 'http'"),
        ("https://bkt.s3.amazonaws.com/x", "scheme 'https'"),
        ("gcs://bkt/x", "use gs://"),
        ("s3a://bkt/x", "use s3://"),
        ("s3:///prefix", "no bucket name"),
        ("s3://", "no bucket name"),
        ("gs:///", "no bucket name"),
        ("s3://Bkt/x", "not a valid s3 bucket"),
        ("s3://my_bucket/x", "not a valid s3 bucket"),
        ("s3://ab/x", "not a valid s3 bucket"),
        ("s3://user@bkt/x", "not a valid s3 bucket"),
        ("s3://bkt:9000/x", "not a valid s3 bucket"),
        ("s3://bkt/a/../b", "'..'"),
        ("gs://bkt/a//b", "empty"),
        ("gs://bkt/./b", "'.'"),
        ("/srv/../etc", "'..'"),
        ("../up", "'..'"),
        ("file://../x", "names a host"),
        ("file://host/srv", "names a host"),
        ("file:relative", "without '//'"),
        ("s3:bkt/x", "without '//'"),
        ("s3://bkt/x?versionId=1", "'?'"),
        ("/srv/a#b", "'#'"),
        ("/", "root"),
    ],
)
def test_parse_location_refuses(text, reason):
    with pytest.raises(ValueError) as err:
        parse_location(text)
    message = str(err.value)
    assert reason in message
    assert "\n" not in message


# ---- io_properties and describe ----

S3 = parse_location("s3://bkt/p")
GS = parse_location("gs://bkt/p")


def test_io_properties_s3_from_env_names():
    env = {
        "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t-value",
        "AWS_SESSION_TOKEN": "tok3n-value",
        "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000/",
    }
    props = io_properties(S3, env)
    assert props == {
        "py-io-impl": NO_DELETE_FILE_IO,
        "s3.access-key-id": "AKIDEXAMPLE",
        "s3.secret-access-key": "s3cr3t-value",
        "s3.session-token": "tok3n-value",
        "s3.region": "eu-west-1",
        "s3.endpoint": "http://127.0.0.1:9000",
    }
    line = describe(S3, props)
    assert "http://127.0.0.1:9000" in line and "keys from the environment" in line
    for secret in ("AKIDEXAMPLE", "s3cr3t-value", "tok3n-value"):
        assert secret not in line


def test_io_properties_s3_service_specific_names_win():
    env = {
        "AWS_REGION": "us-west-2",
        "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_ENDPOINT_URL_S3": "https://minio.internal:9000",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:1",
    }
    props = io_properties(S3, env)
    assert props["s3.region"] == "us-west-2"
    assert props["s3.endpoint"] == "https://minio.internal:9000"
    assert "s3.access-key-id" not in props
    assert "default AWS chain" in describe(S3, props)


def test_io_properties_s3_nothing_set_leaves_it_to_the_default_chain():
    assert io_properties(S3, {}) == {"py-io-impl": NO_DELETE_FILE_IO}
    # An endpoint of its own without a region: us-east-1, never a lookup at AWS.
    props = io_properties(S3, {"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9000"})
    assert props["s3.region"] == "us-east-1"
    # A token without keys belongs to the default chain's credentials, not to ours.
    assert "s3.session-token" not in io_properties(S3, {"AWS_SESSION_TOKEN": "x"})
    # Empty values count as unset.
    assert io_properties(S3, {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}) == {
        "py-io-impl": NO_DELETE_FILE_IO
    }


@pytest.mark.parametrize(
    "env, message",
    [
        ({"AWS_ACCESS_KEY_ID": "a"}, "AWS_ACCESS_KEY_ID is set without AWS_SECRET_ACCESS_KEY"),
        ({"AWS_SECRET_ACCESS_KEY": "s"}, "AWS_SECRET_ACCESS_KEY is set without AWS_ACCESS_KEY_ID"),
        ({"AWS_ENDPOINT_URL_S3": "127.0.0.1:9000"}, "http(s)://host[:port]"),
        ({"AWS_ENDPOINT_URL": "http://user:pw@127.0.0.1:9000"}, "without credentials"),
        ({"AWS_ENDPOINT_URL": "http://127.0.0.1:9000/bucket"}, "without a path"),
    ],
)
def test_io_properties_s3_refuses(env, message):
    with pytest.raises(ValueError) as err:
        io_properties(S3, env)
    assert message in str(err.value)
    assert "pw" not in str(err.value)


def test_io_properties_gcs():
    props = io_properties(GS, {"STORAGE_EMULATOR_HOST": "127.0.0.1:4443"})
    assert props == {
        "py-io-impl": NO_DELETE_FILE_IO,
        "gcs.service.host": "http://127.0.0.1:4443",
        "gcs.oauth2.token": "fake",
        "gcs.oauth2.token-expires-at": "4102444800000",
        "gcs.project-id": "test",
    }
    assert "emulator" in describe(GS, props) and "fake" not in describe(GS, props).split("credentials")[0]
    props = io_properties(GS, {"STORAGE_EMULATOR_HOST": "http://127.0.0.1:4443", "GOOGLE_CLOUD_PROJECT": "p1"})
    assert props["gcs.service.host"] == "http://127.0.0.1:4443" and props["gcs.project-id"] == "p1"
    # No emulator: Application Default Credentials (GKE Workload Identity), nothing set.
    props = io_properties(GS, {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "s"})
    assert props == {"py-io-impl": NO_DELETE_FILE_IO}
    assert "Application Default Credentials" in describe(GS, props)


def test_io_properties_file_only_loads_the_no_delete_io(tmp_path):
    loc = parse_location(str(tmp_path))
    props = io_properties(loc, {"AWS_ACCESS_KEY_ID": "a", "STORAGE_EMULATOR_HOST": "x"})
    assert props == {"py-io-impl": NO_DELETE_FILE_IO}
    assert describe(loc, props) == f"{loc.uri} (local folder)"


def test_no_delete_file_io_counts_and_logs(tmp_path, caplog):
    target = tmp_path / "keep.txt"
    target.write_text("x")
    io = NoDeleteFileIO({})
    before = NoDeleteFileIO.skipped_deletes
    with caplog.at_level(logging.DEBUG, logger="steptail.storage.object_store"):
        io.delete(str(target))
        io.delete(io.new_input(f"file://{target}"))
    assert target.read_text() == "x"
    assert io.skipped == 2 and NoDeleteFileIO.skipped_deletes == before + 2
    assert sum(str(target) in r.getMessage() for r in caplog.records) == 2


# ---- pyiceberg round trips ----

SCHEMA = Schema(
    NestedField(1, "run", StringType(), required=False),
    NestedField(2, "step", LongType(), required=False),
    NestedField(3, "loss", DoubleType(), required=False),
)
SPEC = PartitionSpec(PartitionField(source_id=1, field_id=1000, transform=IdentityTransform(), name="run"))
ARROW = pa.schema([("run", pa.string()), ("step", pa.int64()), ("loss", pa.float64())])


def batch(run: str, first: int, n: int) -> pa.Table:
    steps = list(range(first, first + n))
    return pa.table({"run": [run] * n, "step": steps, "loss": [1.0 / (s + 1) for s in steps]}, schema=ARROW)


def rows(table: pa.Table) -> list[tuple]:
    return sorted(zip(*(table.column(c).to_pylist() for c in ("run", "step", "loss")), strict=True))


def catalog_for(tmp_path, loc, env) -> SqlCatalog:
    return SqlCatalog("t", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=loc.uri, **io_properties(loc, env))


def round_trip(tmp_path, loc, env) -> None:
    catalog = catalog_for(tmp_path, loc, env)
    catalog.create_namespace("steptail")
    table = catalog.create_table(
        "steptail.losses", SCHEMA, partition_spec=SPEC, properties={"commit.retry.num-retries": "0"}
    )
    assert isinstance(table.io, NoDeleteFileIO)
    assert table.location().startswith(loc.uri + "/")
    first, second = batch("run-a", 0, 5), pa.concat_tables([batch("run-a", 5, 3), batch("run-b", 0, 4)])
    table.append(first)
    table.append(second)
    expected = rows(pa.concat_tables([first, second]))
    assert rows(table.scan().to_arrow()) == expected
    assert rows(catalog.load_table("steptail.losses").scan().to_arrow()) == expected
    # Partitioned by run: each run's data files under its own run=... folder.
    objects = [path for path, _ in list_objects(loc, io_properties(loc, env))]
    data = [p for p in objects if p.endswith(".parquet")]
    assert {p.split("/data/")[1].split("/")[0] for p in data} == {"run=run-a", "run=run-b"}
    assert all(p.startswith(loc.uri + "/") for p in objects)

    # A stale handle loses the conflict: its commit fails and the manifests it wrote stay.
    skipped_before = NoDeleteFileIO.skipped_deletes
    fresh, stale = catalog.load_table("steptail.losses"), catalog.load_table("steptail.losses")
    fresh.append(batch("run-c", 0, 2))
    before_conflict = set(objects) | {p for p, _ in list_objects(loc, io_properties(loc, env))}
    with pytest.raises(CommitFailedException):
        stale.append(batch("run-d", 0, 2))
    after_conflict = {p for p, _ in list_objects(loc, io_properties(loc, env))}
    left = after_conflict - before_conflict
    assert before_conflict <= after_conflict, "an object was deleted"
    assert any(p.endswith(".avro") for p in left), f"the loser's manifests are not there: {sorted(left)}"
    assert any("run=run-d" in p for p in left), "the loser's data file is not there"
    assert NoDeleteFileIO.skipped_deletes > skipped_before, "pyiceberg's clean-up was not reached"
    expected = rows(pa.concat_tables([first, second, batch("run-c", 0, 2)]))
    assert rows(catalog.load_table("steptail.losses").scan().to_arrow()) == expected


def test_round_trip_local_folder(tmp_path, no_metadata_servers):  # noqa: F811
    loc = parse_location(str(tmp_path / "warehouse"))
    round_trip(tmp_path, loc, {})


@pytest.mark.parametrize("emulator", ["moto_s3", "fake_gcs"])
def test_round_trip_on_an_emulator(tmp_path, request, emulator):
    server = request.getfixturevalue(emulator)
    prefix = unique_prefix("round-trip")
    loc = parse_location(server.url(prefix))
    round_trip(tmp_path, loc, server.env)
    assert server.deletes() == 0
    assert server.deletes(prefix) == 0


@pytest.mark.parametrize("start", [running_moto_s3, running_fake_gcs])
def test_deletes_counts_a_real_delete(tmp_path, start, no_metadata_servers):  # noqa: F811
    """The counter the round trips rely on does see a delete (made here by pyarrow directly,
    not through pyiceberg), and only under its prefix. On a server of its own: the session's
    servers never see a delete."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    with start(tmp_path, no_metadata_servers) as server:
        prefix = unique_prefix("counter")
        loc = parse_location(server.url(prefix))
        props = {k: v for k, v in io_properties(loc, server.env).items() if k != "py-io-impl"}
        io = PyArrowFileIO(props)
        path = f"{loc.uri}/x.bin"
        with io.new_output(path).create() as out:
            out.write(b"abc")
        assert list_objects(loc, props) == [(path, 3)]
        assert server.deletes() == 0
        io.delete(path)
        assert server.deletes() == 1
        assert server.deletes(prefix) == 1
        assert server.deletes(unique_prefix("elsewhere")) == 0
        assert list_objects(loc, props) == []
    assert server.process.poll() is not None, "the server outlived its block"


@pytest.mark.parametrize("emulator", ["moto_s3", "fake_gcs"])
def test_a_retried_commit_deletes_nothing(request, tmp_path, emulator):
    """With pyiceberg's default retries a stale append lands on its second attempt; the
    manifests of the first attempt, which pyiceberg would delete, stay in the bucket."""
    server = request.getfixturevalue(emulator)
    prefix = unique_prefix("retry")
    loc = parse_location(server.url(prefix))
    catalog = catalog_for(tmp_path, loc, server.env)
    catalog.create_namespace("steptail")
    catalog.create_table("steptail.losses", SCHEMA, partition_spec=SPEC)
    fresh, stale = catalog.load_table("steptail.losses"), catalog.load_table("steptail.losses")
    skipped_before = NoDeleteFileIO.skipped_deletes
    fresh.append(batch("run-a", 0, 3))
    stale.append(batch("run-b", 0, 2))
    assert NoDeleteFileIO.skipped_deletes > skipped_before
    expected = rows(pa.concat_tables([batch("run-a", 0, 3), batch("run-b", 0, 2)]))
    assert rows(catalog.load_table("steptail.losses").scan().to_arrow()) == expected
    assert server.deletes(prefix) == 0
    assert server.deletes() == 0
