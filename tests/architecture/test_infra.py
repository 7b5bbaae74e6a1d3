"""What can be checked of the container infrastructure without Docker (it cannot run here).

- ``infra/compose.yaml`` parses and wires the expected services: ports, healthchecks that probe the port each
  service listens on, ``depends_on`` conditions, GPU reservations, and client addresses that name real services.
- ``prefect.yaml`` parses as Prefect's own model reads it, and every entrypoint imports and names a real flow whose
  signature accepts the deployment's parameters; the scheduled ``reestimate`` deployments carry a cron schedule
  Prefect accepts, one run at a time, and only one of them is scheduled.
- The ``Dockerfile`` installs the package with the same pip command as the Makefile and pins torch like
  ``pyproject.toml``; it ends as a non-root user and starts a worker on the pool the deployments use.
- The docker work-pool template matches the variables of Prefect's default ``docker`` template.
"""
from __future__ import annotations

import ast
import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "infra" / "compose.yaml"
PREFECT_YAML = ROOT / "prefect.yaml"
DOCKERFILE = ROOT / "Dockerfile"
MAKEFILE = ROOT / "Makefile"
PYPROJECT = ROOT / "pyproject.toml"
DOCKER_POOL_TEMPLATE = ROOT / "infra" / "work-pools" / "labelshift-docker.json"
ENV_EXAMPLE = ROOT / "infra" / "env.example"

SERVER_PORTS = {"prefect": 4200, "mlflow": 5000, "s3": 8333}
WORKERS = ("worker-gpu0", "worker-gpu1", "worker-cpu")


# -- helpers -----------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def prefect_yaml() -> dict:
    return yaml.safe_load(PREFECT_YAML.read_text())


def _command_text(command) -> str:
    return " ".join(command) if isinstance(command, list) else str(command)


def _listen_port(command) -> int | None:
    """The port a server command listens on (``--port N`` or ``-s3.port=N``)."""
    text = _command_text(command)
    match = re.search(r"(?:--port[ =]|-s3\.port=)(\d+)", text)
    return int(match.group(1)) if match else None


def _healthcheck_port(check: dict) -> int | None:
    match = re.search(r"127\.0\.0\.1:(\d+)", _command_text(check["test"]))
    return int(match.group(1)) if match else None


def _published_container_ports(service: dict) -> set[int]:
    # "${LABELSHIFT_BIND:-127.0.0.1}:4200:4200" -> 4200 (the container side is the last field)
    return {int(str(p).rsplit(":", 1)[-1]) for p in service.get("ports", [])}


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    out, pending = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        keyword, _, rest = line.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


def _pip_installs(shell_text: str) -> list[tuple[str, ...]]:
    """Arguments of every ``pip install`` in a shell command line (split on && ; |)."""
    installs = []
    for part in re.split(r"&&|;|\|\||\n", shell_text):
        tokens = shlex.split(part)
        for i in range(len(tokens) - 1):
            if tokens[i].endswith("pip") and tokens[i + 1] == "install":
                installs.append(tuple(tokens[i + 2:]))
    return installs


def _makefile_setup_recipe() -> str:
    """The recipe that installs the package: the ``$(STAMP)`` target that ``make setup`` builds."""
    lines = MAKEFILE.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("$(STAMP):")), None)
    if start is None:  # another layout: every pip install of the Makefile
        return "\n".join(line.strip() for line in lines if "pip install" in line)
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    return "\n".join(recipe)


def _pyproject_pins() -> dict[str, str]:
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    pins = {}
    for dep in deps:
        name, sep, version = dep.partition("==")
        if sep:
            pins[name.strip().lower()] = version.strip()
    return pins


# -- compose -----------------------------------------------------------------------------------------------------------
def test_compose_has_the_servers_and_workers(compose):
    services = compose["services"]
    for name in ("postgres", "prefect", "mlflow", "s3", "s3-init", "proxy", *WORKERS):
        assert name in services, f"compose.yaml lacks the {name!r} service"


@pytest.mark.parametrize("name", sorted(SERVER_PORTS))
def test_compose_servers_listen_and_probe_the_same_port_and_only_the_tls_proxy_publishes_it(compose, name):
    service = compose["services"][name]
    port = SERVER_PORTS[name]
    assert _listen_port(service["command"]) == port
    assert _healthcheck_port(service["healthcheck"]) == port
    assert "ports" not in service, f"{name} is published past the TLS proxy"
    proxy = compose["services"]["proxy"]
    assert port in _published_container_ports(proxy)
    # published on LABELSHIFT_BIND, loopback unless the operator opens it
    assert all(str(p).startswith("${LABELSHIFT_BIND:-127.0.0.1}:") for p in proxy["ports"])
    # nginx passes that port (and its internal plain one, port + 1) on to the service, over the servers' network
    conf = (ROOT / "infra" / "proxy" / "nginx.conf").read_text()
    block = re.search(rf"listen {port} ssl;\s*listen {port + 1};(.*?)\n    }}", conf, re.S)
    assert block and re.search(rf"location / {{.*?set \$\w+ http://{name}:{port};\s*proxy_pass", block[1], re.S), name
    # the server is on the servers' network only, which the proxy alone shares with the workers
    assert service["networks"] == ["servers"] and set(proxy["networks"]) == {"default", "servers"}
    assert compose["networks"]["servers"]["internal"] is True


