# syntax=docker/dockerfile:1
# paralab GPU worker: a Celery worker (`paralab worker --queue <host>`) that launches torchrun
# jobs and reports to the backend over HTTP. Built by docker-compose.yml (context: repo root).
#
# Base: python:3.11-slim-bookworm, not nvidia/cuda. The torch 2.13.0 CUDA wheel carries its
# own CUDA runtime, cuDNN, cuBLAS and NCCL (the nvidia-* wheels); only the driver comes from
# the host, injected by the NVIDIA Container Toolkit when compose reserves the GPUs. The
# nvidia/cuda Ubuntu 24.04 images ship Python 3.12 (3.11 would need a PPA) and a second copy
# of the CUDA libraries that can shadow the wheel's on LD_LIBRARY_PATH.
FROM python:3.11-slim-bookworm

# Empty: torch's default Linux wheel from PyPI (a CUDA build). For an older driver pick a
# CUDA variant, e.g. --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126
ARG TORCH_INDEX_URL=

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PARALAB_DATA_DIR=/var/lib/paralab \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# tini as PID 1 forwards SIGTERM to the worker, which stops its torchrun jobs itself.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini procps \
 && rm -rf /var/lib/apt/lists/*

RUN groupadd --system --gid 10001 paralab \
 && useradd --system --uid 10001 --gid paralab --create-home --home-dir /home/paralab \
      --shell /usr/sbin/nologin paralab \
 && install -d -o paralab -g paralab -m 0750 /var/lib/paralab

WORKDIR /src

# Dependencies first, in their own layer: the torch pin (CUDA build) without its dependencies,
# then those and the rest at the versions of requirements.lock (torch's own CUDA wheels,
# nvidia-*, are pinned exactly by torch itself).
COPY pyproject.toml requirements.lock ./
RUN python -c "import tomllib; d = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; t = [x for x in d if x.startswith('torch')]; open('/tmp/torch.txt', 'w').write('\n'.join(t)); open('/tmp/deps.txt', 'w').write('\n'.join(x for x in d if x not in t))" \
 && pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} --no-deps -r /tmp/torch.txt \
 && pip install -c requirements.lock -r /tmp/torch.txt -r /tmp/deps.txt \
 && rm /tmp/torch.txt /tmp/deps.txt requirements.lock

COPY backend ./backend
COPY worker ./worker
COPY jobs ./jobs
COPY paralab_core ./paralab_core
# the public logging call user scripts import (docs/scripts.md)
COPY paralab ./paralab
COPY frontend ./frontend
RUN pip install --no-deps /src \
 && rm -rf /src

# Provenance recorded with each run (the image has no .git): pass the commit at build time.
ARG PARALAB_COMMIT=unknown
ENV PARALAB_COMMIT=${PARALAB_COMMIT}

WORKDIR /var/lib/paralab
USER 10001:10001
VOLUME ["/var/lib/paralab"]

STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["paralab", "worker", "--queue", "default"]
