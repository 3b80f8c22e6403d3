#!/usr/bin/env bash
# One unattended call for CI: test sandboxd on Debian 12 with systemd as PID 1 and cgroup v2, in
# a throwaway VM. Builds the image (cached), prepares the payload (source tree, wheels, sandbox
# images), boots the VM, runs the guest jobs, prints the results, exits non-zero on any failure.
#
#   tests/vm/ci.sh [--src DIR] [--out DIR] [--jobs service,tests] [--timeout S] [--deadline T]
#                  [--mem MB]
#                  [--test-dirs "restricted service ..."] [--no-images]
#
#   --src DIR       the sandboxd checkout to test (default: the current dir)
#   --out DIR       where results go (default $VM_DIR/ci-<timestamp>); also the VM's /share
#   --jobs LIST     guest jobs, comma-separated: service (install as a systemd service per
#                   docs/operations.md and check it), tests (the project's pytest suite). Default
#                   both.
#   --timeout S     limit for the whole VM run (default 5400)
#   --deadline T    the VM run ends by T (seconds since the epoch) at the latest: its limit is
#                   the smaller of --timeout and what is left of T at boot (.ci/run passes the
#                   end of its own budget, so that a slow machine's VM gets all of it)
#   --test-dirs L   tests/ subdirectories for the tests job (default: all)
#   --no-images     do not copy the Docker sandbox images in (container tests will then fail)
#                   nor the daemon's Dockerfile image (built here for tests/service, when run)
#   env TEST_LANE_TIMEOUT seconds per lane (one pytest run); whatever it says, a lane is
#                   interrupted (SIGINT: pytest reports what failed so far) 150 s before the
#                   VM's limit, so that a run that is too slow still says where it was
#   env TEST_DELEGATE=1   run pytest in a delegated transient scope (see guest/test-suite.sh)
#   env TEST_MARKS=EXPR   pytest -m in the guest (default "not same_on_every_host"; empty: all)
#
# Exit status: 0 all green; 1 a check or a test failed; 124 time limit; 125 the VM did not run
# the job; 2 usage or preparation error. Results: $OUT/results/service/checks.tsv,
# $OUT/results/tests/summary.tsv (+ logs, junit XML, the guest journal, the console log).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
export VM_DIR=${VM_DIR:-/var/cache/sandboxd-vm}
SRC="" OUT="" JOBS=service,tests TIMEOUT=5400 DEADLINE="" MEM=4096 TEST_DIRS="" IMAGES=1
while [ $# -gt 0 ]; do
  case $1 in
    --src) SRC=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --jobs) JOBS=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --deadline) DEADLINE=$2; shift 2 ;;
    --mem) MEM=$2; shift 2 ;;
    --test-dirs) TEST_DIRS=$2; shift 2 ;;
    --no-images) IMAGES=0; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "ci.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$SRC" ]; then
  SRC=$(cd "$HERE/../.." && pwd)
