"""The container stack of ``infra/compose.yaml``: checked, started and stopped with one command each.

    python3 -m infra.compose_stack up [--workers N]      # make stack-docker-up
    python3 -m infra.compose_stack down [--volumes]      # make stack-docker-down
    python3 -m infra.compose_stack status

Standard library only. Before anything starts it checks, each with the fix in its message: Docker installed and
its daemon running, a compose tool (the ``docker compose`` plugin or Debian's ``docker-compose``), the images
built (``make image``), every value ``compose.yaml`` requires set in the env file (no template placeholder left,
MLflow's passwords long enough), the TLS proxy's certificate (made for a private CA when there is none; refused
when expired or not naming LABELSHIFT_PUBLIC_HOST: infra/tls.py), and the published ports free.
When ``up`` fails after that, it removes what it started (containers and network; volumes keep their data), so a
failed start leaves nothing running.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from infra.image import SetupError, image_exists, require_docker

INFRA = Path(__file__).resolve().parent
COMPOSE_FILE = INFRA / "compose.yaml"
ENV_FILE = INFRA / ".env"
ENV_EXAMPLE = INFRA / "env.example"
DEFAULT_PROJECT = "labelshift"
#: published service -> (variable choosing the host port, default port)
PUBLISHED = {"prefect": ("LABELSHIFT_PREFECT_PORT", 4200), "mlflow": ("LABELSHIFT_MLFLOW_PORT", 5000),
             "s3": ("LABELSHIFT_S3_PORT", 8333)}
IMAGES = {"LABELSHIFT_IMAGE": "labelshift-worker:latest", "LABELSHIFT_POSTGRES_IMAGE": "labelshift-postgres:latest",
          "LABELSHIFT_PROXY_IMAGE": "labelshift-proxy:latest"}
PLACEHOLDER = "change-me"


# -- settings -------------------------------------------------------------------------------------------------------
def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of a compose env file (comments and blank lines skipped, surrounding quotes removed)."""
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        values[key.strip()] = value.strip().strip("'\"")
    return values


def required_variables(compose_text: str) -> list[str]:
    """The variables compose.yaml marks required (``${NAME:?message}``), in order of first use."""
    return list(dict.fromkeys(re.findall(r"\$\{(\w+):\?", compose_text)))


def check_settings(env_file: Path, compose_file: Path = COMPOSE_FILE) -> dict[str, str]:
    """The env file's values, after checking that each required one is set and not the template's placeholder.

    Raises SetupError naming the file, the variables and the fix."""
    if not env_file.is_file():
        raise SetupError(f"{env_file} does not exist: `cp {ENV_EXAMPLE} {env_file}` and set the values marked "
                         f"{PLACEHOLDER}")
    values = read_env_file(env_file)
    missing = [v for v in required_variables(compose_file.read_text()) if not values.get(v)]
    if missing:
        raise SetupError(f"{env_file} lacks a value for {', '.join(missing)}: add a line NAME=value for each "
                         f"(see {ENV_EXAMPLE})")
    unchanged = [k for k, v in values.items() if PLACEHOLDER in v]
    if unchanged:
        raise SetupError(f"{env_file}: {', '.join(unchanged)} still hold the template's {PLACEHOLDER!r} value: "
                         "set them to long random strings (e.g. `openssl rand -hex 24`)")
    return values


def check_credentials(values: dict[str, str]) -> None:
    """Refuse credentials the servers would refuse later (SetupError naming the variable and the fix)."""
    from stack.access import MIN_PASSWORD_LENGTH, PASSWORDS

    for roles in PASSWORDS.values():
        for name in roles.values():
            if len(values.get(name, "")) < MIN_PASSWORD_LENGTH:
                raise SetupError(f"{name} must be at least {MIN_PASSWORD_LENGTH} characters (MLflow refuses "
                                 "shorter passwords; every role's is held to that): set it to a long random "
                                 "string, e.g. `openssl rand -hex 24`")


def tls_dir(values: dict[str, str]) -> Path:
    """The folder of the proxy's certificate: LABELSHIFT_TLS_DIR (relative to infra/, as compose reads it) or
    infra/tls."""
    folder = Path(values.get("LABELSHIFT_TLS_DIR") or "./tls")
    return folder if folder.is_absolute() else (INFRA / folder).resolve()