def test_the_proxy_certificate_is_made_for_a_private_ca_and_refused_when_it_would_fail(tmp_path):
    """infra/tls.py: a private CA and a server certificate naming the hosts (the keys the owner's only); a missing
    pair, a certificate ending within a day and one for another host are refused, each with its fix."""
    import ssl

    tls = _infra_module("tls")
    tls.make_certificates(tmp_path / "ok", ["stack.example", "127.0.0.1"])
    tls.check_certificate(tmp_path / "ok", "stack.example")
    tls.check_certificate(tmp_path / "ok", "127.0.0.1")
    assert oct((tmp_path / "ok" / "server.key").stat().st_mode & 0o777) == "0o600"
    ssl.create_default_context(cafile=str(tmp_path / "ok" / "ca.crt"))         # a CA Python's ssl takes
    with pytest.raises(tls.SetupError, match="is not for other.example"):
        tls.check_certificate(tmp_path / "ok", "other.example")
    with pytest.raises(tls.SetupError, match="lacks server.crt or server.key"):
        tls.check_certificate(tmp_path / "none", "stack.example")
    tls.make_certificates(tmp_path / "short", ["stack.example"], days=1)
    with pytest.raises(tls.SetupError, match="expires within a day"):
        tls.check_certificate(tmp_path / "short", "stack.example")


def test_compose_every_long_running_service_has_a_healthcheck(compose):
    for name, service in compose["services"].items():
        if name in ("s3-init", "mlflow-init", "prefect-init"):  # one-shot jobs: no restarts, the image's healthcheck switched off
            assert service.get("restart") == "no" and service["healthcheck"] == {"disable": True}
            continue
        assert "healthcheck" in service and service["healthcheck"]["test"], f"{name} has no healthcheck"


def test_compose_start_order(compose):
    services = compose["services"]

    def conditions(name):
        return {dep: spec["condition"] for dep, spec in services[name]["depends_on"].items()}

    assert conditions("prefect") == {"postgres": "service_healthy"}
    assert conditions("s3-init") == {"s3": "service_healthy"}
    assert conditions("mlflow") == {"s3-init": "service_completed_successfully"}
    assert conditions("mlflow-init") == {"mlflow": "service_healthy"}
    for worker in WORKERS:        # their door is open and the workers' MLflow user exists before they start
        assert conditions(worker) == {"proxy": "service_healthy", "prefect-init": "service_completed_successfully",
                                      "mlflow-init": "service_completed_successfully"}
    assert conditions("prefect-init") == {"prefect": "service_healthy"}
    # every dependency is a service of the file
    for name, service in services.items():
        for dep in service.get("depends_on", {}):
            assert dep in services, f"{name} depends on unknown service {dep}"


def test_compose_prefect_uses_postgres(compose):
    env = compose["services"]["prefect"]["environment"]
    url = env["PREFECT_API_DATABASE_CONNECTION_URL"]
    assert url.startswith("postgresql+asyncpg://") and "@postgres:5432/" in url
    postgres = compose["services"]["postgres"]["environment"]
    assert url.endswith("/" + postgres["POSTGRES_DB"])


def test_compose_mlflow_proxies_artifacts_to_the_s3_service(compose):
    mlflow = compose["services"]["mlflow"]
    command = mlflow["command"]
    destination = command[command.index("--artifacts-destination") + 1]
    assert destination.startswith("s3://")
    backend = command[command.index("--backend-store-uri") + 1]
    assert backend.startswith("sqlite:////data/") and "mlflow:/data" in mlflow["volumes"]
    assert mlflow["environment"]["MLFLOW_S3_ENDPOINT_URL"] == f"http://s3:{SERVER_PORTS['s3']}"
    # the Host header other containers send must be accepted
    assert "mlflow:*" in mlflow["environment"]["MLFLOW_SERVER_ALLOWED_HOSTS"].split(",")


def test_compose_gpu_workers_reserve_one_distinct_nvidia_gpu_each(compose):
    seen = []
    for name in ("worker-gpu0", "worker-gpu1"):
        service = compose["services"][name]
        assert service["profiles"] == ["gpu"]
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
        assert len(device["device_ids"]) == 1
        seen.append(device["device_ids"][0])
        assert service["environment"]["LABELSHIFT_WORKER_LIMIT"] == "1"  # one flow run per GPU
    assert len(set(seen)) == len(seen)
    assert "deploy" not in compose["services"]["worker-cpu"]


def test_compose_client_addresses_name_real_services(compose):
    services = compose["services"]
    env = services["worker-gpu0"]["environment"]
    conf = (ROOT / "infra" / "proxy" / "nginx.conf").read_text()
    for variable, service in (("PREFECT_API_URL", "prefect"), ("MLFLOW_TRACKING_URI", "mlflow"),
                              ("AWS_ENDPOINT_URL_S3", "s3")):
        # the proxy's internal port of that service (its server block passes it on to the service)
        match = re.fullmatch(r"http://([\w-]+):(\d+)(/api)?", env[variable])
        assert match, env[variable]
        assert match.group(1) == "proxy" and int(match.group(2)) == SERVER_PORTS[service] + 1
        assert re.search(rf"listen {match.group(2)};.*?http://{service}:{SERVER_PORTS[service]};", conf, re.S)
    assert env["LABELSHIFT_STORE"].startswith("s3://")


