"""Where the Iceberg table lives: a local folder, `s3://bucket/prefix` or `gs://bucket/prefix`.

`parse_location` turns the text a user gives into a `Location` (its `uri` is the warehouse
pyiceberg takes). `io_properties` gives pyiceberg's FileIO properties for it, read from the
environment under the names each cloud's own SDK reads, never from arguments:

- S3: AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN), AWS_REGION or
  AWS_DEFAULT_REGION, AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL. Without keys, pyarrow's default
  AWS chain finds them in the process's environment (profiles, EKS web identity, ...).
- GCS: STORAGE_EMULATOR_HOST (the Google SDK's emulator variable) gives the emulator's address
  and a fake token; without it, nothing: Application Default Credentials (GKE Workload
  Identity, GOOGLE_APPLICATION_CREDENTIALS, ...) are found by pyarrow's GCS client.

Every set of properties loads `NoDeleteFileIO`: the bucket rule is "delete nothing". pyiceberg
deletes the manifests of a failed or retried commit, old metadata files and, on a purge, data
files; here each of those deletes is skipped and counted. What a failed attempt leaves behind is
an orphan nothing refers to, harmless, and `list_objects` lists the objects for a report of
them. `describe` gives a one-line description for logs that never holds a secret."""

from __future__ import annotations

import logging
import os
import posixpath
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar
from urllib.parse import unquote, urlsplit

from pyiceberg.io import InputFile, OutputFile
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.typedef import EMPTY_DICT, Properties

log = logging.getLogger(__name__)

SCHEMES = ("file", "s3", "gs")
NO_DELETE_FILE_IO = f"{__name__}.NoDeleteFileIO"
# The emulator's token never expires within a run: pyarrow's GcsFileSystem takes an access
# token only with an expiry (pyiceberg raises ValueError without one). 2100-01-01 UTC, in ms.
EMULATOR_TOKEN_EXPIRES_AT_MS = "4102444800000"
EMULATOR_PROJECT = "test"
# With an endpoint of its own (MinIO, an emulator) and no region, pyiceberg would ask AWS where
# the bucket is; an S3-compatible server takes any region, and the SDKs' default is this one.
DEFAULT_ENDPOINT_REGION = "us-east-1"

# S3: 3-63 lowercase letters, digits, dots and hyphens. GCS also takes underscores (and up to
# 222 characters with dots). Both start and end with a letter or a digit.
_BUCKET = {
    "s3": re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"),
    "gs": re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]"),
}


@dataclass(frozen=True)
class Location:
    """A warehouse location. `scheme` is "file", "s3" or "gs". For "file", `bucket` is "" and
    `prefix` the absolute path; for the buckets, `prefix` has no slash at either end ("" at
    the bucket's root). `uri` is what pyiceberg takes: `file:///abs/path`, `s3://bucket/prefix`
    or `gs://bucket/prefix`."""

    scheme: str
    bucket: str
    prefix: str
    uri: str


def parse_location(text: str) -> Location:
    """A plain path (made absolute) or file:// URI, `s3://bucket/prefix` or `gs://bucket/prefix`.
    Anything else raises ValueError with a one-line reason."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("empty location: give a folder, s3://bucket/prefix or gs://bucket/prefix")
    text = text.strip()
    if "?" in text or "#" in text:
        raise ValueError(f"location {text!r} has '?' or '#', which pyiceberg would read as a URL query or fragment")
    if "\\" in text or any(ord(c) < 32 for c in text):
        raise ValueError(f"location {text!r} has a backslash or a control character")
    if "://" not in text:
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", text) and not text.startswith(("./", "/")):
            raise ValueError(f"location {text!r} looks like a URL without '//': use s3://, gs:// or file://")
        return _file_location(text, text)
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"file URI {text!r} names a host ({parts.netloc!r}); use file:///absolute/path")
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise ValueError(f"file URI {text!r} has no absolute path; use file:///absolute/path")
        return _file_location(path, text)
    if scheme not in ("s3", "gs"):
        hint = " (use gs://)" if scheme in ("gcs", "gcs3") else " (use s3://)" if scheme in ("s3a", "s3n") else ""
        raise ValueError(f"location {text!r}: scheme {scheme!r} is not file, s3 or gs{hint}")
    bucket = parts.netloc
    if not bucket:
        raise ValueError(f"location {text!r} has no bucket name: use {scheme}://bucket/prefix")
    if not _BUCKET[scheme].fullmatch(bucket) or ".." in bucket:
        raise ValueError(f"location {text!r}: {bucket!r} is not a valid {scheme} bucket name")
    prefix = parts.path.strip("/")
    segments = prefix.split("/") if prefix else []
    if any(s in ("", ".", "..") for s in segments):
        raise ValueError(f"location {text!r}: the prefix has an empty, '.' or '..' part")
    uri = f"{scheme}://{bucket}/{prefix}" if prefix else f"{scheme}://{bucket}"
    return Location(scheme=scheme, bucket=bucket, prefix=prefix, uri=uri)


def _file_location(path: str, text: str) -> Location:
    if ".." in path.split("/"):
        raise ValueError(f"location {text!r} has a '..' part: give the folder itself")
    absolute = os.path.abspath(os.path.expanduser(path))
    if absolute == "/":
        raise ValueError(f"location {text!r} is the file system's root")
    return Location(scheme="file", bucket="", prefix=absolute, uri=f"file://{absolute}")


def io_properties(loc: Location, env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """pyiceberg FileIO properties for `loc`, from `env` read as the cloud's SDK reads it (an
    empty value counts as unset). Always loads NoDeleteFileIO (`py-io-impl`).

    S3 keys come only as a pair: one without the other raises ValueError, as the AWS SDK's own
    environment provider refuses partial credentials. Without keys, nothing is set and pyarrow's
    default AWS chain looks in the process's environment (not `env`) and beyond."""
    props = {"py-io-impl": NO_DELETE_FILE_IO}

    def get(name: str) -> str | None:
        value = env.get(name)
        return value if value else None

    if loc.scheme == "s3":
        key_id, secret = get("AWS_ACCESS_KEY_ID"), get("AWS_SECRET_ACCESS_KEY")
        if bool(key_id) != bool(secret):
            have, lack = (
                ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
                if key_id
                else ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID")
            )
            raise ValueError(f"{have} is set without {lack}: set both, or neither for the default AWS chain")
        if key_id and secret:
            props["s3.access-key-id"] = key_id
            props["s3.secret-access-key"] = secret
            if token := get("AWS_SESSION_TOKEN"):
                props["s3.session-token"] = token
        endpoint = get("AWS_ENDPOINT_URL_S3") or get("AWS_ENDPOINT_URL")
        if endpoint:
            props["s3.endpoint"] = _endpoint_url(endpoint, "AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL")
        region = get("AWS_REGION") or get("AWS_DEFAULT_REGION")
        if region:
            props["s3.region"] = region
        elif endpoint:
            props["s3.region"] = DEFAULT_ENDPOINT_REGION
    elif loc.scheme == "gs":
        if emulator := get("STORAGE_EMULATOR_HOST"):
            host = emulator if "://" in emulator else f"http://{emulator}"
            props["gcs.service.host"] = _endpoint_url(host, "STORAGE_EMULATOR_HOST")
            props["gcs.oauth2.token"] = "fake"
            props["gcs.oauth2.token-expires-at"] = EMULATOR_TOKEN_EXPIRES_AT_MS
            props["gcs.project-id"] = get("GOOGLE_CLOUD_PROJECT") or EMULATOR_PROJECT
        elif project := get("GOOGLE_CLOUD_PROJECT"):
            props["gcs.project-id"] = project
    return props