def ensure_certificate(values: dict[str, str]) -> Path:
    """The proxy's certificate: made for a private CA when the folder has none (its ca.crt is what clients
    trust), then checked (not expired, naming LABELSHIFT_PUBLIC_HOST); SetupError names the fix. Returns the
    folder."""
    from infra.tls import check_certificate, make_certificates

    folder = tls_dir(values)
    host = values.get("LABELSHIFT_PUBLIC_HOST") or "localhost"
    if not (folder / "server.crt").exists() and not (folder / "server.key").exists():
        make_certificates(folder, [host, "localhost", "127.0.0.1"])
        print(f"made a certificate for {host}, localhost and 127.0.0.1, signed by a private CA: clients trust "
              f"{folder / 'ca.crt'} (infra/README.md, 'TLS')", file=sys.stderr)
    check_certificate(folder, host)
    return folder


def published_ports(values: dict[str, str]) -> dict[str, int]:
    """Host port of each published service, from the env file's LABELSHIFT_*_PORT or the default."""
    ports = {}
    for service, (variable, default) in PUBLISHED.items():
        raw = values.get(variable) or str(default)
        if not raw.isdigit() or not 0 < int(raw) < 65536:
            raise SetupError(f"{variable}={raw!r} is not a port number (1-65535): fix it in the env file")
        ports[service] = int(raw)
    return ports


def check_ports_free(bind: str, ports: dict[str, int]) -> None:
    """Raise SetupError naming every published port that something on this machine already holds."""
    taken = []
    for service, port in ports.items():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((bind if bind != "0.0.0.0" else "", port))
            except OSError:
                taken.append(f"{port} ({service}, {PUBLISHED[service][0]})")
    if taken:
        raise SetupError(f"port(s) already taken on {bind}: {', '.join(taken)}. Stop what holds them (`ss -ltnp` "
                         "shows it) or choose other host ports with those variables in the env file")