def test_compose_builds_the_worker_image_from_the_repository(compose):
    postgres = compose["services"]["postgres"]
    # Prefect's database: Debian's PostgreSQL in an image built here, on the same base argument
    assert (COMPOSE.parent / postgres["build"]["context"] / "Dockerfile").is_file()
    assert postgres["image"].startswith("${LABELSHIFT_POSTGRES_IMAGE:-")
    assert "postgresql-15" in (COMPOSE.parent / postgres["build"]["context"] / "Dockerfile").read_text()
    # the TLS proxy: Debian's nginx in an image built here, on the same base argument
    proxy = compose["services"]["proxy"]
    assert proxy["image"].startswith("${LABELSHIFT_PROXY_IMAGE:-")
    assert "nginx" in (COMPOSE.parent / proxy["build"]["context"] / "Dockerfile").read_text()
    for name, service in compose["services"].items():
        if name in ("postgres", "proxy"):
            continue
        build = service["build"]
        context = (COMPOSE.parent / build["context"]).resolve()
        assert context == ROOT and (context / build["dockerfile"]).is_file()


def test_compose_bucket_init_calls_a_real_function(compose):
    from stack.supervisor import ensure_bucket

    command = compose["services"]["s3-init"]["command"]
    assert command[:2] == ["python", "-c"]
    code = command[2]
    compile(code, "s3-init", "exec")  # valid Python
    assert "from stack.supervisor import ensure_bucket" in code and callable(ensure_bucket)


def test_compose_required_variables_are_in_the_env_template(compose):
    required = set(re.findall(r"\$\{(\w+):\?", COMPOSE.read_text()))
    template = {line.split("=", 1)[0] for line in ENV_EXAMPLE.read_text().splitlines()
                if line and not line.startswith("#") and "=" in line}
    assert required, "expected the secrets to be required variables"
    assert required <= template, f"missing from infra/env.example: {sorted(required - template)}"


def test_compose_network_is_the_one_the_docker_pool_joins(compose):
    template = json.loads(DOCKER_POOL_TEMPLATE.read_text())
    name = compose["networks"]["default"]["name"]
    default = re.fullmatch(r"\$\{LABELSHIFT_NETWORK:-([\w-]+)\}", name)   # the env file may rename it
    assert default, name
    assert template["variables"]["properties"]["networks"]["default"] == [default.group(1)]


# -- prefect.yaml ------------------------------------------------------------------------------------------------------
def test_prefect_yaml_is_valid_for_prefect_deploy(prefect_yaml):
    try:
        from prefect.cli.deploy._models import PrefectYamlModel
    except ImportError:  # a private module; the checks below still run
        pytest.skip("prefect's prefect.yaml model moved")
    model = PrefectYamlModel.model_validate(prefect_yaml)
    assert {d.name for d in model.deployments} >= {"reproduce", "reproduce-images", "reproduce-smoke",
                                                   "reproduce-docker", "reestimate", "reestimate-docker"}


def test_prefect_yaml_pull_step_uses_the_code_dir_the_image_and_stack_set(prefect_yaml):
    (step,) = prefect_yaml["pull"]
    assert step == {"prefect.deployments.steps.set_working_directory": {"directory": "{{ $LABELSHIFT_CODE_DIR }}"}}
    env = dict(_dockerfile_env())
    code_dir = Path(env["LABELSHIFT_CODE_DIR"])
    assert any(k == "COPY" and args.split()[-1] == str(code_dir) for k, args in _dockerfile_instructions())
    from stack.supervisor import code_dir as stack_code_dir

    assert (stack_code_dir() / "flows" / "reproduce.py").is_file()


def test_prefect_yaml_entrypoints_name_real_flows_that_accept_the_parameters(prefect_yaml):
    from prefect import Flow
    from prefect.flows import load_flow_from_entrypoint

    for deployment in prefect_yaml["deployments"]:
        path, _, function = deployment["entrypoint"].partition(":")
        assert (ROOT / path).is_file(), f"{deployment['name']}: {path} does not exist"
        flow = load_flow_from_entrypoint(str(ROOT / deployment["entrypoint"]))
        assert isinstance(flow, Flow) and flow.fn.__name__ == function
        # the values must pass the flow's own validation (types, ranges, choices of methods...)
        flow.validate_parameters(dict(deployment.get("parameters") or {}))


def test_prefect_yaml_work_pools(prefect_yaml):
    pools = {d["name"]: d["work_pool"]["name"] for d in prefect_yaml["deployments"]}
    assert pools["reproduce"] == pools["reproduce-smoke"] == "labelshift"
    assert pools["reproduce-docker"] == "labelshift-docker"
    docker = next(d for d in prefect_yaml["deployments"] if d["name"] == "reproduce-docker")
    assert docker["work_pool"]["job_variables"]["image"].startswith("labelshift-worker")
    # the image's worker polls the process pool by default
    assert dict(_dockerfile_env())["LABELSHIFT_POOL"] == "labelshift"


