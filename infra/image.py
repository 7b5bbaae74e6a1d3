"""Build the worker image (``make image``): the Debian base when it is missing, then ``../Dockerfile``.

Standard library only, so that it runs before ``make setup`` with any Python 3.11.

1. Docker must be installed and its daemon running; otherwise it stops with the command that fixes it.
2. The base (``--base``, default ``labelshift-base:bookworm``): used when present. When missing and it is the local
   name, it is made from Debian's packages (``mmdebstrap --variant=minbase bookworm`` piped into ``docker import``),
   so nothing comes from an image registry. Any other name (``debian:bookworm-slim``) must be pulled by the user.
3. pip inside the build: this machine's pip configuration is carried over. Local wheel folders that pip is pointed
   at (``file://`` index URLs and find-links) and the CA bundle pip uses (``PIP_CERT``/``cert``) are served on
   127.0.0.1 by a small HTTP server for the length of the build, which runs with ``--network host`` to reach it.
   The Dockerfile fetches the bundle for each pip command and deletes it after (``infra/with-build-ca``).
"""
from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCAL_BASE = "labelshift-base:bookworm"
DEFAULT_IMAGE = "labelshift-worker:latest"
POSTGRES_IMAGE = "labelshift-postgres:latest"
PROXY_IMAGE = "labelshift-proxy:latest"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
#: fixed, so that the build arguments (and so the layer cache) are the same from one build to the next
DEFAULT_SERVE_PORT = 38471
INSTALL_DOCKER = "apt-get install -y docker.io docker-compose   (Debian 12, as root)"


class SetupError(RuntimeError):
    """Something on this machine must change first; the message says what and how."""


# -- Docker present and running -----------------------------------------------------------------------------------------
def require_docker() -> None:
    """Raise SetupError naming the fix when the docker client is missing or its daemon does not answer."""
    if shutil.which("docker") is None:
        raise SetupError(f"docker is not installed: install it with `{INSTALL_DOCKER}`, then start it with "
                         "`dockerd &` (or `systemctl start docker`)")
    probe = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True)
    if probe.returncode != 0:
        detail = (probe.stderr.strip().splitlines() or ["no answer"])[-1]
        raise SetupError(f"the Docker daemon is not running ({detail}): start it with `systemctl start docker` or, "
                         "without systemd, `dockerd > /var/log/dockerd.log 2>&1 &` (as root)")


