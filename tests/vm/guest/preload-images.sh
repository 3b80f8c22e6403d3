#!/bin/bash
# Guest helper: load the payload's images (images.tar, dockerfile-image.tar) into the data root
# that docker.service uses, through a private engine on its own socket and exec root, while
# other work runs: the service job starts it before its install block, which leaves one of the
# guest's two CPUs idle (a load took ~190 s of the service job under emulation). Nothing else
# sees an engine meanwhile (docker.service is not started; no bridge, no iptables rules).
# Marks each loaded tar with /share/payload/<name>.loaded; the jobs load what is not marked.
# Both jobs call it (they may run side by side, ci.sh): under one lock (LOCK below), so the
# second waits for the first's load and then finds it done; docker.service is started under the
# same lock (start_docker below), never while the private engine holds the data root.
#   preload-images.sh LOG          load what is not loaded yet (waits for a load under way)
#   preload-images.sh --start LOG  the same, then start docker.service
set -u
START=0
[ "${1:-}" = --start ] && { START=1; shift; }
LOG=${1:-/dev/null}
P=/share/payload
SOCK=unix:///run/sandboxd-preload/docker.sock
DOCKER=/usr/bin/docker
LOCK=/run/sandboxd-preload.lock
exec 9> "$LOCK"
flock 9
start_docker() { [ "$START" = 0 ] || systemctl start docker.service; }
# one engine per data root: never beside docker.service
systemctl is-active -q docker.service && { echo "docker.service runs: nothing preloaded" >> "$LOG"; exit 0; }
todo=0
for name in images dockerfile-image; do
  [ -f "$P/$name.tar" ] && [ ! -f "$P/$name.loaded" ] && todo=1
done
[ "$todo" = 1 ] || { start_docker; exit; }
mkdir -p /run/sandboxd-preload
# start the private engine; 1 when it exits before it answers (under emulation its containerd
# can miss dockerd's start timeout: tried twice, then no preload, and the jobs load the images
# through docker.service themselves, as when there is nothing to preload)
engine_up() {
  dockerd --host "$SOCK" --pidfile /run/sandboxd-preload/dockerd.pid \
    --exec-root /run/sandboxd-preload/exec --bridge none --iptables=false --ip6tables=false \
    --ip-masq=false >> "$LOG" 2>&1 9>&- &  # the lock's fd stays here
  engine=$!
  t0=$(date +%s)
  until $DOCKER -H "$SOCK" version > /dev/null 2>&1; do
    kill -0 $engine 2>/dev/null || { echo "the preload engine exited" >> "$LOG"; return 1; }
    [ $(( $(date +%s) - t0 )) -lt 300 ] || { echo "the preload engine did not answer" >> "$LOG"; break; }
    sleep 0.5
  done
}
engine_up || engine_up || { echo "no preload: docker.service loads the images" >> "$LOG"; start_docker; exit; }
for name in images dockerfile-image; do
  [ -f "$P/$name.tar" ] || continue
  t1=$(date +%s)
  $DOCKER -H "$SOCK" load -i "$P/$name.tar" >> "$LOG" 2>&1 && touch "$P/$name.loaded"
  echo "$name: rc $? in $(( $(date +%s) - t1 )) s" >> "$LOG"
done
kill -TERM $engine
wait $engine
echo "preload done in $(( $(date +%s) - t0 )) s" >> "$LOG"
start_docker
