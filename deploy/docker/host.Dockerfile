# syntax=docker/dockerfile:1
#
# The host side of the compose demo (docker-compose.yml): bpuemu with the
# [host] extra (the converter, hb_verifier, the x86 simulator). Not a board
# image: the board image is ./Dockerfile. Build from the repository root:
#
#   docker build -f deploy/docker/host.Dockerfile -t bpuemu-host .

ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MPLBACKEND=Agg

RUN groupadd --system --gid 10002 bpuemu-host \
    && useradd --system --uid 10002 --gid bpuemu-host --create-home --home-dir /home/bpuemu-host \
       --shell /usr/sbin/nologin bpuemu-host

WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY common/ common/
COPY board/ board/
COPY host/ host/
# DL3013 (pin versions) does not apply: this installs the checked-out tree.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir ".[host]"

COPY --chmod=0755 deploy/docker/host-demo.sh /usr/local/bin/bpuemu-host-demo

USER 10002:10002
WORKDIR /home/bpuemu-host
ENTRYPOINT ["bpuemu-host-demo"]
