"""Kubernetes wire details for the simulator: timestamps, Status bodies, label selectors,
TLS material and the kubeconfig. Pure helpers, no server state."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
import re
import sys
import time
from pathlib import Path

import yaml

# ---- timestamps ----------------------------------------------------------------------------


def rfc3339nano(ts_ns: int) -> str:
    """Go's time.RFC3339Nano in UTC: trailing zeros of the fraction dropped, and the dot too
    when the fraction is zero (`2026-11-30T04:12:33.3868Z`, `2026-11-30T04:12:33Z`)."""
    sec, frac = divmod(ts_ns, 1_000_000_000)
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
    if frac == 0:
        return base + "Z"
    return f"{base}.{frac:09d}".rstrip("0") + "Z"


def rfc3339(ts_ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts_ns // 1_000_000_000))


_TS = re.compile(
    r"^(\d{4})-(\d\d)-(\d\d)[Tt ](\d\d):(\d\d):(\d\d)(?:\.(\d+))?(Z|z|[+-]\d\d:\d\d)$"
)


def parse_rfc3339_ns(text: str) -> int:
    """RFC3339 / RFC3339Nano -> ns since the epoch. Raises ValueError."""
    m = _TS.match(text.strip())
    if not m:
        raise ValueError(f"invalid RFC3339 time {text!r}")
    y, mo, d, h, mi, s, frac, tz = m.groups()
    tzinfo = dt.UTC
    if tz not in ("Z", "z"):
        sign = 1 if tz[0] == "+" else -1
        tzinfo = dt.timezone(sign * dt.timedelta(hours=int(tz[1:3]), minutes=int(tz[4:6])))
    t = dt.datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), tzinfo=tzinfo)
    ns = int(frac.ljust(9, "0")[:9]) if frac else 0
    return int(t.timestamp()) * 1_000_000_000 + ns


# ---- Status bodies -------------------------------------------------------------------------

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    410: "Expired",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def status_body(code: int, message: str, reason: str | None = None, details: dict | None = None) -> dict:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason if reason is not None else REASONS.get(code, ""),
        "code": code,
    }
    if details:
        body["details"] = details
    return body


# ---- label selectors -----------------------------------------------------------------------


def _split_terms(sel: str) -> list[str]:
    terms, depth, cur = [], 0, []
    for ch in sel:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        terms.append("".join(cur).strip())
    return [t for t in terms if t]


_SET = re.compile(r"^(\S+)\s+(in|notin)\s*\((.*)\)$")


def parse_selector(sel: str | None):
    """Returns a predicate over a labels dict. Supports `a=b`, `a==b`, `a!=b`, `a in (x,y)`,
    `a notin (x,y)`, `a`, `!a`, comma-joined. Raises ValueError on a malformed selector."""
    if not sel:
        return lambda labels: True
    preds = []
    for term in _split_terms(sel):
        m = _SET.match(term)
        if m:
            key, op, vals = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if op == "in":
                preds.append(lambda lb, k=key, v=vals: lb.get(k) in v)
            else:
                preds.append(lambda lb, k=key, v=vals: lb.get(k) not in v)
        elif "!=" in term:
            k, v = (x.strip() for x in term.split("!=", 1))
            preds.append(lambda lb, k=k, v=v: lb.get(k) != v)
        elif "=" in term:
            k, v = (x.strip() for x in re.split(r"==?", term, maxsplit=1))
            preds.append(lambda lb, k=k, v=v: lb.get(k) == v)
        elif term.startswith("!"):
            neg_key = term[1:].strip()
            preds.append(lambda lb, k=neg_key: k not in lb)
        elif re.match(r"^[\w./-]+$", term):
            preds.append(lambda lb, k=term: k in lb)
        else:
            raise ValueError(f"unable to parse requirement: {term!r}")
    return lambda labels: all(p(labels) for p in preds)


def parse_field_selector(sel: str | None):
    """metadata.name, metadata.namespace, status.phase, spec.nodeName with = / == / !=."""
    if not sel:
        return lambda obj: True
    preds = []
    for term in _split_terms(sel):
        neg = "!=" in term
        k, v = (x.strip() for x in re.split(r"!=|==?", term, maxsplit=1))
        path = k.split(".")

        def get(obj, path=path):
            for p in path:
                obj = obj.get(p, {}) if isinstance(obj, dict) else {}
            return obj if isinstance(obj, str) else ""

        preds.append(lambda o, get=get, v=v, neg=neg: (get(o) != v) if neg else (get(o) == v))
    return lambda obj: all(p(obj) for p in preds)


# ---- TLS -----------------------------------------------------------------------------------


def make_tls(directory: Path, host: str) -> tuple[Path, Path, Path]:
    """Self-signed CA + a server certificate for `host`, 127.0.0.1 and localhost.
    Returns (ca_pem, server_cert_pem, server_key_pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "steptail-simcluster-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    try:
        ip = ipaddress.ip_address(host)
        if str(ip) != "127.0.0.1":
            sans.append(x509.IPAddress(ip))
    except ValueError:
        if host != "localhost":
            sans.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    ca_pem = directory / "ca.crt"
    crt = directory / "server.crt"
    k = directory / "server.key"
    ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    os.chmod(k, 0o600)
    return ca_pem, crt, k


# ---- kubeconfig ----------------------------------------------------------------------------

PLUGIN = Path(__file__).with_name("authplugin.py")


def kubeconfig(
    *, server: str, ca_pem: Path, state_dir: Path, namespace: str, name: str = "simcluster"
) -> dict:
    ctx = f"gke_steptail-sim_local_{name}"
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": ctx,
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem.read_bytes()).decode(),
                },
            }
        ],
        "users": [
            {
                "name": ctx,
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1beta1",
                        "command": sys.executable,
                        "args": ["-I", "-S", str(PLUGIN), "--state-dir", str(state_dir)],
                        "installHint": "The simulated GKE auth plugin ships with steptail "
                        "(simcluster/authplugin.py).",
                        "provideClusterInfo": False,
                        "interactiveMode": "Never",
                    }
                },
            }
        ],
        "contexts": [{"name": ctx, "context": {"cluster": ctx, "user": ctx, "namespace": namespace}}],
        "current-context": ctx,
        "preferences": {},
    }


def write_kubeconfig(path: Path, cfg: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    os.chmod(path, 0o600)
    return path
