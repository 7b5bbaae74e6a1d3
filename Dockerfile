# The labelshift worker image: Python 3.11 from Debian 12 (bookworm), the package installed exactly as `make setup`
# installs it, run as a non-root user. By default it starts a Prefect process worker; infra/compose.yaml also uses it
# for the MLflow server, the Prefect server and the SeaweedFS S3 server (all are dependencies of the package), so
# every part of a deployment runs the same versions.
#
#   make image                               # here: builds the base from Debian's packages when it is missing
#   docker build -t labelshift-worker .      # anywhere Docker Hub's debian:bookworm-slim can be pulled
#   docker run --gpus device=0 -e PREFECT_API_URL=http://prefect-host:4200/api labelshift-worker   # one GPU worker
#
# The base is an argument: any Debian 12 image (debian:bookworm-slim, or the one `make image` builds with mmdebstrap
# where no image registry is reachable). Python 3.11 is Debian 12's own python3.11, no third-party archive. The
# torch wheels on PyPI bring their own CUDA runtime libraries (nvidia-* packages); a GPU reaches the container
# through the NVIDIA container toolkit (`docker run --gpus`), which mounts the host's driver. Without a GPU, torch
# falls back to the CPU and everything still runs.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# Python 3.11 with venv, the CA certificates, and tini to reap the flow-run processes a worker starts.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.11 python3.11-venv ca-certificates tini \
 && rm -rf /var/lib/apt/lists/*

# The virtualenv plays the part of the Makefile's .venv.
RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# Where pip finds packages while the image builds, for machines whose pip needs more than PyPI and the public CAs:
# PIP_INDEX_URL / PIP_EXTRA_INDEX_URL / PIP_FIND_LINKS as pip reads them, and LABELSHIFT_BUILD_CA_URL, a URL the
# CA bundle is fetched from for each pip command and deleted after it (infra/with-build-ca; nothing of it stays in
# a layer). `make image` sets them from this machine's pip configuration; left empty, pip uses PyPI.
ARG PIP_INDEX_URL=
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_FIND_LINKS=
ARG LABELSHIFT_BUILD_CA_URL=
COPY infra/with-build-ca /usr/local/bin/with-build-ca

WORKDIR /opt/labelshift

# Layers from the slowest-changing to the fastest, so that a code change reinstalls nothing but the package:
# 1. torch, the pins of pyproject.toml (multi-gigabyte wheels; tests/architecture/test_infra.py checks the pins match);
RUN with-build-ca python -m pip install --upgrade pip \
 && with-build-ca python -m pip install torch==2.14.1 torchvision==0.29.1
# 2. every other dependency, from pyproject.toml alone (no code yet: the editable install finds no packages);
COPY pyproject.toml README.md /opt/labelshift/
RUN with-build-ca python -m pip install -e '.[test]'
# 3. the code, installed the same way as `make setup` (tests/architecture/test_infra.py checks that the two commands agree).
COPY . /opt/labelshift
RUN with-build-ca python -m pip install -e '.[test]' \
 && python -m compileall -q /opt/labelshift/labelshift /opt/labelshift/labelshift_mlflow /opt/labelshift/tasks /opt/labelshift/flows /opt/labelshift/runtime /opt/labelshift/stack

# Non-root user; its state (LABELSHIFT_HOME, PREFECT_HOME) under its home, server data under /data (a volume).
RUN useradd --create-home --uid 1000 --shell /bin/bash labelshift \
 && mkdir -p /data \
 && chown labelshift:labelshift /data
USER labelshift
ENV HOME=/home/labelshift \
    LABELSHIFT_HOME=/home/labelshift/.labelshift \
    PREFECT_HOME=/home/labelshift/.prefect \
    LABELSHIFT_CODE_DIR=/opt/labelshift \
    LABELSHIFT_POOL=labelshift \
    LABELSHIFT_WORKER_LIMIT=1 \
    PREFECT_WORKER_WEBSERVER_HOST=0.0.0.0 \
    PREFECT_WORKER_WEBSERVER_PORT=8080 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    MLFLOW_DISABLE_TELEMETRY=true

# The worker answers on :8080/health (--with-healthcheck); the compose file gives the other services their own.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/health', timeout=4)"

ENTRYPOINT ["tini", "--"]
# A process worker (`labelshift worker`: Prefect's, whose flow runs end Crashed with their MLflow runs KILLED when
# the container is stopped, instead of staying Running): it runs each flow run as a subprocess in this container, at
# most LABELSHIFT_WORKER_LIMIT at a time (1: one flow run per GPU when the container is given one GPU), named
# LABELSHIFT_WORKER_NAME (default: worker-<container id>). Needs PREFECT_API_URL. Give `docker stop` more than
# LABELSHIFT_WORKER_STOP_S (20 s): `docker stop -t 60`, compose's stop_grace_period.
CMD ["sh", "-c", "exec labelshift worker --pool \"$LABELSHIFT_POOL\" --limit \"$LABELSHIFT_WORKER_LIMIT\" --name \"${LABELSHIFT_WORKER_NAME:-worker-$(hostname)}\" -- --with-healthcheck"]