def test_prefect_yaml_reestimate_deployments(prefect_yaml):
    """The scheduled re-estimation: daily cron in UTC, one run at a time, on the process pool; the docker variant
    has its schedule switched off (both would read the same target and watermark)."""
    from prefect.cli.deploy._models import DeploymentConfig
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.flows import load_flow_from_entrypoint

    deployments = {d["name"]: d for d in prefect_yaml["deployments"]}
    process, docker = deployments["reestimate"], deployments["reestimate-docker"]
    flow = load_flow_from_entrypoint(str(ROOT / process["entrypoint"]))
    assert flow.name == "reestimate" and flow.fn.__name__ == "reestimate"
    for deployment in (process, docker):
        DeploymentConfig.model_validate(deployment)
        assert deployment["entrypoint"] == "flows/reestimate.py:reestimate"
        assert deployment["concurrency_limit"] == 1
        assert deployment["enforce_parameter_schema"] is True
        (schedule,) = deployment["schedules"]
        cron = CronSchedule(cron=schedule["cron"], timezone=schedule["timezone"])   # as the server validates it
        assert (cron.cron, cron.timezone) == ("0 6 * * *", "UTC")
        # the defaults name a registry model and an S3 target, and the flow's own validation accepts them
        parameters = deployment["parameters"]
        assert parameters["model"].startswith("models:/") and "@" in parameters["model"]
        assert parameters["target"].startswith("s3://")
        flow.validate_parameters(dict(parameters))
    assert process["schedules"][0].get("active", True) is True
    assert docker["schedules"][0]["active"] is False
    assert process["work_pool"]["name"] == "labelshift" and docker["work_pool"]["name"] == "labelshift-docker"
    # the target is the `target/` folder of the store the stack and compose.yaml give the workers
    from stack.supervisor import DEFAULT_BUCKET

    assert process["parameters"]["target"] == f"s3://{DEFAULT_BUCKET}/store/target"


# -- Dockerfile --------------------------------------------------------------------------------------------------------
def _dockerfile_env() -> list[tuple[str, str]]:
    pairs = []
    for keyword, args in _dockerfile_instructions():
        if keyword == "ENV":
            for token in shlex.split(args):
                name, _, value = token.partition("=")
                pairs.append((name, value))
    return pairs


def test_dockerfile_installs_the_package_like_the_makefile():
    make_installs = _pip_installs(_makefile_setup_recipe())
    docker_installs = [inst for k, args in _dockerfile_instructions() if k == "RUN" for inst in _pip_installs(args)]
    package = [i for i in make_installs if any(arg.startswith(".") for arg in i)]
    assert package, "the Makefile's setup recipe has no `pip install` of the package"
    for install in make_installs:
        assert install in docker_installs, f"the Dockerfile lacks `pip install {' '.join(install)}`"
    # anything else the Dockerfile installs must be a pin of pyproject.toml (the cached torch layer)
    pins = _pyproject_pins()
    for install in docker_installs:
        if install in make_installs:
            continue
        for requirement in install:
            name, sep, version = requirement.partition("==")
            assert sep and pins.get(name.lower()) == version, f"{requirement} is not pinned so in pyproject.toml"


def test_dockerfile_torch_pins_match_pyproject():
    pins = _pyproject_pins()
    assert {"torch", "torchvision"} <= set(pins)
    text = " ".join(args for k, args in _dockerfile_instructions() if k == "RUN")
    for name in ("torch", "torchvision"):
        assert f"{name}=={pins[name]}" in text.split(), f"the Dockerfile does not pin {name}=={pins[name]}"


def test_dockerfile_runs_as_a_non_root_user():
    instructions = _dockerfile_instructions()
    users = [(i, args) for i, (k, args) in enumerate(instructions) if k == "USER"]
    assert users, "no USER instruction: the image would run as root"
    last_index, user = users[-1]
    assert user.split(":")[0] not in ("root", "0")
    created = " ".join(args for k, args in instructions if k == "RUN")
    assert re.search(rf"useradd\b.*\b{re.escape(user)}\b", created), f"user {user} is never created"
    cmd_index = max(i for i, (k, _) in enumerate(instructions) if k in ("CMD", "ENTRYPOINT"))
    assert last_index < cmd_index


def test_dockerfile_base_python_and_worker_command():
    instructions = _dockerfile_instructions()
    args = dict(v.split("=", 1) for k, v in instructions if k == "ARG" and "=" in v)
    base = args["BASE_IMAGE"]
    # a Debian 12 base any user can get (Docker Hub's, or the one `make image` builds with mmdebstrap)
    assert base.startswith("debian:bookworm"), base
    assert any(k == "FROM" and "${BASE_IMAGE}" in v for k, v in instructions)
    runs = " ".join(v for k, v in instructions if k == "RUN")
    assert "python3.11 -m venv" in runs  # the version pyproject.toml requires
    # Debian's own python3.11: no third-party archive
    assert "python3.11" in runs and "add-apt-repository" not in runs and "ppa:" not in DOCKERFILE.read_text()
    assert ">=3.11,<3.12" in PYPROJECT.read_text()
    (cmd,) = [v for k, v in instructions if k == "CMD"]
    command = " ".join(json.loads(cmd))
    # `labelshift worker` (runtime.worker_guard): Prefect's process worker whose runs end cleanly on docker stop
    assert "exec labelshift worker" in command and "--limit" in command and "-- --with-healthcheck" in command
    from flows.cli import build_parser
    from flows.cli.worker import prefect_command

    argv = shlex.split(command.split("exec ", 1)[1].replace('"$LABELSHIFT_POOL"', "p").replace(
        '"$LABELSHIFT_WORKER_LIMIT"', "1").replace('"${LABELSHIFT_WORKER_NAME:-worker-$(hostname)}"', "w"))
    prefect = prefect_command(build_parser().parse_args(argv[1:]))
    assert prefect[2:] == ["prefect", "worker", "start", "--pool", "p", "--type", "process", "--name", "w",
                           "--limit", "1", "--with-healthcheck"], prefect


