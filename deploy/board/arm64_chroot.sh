#!/usr/bin/env bash
# An arm64 Debian bookworm root, run under qemu-user: "an ARM board without a board".
#
#   deploy/board/arm64_chroot.sh build            build the root once (cached); print its path
#   deploy/board/arm64_chroot.sh rebuild          throw the cached root away and build it again
#   deploy/board/arm64_chroot.sh path             print where the cached root is (built or not)
#   deploy/board/arm64_chroot.sh session NAME|DIR a fresh writable board: an overlay of the cached
#                                                 root; prints the directory to chroot into
#   deploy/board/arm64_chroot.sh run ROOT CMD...  run CMD as root inside a session's ROOT
#   deploy/board/arm64_chroot.sh end ROOT|DIR     unmount a session and delete it
#
# The root is `debootstrap --arch=arm64 --variant=minbase` with python3, venv and
# pip, cached in $BPUEMU_ARM64_ROOT (default /var/cache/bpuemu/arm64-bookworm).
# A stamp file inside records the recipe; the root is rebuilt when the stamp is
# missing or names another recipe, so a second run on the same machine costs
# nothing. It is built into ROOT.partial and renamed, so an interrupted build
# never looks finished, and it is never written to afterwards: every use is a
# session, an overlayfs whose changes land in the session's own directory
# (default /var/cache/bpuemu/sessions/NAME), so each session starts from a
# pristine board and sessions can run side by side. A rebuild waits for the
# users that hold a shared flock on ROOT.lock.
#
# Needs root and the Debian packages qemu-user-static, binfmt-support and
# debootstrap (scripts/test.sh installs them). Exit status 77 means "cannot
# run here" (not root, packages missing, no binfmt_misc or overlayfs): tests
# skip on it.
#
# Only /proc is mounted inside (debootstrap made the /dev nodes a chroot needs).
# /sys is deliberately not: onnxruntime's cpuinfo crashes under qemu when it can
# read it. The root shares the host's network namespace, so a daemon started
# inside on 127.0.0.1:PORT is reachable from the host.
set -euo pipefail

SUITE=bookworm
ARCH=arm64
INCLUDE=python3,python3-venv,python3-pip,ca-certificates
RECIPE="debootstrap $SUITE $ARCH minbase include=$INCLUDE v2"
ROOT="${BPUEMU_ARM64_ROOT:-/var/cache/bpuemu/arm64-bookworm}"
SESSIONS="$(dirname "$ROOT")/sessions"
MIRROR="${BPUEMU_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
STAMP_NAME=.bpuemu-chroot-stamp
HOST_CA="${BPUEMU_HOST_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"

say() { echo "arm64_chroot: $*" >&2; }
die() { say "$*"; exit 1; }
cannot() { say "cannot run here: $*"; exit 77; }

host_ready() {
    [ "$(id -u)" = 0 ] || cannot "needs root (debootstrap, chroot, mount)"
    for tool in debootstrap chroot update-binfmts flock; do
        command -v "$tool" >/dev/null || cannot "$tool is missing (apt-get install qemu-user-static binfmt-support debootstrap)"
    done
    [ -e /usr/libexec/qemu-binfmt/aarch64-binfmt-P ] || [ -x /usr/bin/qemu-aarch64-static ] \
        || cannot "qemu-user-static is not installed"
    if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
        mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null \
            || cannot "binfmt_misc cannot be mounted (a container without the privilege?)"
    fi
    if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || ! grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64; then
        update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || cannot "update-binfmts --enable qemu-aarch64 failed"
    fi
    grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 || cannot "qemu-aarch64 is not registered with binfmt_misc"
}

is_built() { [ -f "$ROOT/$STAMP_NAME" ] && [ "$(cat "$ROOT/$STAMP_NAME")" = "$RECIPE" ]; }
is_mounted() { mountpoint -q "$1" 2>/dev/null; }

umount_inside() {  # whatever debootstrap or a session mounted inside a root; lazy, deepest first
    local m
    for m in "$1/dev/pts" "$1/dev" "$1/sys" "$1/proc"; do
        if is_mounted "$m"; then umount -l "$m" || true; fi
    done
}