fi
[ -f "$SRC/pyproject.toml" ] && [ -d "$SRC/sandboxd" ] || { echo "ci.sh: $SRC is not a sandboxd tree" >&2; exit 2; }
OUT=${OUT:-$VM_DIR/ci-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
T=$OUT/phases.tsv
: > "$T"
stamp() { printf '%s\t%s\n' "$1" "$2" >> "$T"; echo "ci.sh: $1 took $2 s" >&2; }

# 1. the image
t0=$(date +%s)
"$HERE/build-image.sh" || exit 2
stamp build-image $(( $(date +%s) - t0 ))

# 2. the payload: source tree (tracked + untracked-not-ignored files), wheels, images
t0=$(date +%s)
rm -rf "$OUT/payload" "$OUT/results" "$OUT/guest"
mkdir -p "$OUT/payload/src" "$OUT/results"
if git -C "$SRC" rev-parse --git-dir >/dev/null 2>&1; then
  (cd "$SRC" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -) \
    | tar -xf - -C "$OUT/payload/src"
  git -C "$SRC" rev-parse HEAD > "$OUT/payload/COMMIT"
else
  tar -C "$SRC" --exclude=.venv --exclude=__pycache__ -cf - . | tar -xf - -C "$OUT/payload/src"
fi
# Wheels for the guest (no network there). The cache directory keeps earlier downloads, so a
# re-run only builds the sandboxd wheel itself. Debian 12's python is 3.11: build with a 3.11.
PY=${VM_HOST_PYTHON:-python3}
CACHE=$VM_DIR/wheel-cache
mkdir -p "$CACHE"
rm -f "$CACHE"/sandboxd-*.whl
"$PY" -m pip wheel -q --wheel-dir "$CACHE" --find-links "$CACHE" \
  "$OUT/payload/src[dev]" pip setuptools wheel hatchling editables > "$OUT/wheels.log" 2>&1 \
  || { tail -n 20 "$OUT/wheels.log" >&2; exit 2; }
mkdir -p "$OUT/payload/wheels"
cp -l "$CACHE"/*.whl "$OUT/payload/wheels/" 2>/dev/null || cp "$CACHE"/*.whl "$OUT/payload/wheels/"
# The test suite's virtualenv, built here (Debian 12's python on both sides, same path in the
# guest): installing ~60 wheels under software emulation costs minutes per run.
if [[ ",$JOBS," == *",tests,"* ]]; then
  TV=/opt/sandboxd-test-venv
  rm -rf "$TV"
  /usr/bin/python3 -m venv "$TV" && "$TV/bin/pip" install -q --no-index --find-links "$CACHE" \
    "sandboxd[dev]" >> "$OUT/wheels.log" 2>&1 || { tail -n 20 "$OUT/wheels.log" >&2; exit 2; }
  tar -C / -cf "$OUT/payload/test-venv.tar" "${TV#/}"
  rm -rf "$TV"
fi
if [ "$IMAGES" = 1 ]; then
  # always Debian's client: a newer `docker` earlier on PATH may not match the engine
  imgs="sandboxd/python:latest sandboxd/base-offline:latest"
  ids=$(/usr/bin/docker image inspect -f '{{.Id}}' $imgs 2>/dev/null | tr '\n' ' ') || ids=""
  if [ -z "$ids" ]; then
    echo "ci.sh: sandbox images missing on the host (make images); container tests will fail" >&2
  else
    if [ "$(cat "$VM_DIR/images.ids" 2>/dev/null)" != "$ids" ] || [ ! -f "$VM_DIR/images.tar" ]; then
      /usr/bin/docker save $imgs -o "$VM_DIR/images.tar.new" && mv "$VM_DIR/images.tar.new" "$VM_DIR/images.tar"
      echo "$ids" > "$VM_DIR/images.ids"
    fi
    ln -f "$VM_DIR/images.tar" "$OUT/payload/images.tar" 2>/dev/null || cp "$VM_DIR/images.tar" "$OUT/payload/images.tar"
    # tests/service/test_dockerfile.py's image, built once here from the payload's tree with the
    # test's own offline build (minutes under emulation; make test still builds it in the test)
    if [[ ",$JOBS," == *",tests,"* ]] && { [ -z "$TEST_DIRS" ] || [[ " ${TEST_DIRS//,/ } " =~ \ service[\ /] ]]; }; then
      dtag=sandboxd-daemon-vm:$(date +%s)
      dwork=$(mktemp -d)
      # saved without the sandbox image's layers, which images.tar brings
      if (cd "$OUT/payload/src" && "$PY" -m tests.support.dockerfile_image --tag "$dtag" \
            --docker /usr/bin/docker --find-links "$CACHE" --workdir "$dwork" \
            --save "$OUT/payload/dockerfile-image.tar") >> "$OUT/wheels.log" 2>&1; then
        echo "$dtag" > "$OUT/payload/dockerfile-image.tag"
      else
        echo "ci.sh: the Dockerfile image did not build on the host; the VM test builds it" >&2
      fi
      /usr/bin/docker rmi "$dtag" > /dev/null 2>&1 || true
      rm -rf "$dwork"
    fi
  fi
fi
cp -r "$HERE/guest" "$OUT/guest"
stamp payload $(( $(date +%s) - t0 ))

# 3. the job (the VM's limit first: the job knows when it ends)
if [ -n "$DEADLINE" ]; then
  left=$(( DEADLINE - $(date +%s) ))
  [ "$left" -lt "$TIMEOUT" ] && TIMEOUT=$left
  [ "$TIMEOUT" -ge 600 ] || { echo "ci.sh: only ${TIMEOUT} s left before --deadline: no VM run" >&2; exit 124; }
  echo "ci.sh: the VM run's limit is ${TIMEOUT} s (--deadline)" >&2
fi
{
  echo '#!/bin/bash'
  echo 'rc=0'
  echo "export TEST_DIRS='$TEST_DIRS' TEST_DELEGATE='${TEST_DELEGATE:-0}'"
  [ -n "${TEST_LANE_TIMEOUT:-}" ] && echo "export TEST_LANE_TIMEOUT='$TEST_LANE_TIMEOUT'"
  # the guest's own clock for the end of the VM's limit (guest/test-suite.sh stops its lanes
  # 150 s before it): the limit counts from the VM's start, which is the guest's uptime ago
  echo "export JOB_END=\$(( \$(date +%s) + $TIMEOUT - \$(cut -d. -f1 /proc/uptime) ))"
  [ -n "${PYTEST_ARGS:-}" ] && echo "export PYTEST_ARGS='$PYTEST_ARGS'"
  # TEST_MARKS (guest/test-suite.sh): unset = its default, "not same_on_every_host"
  [ -n "${TEST_MARKS+set}" ] && echo "export TEST_MARKS='$TEST_MARKS'"
  echo '[ -n "$TEST_DIRS" ] || unset TEST_DIRS'
  # A heartbeat in the kernel's log (so on the serial console, never through the 9p share, which
  # a stalled guest may be waiting on): every 120 s the uptime, load, free memory, memory
  # pressure and the tasks in uninterruptible sleep. When a run reaches its limit, the report
  # below shows the last beats: beats to the end mean the guest ran and its jobs were stuck
  # (on what: the D-state tasks); beats that stop date a guest or emulator that froze.
  cat <<'BEAT'
( exec </dev/null >/dev/null 2>&1
  while sleep 120; do
    d=$(grep -l '^State:[[:space:]]*D' /proc/[0-9]*/status 2>/dev/null | head -n 5 | while read -r f; do
          p=${f%/status}; printf ' %s:%s' "$(cat "$p/comm")" "$(cat "$p/wchan")"; done)
    echo "<5>vm-heartbeat: up $(cut -d' ' -f1 /proc/uptime) s, load $(cut -d' ' -f1-3 /proc/loadavg)," \
      "MemAvailable $(awk '/^MemAvailable/ {print int($2/1024)}' /proc/meminfo) MiB," \
      "memory pressure $(head -n1 /proc/pressure/memory 2>/dev/null | cut -d' ' -f2-3); D:${d:- none}" > /dev/kmsg
  done ) & beat_pid=$!
