# syntax=docker/dockerfile:1
# One image for every Hermes process; the command picks which (see docker-compose.yml):
#
#   docker build -t hermes-agent .
#   docker run hermes-agent worker                                     # the worker (the default)
#   docker run hermes-agent serve --host 0.0.0.0 --port 8000           # the HTTP API
#   docker run hermes-agent codec-server --host 0.0.0.0 --port 8081    # the Web UI's codec server
#
# Keys and tokens are never part of the image: give them at run time (env file or secrets,
# README "Deploying"). .dockerignore keeps .env, .hermes/ and deploy/secrets/ out of the
# build context.
#
# Python as in pyproject.toml (requires-python >= 3.11, the version CI tests), on Debian's
# slim image; the tag is pinned to a patch release (override with --build-arg PYTHON_IMAGE=...,
# e.g. a digest, to pin harder).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# ---- build: a virtualenv with Hermes and its dependencies --------------------------------
FROM ${PYTHON_IMAGE} AS build
# A compiler only for a dependency without a wheel for this platform; it stays in this stage.
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Dependencies first (a layer reused while only the code changes), then the code.
COPY pyproject.toml README.md ./
RUN mkdir -p hermes workflows activities && touch hermes/__init__.py workflows/__init__.py activities/__init__.py worker.py \
    && pip install . && pip uninstall -y hermes-agent
COPY hermes ./hermes
COPY workflows ./workflows
COPY activities ./activities
COPY worker.py ./
RUN rm -rf build ./*.egg-info && pip install --no-deps . && python -c "import hermes.cli, worker, workflows, activities"

# ---- runtime: the virtualenv, no compiler, a user without privileges ---------------------
FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 hermes \
    && useradd --system --uid 10001 --gid hermes --home-dir /var/lib/hermes --create-home --shell /usr/sbin/nologin hermes \
    && install -d -o hermes -g hermes -m 0700 /var/lib/hermes/api-keys
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# The data directory (HERMES_DATA_DIR, default .hermes) is relative to here; with the
# compose file the memory store is on S3 and nothing there must survive the container.
WORKDIR /var/lib/hermes
USER 10001:10001
EXPOSE 8000 8081
# Finds the hermes process of the container: a worker is healthy when Temporal lists its
# poller, `serve` and `codec-server` when their /health answers 200 (hermes/cli/health.py).
HEALTHCHECK --interval=30s --timeout=15s --start-period=120s --retries=3 CMD ["hermes", "healthcheck"]
# SIGTERM: a worker takes no new work and lets running calls finish (HERMES_WORKER_SHUTDOWN_SECONDS).
STOPSIGNAL SIGTERM
ENTRYPOINT ["hermes"]
CMD ["worker"]
