"""TLS for the judge: a self-signed certificate, made once with openssl.

Agents pin the judge's certificate when they start (``agents/check.py``), so no chain
of trust is needed: what matters is whether a tunnel shows them the same certificate.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

__all__ = ["judge_context", "self_signed"]


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
