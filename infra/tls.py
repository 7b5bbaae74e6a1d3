"""The certificate of the stack's TLS front (infra/compose.yaml's `proxy`): the operator's, or one made here for a
private CA, and the checks that refuse a certificate the clients would refuse.

    python3 -m infra.tls make DIR --name HOST [--name HOST ...]   # a private CA and a server certificate in DIR
    python3 -m infra.tls check DIR --name HOST                    # exit 2 with the reason when it would not do

DIR holds ``server.crt`` and ``server.key`` (what the proxy serves) and, when made here, ``ca.crt`` (what the
clients trust: ``SSL_CERT_FILE``, ``PREFECT_API_SSL_CERT_FILE``, ``MLFLOW_TRACKING_SERVER_CERT_PATH``,
``AWS_CA_BUNDLE``) and ``ca.key`` (kept to sign again; only the owner reads the keys). Standard library and the
``openssl`` command (Debian's package), so that it runs before ``make setup``.
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from infra.image import SetupError

__all__ = ["make_certificates", "check_certificate", "client_environment", "DAYS"]

#: how long a certificate made here lasts (days); `make stack-docker-up` refuses one that has ended
DAYS = 825


def _openssl(*args: str, cwd: Path) -> str:
    if shutil.which("openssl") is None:
        raise SetupError("openssl is not installed: apt-get install -y openssl (as root), or put your own "
                         "server.crt and server.key in LABELSHIFT_TLS_DIR")
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SetupError(f"openssl {args[0]} failed: {done.stderr.strip()[-500:]}")
    return done.stdout


def _san(names: list[str]) -> str:
    entries = []
    for name in dict.fromkeys(names):
        try:
            ipaddress.ip_address(name)
            entries.append(f"IP:{name}")
        except ValueError:
            entries.append(f"DNS:{name}")
    return ",".join(entries)


def make_certificates(folder: Path, names: list[str], days: int = DAYS) -> None:
    """A private CA (``ca.crt``, ``ca.key``) and a server certificate for ``names`` signed by it (``server.crt``,
    ``server.key``) in ``folder``; the keys readable by their owner only."""
    folder.mkdir(parents=True, exist_ok=True)
    old = os.umask(0o077)
    try:
        _openssl("req", "-x509", "-newkey", "rsa:3072", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
                 "-days", str(days), "-subj", "/CN=labelshift stack private CA",
                 "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                 cwd=folder)
        _openssl("req", "-newkey", "rsa:3072", "-nodes", "-keyout", "server.key", "-out", "server.csr",
                 "-subj", f"/CN={names[0]}", cwd=folder)
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".ext", delete=False) as ext:
            ext.write(f"subjectAltName={_san(names)}\nextendedKeyUsage=serverAuth\n"
                      "basicConstraints=critical,CA:FALSE\n")
        _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", "server.crt", "-days", str(days), "-extfile", ext.name, cwd=folder)
    finally:
        os.umask(old)
        for leftover in (folder / "server.csr", folder / "ca.srl", *folder.glob("*.ext")):
            leftover.unlink(missing_ok=True)
    (folder / "ca.crt").chmod(0o644)
    (folder / "server.crt").chmod(0o644)


def check_certificate(folder: Path, name: str) -> None:
    """Raise SetupError naming the fix when ``folder`` has no server certificate and key, when the certificate has
    ended (or ends within a day), or when it does not name ``name`` (the host the clients use)."""
    crt, key = folder / "server.crt", folder / "server.key"
    if not crt.is_file() or not key.is_file():
        raise SetupError(f"{folder} lacks server.crt or server.key: put your certificate and key there, or remove "
                         "the folder and `make stack-docker-up` makes them for a private CA")
    if subprocess.run(["openssl", "x509", "-checkend", "86400", "-noout", "-in", str(crt)],
                      capture_output=True).returncode != 0:
        raise SetupError(f"{crt} has expired or expires within a day: renew it, or remove {folder} and `make "
                         "stack-docker-up` makes a new one")
    kind = "-checkip" if _is_ip(name) else "-checkhost"
    said = _openssl("x509", "-noout", "-in", str(crt), kind, name, cwd=folder)
    if "does NOT match" in said:
        raise SetupError(f"{crt} is not for {name} (LABELSHIFT_PUBLIC_HOST): clients would refuse it; make one "
                         f"that names it, or remove {folder} and `make stack-docker-up` makes one")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def client_environment(ca_file: Path) -> dict[str, str]:
    """What a client (Prefect, MLflow, boto3, Python's ssl) needs to trust the stack's certificate."""
    ca = str(ca_file)
    return {"SSL_CERT_FILE": ca, "PREFECT_API_SSL_CERT_FILE": ca, "MLFLOW_TRACKING_SERVER_CERT_PATH": ca,
            "REQUESTS_CA_BUNDLE": ca, "AWS_CA_BUNDLE": ca}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m infra.tls", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("make", "check"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--name", action="append", required=True, help="a host name or address the clients use")
    args = parser.parse_args(argv)
    try:
        if args.action == "make":
            make_certificates(args.folder, args.name)
        check_certificate(args.folder, args.name[0])
    except SetupError as exc:
        print(f"python3 -m infra.tls {args.action}: {exc}", file=sys.stderr)
        return 2
    print(f"{args.folder}/server.crt serves {', '.join(args.name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