BEAT
  service='t=$(date +%s); bash /share/guest/service-checks.sh || rc=1; echo "service-job $(( $(date +%s) - t ))" >> /share/results/guest-phases.txt'
  tests='t=$(date +%s); bash /share/guest/test-suite.sh || rc=1; echo "tests-job $(( $(date +%s) - t ))" >> /share/results/guest-phases.txt'
  IFS=, read -ra jl <<< "$JOBS"
  for j in "${jl[@]}"; do
    case $j in service|tests) ;; *) echo "ci.sh: unknown job $j" >&2; exit 2 ;; esac
  done
  if [[ ",$JOBS," == *",service,"* && ",$JOBS," == *",tests,"* ]]; then
    # Both: side by side. The service job's install block keeps one of the guest's two CPUs
    # busy for most of its time and its checks wait on systemd and the daemon, so the tests
    # job's first lane runs beside it from the start; the other lanes wait for its end
    # (LATER_LANES_AFTER, guest/test-suite.sh), so that two streams of work share the two CPUs.
    # Each job keeps clear of the other's uids, scopes, containers and processes.
    echo 'done_file=/run/sandboxd-vm-service.done; rm -f "$done_file"'
    echo "( export LATER_LANES_AFTER=\$done_file; $tests; exit \$rc ) & tests_pid=\$!"
    echo "$service"
    echo 'touch "$done_file"'
    echo 'wait "$tests_pid" || rc=1'
  else
    for j in "${jl[@]}"; do
      [ "$j" = service ] && echo "$service"
      [ "$j" = tests ] && echo "$tests"
    done
  fi
  echo 'kill "$beat_pid" 2>/dev/null'
  echo 'exit $rc'
} > "$OUT/job.sh"

# 4. boot and run
t0=$(date +%s)
set +e
"$HERE/run-in-vm.sh" --share "$OUT" --timeout "$TIMEOUT" --mem "$MEM" --quiet "$OUT/job.sh"
rc=$?
set -e
stamp vm-run $(( $(date +%s) - t0 ))
[ -f "$OUT/boot-time" ] && stamp guest-boot "$(grep -oE '[0-9.]+ s' "$OUT/boot-time" | cut -d' ' -f1)"
[ -f "$OUT/results/guest-phases.txt" ] && while read -r n s; do stamp "$n" "$s"; done < "$OUT/results/guest-phases.txt"

# 5. report
if [ -f "$OUT/results/service/checks.tsv" ]; then
  echo; echo "== service checks ($OUT/results/service/checks.tsv)"
  cut -f1-2 "$OUT/results/service/checks.tsv" | column -t
fi
if [ -f "$OUT/results/tests/summary.tsv" ]; then
  echo; echo "== test suite ($OUT/results/tests/summary.tsv)"
  column -t "$OUT/results/tests/summary.tsv"
fi
if [ -s "$OUT/results/tests/flaky.txt" ]; then
  echo; echo "== flaky tests in the VM (failed once, passed on the rerun)"
  sort -u "$OUT/results/tests/flaky.txt"
fi
echo; echo "== phases (s)"; column -t "$T"
case $rc in
  0) echo "ci.sh: all green" ;;
  124) echo "ci.sh: FAILED: time limit reached"
       # whether the guest lived to the end (the job's heartbeat, above) and what it last said
       echo "ci.sh: the guest's last heartbeats and console lines ($OUT/console.log):"
       grep -a 'vm-heartbeat' "$OUT/console.log" | tail -n 4 || true
       grep -av 'vm-heartbeat' "$OUT/console.log" | tail -n 8 || true ;;
  125) echo "ci.sh: FAILED: the VM did not run the job (see $OUT/console.log)" ;;
  *) echo "ci.sh: FAILED (job exit $rc); details in $OUT/results" ;;
esac
exit $(( rc == 0 ? 0 : (rc == 124 || rc == 125 ? rc : 1) ))