def test_compose_gives_a_stopped_worker_time_for_its_runs():
    """`docker compose stop` waits stop_grace_period before SIGKILL: longer than the worker's own grace for its
    flow runs (LABELSHIFT_WORKER_STOP_S) plus its own exit."""
    from runtime.timeouts import WORKER_STOP_S
    from runtime.worker_guard import KILL_WAIT_S, SETTLE_BUDGET_S, WORKER_EXIT_S

    compose = yaml.safe_load(COMPOSE.read_text())
    for name in WORKERS:
        period = compose["services"][name]["stop_grace_period"]
        assert period.endswith("s") and float(period[:-1]) > WORKER_STOP_S + KILL_WAIT_S + SETTLE_BUDGET_S + \
            WORKER_EXIT_S, (name, period)


def test_dockerignore_keeps_local_state_out():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", ".labelshift", "infra/.env"} <= ignored


# -- docker work-pool template -------------------------------------------------------------------------------------------
def test_docker_pool_template_matches_prefects_docker_variables():
    template = json.loads(DOCKER_POOL_TEMPLATE.read_text())
    properties = template["variables"]["properties"]
    # every job field is a template of the variable of the same name
    assert template["job_configuration"] == {name: "{{ " + name + " }}" for name in properties}
    import prefect

    bundled = Path(prefect.__file__).parent / "server/api/collections_data/views/aggregate-worker-metadata.json"
    if not bundled.is_file():
        pytest.skip("prefect no longer bundles the worker metadata")
    default = json.loads(bundled.read_text())["prefect-docker"]["docker"]["default_base_job_configuration"]
    assert set(properties) == set(default["variables"]["properties"])
    env = properties["env"]["default"]
    # secrets come from Secret blocks, never from the file
    assert env["AWS_SECRET_ACCESS_KEY"].startswith("{{ prefect.blocks.secret.")
    assert env["AWS_ACCESS_KEY_ID"].startswith("{{ prefect.blocks.secret.")
    assert env["MLFLOW_TRACKING_URI"] == f"http://mlflow:{SERVER_PORTS['mlflow']}"
    assert env["AWS_ENDPOINT_URL_S3"] == f"http://s3:{SERVER_PORTS['s3']}"


# -- the container tooling, what runs without Docker ----------------------------------------------------------------------
# infra/ is a package of scripts run as modules (python3 -m infra.image); image, tls and compose_stack need the
# standard library only
def _infra_module(name: str):
    import importlib

    return importlib.import_module(f"infra.{name}")


#: the infra modules any Python 3.11 runs before ``make setup`` (the Makefile's $(PYTHON), not the project's venv)
SYSTEM_PYTHON_MODULES = ("image", "tls", "compose_stack")


def sys_path_edits(source: str) -> list[int]:
    """Line numbers where ``source`` reaches ``sys.path`` (``sys.path.insert``, ``sys.path.append``, an assignment,
    ``from sys import path``)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                and node.value.id == "sys"):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "sys" and any(a.name == "path" for a in node.names):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_sys_path_check_sees_an_edit():
    assert sys_path_edits("import sys\nsys.path.insert(0, 'x')\nfrom sys import path\n") == [2, 3]
    assert sys_path_edits("import os\nos.path.join('a')\nsys_path = []\n") == []


def test_infra_is_a_package_run_as_modules():
    """infra/ is a package: its modules import each other as ``infra.NAME`` (never a sibling by a bare name, never
    through ``sys.path``), and the Makefile runs them as modules (``python -m infra.NAME``), never by path."""
    assert (ROOT / "infra" / "__init__.py").is_file()
    siblings = {p.stem for p in (ROOT / "infra").glob("*.py")} - {"__init__"}
    problems = []
    for path in sorted((ROOT / "infra").glob("*.py")):
        source = path.read_text(encoding="utf-8")
        problems += [f"{path.name}:{line} edits sys.path" for line in sys_path_edits(source)]
        for node in ast.walk(ast.parse(source)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and not node.level else [])
            problems += [f"{path.name}:{node.lineno} imports {name} by a bare name (write infra.{name})"
                         for name in names if name and name.split(".")[0] in siblings]
    assert not problems, problems
    make = MAKEFILE.read_text()
    assert not re.findall(r"python\S*\)?\s+infra/\w+\.py", make), "the Makefile runs an infra script by path"
    for name in ("image", "compose_stack", "stack_e2e"):
        assert f"-m infra.{name}" in make, f"the Makefile does not run infra.{name} as a module"


def test_no_test_reaches_infra_through_sys_path():
    """The tests import infra's modules as the package they are (``from infra.access_probes import ...``)."""
    found = [f"{path.relative_to(ROOT)}:{number}"
             for top in ("tests", "tests_ui") for path in sorted((ROOT / top).rglob("*.py"))
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if "sys.path" in line and "infra" in line and path.name != "test_infra.py"]
    assert not found, found