# -- the compose tool ---------------------------------------------------------------------------------------------------
def compose_tool() -> list[str]:
    """``docker compose`` when the plugin is installed, else ``docker-compose``; raises SetupError naming the
    package when neither is."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise SetupError("no compose tool: install Debian's with `apt-get install -y docker-compose` (as root), or "
                     "Docker's compose plugin")


@dataclass(frozen=True)
class Stack:
    """One compose project of infra/compose.yaml: its name, env file and the tool that drives it."""
    project: str = DEFAULT_PROJECT
    env_file: Path = ENV_FILE
    tool: tuple[str, ...] = ("docker-compose",)

    def command(self, *args: str) -> list[str]:
        return [*self.tool, "-p", self.project, "--env-file", str(self.env_file), "-f", str(COMPOSE_FILE), *args]

    def run(self, *args: str, check: bool = True, capture: bool = False) -> subprocess.CompletedProcess:
        done = subprocess.run(self.command(*args), text=True, capture_output=capture)
        if check and done.returncode != 0:
            detail = f": {done.stderr.strip()[-2000:]}" if capture else " (its output is above)"
            raise SetupError(f"`{' '.join(self.command(*args))}` failed{detail}")
        return done

    def leftovers(self) -> dict[str, list[str]]:
        """Containers, networks and volumes Docker still holds for this project (by compose's project label)."""
        label = f"label=com.docker.compose.project={self.project}"
        found = {}
        for kind, listing in (("containers", ["ps", "-a"]), ("networks", ["network", "ls"]),
                              ("volumes", ["volume", "ls"])):
            out = subprocess.run(["docker", *listing, "-q", "--filter", label], capture_output=True, text=True)
            found[kind] = out.stdout.split()
        return found


def check_images(values: dict[str, str]) -> None:
    missing = [values.get(var) or default for var, default in IMAGES.items()
               if not image_exists(values.get(var) or default)]
    if missing:
        raise SetupError(f"image(s) {', '.join(missing)} not built: run `make image` first")


def preflight(env_file: Path) -> tuple[Stack, dict[str, str]]:
    """Every check that must pass before anything starts; returns the stack and the env file's values."""
    require_docker()
    tool = compose_tool()
    values = check_settings(env_file)
    check_credentials(values)
    ensure_certificate(values)
    check_images(values)
    check_ports_free(values.get("LABELSHIFT_BIND") or "127.0.0.1", published_ports(values))
    project = values.get("COMPOSE_PROJECT_NAME") or DEFAULT_PROJECT
    return Stack(project=project, env_file=env_file, tool=tuple(tool)), values


def up(stack: Stack, workers: int, timeout: float = 300) -> None:
    """Start the servers and ``workers`` CPU workers, waiting for every healthcheck; on any failure remove what
    this start created (containers, network, and the volumes that did not exist before it: data from earlier
    starts stays) and re-raise."""
    args = ["--profile", "cpu"] if workers else []
    volumes_before = set(stack.leftovers()["volumes"])
    try:
        stack.run(*args, "up", "-d", "--no-build", *(["--scale", f"worker-cpu={workers}"] if workers else []))
        wait_healthy(stack, timeout)
    except BaseException:
        new_volumes = sorted(set(stack.leftovers()["volumes"]) - volumes_before)
        print("start failed: removing the containers and the network it started" +
              (f", and the volumes it created ({', '.join(new_volumes)})" if new_volumes else "") +
              "; volumes of earlier starts keep their data", file=sys.stderr)
        stack.run("--profile", "cpu", "down", "--remove-orphans", check=False)
        if new_volumes:
            subprocess.run(["docker", "volume", "rm", *new_volumes], capture_output=True)
        raise


def container_health(stack: Stack) -> dict[str, str]:
    """Container name -> health (or state, for containers without a healthcheck) of the project's containers."""
    ids = stack.leftovers()["containers"]
    if not ids:
        return {}
    out = subprocess.run(["docker", "inspect", *ids], capture_output=True, text=True, check=True).stdout
    health = {}
    for info in json.loads(out):
        state = info["State"]
        health[info["Name"].lstrip("/")] = (state.get("Health") or {}).get("Status") or state["Status"]
    return health


def wait_healthy(stack: Stack, timeout: float) -> dict[str, str]:
    """Wait until every container is healthy (or exited 0, for the one-shot bucket job); raise SetupError naming
    the ones that are not, with the end of their logs."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        health = container_health(stack)
        bad = {n: h for n, h in health.items() if h not in ("healthy", "exited")}
        if health and not bad:
            return health
        if time.monotonic() > deadline or any(h in ("unhealthy", "dead") for h in bad.values()):
            logs = {n: subprocess.run(["docker", "logs", "--tail", "15", n], capture_output=True,
                                      text=True).stderr[-1500:] for n in bad}
            raise SetupError("not healthy after start: " + ", ".join(f"{n} ({h})" for n, h in bad.items()) +
                             "".join(f"\n--- {n}\n{text}" for n, text in logs.items()))
        time.sleep(2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m infra.compose_stack", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument("--env-file", type=Path, default=ENV_FILE)
    parser.add_argument("--workers", type=int, default=2, help="CPU workers to start with `up` (default 2)")
    parser.add_argument("--volumes", action="store_true", help="`down` also removes the data volumes")
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            stack, values = preflight(args.env_file)
            up(stack, args.workers)
            ports = published_ports(values)
            bind = values.get("LABELSHIFT_BIND") or "127.0.0.1"
            print(f"stack '{stack.project}' up: Prefect https://{bind}:{ports['prefect']}, MLflow "
                  f"https://{bind}:{ports['mlflow']}, S3 https://{bind}:{ports['s3']}, {args.workers} CPU worker(s); "
                  f"clients trust {tls_dir(values) / 'ca.crt'}")
            return 0
        require_docker()
        values = check_settings(args.env_file)
        stack = Stack(project=values.get("COMPOSE_PROJECT_NAME") or DEFAULT_PROJECT, env_file=args.env_file,
                      tool=tuple(compose_tool()))
        if args.action == "down":
            stack.run("--profile", "cpu", "--profile", "gpu", "down", "--remove-orphans",
                      *(["--volumes"] if args.volumes else []))
            return 0
        for name, health in sorted(container_health(stack).items()):
            print(f"{name:40s} {health}")
        return 0
    except SetupError as exc:
        print(f"{parser.prog} {args.action}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