def image_exists(name: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", name], capture_output=True).returncode == 0


# -- the base -------------------------------------------------------------------------------------------------------
def build_debian_base(tag: str = LOCAL_BASE, mirror: str = DEBIAN_MIRROR) -> float:
    """Make a minimal Debian 12 root file system with mmdebstrap and import it as ``tag``; returns seconds taken.

    Raises SetupError when mmdebstrap is missing or fails."""
    if shutil.which("mmdebstrap") is None:
        raise SetupError(f"the base image {tag} is missing and mmdebstrap is not installed: "
                         "`apt-get install -y mmdebstrap` (as root), or pull a Debian 12 image and pass it as "
                         "BASE_IMAGE (make image BASE_IMAGE=debian:bookworm-slim)")
    t0 = time.monotonic()
    print(f"building the base {tag} from Debian's packages (mmdebstrap bookworm, about a minute)", flush=True)
    strap = subprocess.Popen(["mmdebstrap", "--quiet", "--variant=minbase", "--mode=root", "bookworm", "-", mirror],
                             stdout=subprocess.PIPE)
    imported = subprocess.run(["docker", "import", "--change", 'CMD ["bash"]', "--change",
                               "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "-", tag],
                              stdin=strap.stdout, capture_output=True, text=True)
    strap.stdout.close()
    if strap.wait() != 0 or imported.returncode != 0:
        raise SetupError(f"building the base {tag} failed (mmdebstrap exit {strap.returncode}, docker import: "
                         f"{imported.stderr.strip()}); check that {mirror} is reachable")
    return time.monotonic() - t0


def ensure_base(base: str) -> None:
    """Build the local base when it is missing; raise SetupError for a missing registry image."""
    if image_exists(base):
        return
    if base != LOCAL_BASE:
        raise SetupError(f"the base image {base} is not on this machine: `docker pull {base}`, or leave BASE_IMAGE "
                         f"unset to build {LOCAL_BASE} from Debian's packages")
    print(f"base {base} built in {build_debian_base(base):.0f} s", flush=True)


# -- this machine's pip configuration, carried into the build -------------------------------------------------------
@dataclass
class PipSources:
    """Where the host's pip finds packages, as the build sees them over the loopback server."""
    index_url: str = ""
    extra_index_urls: list[str] = field(default_factory=list)
    find_links: list[str] = field(default_factory=list)
    ca_bundle: Path | None = None
    #: URL path prefix -> local folder the server exposes
    folders: dict[str, Path] = field(default_factory=dict)


def host_pip_config(python: str = sys.executable) -> dict[str, str]:
    """``pip config list`` of this machine plus the PIP_* variables (these win, as in pip): key -> value."""
    listed = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    config = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        config[key.split(".", 1)[-1].replace("_", "-")] = value.strip().strip("'\"")
    for name, value in os.environ.items():
        if name.startswith("PIP_"):
            config[name[4:].lower().replace("_", "-")] = value
    return config


def pip_sources(config: dict[str, str], port: int) -> PipSources:
    """Rewrite the ``file://`` locations of a pip configuration to the loopback server; keep network URLs."""
    sources = PipSources()
    base = f"http://127.0.0.1:{port}"

    def serve(location: str, index: bool) -> str | None:
        if not location.startswith(("file://", "/")):
            return location
        path = Path(location.removeprefix("file://"))
        root = path.parent if index else path          # an index's pages link ../../files/, so serve its parent
        if not root.is_dir():
            return None
        prefix = f"d{len(sources.folders)}"
        sources.folders[prefix] = root
        return f"{base}/{prefix}/{path.name}/" if index else f"{base}/{prefix}/"

    sources.index_url = serve(config["index-url"], True) or "" if "index-url" in config else ""
    sources.extra_index_urls = [u for u in (serve(x, True) for x in config.get("extra-index-url", "").split()) if u]
    sources.find_links = [u for u in (serve(x, False) for x in config.get("find-links", "").split()) if u]
    cert = config.get("cert")
    if cert and Path(cert).is_file():
        sources.ca_bundle = Path(cert)
    return sources


def build_args(sources: PipSources, port: int) -> dict[str, str]:
    args = {"PIP_INDEX_URL": sources.index_url, "PIP_EXTRA_INDEX_URL": " ".join(sources.extra_index_urls),
            "PIP_FIND_LINKS": " ".join(sources.find_links),
            "LABELSHIFT_BUILD_CA_URL": f"http://127.0.0.1:{port}/ca.crt" if sources.ca_bundle else ""}
    return {k: v for k, v in args.items() if v}


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves /ca.crt and /<prefix>/... from the folders of a PipSources; read-only, quiet."""

    def __init__(self, *args, sources: PipSources, **kwargs):
        self.sources = sources
        super().__init__(*args, directory="/nonexistent", **kwargs)

    def translate_path(self, path: str) -> str:
        clean = urllib.parse.unquote(path.split("?", 1)[0].split("#", 1)[0])
        if clean == "/ca.crt" and self.sources.ca_bundle:
            return str(self.sources.ca_bundle)
        prefix, _, rest = clean.lstrip("/").partition("/")
        folder = self.sources.folders.get(prefix)
        if folder is None:
            return "/nonexistent"
        target = (folder / rest).resolve()
        return str(target) if target.is_relative_to(folder.resolve()) else "/nonexistent"

    def log_message(self, *args) -> None:
        pass


def serve_sources(sources: PipSources, port: int) -> http.server.ThreadingHTTPServer:
    """Start the loopback file server in a daemon thread (raises SetupError when the port is taken)."""
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port),
                                                 functools.partial(_Handler, sources=sources))
    except OSError as exc:
        raise SetupError(f"port {port} on 127.0.0.1 (the build's package server) is taken ({exc.strerror}): "
                         "free it or choose another with IMAGE_SERVE_PORT=<port>") from exc
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# -- the build -----------------------------------------------------------------------------------------------------
def docker_build(tag: str, context: Path, build_args: dict[str, str]) -> None:
    """``docker build`` with the classic builder (Debian's docker.io needs no buildx), host network (the loopback
    package server); raises SetupError when it fails."""
    command = ["docker", "build", "--network", "host", "-t", tag]
    for name, value in build_args.items():
        command += ["--build-arg", f"{name}={value}"]
    command.append(str(context))
    print("+ " + " ".join(command), flush=True)
    done = subprocess.run(command, env=dict(os.environ, DOCKER_BUILDKIT="0"))
    if done.returncode != 0:
        raise SetupError(f"docker build of {tag} failed (exit {done.returncode}); the lines above say where")


def build_images(image: str, postgres_image: str, base: str, port: int, use_host_pip: bool,
                 proxy_image: str = PROXY_IMAGE) -> dict[str, float]:
    """The worker image (../Dockerfile), Prefect's PostgreSQL image (postgres/Dockerfile) and the TLS proxy's
    (proxy/Dockerfile) on ``base``, the base first when it is missing; returns the seconds each took. Raises
    SetupError."""
    require_docker()
    timings = {}
    if not image_exists(base):
        ensure_base(base)
    sources = pip_sources(host_pip_config(), port) if use_host_pip else PipSources()
    args = build_args(sources, port)
    server = serve_sources(sources, port) if args else None
    try:
        t0 = time.monotonic()
        docker_build(image, ROOT, {"BASE_IMAGE": base, **args})
        timings[image] = time.monotonic() - t0
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
    t0 = time.monotonic()
    docker_build(postgres_image, ROOT / "infra" / "postgres", {"BASE_IMAGE": base})
    timings[postgres_image] = time.monotonic() - t0
    t0 = time.monotonic()
    docker_build(proxy_image, ROOT / "infra" / "proxy", {"BASE_IMAGE": base})
    timings[proxy_image] = time.monotonic() - t0
    return timings


def image_size_bytes(image: str) -> int:
    out = subprocess.run(["docker", "image", "inspect", image], capture_output=True, text=True, check=True).stdout
    return int(json.loads(out)[0]["Size"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m infra.image", description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", default=os.environ.get("LABELSHIFT_IMAGE") or DEFAULT_IMAGE)
    parser.add_argument("--postgres-image", default=os.environ.get("LABELSHIFT_POSTGRES_IMAGE") or POSTGRES_IMAGE)
    parser.add_argument("--proxy-image", default=os.environ.get("LABELSHIFT_PROXY_IMAGE") or PROXY_IMAGE)
    parser.add_argument("--base", default=os.environ.get("BASE_IMAGE") or LOCAL_BASE)
    parser.add_argument("--port", type=int, default=int(os.environ.get("IMAGE_SERVE_PORT") or DEFAULT_SERVE_PORT))
    parser.add_argument("--no-host-pip", action="store_true",
                        help="do not carry this machine's pip configuration into the build (plain PyPI)")
    args = parser.parse_args(argv)
    try:
        timings = build_images(args.image, args.postgres_image, args.base, args.port, not args.no_host_pip,
                               args.proxy_image)
    except SetupError as exc:
        print(f"make image: {exc}", file=sys.stderr)
        return 2
    for tag, seconds in timings.items():
        size = image_size_bytes(tag)
        print(f"image {tag} built in {seconds:.0f} s; size {size / 2**30:.2f} GiB ({size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
