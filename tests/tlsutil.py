"""Test certificates made with the openssl command line: a CA, server and client certificates."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


def make_ca(d: Path, name: str) -> Pair:
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.crt",
             "-days", "2", "-subj", f"/CN={name}", cwd=d)
    return Pair(d / f"{name}.crt", d / f"{name}.key")


def make_cert(d: Path, ca: Pair, name: str, *, server: bool) -> Pair:
    """A certificate signed by ``ca``: for a server on 127.0.0.1, or a client named ``name``."""
    ext = d / f"{name}.ext"
    ext.write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                   + ("extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n" if server
                      else "extendedKeyUsage=clientAuth\n"))
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", f"/CN={name}", cwd=d)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", str(ca.cert), "-CAkey", str(ca.key), "-CAcreateserial",
             "-out", f"{name}.crt", "-days", "2", "-extfile", ext.name, cwd=d)
    return Pair(d / f"{name}.crt", d / f"{name}.key")


@dataclass(frozen=True)
class TLSSet:
    """What an mTLS test needs: the server's CA, server pair, the client CA, a client signed by it,
    and a client signed by another CA (which must be refused)."""

    ca: Pair
    server: Pair
    client_ca: Pair
    client: Pair
    stranger: Pair

    def server_args(self) -> list[str]:
        return ["--tls-cert", str(self.server.cert), "--tls-key", str(self.server.key),
                "--tls-client-ca", str(self.client_ca.cert)]


def make_tls_set(d: Path) -> TLSSet:
    ca = make_ca(d, "server-ca")
    client_ca = make_ca(d, "client-ca")
    other_ca = make_ca(d, "other-ca")
    return TLSSet(ca=ca, server=make_cert(d, ca, "extender", server=True), client_ca=client_ca,
                  client=make_cert(d, client_ca, "kube-scheduler", server=False),
                  stranger=make_cert(d, other_ca, "stranger", server=False))
