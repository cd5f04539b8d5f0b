# syntax=docker/dockerfile:1
# paralab backend: FastAPI API + static front end; `paralab migrate` applies the Alembic
# migrations shipped in the package. Built by docker-compose.yml (context: repository root).
# torch (pinned in pyproject.toml) comes from PyTorch's CPU index: the backend never runs a
# training job, and the CPU wheel is a fraction of the CUDA one.
FROM python:3.11-slim-bookworm

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PARALAB_DATA_DIR=/var/lib/paralab

# tini as PID 1: forwards SIGTERM and reaps zombies.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/*

RUN groupadd --system --gid 10001 paralab \
 && useradd --system --uid 10001 --gid paralab --create-home --home-dir /home/paralab \
      --shell /usr/sbin/nologin paralab \
 && install -d -o paralab -g paralab -m 0750 /var/lib/paralab

WORKDIR /src

# Dependencies first, in their own layer (rebuilt only when pyproject.toml or the lock
# changes): the torch pin from the CPU index (2.13.0+cpu satisfies ==2.13.0), without its
# dependencies; then those and the rest from PyPI, at the versions of requirements.lock.
COPY pyproject.toml requirements.lock ./
RUN python -c "import tomllib; d = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; t = [x for x in d if x.startswith('torch')]; open('/tmp/torch.txt', 'w').write('\n'.join(t)); open('/tmp/deps.txt', 'w').write('\n'.join(x for x in d if x not in t))" \
 && pip install --index-url "${TORCH_INDEX_URL}" --no-deps -r /tmp/torch.txt \
 && pip install -c requirements.lock -r /tmp/torch.txt -r /tmp/deps.txt \
 && rm /tmp/torch.txt /tmp/deps.txt requirements.lock

# The project itself (pip install . : packages, migrations and static files as package data).
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
EXPOSE 8000
VOLUME ["/var/lib/paralab"]

ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["sh", "-c", "paralab migrate && exec paralab serve --host 0.0.0.0 --port 8000"]
