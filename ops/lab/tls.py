"""TLS for the judge (a self-signed certificate, made once with openssl) and for a NATS
server of the tests' and benchmarks' own (a CA, and a server and a client certificate
it signed).

Agents pin the judge's certificate when they start (``agents/check.py``), so no chain
of trust is needed: what matters is whether a tunnel shows them the same certificate.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

__all__ = ["judge_context", "nats_certs", "self_signed"]


def self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    """A certificate and key for ``name`` (openssl, in every Debian), made once."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    if not cert.exists():
        # Ten years: agents pin the certificate and never look at its dates.
        cmd = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650"]
        cmd += ["-subj", f"/CN={name}", "-addext", "subjectAltName=IP:127.0.0.1"]
        subprocess.run(
            [*cmd, "-keyout", str(key), "-out", str(cert)],
            check=True,
            capture_output=True,
            timeout=60,
        )
        key.chmod(0o600)
    return cert, key


def judge_context(directory: Path) -> ssl.SSLContext | None:
    """A server context for the judge, or None where openssl is not installed."""
    if shutil.which("openssl") is None:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(*self_signed(directory, "judge"))
    return ctx


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def nats_certs(d: Path) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by
    it: paths by role (ca, cert, key, client, client_key)."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
             "/CN=ppf test CA", "-keyout", "ca.key", "-out", "ca.pem", cwd=d)  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=ppf {name}",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-extfile", "san.ext",
                 "-out", f"{name}.pem", cwd=d)  # fmt: skip
    return {k: str(d / v) for k, v in {
        "ca": "ca.pem", "cert": "server.pem", "key": "server.key",
        "client": "client.pem", "client_key": "client.key",
    }.items()}  # fmt: skip
