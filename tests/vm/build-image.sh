#!/usr/bin/env bash
# Build (or reuse) a Debian 12 VM image with systemd as PID 1 and cgroup v2, for testing sandboxd
# the way it is deployed. Cached: a second call with the same package list and the same version
# of this script returns at once.
#
#   tests/vm/build-image.sh            # -> $VM_DIR/image/{base.img,vmlinuz,initrd.img,KEY}
#
# Environment (all optional):
#   VM_DIR      work directory (default /tmp/vm); the image lands in $VM_DIR/image
#   VM_MIRROR   Debian mirror (default http://deb.debian.org/debian)
#   VM_SUITE    suite (default bookworm)
#   VM_SIZE     ext4 image size (default 10G, sparse)
#   VM_EXTRA    extra packages, comma-separated
#   VM_REBUILD  1: ignore the cache
#
# Needs root, debootstrap, e2fsprogs (mkfs.ext4 -d), and for booting qemu-system-x86 + qemu-utils:
#   apt-get install -y qemu-system-x86 qemu-utils debootstrap
# The image boots with tests/vm/run-in-vm.sh; see README.md beside this file.
set -euo pipefail

VM_DIR=${VM_DIR:-/var/cache/sandboxd-vm}
MIRROR=${VM_MIRROR:-http://deb.debian.org/debian}
SUITE=${VM_SUITE:-bookworm}
SIZE=${VM_SIZE:-10G}
HERE=$(cd "$(dirname "$0")" && pwd)

# apparmor: Debian 12 has AppArmor in its LSM list; dockerd needs apparmor_parser to load
# docker-default (without it every `docker run` fails: exec: "apparmor_parser": not found).
PKGS="systemd,systemd-sysv,udev,dbus,linux-image-amd64,python3,python3-venv,python3-pip,\
docker.io,iproute2,procps,kmod,ca-certificates,curl,util-linux,e2fsprogs,libseccomp2,\
less,psmisc,jq,apparmor"
[ -n "${VM_EXTRA:-}" ] && PKGS="$PKGS,$VM_EXTRA"

# The cache key: everything that changes the image.
KEY=$( { echo "$SUITE $MIRROR $SIZE $PKGS"; sed -n '/^# ---- image content/,$p' "$0"; } \
       | sha256sum | cut -c1-16)
IMG=$VM_DIR/image
if [ "${VM_REBUILD:-0}" != 1 ] && [ -f "$IMG/KEY" ] && [ "$(cat "$IMG/KEY")" = "$KEY" ] \
   && [ -f "$IMG/base.img" ] && [ -f "$IMG/vmlinuz" ] && [ -f "$IMG/initrd.img" ]; then
  echo "build-image: cached image $IMG (key $KEY)"
  exit 0
fi

[ "$(id -u)" = 0 ] || { echo "build-image: needs root" >&2; exit 1; }
need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v qemu-img >/dev/null || need+=(qemu-utils)
if [ ${#need[@]} -gt 0 ]; then
  echo "build-image: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null
fi

mkdir -p "$VM_DIR"
ROOT=$VM_DIR/rootfs
t0=$(date +%s)
rm -rf "$ROOT" "$IMG.new"
echo "build-image: debootstrap $SUITE -> $ROOT"
debootstrap --variant=minbase --include="$PKGS" "$SUITE" "$ROOT" "$MIRROR" \
  > "$VM_DIR/debootstrap.log" 2>&1 || { tail -n 40 "$VM_DIR/debootstrap.log" >&2; exit 1; }
t1=$(date +%s)
echo "build-image: debootstrap took $((t1 - t0)) s"

# ---- image content (any change below this line changes the cache key)
echo sandboxd-vm > "$ROOT/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 sandboxd-vm\n::1 localhost\n' > "$ROOT/etc/hosts"
cat > "$ROOT/etc/fstab" <<'EOF'
/dev/vda / ext4 rw,errors=remount-ro 0 0
EOF
# No login on any console: the VM runs one job and powers off (unattended).
for u in serial-getty@ttyS0.service getty@tty1.service; do
  ln -sf /dev/null "$ROOT/etc/systemd/system/$u"
done
# Docker is started by the job when it needs it (keeps boots short and the host unchanged).
rm -f "$ROOT/etc/systemd/system/multi-user.target.wants/docker.service" \
      "$ROOT/etc/systemd/system/sockets.target.wants/docker.socket" \
      "$ROOT/etc/systemd/system/multi-user.target.wants/containerd.service"
# No network in the VM: don't wait for it.
ln -sf /dev/null "$ROOT/etc/systemd/system/systemd-networkd-wait-online.service"
# Journal: keep it in memory and large enough for a whole test run.
mkdir -p "$ROOT/etc/systemd/journald.conf.d"
printf '[Journal]\nStorage=volatile\nRuntimeMaxUse=256M\n' \
  > "$ROOT/etc/systemd/journald.conf.d/vm.conf"

# The runner: mount the 9p share, run /share/run.sh, save exit code + journal, power off.
cat > "$ROOT/usr/local/sbin/vm-runner" <<'EOF'
#!/bin/bash
# Started by vm-runner.service at the end of boot (see tools/vm/build-image.sh).
set -u
modprobe 9pnet_virtio 2>/dev/null
mkdir -p /share
if ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 share /share; then
  echo "vm-runner: cannot mount the 9p share" > /dev/console
  systemctl poweroff --no-block; exit 1
fi
echo "vm-runner: boot finished at $(cut -d' ' -f1 /proc/uptime) s uptime" | tee /share/boot-time
rc=127
if [ -f /share/run.sh ]; then
  set -o pipefail
  ( cd /share && exec bash /share/run.sh ) 2>&1 | tee /share/run.log > /dev/console
  rc=$?
fi
echo "$rc" > /share/exit-code
journalctl -b --no-pager -o short-monotonic > /share/journal.txt 2>&1
sync
echo "vm-runner: job exited $rc; powering off" > /dev/console
systemctl poweroff --no-block
EOF
chmod 0755 "$ROOT/usr/local/sbin/vm-runner"
cat > "$ROOT/etc/systemd/system/vm-runner.service" <<'EOF'
[Unit]
Description=CI job: run /share/run.sh, then power off
After=multi-user.target
[Service]
Type=oneshot
ExecStart=/usr/local/sbin/vm-runner
TimeoutStartSec=infinity
StandardOutput=journal+console
StandardError=journal+console
EOF
cat > "$ROOT/etc/systemd/system/vm-run.target" <<'EOF'
[Unit]
Description=multi-user.target plus the CI job
Requires=multi-user.target
Wants=vm-runner.service
After=multi-user.target
AllowIsolate=yes
EOF
ln -sf /etc/systemd/system/vm-run.target "$ROOT/etc/systemd/system/default.target"
# machine-id: empty file -> systemd creates a fresh one (in memory) on each boot
: > "$ROOT/etc/machine-id"
rm -f "$ROOT"/var/cache/apt/archives/*.deb
# ---- end of image content

echo "build-image: ext4 image ($SIZE)"
mkdir -p "$IMG.new"
kver=$(ls "$ROOT/lib/modules" | sort -V | tail -n1)
cp "$ROOT/boot/vmlinuz-$kver" "$IMG.new/vmlinuz"
cp "$ROOT/boot/initrd.img-$kver" "$IMG.new/initrd.img"
mkfs.ext4 -q -F -L sandboxd-vm -d "$ROOT" "$IMG.new/base.img" "$SIZE"
echo "$KEY" > "$IMG.new/KEY"
{ echo "kernel $kver"; chroot "$ROOT" dpkg-query -W -f '${Package} ${Version}\n' \
    systemd python3 docker.io linux-image-amd64 2>/dev/null; } > "$IMG.new/VERSIONS"
rm -rf "$IMG" && mv "$IMG.new" "$IMG"
t2=$(date +%s)
echo "build-image: image built in $((t2 - t1)) s (total $((t2 - t0)) s): $IMG"
cat "$IMG/VERSIONS"
