#!/usr/bin/env bash
# Set up a fresh machine and run the whole test suite.  Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages the tests use (Debian), installed when missing and we are root:
#   chromium  - hb_perf's HTML report is opened and screenshotted headless (tests/host/test_tools.py)
#   openssh-server - a real sshd on loopback for the SSH board transport (tests/host/test_ssh.py, test_verifier.py)
#   qemu-user-static binfmt-support debootstrap - an arm64 Debian root under qemu-user, where the board
#                    install script runs for real (deploy/board/arm64_chroot.sh, tests/deploy/test_install_arm64.py)
#   systemd        - systemd-analyze checks the board's unit offline (tests/deploy/test_systemd_unit.py)
#   openssl        - hashes the root password of the sshd that takes the seed's -u root -p PASSWORD (tests/host/sshd_harness.py)
#   iproute2       - ip netns / ip link: boards in their own network namespaces behind emulated links (bench/netlab.py,
#                    tests/board/test_network.py)
# Add to this list rather than writing another apt-get line: one update, one install.
APT_PACKAGES="chromium openssh-server qemu-user-static binfmt-support debootstrap systemd openssl iproute2"
missing=""
for pkg in $APT_PACKAGES; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing="$missing $pkg"
done
if [ -n "$missing" ]; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
        echo "installing system packages:$missing"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
    else
        echo "not installing system packages (need root and apt-get):$missing; the tests that need them skip" >&2
    fi
fi

scripts/setup_env.sh test
# Both cores (pytest-xdist); the modules tests/conftest.py puts in one group (timing, many daemons) run
# one after the other on one worker. The ten slowest tests are listed at the end.
exec .venv/bin/python -m pytest tests -n 2 --dist loadgroup --durations=10 "$@"
