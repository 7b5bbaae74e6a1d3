# syntax=docker/dockerfile:1
# The labelshift worker image: the package installed exactly as `make setup` installs it, on a CUDA base, run as a
# non-root user. By default it starts a Prefect process worker; infra/compose.yaml also uses it for the MLflow
# server, the Prefect server and the SeaweedFS S3 server (all are dependencies of the package), so every part of a
# deployment runs the same versions.
#
#   docker build -t labelshift-worker .
#   docker run --gpus all -e PREFECT_API_URL=http://prefect-host:4200/api labelshift-worker      # one GPU worker
#
# The torch wheels on PyPI bring their own CUDA runtime libraries (nvidia-* packages); the base image contributes
# the CUDA driver hooks (NVIDIA_VISIBLE_DEVICES / NVIDIA_DRIVER_CAPABILITIES for the NVIDIA container toolkit) and
# stays small. Without a GPU, torch falls back to the CPU and everything still runs.
ARG BASE_IMAGE=nvidia/cuda:12.8.1-base-ubuntu22.04
FROM ${BASE_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

# Python 3.11 (the package requires >=3.11,<3.12; Ubuntu 22.04 ships 3.10) from the deadsnakes archive, and tini to
# reap the flow-run processes a worker starts.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates gnupg software-properties-common \
 && add-apt-repository -y ppa:deadsnakes/ppa \
 && apt-get update \
 && apt-get install -y --no-install-recommends python3.11 python3.11-venv tini \
 && apt-get purge -y --auto-remove software-properties-common \
 && rm -rf /var/lib/apt/lists/*

# The virtualenv plays the part of the Makefile's .venv.
RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /opt/labelshift

# torch first, in a layer of its own: the pins of pyproject.toml, so that a code change does not download the
# multi-gigabyte wheels again (tests/test_infra.py checks that these pins match pyproject.toml).
RUN python -m pip install --upgrade pip \
 && python -m pip install torch==2.14.1 torchvision==0.29.1

# The package, the same way as `make setup` (tests/test_infra.py checks that the two commands agree).
COPY . /opt/labelshift
RUN python -m pip install -e '.[test]' \
 && python -m compileall -q /opt/labelshift/labelshift /opt/labelshift/tasks /opt/labelshift/flows

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
# A process worker: it runs each flow run as a subprocess in this container, at most LABELSHIFT_WORKER_LIMIT at a
# time (1: one flow run per GPU when the container is given one GPU). Needs PREFECT_API_URL.
CMD ["sh", "-c", "exec prefect worker start --pool \"$LABELSHIFT_POOL\" --type process --limit \"$LABELSHIFT_WORKER_LIMIT\" --with-healthcheck"]