def test_the_system_python_scripts_load_the_standard_library_only():
    """``make image`` and ``make stack-docker-up`` run with any Python 3.11, before ``make setup``: importing their
    modules, and stack.access (the roles compose_stack checks the env file against), loads nothing but the standard
    library."""
    import subprocess
    import sys

    modules = ", ".join(f"infra.{name}" for name in SYSTEM_PYTHON_MODULES)
    code = ("import sys\n"
            "before = set(sys.modules)\n"
            f"import {modules}\n"
            "import stack.access\n"
            "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
            "print(sorted(new - set(sys.stdlib_module_names) - {'infra', 'stack'}))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", f"importing {modules} and stack.access loaded {done.stdout.strip()}"


def test_dockerfile_installs_dependencies_before_the_code():
    """A code change must not reinstall torch or the other dependencies: torch, then pyproject.toml alone and its
    dependencies, and only then the whole source."""
    instructions = _dockerfile_instructions()

    def index(predicate) -> int:
        return next(i for i, (k, v) in enumerate(instructions) if predicate(k, v))

    torch = index(lambda k, v: k == "RUN" and "torch==" in v)
    manifest = index(lambda k, v: k == "COPY" and v.split()[0] == "pyproject.toml")
    deps = index(lambda k, v: k == "RUN" and "pip install -e" in v)
    code = index(lambda k, v: k == "COPY" and v.split()[0] == ".")
    assert torch < manifest < deps < code
    assert set(instructions[manifest][1].split()[:-1]) <= {"pyproject.toml", "README.md"}
    # everything that pip installs needs the CA helper wrapper (a no-op without LABELSHIFT_BUILD_CA_URL)
    for k, v in instructions:
        if k == "RUN" and "pip install" in v:
            assert all(part.strip().startswith("with-build-ca") for part in v.split("&&") if "pip install" in part)


def test_env_file_checks_name_the_variable_and_the_fix(tmp_path):
    stack = _infra_module("compose_stack")
    with pytest.raises(stack.SetupError, match=r"cp .*env.example"):
        stack.check_settings(tmp_path / "absent.env")
    from stack.access import S3_KEYS, SECRETS

    required = stack.required_variables(COMPOSE.read_text())
    assert set(required) == set(SECRETS) | {v for pair in S3_KEYS.values() for v in pair}
    complete = {name: f"value-of-{name.lower()}" for name in required}
    env = tmp_path / ".env"
    env.write_text("".join(f"{k}={v}\n" for k, v in complete.items() if k not in ("AWS_SECRET_ACCESS_KEY",
                                                                                  "POSTGRES_PASSWORD"))
                   + "AWS_SECRET_ACCESS_KEY=\n# POSTGRES_PASSWORD=x\n")
    with pytest.raises(stack.SetupError, match=r"lacks a value for (POSTGRES_PASSWORD, AWS_SECRET_ACCESS_KEY|"
                                               r"AWS_SECRET_ACCESS_KEY, POSTGRES_PASSWORD)"):
        stack.check_settings(env)
    # the template's placeholders are refused too, every secret named
    with pytest.raises(stack.SetupError, match=r"change-me") as refused:
        stack.check_settings(ENV_EXAMPLE)
    assert all(name in str(refused.value) for name in SECRETS), refused.value
    env.write_text("".join(f"{k}={v}\n" for k, v in complete.items()).replace("value-of-aws_secret_access_key",
                                                                                "'s3cr3t'"))
    assert stack.check_settings(env)["AWS_SECRET_ACCESS_KEY"] == "s3cr3t"
    with pytest.raises(stack.SetupError, match="LABELSHIFT_S3_PORT='83x3' is not a port"):
        stack.published_ports({"LABELSHIFT_S3_PORT": "83x3"})


def test_every_compose_variable_is_in_the_env_template():
    used = set(re.findall(r"\$\{(\w+)", COMPOSE.read_text())) - {"BASE_IMAGE"}   # BASE_IMAGE: make image's argument
    template = {line.split("=", 1)[0] for line in ENV_EXAMPLE.read_text().splitlines()
                if line and not line.startswith("#") and "=" in line}
    assert used <= template, f"missing from infra/env.example: {sorted(used - template)}"


def test_a_taken_port_is_named_with_its_variable():
    import socket

    stack = _infra_module("compose_stack")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            free = probe.getsockname()[1]
        with pytest.raises(stack.SetupError, match=rf"{taken} \(mlflow, LABELSHIFT_MLFLOW_PORT\)") as info:
            stack.check_ports_free("127.0.0.1", {"prefect": free, "mlflow": taken})
        assert str(free) not in str(info.value)


def test_missing_or_stopped_docker_names_the_fix(monkeypatch):
    import subprocess

    image = _infra_module("image")
    monkeypatch.setattr(image.shutil, "which", lambda name: None)
    with pytest.raises(image.SetupError, match=r"apt-get install -y docker\.io"):
        image.require_docker()
    monkeypatch.setattr(image.shutil, "which", lambda name: "/usr/bin/" + name)
    refused = subprocess.CompletedProcess([], 1, "", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock")
    monkeypatch.setattr(image.subprocess, "run", lambda *a, **k: refused)
    with pytest.raises(image.SetupError, match=r"not running \(Cannot connect.*\): start it with `systemctl start"):
        image.require_docker()


def test_host_pip_configuration_is_served_on_loopback(tmp_path):
    """file:// indexes and find-links folders become URLs of the build's loopback server (an index's parent is
    served, its pages link ../../files/); network URLs are kept; the CA bundle is served as /ca.crt and nothing
    outside the folders is."""
    import urllib.error
    import urllib.request

    image = _infra_module("image")
    (tmp_path / "pypi" / "simple" / "pkg").mkdir(parents=True)
    (tmp_path / "pypi" / "files").mkdir()
    (tmp_path / "pypi" / "files" / "pkg-1.0-py3-none-any.whl").write_bytes(b"wheel")
    (tmp_path / "pypi" / "files" / "pkg-2.0+cpu-py3-none-any.whl").write_bytes(b"local version")
    (tmp_path / "wheels").mkdir()
    (tmp_path / "secret.txt").write_text("not served")
    bundle = tmp_path / "ca.crt"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    config = {"extra-index-url": f"file://{tmp_path}/pypi/simple https://mirror.example/simple",
              "find-links": f"{tmp_path}/wheels {tmp_path}/absent", "cert": str(bundle)}
    with socket_port() as port:
        sources = image.pip_sources(config, port)
    base = f"http://127.0.0.1:{port}"
    assert sources.extra_index_urls == [f"{base}/d0/simple/", "https://mirror.example/simple"]
    assert sources.find_links == [f"{base}/d1/"]          # the absent folder is dropped
    args = image.build_args(sources, port)
    assert args == {"PIP_EXTRA_INDEX_URL": f"{base}/d0/simple/ https://mirror.example/simple",
                    "PIP_FIND_LINKS": f"{base}/d1/", "LABELSHIFT_BUILD_CA_URL": f"{base}/ca.crt"}
    server = image.serve_sources(sources, port)
    try:
        assert urllib.request.urlopen(f"{base}/d0/files/pkg-1.0-py3-none-any.whl").read() == b"wheel"
        # pip quotes the '+' of a local version
        assert urllib.request.urlopen(f"{base}/d0/files/pkg-2.0%2Bcpu-py3-none-any.whl").read() == b"local version"
        assert urllib.request.urlopen(f"{base}/ca.crt").read() == bundle.read_bytes()
        for outside in ("/d0/../secret.txt", "/d0/%2e%2e/secret.txt", "/secret.txt", "/d9/x"):
            with pytest.raises(urllib.error.HTTPError):
                urllib.request.urlopen(base + outside)
        with pytest.raises(image.SetupError, match=f"port {port} .* IMAGE_SERVE_PORT"):
            image.serve_sources(sources, port)             # taken now: by the server itself
    finally:
        server.shutdown()
        server.server_close()


class socket_port:
    """A free loopback port (released on entry, so a server can take it)."""

    def __enter__(self) -> int:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    def __exit__(self, *exc) -> None:
        pass


def test_build_ca_helper_gives_pip_the_bundle_and_removes_it(tmp_path):
    """infra/with-build-ca as the Dockerfile runs it: without a URL the command runs as it is; with one, the
    command sees PIP_CERT naming a file with the bundle's bytes, and the file is gone afterwards."""
    import shutil
    import subprocess

    if shutil.which("python3.11") is None:
        pytest.skip("the helper runs python3.11, as in the image")
    image = _infra_module("image")
    helper = ROOT / "infra" / "with-build-ca"
    probe = "import os,sys; p=os.environ.get('PIP_CERT',''); print(p); print(open(p).read() if p else '')"
    plain = subprocess.run([str(helper), "python3.11", "-c", probe], capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin"})
    assert plain.returncode == 0 and plain.stdout.strip() == ""
    bundle = tmp_path / "ca.crt"
    bundle.write_text("CA BYTES")
    with socket_port() as port:
        sources = image.PipSources(ca_bundle=bundle)
    server = image.serve_sources(sources, port)
    try:
        done = subprocess.run([str(helper), "python3.11", "-c", probe], capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin", "LABELSHIFT_BUILD_CA_URL": f"http://127.0.0.1:{port}/ca.crt"})
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stderr
    path, content = done.stdout.split("\n", 1)
    assert content.strip() == "CA BYTES" and not Path(path).exists()


def test_the_e2e_env_file_passes_the_checks_of_a_real_start(tmp_path):
    stack = _infra_module("compose_stack")
    e2e = _infra_module("stack_e2e")
    path, values = e2e.write_env_file(tmp_path)
    checked = stack.check_settings(path)
    assert checked == values and checked["COMPOSE_PROJECT_NAME"] != stack.DEFAULT_PROJECT
    ports = stack.published_ports(checked)
    assert len(set(ports.values())) == 3
    assert oct(path.stat().st_mode & 0o777) == "0o600"                # it holds the secrets
    env = e2e.client_environment(values, tmp_path)
    assert env["PREFECT_API_URL"] == f"https://127.0.0.1:{ports['prefect']}/api"
    assert env["AWS_CA_BUNDLE"] == env["SSL_CERT_FILE"] == values["LABELSHIFT_TLS_DIR"] + "/ca.crt"
    assert env["AWS_ENDPOINT_URL_S3"].endswith(f":{ports['s3']}")


def test_a_failed_start_removes_what_it_created_and_keeps_older_volumes(monkeypatch):
    """`up` fails (a service never healthy): `down` runs and the volumes this start created are removed, the ones
    that existed before it are not."""
    import subprocess

    stack_mod = _infra_module("compose_stack")
    calls, removed = [], []

    class FakeStack:
        volumes = ["labelshift_s3"]                      # data of an earlier start

        def leftovers(self):
            return {"containers": [], "networks": [], "volumes": list(self.volumes)}

        def run(self, *args, check=True, capture=False):
            calls.append(args)
            if "up" in args:
                self.volumes += ["labelshift_postgres", "labelshift_mlflow"]
                raise stack_mod.SetupError("prefect is unhealthy")
            return subprocess.CompletedProcess(args, 0)

    monkeypatch.setattr(stack_mod.subprocess, "run", lambda cmd, **kw: removed.append(cmd))
    with pytest.raises(stack_mod.SetupError, match="unhealthy"):
        stack_mod.up(FakeStack(), workers=2)
    assert any("down" in c for c in calls)
    assert removed == [["docker", "volume", "rm", "labelshift_mlflow", "labelshift_postgres"]]


# -- credentials (issue 31) --------------------------------------------------------------------------------------------
def test_the_roles_table_of_the_readme_is_runtime_access():
    from stack.access import ROLES

    text = (ROOT / "infra" / "README.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and line.count(" | ") == 4
            and line.split(" | ")[0][2:] in {r.name for r in ROLES}]
    assert rows == [f"| {r.name} | {r.held_by} | {r.prefect} | {r.mlflow} | {r.s3} |" for r in ROLES]


def test_every_service_of_the_compose_stack_asks_for_credentials():
    """The proxy gets every role's Prefect and MLflow password, MLflow runs the basic-auth app, SeaweedFS gets the
    roles' identities, and the workers hold the workers' credentials, never the operator's, and reach the servers
    through the proxy; every secret is required (no default)."""
    from stack.access import PASSWORDS, S3_KEYS, SECRETS

    text = COMPOSE.read_text()
    compose = yaml.safe_load(text)
    services = compose["services"]
    proxy_env = services["proxy"]["environment"]
    for name in (n for roles in PASSWORDS.values() for n in roles.values()):
        assert proxy_env[name].startswith(f"${{{name}:?"), name
    assert "PREFECT_SERVER_API_AUTH_STRING" not in services["prefect"]["environment"]   # the proxy checks, by role
    mlflow = services["mlflow"]
    assert mlflow["command"][:4] == ["mlflow", "server", "--app-name", "basic-auth"]
    assert mlflow["environment"]["MLFLOW_AUTH_CONFIG_PATH"] == "/opt/labelshift/infra/mlflow/basic_auth.ini"
    assert (ROOT / "infra" / "mlflow" / "basic_auth.ini").is_file()
    s3 = " ".join(services["s3"]["command"])
    assert "python -m stack.access s3-config /tmp/s3.json" in s3 and "-s3.config=/tmp/s3.json" in s3
    assert set(services["s3"]["environment"]) >= {v for pair in S3_KEYS.values() for v in pair}
    worker = services["worker-cpu"]["environment"]
    assert worker["AWS_ACCESS_KEY_ID"].startswith("${LABELSHIFT_S3_WORKER_ACCESS_KEY_ID:?")
    assert worker["MLFLOW_TRACKING_USERNAME"] == "worker"
    assert worker["PREFECT_API_AUTH_STRING"].startswith("worker:${LABELSHIFT_PREFECT_WORKER_PASSWORD:?")
    assert [worker[k] for k in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "AWS_ENDPOINT_URL_S3")] == \
        ["http://proxy:4201/api", "http://proxy:5001", "http://proxy:8334"]
    assert "mlflow-init" in services["worker-cpu"]["depends_on"]
    required = set(re.findall(r"\$\{(\w+):\?", text))
    assert set(SECRETS) <= required, set(SECRETS) - required
    example = ENV_EXAMPLE.read_text()
    assert all(f"\n{name}=" in example and "change-me" in example.split(f"\n{name}=")[1].split("\n")[0]
               for name in SECRETS), "a secret without a placeholder"


def test_stack_docker_up_refuses_short_passwords():
    from infra.compose_stack import SetupError, check_credentials
    from stack.access import PASSWORDS

    good = {name: "p" * 12 for roles in PASSWORDS.values() for name in roles.values()}
    check_credentials(good)
    for name in good:
        with pytest.raises(SetupError, match=f"{name} must be at least 12 characters"):
            check_credentials({**good, name: "short"})