def _endpoint_url(value: str, name: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.username or parts.password:
        raise ValueError(f"{name} must be an http(s)://host[:port] URL without credentials")
    if parts.path.strip("/") or parts.query or parts.fragment:
        raise ValueError(f"{name} must be an http(s)://host[:port] URL without a path")
    return f"{parts.scheme}://{parts.netloc}"


def describe(loc: Location, props: Mapping[str, str]) -> str:
    """One line for logs: where, which endpoint and where the credentials come from. Built only
    from non-secret properties: no key, secret or token ever appears in it."""
    if loc.scheme == "file":
        return f"{loc.uri} (local folder)"
    if loc.scheme == "s3":
        endpoint = props.get("s3.endpoint") or "AWS"
        region = props.get("s3.region") or "the bucket's own (looked up)"
        if props.get("s3.access-key-id"):
            creds = "keys from the environment" + (" with a session token" if props.get("s3.session-token") else "")
        else:
            creds = "the default AWS chain"
        return f"{loc.uri} endpoint={endpoint} region={region} credentials: {creds}"
    endpoint = props.get("gcs.service.host")
    if endpoint:
        return f"{loc.uri} endpoint={endpoint} (emulator, STORAGE_EMULATOR_HOST) credentials: a fake token"
    return f"{loc.uri} endpoint=Google Cloud Storage credentials: Application Default Credentials"


class NoDeleteFileIO(PyArrowFileIO):
    """PyArrowFileIO whose `delete` deletes nothing: it counts the call (on the class, for the
    whole process, and on the instance) and logs the path at DEBUG. Load it with the catalog
    property `py-io-impl` (io_properties does)."""

    skipped_deletes: ClassVar[int] = 0
    _count_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, properties: Properties = EMPTY_DICT):
        super().__init__(properties)
        self.skipped = 0

    def delete(self, location: str | InputFile | OutputFile) -> None:
        path = location.location if isinstance(location, (InputFile, OutputFile)) else location
        with NoDeleteFileIO._count_lock:
            NoDeleteFileIO.skipped_deletes += 1
            self.skipped += 1
        log.debug("not deleting %s: nothing in the table's store is ever deleted", path)


def bucket_exists(loc: Location, props: Mapping[str, str]) -> bool:
    """Whether the bucket of `loc` (s3:// or gs://) exists: one metadata request, through the
    same pyarrow file system pyiceberg builds from `props`. Raises OSError when the store
    cannot say (refused credentials, unreachable)."""
    from pyarrow.fs import FileType

    fs = NoDeleteFileIO(dict(props)).fs_by_scheme(loc.scheme, loc.bucket)
    return fs.get_file_info(loc.bucket).type != FileType.NotFound


def list_objects(loc: Location, props: Mapping[str, str]) -> list[tuple[str, int]]:
    """Every object (file) under `loc` with its size, sorted, as (URI, bytes): the URIs in the
    form the table's metadata refers to them (`s3://bucket/key`, `file:///abs/path`). Through
    the same pyarrow file system pyiceberg builds from `props`. A location with nothing in it
    (or not there yet) gives []."""
    from pyarrow.fs import FileSelector, FileType

    io = NoDeleteFileIO(dict(props))
    if loc.scheme == "file":
        fs = io.fs_by_scheme("file", "")
        base = loc.prefix
    else:
        fs = io.fs_by_scheme(loc.scheme, loc.bucket)
        base = posixpath.join(loc.bucket, loc.prefix) if loc.prefix else loc.bucket
    infos = fs.get_file_info(FileSelector(base, recursive=True, allow_not_found=True))
    found = []
    for info in infos:
        if info.type != FileType.File:
            continue
        uri = f"file://{info.path}" if loc.scheme == "file" else f"{loc.scheme}://{info.path}"
        found.append((uri, int(info.size)))
    return sorted(found)
