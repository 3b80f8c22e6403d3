#!/usr/bin/env bash
# Build the sandboxd base image with no container registry: debootstrap a minimal Debian (or
# Ubuntu) root filesystem from the host's configured apt mirror, strip it, and `docker import` it.
#
#   images/offline/build-rootfs.sh [TAG]            (default TAG: sandboxd/base-offline:latest)
#
# Environment (all optional):
#   MIRROR    apt mirror URL     (default: read from /etc/apt/sources.list and sources.list.d)
#   SUITE     release codename   (default: VERSION_CODENAME from /etc/os-release)
#   CACHE_DIR .deb cache         (default: ${XDG_CACHE_HOME:-~/.cache}/sandboxd/debootstrap/SUITE)
#   DOCKER    docker CLI         (default: /usr/bin/docker, else the first docker on PATH)
#   APT_ETC   apt config dir     (default: /etc/apt; where the sources are read)
#
#   images/offline/build-rootfs.sh --print-mirror   prints the detected mirror and exits
#
# The sandbox user (10001) and the runner are added by images/python/Dockerfile built FROM this
# image (`sandboxd images build --offline` does both steps). Needs root (debootstrap).
set -euo pipefail

TAG="${1:-sandboxd/base-offline:latest}"
# curl and pip: what a sandbox with egress fetches with (docs/egress.md)
PACKAGES="python3,git,ca-certificates,curl,python3-pip"
APT_ETC="${APT_ETC:-/etc/apt}"
PRINT_MIRROR=0
[[ "$TAG" == "--print-mirror" ]] && PRINT_MIRROR=1

if [[ $PRINT_MIRROR -eq 0 && $EUID -ne 0 ]]; then
    echo "build-rootfs.sh: debootstrap needs root" >&2
    exit 1
fi
if [[ $PRINT_MIRROR -eq 0 ]] && ! command -v debootstrap >/dev/null; then
    echo "build-rootfs.sh: debootstrap is not installed" >&2
    exit 1
fi

if [[ -z "${DOCKER:-}" ]]; then
    if [[ -x /usr/bin/docker ]]; then DOCKER=/usr/bin/docker; else DOCKER=docker; fi
fi

# shellcheck disable=SC1091
. /etc/os-release
SUITE="${SUITE:-${VERSION_CODENAME:-}}"
[[ -n "$SUITE" ]] || { echo "build-rootfs.sh: cannot tell the release codename; set SUITE" >&2; exit 1; }

# The first enabled "deb" source that carries SUITE (not -updates/-security): one-line format
# (sources.list, *.list) and deb822 format (*.sources).
detect_mirror() {
    local f
    for f in "$APT_ETC"/sources.list "$APT_ETC"/sources.list.d/*.list; do
        [[ -f "$f" ]] || continue
        awk -v suite="$SUITE" '
            $1 == "deb" {
                i = 2
                if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                if ($(i+1) == suite) { print $i; exit }
            }' "$f"
    done
    for f in "$APT_ETC"/sources.list.d/*.sources; do
        [[ -f "$f" ]] || continue
        awk -v suite="$SUITE" '
            function flush() {
                if (types ~ /(^| )deb( |$)/ && enabled != "no" && uris != "") {
                    n = split(suites, s, " ")
                    for (k = 1; k <= n; k++) if (s[k] == suite) { split(uris, u, " "); print u[1]; found = 1; exit }
                }
                types = ""; uris = ""; suites = ""; enabled = ""
            }
            /^[ \t]*#/ { next }
            /^[ \t]*$/ { flush(); next }
            { key = tolower($1); sub(/:$/, "", key); $1 = ""; sub(/^ +/, "")
              if (key == "types") types = $0
              else if (key == "uris") uris = $0
              else if (key == "suites") suites = $0
              else if (key == "enabled") enabled = tolower($0) }
            END { if (!found) flush() }' "$f"
    done
}

if [[ -z "${MIRROR:-}" ]]; then
    MIRROR="$(detect_mirror | head -n1)"
fi
[[ -n "$MIRROR" ]] || { echo "build-rootfs.sh: no apt source for '$SUITE' found; set MIRROR" >&2; exit 1; }
if [[ $PRINT_MIRROR -eq 1 ]]; then
    echo "$MIRROR"
    exit 0
fi

CACHE_DIR="${CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sandboxd/debootstrap/$SUITE}"
mkdir -p "$CACHE_DIR"
WORK="$(mktemp -d /tmp/sandboxd-rootfs.XXXXXX)"
trap 'rm -rf --one-file-system "$WORK"' EXIT
ROOT="$WORK/rootfs"

echo "build-rootfs.sh: debootstrap $SUITE from $MIRROR (cache $CACHE_DIR)" >&2
fail() {
    tail -n 30 "$WORK/debootstrap.log" >&2
    tail -n 30 "$ROOT/debootstrap/debootstrap.log" >&2 2>/dev/null || true
    exit 1
}
# Two stages so that dpkg can run with force-unsafe-io (no fsync per file: this rootfs is
# thrown away if the build fails, and `docker import` copies it anyway).
debootstrap --foreign --variant=minbase --include="$PACKAGES" --cache-dir="$CACHE_DIR" \
    "$SUITE" "$ROOT" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 || fail
echo force-unsafe-io >"$ROOT/etc/dpkg/dpkg.cfg.d/00sandboxd-unsafe-io"
chroot "$ROOT" /debootstrap/debootstrap --second-stage >>"$WORK/debootstrap.log" 2>&1 || fail
rm -f "$ROOT/etc/dpkg/dpkg.cfg.d/00sandboxd-unsafe-io"

# Strip what a sandbox never needs (docs, man pages, locales, apt state, caches, logs).
rm -rf "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/info/* \
       "$ROOT"/usr/share/locale/* "$ROOT"/usr/share/lintian "$ROOT"/var/lib/apt/lists/* \
       "$ROOT"/var/cache/apt/* "$ROOT"/var/cache/debconf/*-old "$ROOT"/var/log/* \
       "$ROOT"/debootstrap "$ROOT"/usr/share/git-core/templates/hooks/*.sample
find "$ROOT" -name '__pycache__' -prune -exec rm -rf {} + 2>/dev/null || true
# No setuid/setgid programs in the sandbox (no-new-privileges makes them inert anyway).
find "$ROOT" -xdev -perm /6000 -type f -exec chmod ug-s {} + 2>/dev/null || true
# Python byte-code for the whole stdlib, so a read-only rootfs starts fast.
chroot "$ROOT" sh -c '/usr/bin/python3 -m compileall -q -j 0 /usr/lib/python3 /usr/lib/python3.*' \
    >/dev/null 2>&1 || true

tar --numeric-owner --xattrs -C "$ROOT" -c . | "$DOCKER" import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'ENV LANG=C.UTF-8' \
    -c 'CMD ["/bin/sh"]' \
    -m "sandboxd offline base: debootstrap $SUITE minbase + $PACKAGES" \
    - "$TAG" >/dev/null
echo "build-rootfs.sh: imported $TAG" >&2
