"""TLS for a NATS server of the tests' and benchmarks' own: a CA, and a server and a
client certificate it signed (openssl). The judge's own certificate is the judge's
(``gateway/judge.py``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["nats_certs"]


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