build() {  # build [force]
    host_ready
    if is_built && [ "${1:-}" != force ]; then
        echo "$ROOT"  # built: no lock needed (a built root is never written to)
        return
    fi
    mkdir -p "$(dirname "$ROOT")"
    exec 9>"$ROOT.lock"
    flock 9  # exclusive: one build at a time, and none while sessions hold the shared lock
    if is_built && [ "${1:-}" != force ]; then
        echo "$ROOT"
        return
    fi
    local partial="$ROOT.partial" t0=$SECONDS
    umount_inside "$ROOT"
    umount_inside "$partial"
    rm -rf --one-file-system "$partial" "$ROOT"
    say "building $ARCH $SUITE in $ROOT (debootstrap from $MIRROR, a few minutes)"
    if ! debootstrap --arch="$ARCH" --variant=minbase --include="$INCLUDE" "$SUITE" "$partial" "$MIRROR" \
            >"$ROOT.build.log" 2>&1; then
        tail -n 30 "$ROOT.build.log" >&2
        umount_inside "$partial"
        die "debootstrap failed; full log in $ROOT.build.log"
    fi
    umount_inside "$partial"
    # With binfmt's F flag the kernel already holds the interpreter; a host
    # registered without it needs the interpreter inside the root.
    if [ -x /usr/bin/qemu-aarch64-static ]; then
        cp /usr/bin/qemu-aarch64-static "$partial/usr/bin/"
    fi
    chroot "$partial" /usr/bin/python3 -c 'import platform, venv, ensurepip; assert platform.machine() == "aarch64", platform.machine()' \
        || die "python3 inside the new root does not run as aarch64"
    echo "$RECIPE" >"$partial/$STAMP_NAME"
    mv "$partial" "$ROOT"
    say "built in $((SECONDS - t0)) s ($(du -sm --one-file-system "$ROOT" | cut -f1) MB)"
    echo "$ROOT"
}

session_dir() {  # NAME, DIR or DIR/root -> the session directory
    local arg="${1%/}"
    case "$arg" in
        */root) arg="${arg%/root}" ;;
    esac
    case "$arg" in
        */*) echo "$arg" ;;
        *) [[ "$arg" =~ ^[A-Za-z0-9._-]+$ ]] || die "bad session name '$arg'"; echo "$SESSIONS/$arg" ;;
    esac
}

prepare() {  # what every command run inside needs: /proc, DNS, the host's CA bundle
    local root="$1"
    is_mounted "$root/proc" || mount -t proc proc "$root/proc"
    cp -L /etc/resolv.conf "$root/etc/resolv.conf"
    mkdir -p "$root/etc/bpuemu-host"
    if [ -f "$HOST_CA" ]; then
        cp -L "$HOST_CA" "$root/etc/bpuemu-host/ca-bundle.crt"
    fi
}

session() {
    is_built || die "no root built at $ROOT (run: $0 build)"
    host_ready
    local dir
    dir="$(session_dir "$1")"
    [ ! -e "$dir" ] || die "session $dir exists already (end it first: $0 end $dir)"
    mkdir -p "$dir/upper" "$dir/work" "$dir/root"
    mount -t overlay overlay -o "lowerdir=$ROOT,upperdir=$dir/upper,workdir=$dir/work" "$dir/root" \
        || { rm -rf "$dir"; cannot "overlayfs is not available"; }
    prepare "$dir/root"
    echo "$dir/root"
}

end_session() {
    local dir
    dir="$(session_dir "$1")"
    [ -d "$dir" ] || return 0
    [ -d "$dir/upper" ] || die "$dir is not a session directory"
    umount_inside "$dir/root"
    if is_mounted "$dir/root"; then umount -l "$dir/root"; fi
    rm -rf --one-file-system "$dir"
}

run() {
    local root="${1%/}"
    shift
    [ $# -gt 0 ] || die "run needs a command"
    [ -f "$root/$STAMP_NAME" ] || die "$root is not an arm64 root made by this script"
    [ "$(cd "$root" && pwd -P)" != "$(cd "$ROOT" && pwd -P)" ] \
        || die "the cached root stays pristine: start a session ($0 session NAME) and run there"
    is_mounted "$root" || die "$root is not a mounted session"
    host_ready
    prepare "$root"
    exec chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        LANG=C.UTF-8 PIP_CERT=/etc/bpuemu-host/ca-bundle.crt SSL_CERT_FILE=/etc/bpuemu-host/ca-bundle.crt \
        PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT="${PIP_DEFAULT_TIMEOUT:-180}" "$@"
}

cmd="${1:-build}"
[ $# -gt 0 ] && shift
case "$cmd" in
    build) build ;;
    rebuild) build force ;;
    path) echo "$ROOT" ;;
    session) [ $# -eq 1 ] || die "session needs a NAME or DIR"; session "$1" ;;
    end) [ $# -eq 1 ] || die "end needs a session ROOT or DIR"; end_session "$1" ;;
    run) [ $# -ge 2 ] || die "run needs a ROOT and a command"; run "$@" ;;
    -h|--help|help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' ;;
    *) die "unknown command '$cmd' (build, rebuild, path, session, run, end)" ;;
esac
