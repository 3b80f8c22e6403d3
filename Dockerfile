# The sandboxd daemon itself, as a container (docs/operations.md, "Docker").
#
# Build, online (a registry and PyPI are reachable):
#     docker build -t sandboxd/daemon .
# Build, offline (no registry: wheels built on the host, base image built with debootstrap by
# `sandboxd images build --offline`; the wheels must match the base image's Python 3.11):
#     rm -rf dist/wheels && python3 -m pip wheel --wheel-dir dist/wheels . pip
#     docker build --build-arg BASE=sandboxd/python:latest -t sandboxd/daemon .
#
# The daemon runs as root *inside* the container so that each worker can drop to the sandbox
# uid 10001 and chroot into its workspace; give it only the six capabilities that needs, and a
# writable cgroup subtree for the per-call limits (cgroup v1 shown; v2: docs/operations.md):
#     mkdir -p /sys/fs/cgroup/{memory,cpu,pids}/sandboxd-ctr
#     docker run -d --name sandboxd --read-only --tmpfs /tmp \
#       --cap-drop ALL --cap-add SETUID --cap-add SETGID --cap-add SYS_CHROOT \
#       --cap-add CHOWN --cap-add DAC_OVERRIDE --cap-add KILL \
#       --security-opt no-new-privileges --network none --memory 2g --pids-limit 512 \
#       --cgroup-parent /sandboxd-ctr -e SANDBOXD_CGROUP_ROOT=/host-cgroup \
#       -v /sys/fs/cgroup/memory/sandboxd-ctr:/host-cgroup/memory/sandboxd-ctr \
#       -v /sys/fs/cgroup/cpu/sandboxd-ctr:/host-cgroup/cpu/sandboxd-ctr \
#       -v /sys/fs/cgroup/pids/sandboxd-ctr:/host-cgroup/pids/sandboxd-ctr \
#       -v /run/sandboxd-ctr:/run/sandboxd -v sandboxd-state:/var/lib/sandboxd \
#       -v /run/sandboxd-uids:/run/sandboxd-uids -e SANDBOXD_SANDBOX_UID_FIRST=11000 \
#       -v sandboxd-logs:/var/log/sandboxd sandboxd/daemon
# /run/sandboxd-uids (root 0755 on the host): its sandbox uids are host uids, so the daemon
# claims its range host-wide there and refuses to start without it (docs/operations.md).
# Without a writable cgroup subtree the restricted backend's self-test fails and the daemon
# refuses to start (it says so, naming the "cgroup" probe).
ARG BASE=python:3.12-slim

# ---- stage 1: wheels -> a self-contained virtualenv in /opt/sandboxd
FROM ${BASE} AS build
# lets a CI job prune this (untagged) stage after a build
LABEL org.sandboxd.stage=build
USER root
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# .dockerignore keeps this to pyproject.toml, README.md, sandboxd/, client/sandboxd_client/,
# policies/ and dist/wheels/.
COPY . /src
RUN set -eu; \
    mkdir -p /src/dist/wheels; \
    if ! ls /src/dist/wheels/sandboxd-*.whl >/dev/null 2>&1; then \
        echo "no prebuilt wheels in dist/wheels: building them from PyPI"; \
        python3 -m pip wheel --wheel-dir /src/dist/wheels /src pip; \
    fi; \
    pip_wheel="$(ls /src/dist/wheels/pip-*.whl | head -n 1)"; \
    test -n "$pip_wheel" || { echo "dist/wheels has no pip wheel (pip wheel ... . pip)"; exit 1; }; \
    python3 -m venv --without-pip /opt/sandboxd; \
    /opt/sandboxd/bin/python "$pip_wheel/pip" install --no-index --find-links /src/dist/wheels \
        --no-compile --no-warn-script-location sandboxd; \
    /opt/sandboxd/bin/python -m compileall -q /opt/sandboxd/lib; \
    /opt/sandboxd/bin/sandboxd version

# ---- stage 2: the runtime - no compiler, no pip, no wheels
FROM ${BASE}
USER root
RUN set -eu; \
    install -d -o root -g root -m 0700 /var/lib/sandboxd; \
    install -d -o root -g root -m 0750 /var/log/sandboxd; \
    install -d -o root -g root -m 0755 /run/sandboxd /etc/sandboxd /etc/sandboxd/policies; \
    find / -xdev -perm /6000 -type f -exec chmod ug-s {} + 2>/dev/null || true
COPY --from=build /opt/sandboxd /opt/sandboxd

ENV PATH=/opt/sandboxd/bin:/usr/local/bin:/usr/bin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SANDBOXD_STATE_DIR=/var/lib/sandboxd \
    SANDBOXD_AUDIT_LOG=/var/log/sandboxd/audit.jsonl \
    SANDBOXD_CONTAINER_ENABLED=false

# root in the container, confined by the run flags above; sandboxed code runs as 10001.
USER 0:0
WORKDIR /var/lib/sandboxd
STOPSIGNAL SIGTERM
# Ready = the confinement self-test passes (GET /readyz), over the unix socket when there is one,
# else loopback TCP on $SANDBOXD_PORT (sandboxd/health/check.py: the standard library only).
HEALTHCHECK --interval=30s --timeout=15s --start-period=60s --retries=3 \
    CMD ["/opt/sandboxd/bin/python", "-I", "-m", "sandboxd.health.check"]
ENTRYPOINT ["/opt/sandboxd/bin/sandboxd"]
CMD ["serve", "--uds", "/run/sandboxd/sandboxd.sock"]
