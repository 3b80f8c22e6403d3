#!/usr/bin/env bash
# Boot the VM image made by build-image.sh, run one job script inside it as root (after the whole
# boot, with systemd as PID 1 and cgroup v2), copy its results back, power off. Unattended: no
# console, bounded time, the job's exit status is this script's.
#
#   tests/vm/run-in-vm.sh [options] JOB.sh
#     --share DIR     host directory mounted in the guest at /share (9p, read-write). The job
#                     reads its inputs from there and writes results there. Default: a new
#                     directory $VM_DIR/runs/<timestamp>. JOB.sh is copied to DIR/run.sh.
#     --timeout S     wall-clock limit for the whole VM run (default 2400)
#     --mem MB        guest memory (default 4096; keep <= 6144 on a shared 2-core host)
#     --smp N         guest CPUs (default 2)
#     --accel A       kvm, tcg or auto (default; env VM_ACCEL): kvm when /dev/kvm is backed by
#                     kvm_intel/kvm_amd (hardware virtualization). Nested "PVM" KVM (kvm_pvm, as
#                     on Firecracker-style hosts) only runs PVM-enabled guest kernels, and Debian's
#                     does not boot there (hangs after "Probing EDD"), so auto picks tcg (software
#                     emulation: correct, several times slower).
#     --cpu MODEL     qemu -cpu (default host,-arch-capabilities for kvm, max for tcg; env VM_CPU)
#     --append ARGS   extra kernel command-line arguments
#     --quiet         do not stream the guest console to stdout
#     --keep          keep the qcow2 overlay (the guest's disk) in DIR/overlay.qcow2
#
# Results in the share directory:
#   run.log       the job's stdout+stderr       exit-code   the job's exit status
#   journal.txt   the guest's whole journal      console.log the serial console (boot + job)
#   boot-time     guest uptime when the job started, anything else the job wrote to /share
#
# Exit status: the job's; 124 when the time limit was reached; 125 when the VM never ran the
# job (no exit-code file: boot failure, kernel panic...); 2 on a usage error.
set -euo pipefail

VM_DIR=${VM_DIR:-/var/cache/sandboxd-vm}
IMG=$VM_DIR/image
SHARE="" TIMEOUT=2400 MEM=4096 SMP=2 APPEND="" QUIET=0 KEEP=0
ACCEL=${VM_ACCEL:-auto} CPU=${VM_CPU:-}
while [ $# -gt 0 ]; do
  case $1 in
    --share) SHARE=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --mem) MEM=$2; shift 2 ;;
    --smp) SMP=$2; shift 2 ;;
    --cpu) CPU=$2; shift 2 ;;
    --accel) ACCEL=$2; shift 2 ;;
    --append) APPEND=$2; shift 2 ;;
    --quiet) QUIET=1; shift ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    -*) echo "run-in-vm: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -eq 1 ] || { echo "usage: run-in-vm.sh [options] JOB.sh (see --help)" >&2; exit 2; }
JOB=$1
[ -f "$JOB" ] || { echo "run-in-vm: no such job script: $JOB" >&2; exit 2; }
for f in base.img vmlinuz initrd.img; do
  [ -f "$IMG/$f" ] || { echo "run-in-vm: $IMG/$f missing: run build-image.sh first" >&2; exit 2; }
done
if [ "$ACCEL" = auto ]; then
  if [ -r /dev/kvm ] && [ -d /sys/module/kvm_intel -o -d /sys/module/kvm_amd ]; then
    ACCEL=kvm
  else
    ACCEL=tcg
  fi
fi
case $ACCEL in
  # -arch-capabilities: nested KVM may refuse MSR 0x10a ("failed to set MSR 0x10a"; qemu aborts)
  kvm) ACCEL_ARGS=(-enable-kvm); CPU=${CPU:-host,-arch-capabilities} ;;
  tcg) ACCEL_ARGS=(-accel tcg,thread=multi,tb-size=512); CPU=${CPU:-max} ;;
  *) echo "run-in-vm: --accel must be kvm, tcg or auto" >&2; exit 2 ;;
esac

if [ -z "$SHARE" ]; then
  SHARE=$VM_DIR/runs/$(date +%Y%m%d-%H%M%S)
fi
mkdir -p "$SHARE"
SHARE=$(cd "$SHARE" && pwd)
rm -f "$SHARE"/{exit-code,run.log,journal.txt,console.log,boot-time}
cp "$JOB" "$SHARE/run.sh"

# A throwaway copy-on-write layer: the base image stays pristine for the next run.
OVERLAY=$SHARE/overlay.qcow2
rm -f "$OVERLAY"
qemu-img create -q -f qcow2 -F raw -b "$IMG/base.img" "$OVERLAY"

: > "$SHARE/console.log"
tail_pid=""
if [ "$QUIET" = 0 ]; then
  tail -n +1 -F "$SHARE/console.log" 2>/dev/null &
  tail_pid=$!
fi
cleanup() {
  [ -n "$tail_pid" ] && kill "$tail_pid" 2>/dev/null || true
  [ "$KEEP" = 1 ] || rm -f "$OVERLAY"
}
trap cleanup EXIT

echo "run-in-vm: booting ($ACCEL, cpu $CPU, mem ${MEM}M, ${SMP} CPUs, limit ${TIMEOUT}s), share $SHARE" >&2
t0=$(date +%s)
set +e
timeout --kill-after=20 "$TIMEOUT" qemu-system-x86_64 \
  "${ACCEL_ARGS[@]}" -cpu "$CPU" -smp "$SMP" -m "$MEM" \
  -kernel "$IMG/vmlinuz" -initrd "$IMG/initrd.img" \
  -append "root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=1 panic=-1 $APPEND" \
  -drive "file=$OVERLAY,if=virtio,format=qcow2,cache=unsafe,discard=unmap" \
  -virtfs "local,path=$SHARE,mount_tag=share,security_model=passthrough,id=share" \
  -device virtio-rng-pci \
  -nic none -display none -monitor none -serial "file:$SHARE/console.log" -no-reboot \
  < /dev/null
qrc=$?
set -e
t1=$(date +%s)
sleep 0.5  # let tail print the last lines

if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
  echo "run-in-vm: time limit of ${TIMEOUT}s reached; VM killed after $((t1 - t0)) s" >&2
  exit 124
fi
if [ ! -f "$SHARE/exit-code" ]; then
  echo "run-in-vm: the VM stopped (qemu exit $qrc) after $((t1 - t0)) s without running the job;" \
       "see $SHARE/console.log" >&2
  [ "$QUIET" = 1 ] && tail -n 30 "$SHARE/console.log" >&2
  exit 125
fi
rc=$(cat "$SHARE/exit-code")
echo "run-in-vm: job exited $rc; VM ran $((t1 - t0)) s ($(cat "$SHARE/boot-time" 2>/dev/null))" >&2
exit "$rc"
