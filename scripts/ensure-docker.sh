#!/usr/bin/env bash
# Make sure a Docker engine is installed and running (Debian/Ubuntu, as root).
# Installs Debian's docker.io when dockerd is missing, starts dockerd in the background when
# no engine answers, and waits until it does. Uses Debian's client /usr/bin/docker on purpose:
# a newer `docker` earlier on PATH may not match the engine.
set -euo pipefail

DOCKER=/usr/bin/docker
log=${DOCKERD_LOG:-/var/log/dockerd.log}

need=()
command -v dockerd >/dev/null 2>&1 && [ -x "$DOCKER" ] || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
[ -e /usr/lib/x86_64-linux-gnu/libseccomp.so.2 ] || ldconfig -p | grep -q libseccomp.so.2 || need+=(libseccomp2)
if [ ${#need[@]} -gt 0 ]; then
  echo "ensure-docker: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi

if "$DOCKER" info >/dev/null 2>&1; then
  if ! command -v ip >/dev/null 2>&1 || ip link show docker0 >/dev/null 2>&1; then
    echo "ensure-docker: engine running ($("$DOCKER" version --format '{{.Server.Version}}'))"
    exit 0
  fi
  # e.g. another engine started with --bridge none deleted it: builds would fail
  echo "ensure-docker: the engine's bridge docker0 is missing: restarting dockerd"
  pid=$(cat /var/run/docker.pid 2>/dev/null || pgrep -xo dockerd || true)
  [ -n "$pid" ] && kill "$pid"
  for _ in $(seq 1 60); do "$DOCKER" info >/dev/null 2>&1 || break; sleep 1; done
  for _ in $(seq 1 30); do [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || break; sleep 1; done
fi

echo "ensure-docker: starting dockerd (log: $log)"
nohup dockerd >"$log" 2>&1 &
for _ in $(seq 1 60); do
  if "$DOCKER" info >/dev/null 2>&1; then
    echo "ensure-docker: engine running ($("$DOCKER" version --format '{{.Server.Version}}'))"
    exit 0
  fi
  sleep 1
done
echo "ensure-docker: dockerd did not come up; last lines of $log:" >&2
tail -n 30 "$log" >&2
exit 1
