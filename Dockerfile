# syntax=docker/dockerfile:1
#
# ratewarden's image: wheels built in one stage, installed into a slim runtime that runs
# as a non-root user and has no compiler, no pip cache and no build tools. Its Python
# packages are those of deploy/requirements.lock, hashes checked (docs/install.md).
#
#   docker build -t ratewarden .
#   docker run -p 8470:8470 -e RATEWARDEN_API_TOKENS=... -e RATEWARDEN_ADMIN_TOKENS=... \
#     -v ./ratewarden.yaml:/etc/ratewarden/ratewarden.yaml:ro \
#     -e RATEWARDEN_POLICY=/etc/ratewarden/ratewarden.yaml ratewarden
#
# The daemon listens on 0.0.0.0 in the container, and ratewarden refuses a non-loopback
# address without tokens: set RATEWARDEN_API_TOKENS and RATEWARDEN_ADMIN_TOKENS (or
# RATEWARDEN_INSECURE_NO_AUTH=true when something in front of it does the auth).
# Checked by tests/test_deploy_files.py (hadolint, and the build commands run for real).

# -- build: the wheels of the locked dependencies, and ratewarden's own ----------------------
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
# The daemon's dependencies exactly as tested: deploy/requirements.lock pins each one with
# the hashes of its files on PyPI, and pip refuses any file that does not match.
COPY deploy/requirements.lock /wheels/
RUN pip wheel --no-cache-dir --disable-pip-version-check --require-hashes \
        --wheel-dir /wheels -r /wheels/requirements.lock
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --no-cache-dir --disable-pip-version-check --no-deps --wheel-dir /wheels .

# -- runtime --------------------------------------------------------------------------------
FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="ratewarden" \
      org.opencontainers.image.description="Rate limits, concurrency caps and cost budgets for AI-agent tool calls" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    RATEWARDEN_HOST=0.0.0.0 \
    RATEWARDEN_PORT=8470 \
    RATEWARDEN_LOG_FORMAT=json \
    RATEWARDEN_STATE_FILE=/var/lib/ratewarden/state.json

# Installed offline from the build stage's wheels only: nothing is fetched here. The locked
# dependencies first (their hashes checked again), then ratewarden alone (--no-deps).
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --disable-pip-version-check --no-index \
        --find-links=/wheels --require-hashes -r /wheels/requirements.lock \
    && pip install --no-cache-dir --disable-pip-version-check --no-index --no-deps \
        /wheels/ratewarden-*.whl \
    && groupadd --system --gid 10001 ratewarden \
    && useradd --system --uid 10001 --gid ratewarden --no-create-home \
        --home-dir /var/lib/ratewarden --shell /usr/sbin/nologin ratewarden \
    && install -d -o ratewarden -g ratewarden -m 0750 /var/lib/ratewarden \
    && install -d -m 0755 /etc/ratewarden

# The embedded store's state file lives here (mount a volume to keep it across
# containers); a policy goes in /etc/ratewarden (set RATEWARDEN_POLICY to it).
WORKDIR /var/lib/ratewarden
USER 10001:10001
EXPOSE 8470

# No curl in a slim image: Python's own urllib, without any proxy from the environment.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.build_opener(u.ProxyHandler({})).open('http://127.0.0.1:%s/healthz' % os.environ.get('RATEWARDEN_PORT', '8470'), timeout=2)"]

ENTRYPOINT ["ratewarden", "serve"]
