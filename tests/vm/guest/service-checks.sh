#!/bin/bash
# Guest job: install sandboxd as a real systemd service the way docs/operations.md says, then
# check it on cgroup v2. Runs inside the VM as root (tools/vm/run-in-vm.sh).
#
# Inputs:  /share/payload/wheels (sandboxd + dependency wheels), /share/payload/src (the tree)
# Outputs: /share/results/service/checks.tsv (NAME<TAB>PASS|FAIL|INFO<TAB>evidence) and one file
#          per piece of evidence beside it. Exit status: number of FAILed checks (capped at 100).
set -u
R=/share/results/service
mkdir -p "$R"
: > "$R/checks.tsv"
SRC=/share/payload/src
WHEELS=/share/payload/wheels
SOCK=/run/sandboxd/sandboxd.sock
URL=unix:$SOCK
SBX=/opt/sandboxd/bin/sandboxd
CG=/sys/fs/cgroup
export SYSTEMD_PAGER= SYSTEMD_COLORS=0 PYTHONDONTWRITEBYTECODE=1

check() {  # check NAME PASS|FAIL|INFO "evidence"
  local ev=${3//$'\n'/ | }
  printf '%s\t%s\t%s\n' "$1" "$2" "${ev:0:600}" >> "$R/checks.tsv"
  printf '[%s] %s: %s\n' "$2" "$1" "${ev:0:300}"
}
phase() { echo "=== $* ($(date +%T), uptime $(cut -d' ' -f1 /proc/uptime))"; echo "$* $(cut -d' ' -f1 /proc/uptime)" >> "$R/phases.txt"; }
api() {  # api METHOD PATH [JSON]: prints body, then a last line HTTP=<code>
  if [ $# -ge 3 ]; then
    curl -sS --max-time 120 --unix-socket "$SOCK" -X "$1" -H 'content-type: application/json' \
      -d "$3" -w '\nHTTP=%{http_code}\n' "http://sandboxd$2"
  else
    curl -sS --max-time 120 --unix-socket "$SOCK" -X "$1" -w '\nHTTP=%{http_code}\n' "http://sandboxd$2"
  fi
}
jget() { python3 -c 'import json,sys; d=json.loads(sys.stdin.read().rsplit("\nHTTP=",1)[0]); print(eval(sys.argv[1], {"d": d}))' "$1" 2>/dev/null; }
svc_cg() { echo "$CG$(systemctl show -p ControlGroup --value sandboxd.service)"; }
cg_tree() { find "$1" -mindepth 1 -maxdepth 3 -type d 2>/dev/null | sed "s|^$1/||" | sort; }
# the worker cgroups below the unit's daemon subtree (CGROUP/sandboxd-<instance>/<worker>)
worker_cgroups() { find "$1" -mindepth 2 -maxdepth 2 -type d -path '*/sandboxd-*/*' 2>/dev/null; }
# The scopes a run names in its output (sandboxd-<instance>-<pid>.scope) that still exist: only
# its own, since the tests job's first lane runs beside this job (ci.sh) and its daemons make
# scopes of their own. "none named" when it named none: a check on it must then fail.
scopes_named() { grep -ohE 'sandboxd-[A-Za-z0-9_.-]+-[0-9]+\.scope' "$@" 2>/dev/null | sort -u | tr '\n' ' '; }
scopes_left() {
  local names
  names=$(scopes_named "$@")
  [ -n "$names" ] || { echo "none named"; return; }
  # shellcheck disable=SC2086
  systemctl list-units --all --no-legend --plain $names 2>/dev/null | awk '{print $1}' | tr '\n' ' '
}
until_gone() {  # until_gone FILE...: wait (up to 60 s) until scopes_left finds none; prints it
  local left
  for _ in $(seq 1 120); do
    left=$(scopes_left "$@"); [ -z "$left" ] && return 0
    [ "$left" = "none named" ] && break
    sleep 0.5
  done
  echo "$left"
}
audit_decisions() { grep -c '"event":"decision"' /var/log/sandboxd/audit.jsonl 2>/dev/null || echo 0; }
until_decided() {  # until_decided N: wait (up to 120 s) until the audit log has more than N decisions
  for _ in $(seq 1 240); do [ "$(audit_decisions)" -gt "$1" ] && return 0; sleep 0.5; done
  return 1
}
until_logged() {  # until_logged SINCE REGEX: wait (up to 60 s) for the unit's journal to match
  for _ in $(seq 1 120); do
    journalctl -u sandboxd --since "$1" --no-pager 2>/dev/null | grep -qE "$2" && return 0
    sleep 0.5
  done
  return 1
}
show() { systemctl show -p ActiveState,SubState,MainPID,Result,ExecMainStatus,NRestarts,StatusText sandboxd.service | tr '\n' ' '; }

phase "host facts"
{
  uname -a; cat /proc/self/cgroup; stat -fc %T $CG; cat $CG/cgroup.controllers
  systemctl --version | head -1; python3 --version
  echo "LSMs: $(cat /sys/kernel/security/lsm 2>/dev/null)"
} > "$R/host.txt" 2>&1
check cgroup-v2 "$( [ "$(stat -fc %T $CG)" = cgroup2fs ] && echo PASS || echo FAIL)" \
  "$(stat -fc %T $CG); controllers: $(cat $CG/cgroup.controllers); $(systemctl --version | head -1)"
check landlock-in-kernel INFO "LSMs: $(cat /sys/kernel/security/lsm 2>/dev/null)"

# the payload's images load meanwhile, into docker.service's data root by a private engine
# (guest/preload-images.sh); docker.service starts only in the container phase
preload=""
if [ -f /share/payload/images.tar ]; then
  bash /share/guest/preload-images.sh "$R/docker-preload.txt" & preload=$!
fi

# Under emulation a start takes ~35 s alone, and more beside the tests job's first lane (ci.sh):
# near the shipped unit's TimeoutStartSec=90s (a real host starts in ~2 s). This job's own
# drop-in, not the docs', gives a start 300 s here.
mkdir -p /etc/systemd/system/sandboxd.service.d
printf '[Service]\nTimeoutStartSec=300s\n' > /etc/systemd/system/sandboxd.service.d/vm-emulation.conf

phase "install (docs/operations.md, systemd section, verbatim)"
# The install block of docs/operations.md, as written there (between <!-- install:begin/end -->).
# No network in the VM: pip resolves from the payload's wheels (PIP_NO_INDEX/PIP_FIND_LINKS).
cd "$SRC" || exit 100
awk '/<!-- install:begin -->/{f=1; next} /<!-- install:end -->/{f=0} f' docs/operations.md \
  | sed '/^```/d' > "$R/install-block.sh"
cp -a "$SRC" /root/install-src && cd /root/install-src || exit 100
t0=$(date +%s)
# each traced line with its time (bash takes no PS4 from the environment as root)
PIP_NO_INDEX=1 PIP_FIND_LINKS=$WHEELS PIP_DISABLE_PIP_VERSION_CHECK=1 \
  bash -ec 'PS4="+ [\$(date +%s)] "; set -x; . "$0"' "$R/install-block.sh" \
  > "$R/install.txt" 2>&1; rc=$?
st=$(show)
check docs-install-block "$( [ $rc = 0 ] && systemctl is-active -q sandboxd && echo PASS || echo FAIL)" \
  "rc $rc in $(( $(date +%s) - t0 )) s ($(grep -c . "$R/install-block.sh") lines); $st; $(tail -n 3 "$R/install.txt")"
check fresh-install-embedded-policy "$(journalctl -b -u sandboxd --no-pager | grep -q 'embedded default policy' && echo PASS || echo FAIL)" \
  "$(journalctl -b -u sandboxd --no-pager | grep -m1 'embedded default policy' | cut -c1-250)"
check venv-install "$( [ -x $SBX ] && echo PASS || echo FAIL)" "$($SBX --version 2>&1 | head -1)"
out=$(systemd-analyze verify /etc/systemd/system/sandboxd.service 2>&1); rc=$?
echo "$out" > "$R/verify.txt"
check unit-verify "$( [ $rc = 0 ] && [ -z "$out" ] && echo PASS || echo FAIL)" "systemd-analyze verify: rc $rc ${out:0:300}"
cd "$SRC" || exit 100
systemctl stop sandboxd.service

phase "start"
t0=$(date +%s.%N)
out=$(systemctl start sandboxd.service 2>&1); rc=$?
t1=$(date +%s.%N)
st=$(show)
start_s=$(python3 -c "print(round($t1-$t0,1))")
check start "$( [ $rc = 0 ] && systemctl is-active -q sandboxd && echo PASS || echo FAIL)" "rc $rc in ${start_s} s; $st; $out"
# Type=notify: `systemctl start` returns only after READY=1, so "active" right after it returns
# means the notification arrived (the journal shows STATUS= too).
check type-notify-ready "$( [ "$(systemctl show -p Type --value sandboxd)" = notify ] && \
  systemctl is-active -q sandboxd && echo PASS || echo FAIL)" \
  "Type=$(systemctl show -p Type --value sandboxd); StatusText=$(systemctl show -p StatusText --value sandboxd); NotifyAccess=$(systemctl show -p NotifyAccess --value sandboxd)"
# The live daemon's own state, read from outside: seccomp filter mode (2), no_new_privs, and
# effective capabilities equal to a bounding set of exactly the unit's CapabilityBoundingSet=.
mainpid=$(systemctl show -p MainPID --value sandboxd)
cp "/proc/$mainpid/status" "$R/mainpid-status.txt" 2>/dev/null
caps=$(systemctl show -p CapabilityBoundingSet --value sandboxd)
v=$(python3 - "$R/mainpid-status.txt" "$caps" <<'EOF'
import sys
status = dict(line.split(":\t", 1) for line in open(sys.argv[1]).read().splitlines() if ":\t" in line)
eff, bnd, amb = (int(status[k], 16) for k in ("CapEff", "CapBnd", "CapAmb"))
ok = (status["Seccomp"].strip() == "2" and status["NoNewPrivs"].strip() == "1" and eff == bnd
      and amb == 0 and bin(bnd).count("1") == len(sys.argv[2].split()) > 0)
print(("PASS" if ok else "FAIL") + f" Seccomp={status['Seccomp'].strip()} "
      f"NoNewPrivs={status['NoNewPrivs'].strip()} CapEff={eff:#x} CapBnd={bnd:#x} CapAmb={amb:#x}")
EOF
) || v="FAIL cannot read /proc/$mainpid/status"
check main-process-confined "${v%% *}" "MainPID $mainpid: ${v#* }; unit: $caps"
systemctl status --no-pager -l sandboxd > "$R/status-after-start.txt" 2>&1
journalctl -b -u sandboxd --no-pager > "$R/journal-after-start.txt" 2>&1

phase "API"
out=$(api GET /healthz); echo "$out" > "$R/healthz.txt"
check healthz "$(echo "$out" | grep -q HTTP=200 && echo PASS || echo FAIL)" "$out"
out=$(api GET /readyz); echo "$out" > "$R/readyz.txt"
check readyz "$(echo "$out" | grep -q HTTP=200 && echo PASS || echo FAIL)" "$out"
out=$($SBX tools --url $URL 2>&1); rc=$?; echo "$out" > "$R/tools.txt"
check cli-tools "$( [ $rc = 0 ] && echo PASS || echo FAIL)" "rc $rc; $out"
out=$($SBX invoke python --arg code='print(6*7)' --url $URL 2>&1); rc=$?; echo "$out" > "$R/invoke-cli.txt"
check cli-invoke-python "$( [ $rc = 0 ] && echo "$out" | grep -q 42 && echo PASS || echo FAIL)" "rc $rc; $out"
out=$(api POST /v1/tools/python/invoke '{"arguments":{"code":"print(6*7)"}}'); echo "$out" > "$R/invoke-python.json"
check api-invoke-python "$( [ "$(echo "$out" | jget 'd["status"], d["stdout"], d["cleanup"]["verified"]')" = "('ok', '42\n', True)" ] && echo PASS || echo FAIL)" \
  "$(echo "$out" | jget 'd["status"], d["stdout"], d["termination"], d["cleanup"], d["resources"]')"

phase "limits"
out=$(api POST /v1/tools/python/invoke \
  '{"arguments":{"code":"x = bytearray(1024**3)\nprint(len(x))"},"limits":{"memory_bytes":134217728}}')
echo "$out" > "$R/memory-limit.json"
v=$(echo "$out" | jget 'd["status"], d["termination"]["reason"], d["cleanup"]["verified"]')
check memory-limit-1GiB-in-128MiB "$( [ "$v" = "('killed', 'memory_limit', True)" ] && echo PASS || echo FAIL)" \
  "$(echo "$out" | jget 'd["status"], d["termination"], d["resources"], d["cleanup"], d.get("message")')"
out=$(api POST /v1/tools/python/invoke \
  '{"arguments":{"code":"x = []\nwhile True:\n    x.append(\"a\" * 10**6)"},"limits":{"memory_bytes":134217728}}')
echo "$out" > "$R/memory-limit-gradual.json"
v=$(echo "$out" | jget 'd["status"], d["termination"]["reason"], d["cleanup"]["verified"]')
check memory-limit-gradual-128MiB "$( [ "$v" = "('killed', 'memory_limit', True)" ] && echo PASS || echo FAIL)" \
  "$(echo "$out" | jget 'd["status"], d["termination"], d["resources"], d["cleanup"], d.get("message")')"
out=$(api POST /v1/tools/python/invoke \
  '{"arguments":{"code":"print(\"start\")\nwhile True:\n    pass"},"limits":{"timeout_s":2}}')
echo "$out" > "$R/timeout.json"
v=$(echo "$out" | jget 'd["status"], d["termination"]["reason"], d["cleanup"]["verified"]')
check timeout-kill-cleanup "$( [ "$v" = "('timeout', 'wall_timeout', True)" ] && echo PASS || echo FAIL)" \
  "$(echo "$out" | jget 'd["status"], d["termination"], d["resources"], d["cleanup"]')"
# kernels you can trust, under the real unit (ProtectProc=invisible, no CAP_SYS_PTRACE): a session's
# kernel is proven idle from /proc (read as the sandbox's uid) call after call, and a timeout
# interrupts it first and keeps its variables
sid=$(api POST /v1/sessions '{}' | jget 'd["id"]')
api POST /v1/tools/python/invoke "{\"arguments\":{\"code\":\"x = 41\"},\"session\":\"$sid\"}" > "$R/kernel-1.json"
out=$(api POST /v1/tools/python/invoke "{\"arguments\":{\"code\":\"x + 1\"},\"session\":\"$sid\"}"); echo "$out" > "$R/kernel-2.json"
v=$(echo "$out" | jget 'd["value"], d["kernel"]["lost"], d["kernel"]["calls"]')
check kernel-proven-idle-under-unit "$( [ "$v" = "(42, False, 2)" ] && echo PASS || echo FAIL)" \
  "$(echo "$out" | jget 'd["status"], d["value"], d["kernel"], d.get("message")')"
out=$(api POST /v1/tools/python/invoke "{\"arguments\":{\"code\":\"while True:\\n    pass\"},\"session\":\"$sid\",\"limits\":{\"timeout_s\":2}}")
echo "$out" > "$R/kernel-interrupt.json"
after=$(api POST /v1/tools/python/invoke "{\"arguments\":{\"code\":\"x\"},\"session\":\"$sid\"}")
v=$(echo "$out" | jget 'd["status"], d["kernel"]["interrupted"], d["kernel"]["lost"]')
check kernel-interrupt-keeps-state "$( [ "$v" = "('timeout', True, False)" ] && [ "$(echo "$after" | jget 'd["value"]')" = 41 ] && echo PASS || echo FAIL)" \
  "$(echo "$out" | jget 'd["status"], d["kernel"], d["cleanup"]'); then x: $(echo "$after" | jget 'd["value"], d["kernel"]')"
api DELETE "/v1/sessions/$sid" > /dev/null

phase "per-call cgroups"
SCG=$(svc_cg)
cg_tree "$SCG" > "$R/cgroup-before.txt"
{ echo "unit cgroup: $SCG"; echo "subtree_control: $(cat $SCG/cgroup.subtree_control)"
  echo "controllers: $(cat $SCG/cgroup.controllers)"; echo "procs: $(cat $SCG/cgroup.procs | tr '\n' ' ')"
  systemctl show -p Delegate,DelegateControllers,ControlGroup sandboxd; } > "$R/cgroup-unit.txt" 2>&1
( api POST /v1/tools/python/invoke \
    '{"arguments":{"code":"import time\ntime.sleep(6)\nprint(\"slept\")"},"limits":{"pids":7,"memory_bytes":100000000,"cpus":0.5}}' \
    > "$R/cgroup-call.json" ) &
cpid=$!
# until the call runs: a cgroup below the unit's with the call's pids limit and a process in it
for _ in $(seq 1 240); do
  for d in $(worker_cgroups "$SCG"); do
    [ "$(cat $d/pids.max 2>/dev/null)" = 7 ] && [ -n "$(cat $d/cgroup.procs 2>/dev/null)" ] && break 2
  done
  sleep 0.25
done
cg_tree "$SCG" > "$R/cgroup-during.txt"
calls=""
for d in $(worker_cgroups "$SCG"); do
  [ -n "$(cat $d/cgroup.procs 2>/dev/null)" ] || continue
  calls="$calls $d"
  echo "$d: pids.max=$(cat $d/pids.max) memory.max=$(cat $d/memory.max) cpu.max=$(cat $d/cpu.max) memory.swap.max=$(cat $d/memory.swap.max 2>&1) procs=$(cat $d/cgroup.procs | tr '\n' ' ')" >> "$R/cgroup-call-limits.txt"
done
wait $cpid
sleep 1
cg_tree "$SCG" > "$R/cgroup-after.txt"
# memory.max is rounded down to a page by the kernel (100000000 -> 99999744)
busy=$(grep -cE "pids.max=7 memory.max=999997(44|60) cpu.max=50000 100000" "$R/cgroup-call-limits.txt" 2>/dev/null)
check per-call-cgroup-under-unit "$( [ -n "$calls" ] && echo PASS || echo FAIL)" \
  "unit cgroup $SCG; during: $(tr '\n' ' ' < "$R/cgroup-during.txt")"
check per-call-limits-written "$( [ "${busy:-0}" -ge 1 ] 2>/dev/null && echo PASS || echo FAIL)" \
  "$(cat "$R/cgroup-call-limits.txt" 2>/dev/null)"
# The call took a standby worker's cgroup and set the call's limits on it (the zygote also keeps
# standby workers, each in its own cgroup, which stay): the call's cgroup is the one with the
# call's limits that existed during the call; it must be gone afterwards.
removed=""; kept=""
for d in $(grep -E "pids.max=7 " "$R/cgroup-call-limits.txt" 2>/dev/null | cut -d: -f1); do
  if [ -d "$d" ]; then kept="$kept $d"; else removed="$removed ${d##*/}"; fi
done
check per-call-cgroup-removed "$( [ -n "$removed" ] && echo PASS || echo FAIL)" \
  "removed after the call:${removed:- none}; cgroups with the call's limits still there (a standby preset to the last limits is expected):${kept:- none}; after: $(tr '\n' ' ' < "$R/cgroup-after.txt"); result: $(jget 'd["status"], d["stdout"], d["cleanup"]' < "$R/cgroup-call.json")"
check delegate-subtree INFO "$(tr '\n' ' ' < "$R/cgroup-unit.txt")"

# pids limit, observed from inside a call: the restricted backend has no fork(), so the limit is
# checked by reading it above; here the container backend (if it works) runs a fork bomb later.

phase "doctor, security score"
out=$($SBX doctor 2>&1); rc=$?; echo "$out" > "$R/doctor.txt"
check doctor-from-shell "$( [ $rc = 0 ] && echo PASS || echo FAIL)" "rc $rc (run in $(cat /proc/self/cgroup)); $(echo "$out" | grep -E 'FAIL|ok:|warn|cgroup' | head -8)"
own=$CG$(cut -d: -f3 /proc/self/cgroup)
scopes=$(until_gone "$R/doctor.txt")
left=$(find "$own" -mindepth 1 -maxdepth 1 -type d -name 'sandboxd-*' 2>/dev/null | tr '\n' ' ')
check doctor-leaves-no-cgroup "$( [ -z "$left" ] && [ -z "$scopes" ] && echo PASS || echo FAIL)" \
  "doctor ran in $own (not delegated); left behind: ${left:-nothing}; its scope ($(scopes_named "$R/doctor.txt")) left: ${scopes:-no}"
check doctor-finds-unit-audit-log "$(echo "$out" | grep -q 'audit_log.*/var/log/sandboxd/audit.jsonl' && echo PASS || echo FAIL)" \
  "$(echo "$out" | grep -E 'audit_log|state_dir' | tr '\n' ' ')"
out=$($SBX doctor 2>&1); rc=$?
check doctor-twice "$( [ $rc = 0 ] && echo PASS || echo FAIL)" "second doctor run: rc $rc; $(echo "$out" | grep -E 'FAIL|cgroup' | head -3)"

phase "serve from a shell (make run's way), not delegated"
mkdir -p /root/shell-state
# Beside the service (sandbox uids 10100-10999, claimed host-wide) the default range is refused
# before anything starts: exit 6, one line naming the settings, the service's pid and a free
# range; the shell daemon then serves on that range (docs/operations.md, "Sandbox uid ranges").
mainpid=$(systemctl show -p MainPID --value sandboxd)
SANDBOXD_CONFIG=/dev/null timeout 120 $SBX serve --port 8799 --state-dir /root/shell-state \
  > "$R/serve-shell-refused.log" 2>&1; rrc=$?
refusal=$(cat "$R/serve-shell-refused.log")
free=$(grep -o 'SANDBOXD_SANDBOX_UID_FIRST=[0-9]*' <<< "$refusal" | head -n 1 | cut -d= -f2)
check uid-range-claimed-host-wide "$( [ $rrc = 6 ] && [ "$(grep -c . <<< "$refusal")" = 1 ] \
  && grep -q "sandbox_uid_first=10100, sandbox_uid_count=900" <<< "$refusal" \
  && grep -q "(pid $mainpid)" <<< "$refusal" && [ -n "$free" ] && [ "$free" -ge 11000 ] \
  && [ ! -e /root/shell-state/audit.jsonl ] && systemctl is-active -q sandboxd && echo PASS || echo FAIL)" \
  "exit $rrc; service pid $mainpid; $refusal"
SANDBOXD_CONFIG=/dev/null SANDBOXD_SANDBOX_UID_FIRST=${free:-11000} \
  $SBX serve --port 8799 --state-dir /root/shell-state > "$R/serve-shell.log" 2>&1 &
spid=$!
for _ in $(seq 1 300); do curl -s -o /dev/null http://127.0.0.1:8799/healthz && break; sleep 1; done
scg=$(cut -d: -f3 /proc/$spid/cgroup 2>/dev/null)
out=$(curl -sS --max-time 60 -H 'content-type: application/json' \
  -d '{"arguments":{"code":"x = bytearray(1024**3)"},"limits":{"memory_bytes":134217728}}' \
  -w '\nHTTP=%{http_code}\n' http://127.0.0.1:8799/v1/tools/python/invoke)
echo "$out" > "$R/serve-shell-memory.json"
v=$(echo "$out" | jget 'd["status"], d["termination"]["reason"], d["cleanup"]["verified"]')
check serve-from-shell "$( [ "$v" = "('killed', 'memory_limit', True)" ] && echo PASS || echo FAIL)" \
  "daemon cgroup $scg; 1 GiB in 128 MiB: $v; $(grep -m1 -E 'cgroup|restricted:' "$R/serve-shell.log" | cut -c1-200)"
kill -TERM $spid; wait $spid; src=$?
scopes=$(until_gone "$R/serve-shell.log")
check serve-from-shell-cleanup "$( [ $src = 0 ] && [ -z "$scopes" ] && [ ! -d "$CG$scg" ] && echo PASS || echo FAIL)" \
  "exit $src; scope $scg exists after exit: $( [ -d "$CG$scg" ] && echo yes || echo no); its scope ($(scopes_named "$R/serve-shell.log")) left: ${scopes:-no}"

out=$(systemd-run --quiet --wait --pipe --collect -p Delegate=yes $SBX doctor --state-dir /tmp/doctor-state 2>&1); rc=$?
echo "$out" > "$R/doctor-systemd-run.txt"
check doctor-delegated-scope INFO "systemd-run -p Delegate=yes sandboxd doctor: rc $rc; $(echo "$out" | grep -E 'FAIL|ok:|cgroup' | head -5)"
out=$(systemd-analyze security sandboxd.service 2>&1); echo "$out" > "$R/security-live.txt"
live=$(echo "$out" | grep -o 'Overall exposure level for sandboxd.service: .*')
out2=$(systemd-analyze security --offline=true "$SRC/systemd/sandboxd.service" 2>&1); echo "$out2" > "$R/security-offline.txt"
off=$(echo "$out2" | grep -o 'Overall exposure level for sandboxd.service: .*')
num=$(echo "$live" | grep -oE '[0-9]+\.[0-9]+' | head -1)
check security-score-live "$(python3 -c "import sys; print('PASS' if float(sys.argv[1] or 99) <= 2.0 else 'FAIL')" "${num:-}")" \
  "live: ${live:-none} / offline (repo file): ${off:-none}"

phase "audit"
out=$($SBX audit verify /var/log/sandboxd/audit.jsonl 2>&1); rc=$?; echo "$out" > "$R/audit-verify.txt"
check audit-verify "$( [ $rc = 0 ] && echo PASS || echo FAIL)" "rc $rc; ${out:0:300}"

phase "reload"
pid0=$(systemctl show -p MainPID --value sandboxd)
since=$(date '+%Y-%m-%d %H:%M:%S.%6N')
out=$(systemctl reload sandboxd 2>&1); rc=$?
# ExecReload signals the daemon: its policy logger's line says it has read the policies again
until_logged "$since" 'policies reloaded|reload refused'
pid1=$(systemctl show -p MainPID --value sandboxd)
journalctl -u sandboxd --since "$since" --no-pager > "$R/reload-journal.txt" 2>&1
check reload-sighup "$( [ $rc = 0 ] && [ "$pid0" = "$pid1" ] && systemctl is-active -q sandboxd && echo PASS || echo FAIL)" \
  "rc $rc; MainPID $pid0 -> $pid1; $(show); journal: $(tail -n 3 "$R/reload-journal.txt")"
# a broken policy: refused with file:line, the old one stays in force
printf 'version: 1\nname: broken\nclients: ["*"]\ntools:\n  python: [unclosed\n' > /etc/sandboxd/policies/broken.yaml
since=$(date '+%Y-%m-%d %H:%M:%S.%6N')
systemctl reload sandboxd; until_logged "$since" 'broken\.yaml'
journalctl -u sandboxd --since "$since" --no-pager > "$R/reload-broken-journal.txt" 2>&1
out=$(api POST /v1/tools/python/invoke '{"arguments":{"code":"print(1+1)"}}')
check reload-broken-policy-refused "$(grep -q 'broken.yaml' "$R/reload-broken-journal.txt" && systemctl is-active -q sandboxd && [ "$(echo "$out" | jget 'd["stdout"]')" = 2 ] && echo PASS || echo FAIL)" \
  "journal: $(grep -m2 -i 'broken\|refus\|error' "$R/reload-broken-journal.txt"); call after: $(echo "$out" | jget 'd["status"], d["stdout"]')"
since=$(date '+%Y-%m-%d %H:%M:%S.%6N')
rm -f /etc/sandboxd/policies/broken.yaml; systemctl reload sandboxd; until_logged "$since" 'policies reloaded|reload refused'


phase "crash + restart (SIGKILL during a call)"
decided=$(audit_decisions)
( api POST /v1/tools/python/invoke '{"arguments":{"code":"import time\ntime.sleep(20)"}}' > "$R/crash-call.txt" 2>&1 ) &
cpid=$!
until_decided "$decided"  # the call is admitted (audited): the kill comes during it
pid0=$(systemctl show -p MainPID --value sandboxd)
systemctl kill -s SIGKILL --kill-who=main sandboxd
wait $cpid
for _ in $(seq 1 240); do
  pid1=$(systemctl show -p MainPID --value sandboxd)
  [ "$pid1" != 0 ] && [ "$pid1" != "$pid0" ] && systemctl is-active -q sandboxd && break
  sleep 1
done
sleep 2
SCG=$(svc_cg)
cg_tree "$SCG" > "$R/cgroup-after-restart.txt"
# sandboxd-code's processes but the tests job's containers' (its first lane runs beside, ci.sh)
left=$(ps -u 10001 -o pid=,cgroup=,cmd= 2>/dev/null | grep -vE 'docker-[0-9a-f]{64}\.scope')
journalctl -b -u sandboxd --no-pager | tail -n 40 > "$R/restart-journal.txt"
check restart-after-sigkill "$(systemctl is-active -q sandboxd && [ "$pid1" != "$pid0" ] && [ -z "$left" ] && echo PASS || echo FAIL)" \
  "MainPID $pid0 -> $pid1; $(show); uid-10001 procs left: ${left:-none}; cgroups: $(tr '\n' ' ' < "$R/cgroup-after-restart.txt")"
grep -c '"interrupted"' /var/log/sandboxd/audit.jsonl > /dev/null 2>&1
check restart-interrupted-audited "$(grep -q 'interrupted' /var/log/sandboxd/audit.jsonl && echo PASS || echo FAIL)" \
  "$(grep -m1 interrupted /var/log/sandboxd/audit.jsonl | cut -c1-250)"

phase "stop while a call is in flight (drain)"
decided=$(audit_decisions)
( api POST /v1/tools/python/invoke '{"arguments":{"code":"import time\ntime.sleep(4)\nprint(\"done\")"}}' > "$R/drain-call.json" 2>&1 ) &
cpid=$!
until_decided "$decided"  # the call is admitted: the stop comes while it runs
SCG=$(svc_cg)
t0=$(date +%s.%N)
out=$(systemctl stop sandboxd 2>&1); rc=$?
t1=$(date +%s.%N)
wait $cpid
st=$(systemctl show -p Result,ExecMainCode,ExecMainStatus,ActiveState sandboxd | tr '\n' ' ')
check stop-drain-exit0 "$( [ $rc = 0 ] && echo "$st" | grep -q 'Result=success' && echo "$st" | grep -q 'ExecMainStatus=0' && echo PASS || echo FAIL)" \
  "rc $rc; stop took $(python3 -c "print(round($t1-$t0,1))") s; $st"
check stop-inflight-call-finished "$( [ "$(jget 'd["status"], d["stdout"]' < "$R/drain-call.json")" = "('ok', 'done\n')" ] && echo PASS || echo FAIL)" \
  "$(head -c 400 "$R/drain-call.json")"
check stop-cgroup-gone "$( [ ! -d "$SCG" ] && echo PASS || echo FAIL)" "$SCG exists after stop: $( [ -d "$SCG" ] && echo yes || echo no)"
journalctl -b -u sandboxd --no-pager > "$R/journal-full.txt" 2>&1

phase "container backend under the unit (sandboxd-docker.conf)"
if [ -f /share/payload/images.tar ]; then
  [ -n "$preload" ] && wait "$preload"
  # under the preload's lock: the tests job (running beside, ci.sh) may be loading or starting
  bash /share/guest/preload-images.sh --start "$R/docker-preload.txt" > "$R/docker-start.txt" 2>&1
  [ -f /share/payload/images.loaded ] || { /usr/bin/docker load -i /share/payload/images.tar \
    > "$R/docker-load.txt" 2>&1 && touch /share/payload/images.loaded; }
  # the loaded image is the host's: rebuilt here from the loaded base only when its runner is
  # not this tree's (a runner change not yet in the host's image, e.g. a new runner request)
  $SBX images build --offline --if-missing > "$R/docker-images-build.txt" 2>&1
  install -D -m 0644 systemd/sandboxd-docker.conf /etc/systemd/system/sandboxd.service.d/docker.conf
  systemctl daemon-reload
  out=$(systemctl start sandboxd 2>&1); rc=$?
  sleep 1
  out2=$(api GET /readyz); echo "$out2" > "$R/docker-readyz.txt"
  check docker-dropin-start "$( [ $rc = 0 ] && echo "$out2" | grep -q HTTP=200 && echo PASS || echo FAIL)" "start rc $rc $out; readyz: ${out2:0:400}"
  out=$(api POST /v1/tools/shell/invoke '{"arguments":{"command":"echo hello"}}'); echo "$out" > "$R/docker-shell.json"
  check docker-shell-echo "$( [ "$(echo "$out" | jget 'd["status"], d["stdout"]')" = "('ok', 'hello\n')" ] && echo PASS || echo FAIL)" \
    "$(echo "$out" | jget 'd["status"], d["stdout"], d["termination"], d.get("message"), d["cleanup"]')"
  out=$(api POST /v1/tools/shell/invoke '{"arguments":{"command":"python3 -c \"import os\nn=0\ntry:\n    while True:\n        pid=os.fork()\n        if pid==0:\n            import time; time.sleep(30); os._exit(0)\n        n+=1\nexcept OSError as e:\n    print(n, e)\""},"limits":{"pids":16,"timeout_s":60}}')
  echo "$out" > "$R/docker-pids.json"
  # the result says pids_limit; if the bomb got to print its count, it stayed below 16 plus the
  # runner's fixed overhead (engine.PIDS_OVERHEAD = 6)
  n=$(echo "$out" | jget '(d["stdout"].split() or ["0"])[0]')
  check docker-pids-limit-16 "$( [ "${n:-99}" -lt 22 ] && [ "$(echo "$out" | jget 'd["termination"]["reason"], d["cleanup"]["verified"]')" = "('pids_limit', True)" ] && echo PASS || echo FAIL)" \
    "$(echo "$out" | jget 'd["status"], d["stdout"], d["stderr"][:200], d["termination"], d["cleanup"]')"
  out=$(api POST /v1/tools/shell/invoke '{"arguments":{"command":"python3 -c \"x = bytearray(1024**3)\""},"limits":{"memory_bytes":134217728}}')
  echo "$out" > "$R/docker-memory.json"
  check docker-memory-limit "$( [ "$(echo "$out" | jget 'd["termination"]["reason"]')" = memory_limit ] && echo PASS || echo FAIL)" \
    "$(echo "$out" | jget 'd["status"], d["termination"], d["stderr"][:200], d["cleanup"]')"
  # an upgrade must not end users' work: `systemctl restart sandboxd` keeps sessions. A container
  # session keeps its container, its kernel's variable and its files; a restricted session keeps its
  # files (its kernel died with the daemon: its next python call says lost, daemon_restart)
  rsid=$(api POST /v1/sessions '{}' | jget 'd["id"]')
  api POST /v1/tools/write_file/invoke "{\"arguments\":{\"path\":\"r.txt\",\"content\":\"restricted-kept\"},\"session\":\"$rsid\"}" > "$R/restart-r-1.json"
  api POST /v1/tools/python/invoke "{\"arguments\":{\"code\":\"y = 1\"},\"session\":\"$rsid\"}" >> "$R/restart-r-1.json"
  printf 'version: 1\nname: restart-check\nclients: ["*"]\ntools:\n  python:\n    backend: container\n' \
    > /etc/sandboxd/policies/restart-check.yaml
  since=$(date '+%Y-%m-%d %H:%M:%S.%6N')
  systemctl reload sandboxd; until_logged "$since" 'policies reloaded|reload refused'
  csid=$(api POST /v1/sessions '{}' | jget 'd["id"]')
  api POST /v1/tools/python/invoke "{\"arguments\":{\"code\":\"x = 41\\nopen('c.txt', 'w').write('container-kept')\\nx\"},\"session\":\"$csid\"}" > "$R/restart-c-1.json"
  pid0=$(systemctl show -p MainPID --value sandboxd)
  out=$(systemctl restart sandboxd 2>&1); rc=$?
  pid1=$(systemctl show -p MainPID --value sandboxd)
  out=$(api POST /v1/tools/python/invoke "{\"arguments\":{\"code\":\"[x + 1, open('c.txt').read()]\"},\"session\":\"$csid\"}"); echo "$out" > "$R/restart-c-2.json"
  v=$(echo "$out" | jget 'd["value"], d["kernel"]["lost"], d["kernel"]["calls"]')
  check restart-keeps-container-session "$( [ $rc = 0 ] && [ "$pid0" != "$pid1" ] && [ "$v" = "([42, 'container-kept'], False, 2)" ] && echo PASS || echo FAIL)" \
    "restart rc $rc, MainPID $pid0 -> $pid1; after: $(echo "$out" | jget 'd["status"], d["value"], d["kernel"], d.get("message")')"
  # a start is bounded whatever sandboxes do: three sessions whose runners are stopped (SIGSTOP,
  # as their own code could after the daemon hung up) do not hold it (they are re-adopted while
  # it serves, within adopt_timeout_s); each kept record is consumed as it is tried; their next
  # python calls say their kernels were lost
  fsids=""
  for _ in 1 2 3; do
    fsid=$(api POST /v1/sessions '{}' | jget 'd["id"]')
    api POST /v1/tools/python/invoke "{\"arguments\":{\"code\":\"x = 1\"},\"session\":\"$fsid\"}" >> "$R/frozen-1.json"
    fsids="$fsids $fsid"
  done
  systemctl stop sandboxd
  frozen=""
  for fsid in $fsids; do
    ipid=$(docker inspect -f '{{.State.Pid}}' "$(docker ps -q --filter "label=sandboxd.session=$fsid")" 2>/dev/null)
    rpid=$(pgrep -P "${ipid:-0}" -f runner.py | head -n 1)
    [ -n "$rpid" ] && kill -STOP "$rpid" && frozen="$frozen $rpid"
  done
  t0=$(date +%s.%N)
  out=$(systemctl start sandboxd 2>&1); rc=$?
  t1=$(date +%s.%N)
  records=$(find /var/lib/sandboxd/kept-containers -name '*.json' 2>/dev/null | wc -l)
  lost=""
  for fsid in $fsids; do
    out2=$(curl -sS --max-time 200 --unix-socket "$SOCK" -X POST -H 'content-type: application/json' \
      -d "{\"arguments\":{\"code\":\"x\"},\"session\":\"$fsid\"}" -w '\nHTTP=%{http_code}\n' http://sandboxd/v1/tools/python/invoke)
    echo "$out2" >> "$R/frozen-2.json"
    lost="$lost$(echo "$out2" | jget 'd["kernel"]["lost"], d["kernel"]["reason"]');"
  done
  left=$(docker ps -q --filter label=sandboxd.role=session | tr '\n' ' ')
  check start-with-stopped-runners-bounded "$( [ $rc = 0 ] && [ "$(echo $frozen | wc -w)" = 3 ] && [ "$records" = 0 ] && [ "$lost" = "(True, 'daemon_restart');(True, 'daemon_restart');(True, 'daemon_restart');" ] && echo PASS || echo FAIL)" \
    "start rc $rc in $(python3 -c "print(round($t1-$t0,1))") s (the first start: ${start_s} s) with runners$frozen stopped; records left at READY: $records; kernels: $lost; session containers now: ${left:-none}; $(grep -c session_recovered /var/log/sandboxd/audit.jsonl) session_recovered; $out"
  for fsid in $fsids; do api DELETE "/v1/sessions/$fsid" > /dev/null; done
  since=$(date '+%Y-%m-%d %H:%M:%S.%6N')
  rm -f /etc/sandboxd/policies/restart-check.yaml; systemctl reload sandboxd
  until_logged "$since" 'policies reloaded|reload refused'
  out=$(api POST /v1/tools/read_file/invoke "{\"arguments\":{\"path\":\"r.txt\"},\"session\":\"$rsid\"}"); echo "$out" > "$R/restart-r-2.json"
  out2=$(api POST /v1/tools/python/invoke "{\"arguments\":{\"code\":\"1\"},\"session\":\"$rsid\"}"); echo "$out2" >> "$R/restart-r-2.json"
  check restart-keeps-restricted-session-files "$( [ "$(echo "$out" | jget 'd["stdout"]')" = restricted-kept ] && [ "$(echo "$out2" | jget 'd["kernel"]["lost"], d["kernel"]["reason"]')" = "(True, 'daemon_restart')" ] && echo PASS || echo FAIL)" \
    "read_file: $(echo "$out" | jget 'd["status"], d["stdout"]'); python: $(echo "$out2" | jget 'd["status"], d["kernel"]'); audit: $(grep -c session_recovered /var/log/sandboxd/audit.jsonl) session_recovered"
  api DELETE "/v1/sessions/$rsid" > /dev/null; api DELETE "/v1/sessions/$csid" > /dev/null
  # a stop is bounded whatever clients do: a call printing 1 MB to a client that never reads
  # its answer (a unix socket's send buffer holds ~200 KB) does not hold it past the unit's
  # TimeoutStopSec=45s (drain_grace_s 30 + shutdown_timeout_s 10): it exits 0 by itself
  results=$(grep -c '"event":"result"' /var/log/sandboxd/audit.jsonl)
  python3 -c '
import json, socket, sys, time
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
sock.connect(sys.argv[1])
body = json.dumps({"arguments": {"code": "print(\"x\" * 1_000_000)"}}).encode()
sock.sendall(b"POST /v1/tools/python/invoke HTTP/1.1\r\nhost: sandboxd\r\ncontent-type: application/json\r\n"
             + b"content-length: %d\r\n\r\n" % len(body) + body)
time.sleep(120)  # never reads
' "$SOCK" > "$R/stop-deaf-client.txt" 2>&1 &
  dpid=$!
  # until the call's result is audited: its answer is going out, to nobody
  for _ in $(seq 1 240); do [ "$(grep -c '"event":"result"' /var/log/sandboxd/audit.jsonl)" -gt "$results" ] && break; sleep 0.5; done
  t0=$(date +%s.%N)
  out=$(systemctl stop sandboxd 2>&1); rc=$?
  t1=$(date +%s.%N)
  kill "$dpid" 2>/dev/null; wait "$dpid" 2>/dev/null
  st=$(systemctl show -p Result,ExecMainCode,ExecMainStatus sandboxd | tr '\n' ' ')
  took=$(python3 -c "print(round($t1-$t0,1))")
  check stop-with-unread-answer-bounded "$( [ $rc = 0 ] && echo "$st" | grep -q 'Result=success' && echo "$st" | grep -q 'ExecMainStatus=0' && python3 -c "import sys; sys.exit(0 if $took < 45 else 1)" && echo PASS || echo FAIL)" \
    "rc $rc; stop took $took s; $st; journal: $(journalctl -u sandboxd -n 20 --no-pager 2>/dev/null | grep -m2 -iE 'graceful|Cancel' | cut -c1-200) $out"
  rm -f /etc/systemd/system/sandboxd.service.d/docker.conf; systemctl daemon-reload
  journalctl -b -u sandboxd --no-pager > "$R/journal-full.txt" 2>&1
fi

phase "done"
fails=$(awk -F'\t' '$2=="FAIL"' "$R/checks.tsv" | wc -l)
echo "service checks: $(awk -F'\t' '$2=="PASS"' "$R/checks.tsv" | wc -l) PASS, $fails FAIL, $(awk -F'\t' '$2=="INFO"' "$R/checks.tsv" | wc -l) INFO"
exit $(( fails > 100 ? 100 : fails ))
