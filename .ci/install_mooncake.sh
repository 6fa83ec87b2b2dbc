#!/usr/bin/env bash
# Install what the Mooncake store tests (tests/connectors) need on a fresh Debian machine.
# Run as root. Idempotent: every step is skipped when already satisfied.
#
#   - libibverbs1: the Mooncake transfer engine links against it even for TCP (no RDMA needed).
#   - mooncake-transfer-engine-non-cuda: Python client + mooncake_master / mooncake_client
#     binaries (the default mooncake-transfer-engine wheel needs libcuda.so.1 to import).
#   - iproute2 is NOT needed: the tests enter a loopback-only network namespace with
#     unshare(2)/setns(2) from Python; it is installed only if INSTALL_IPROUTE2=1 (debugging with
#     `ip netns` / `ss`).
#
# Usage: .ci/install_mooncake.sh [python-executable]   (default: python3)
set -euo pipefail

PYTHON="${1:-python3}"
MOONCAKE_VERSION="0.3.13.post1"

if [ "$(id -u)" -ne 0 ]; then
    echo "install_mooncake.sh: must run as root (apt-get, and the tests need CAP_SYS_ADMIN)" >&2
    exit 1
fi

apt_pkgs=()
dpkg-query -W -f='${Status}' libibverbs1 2>/dev/null | grep -q "install ok installed" \
    || apt_pkgs+=(libibverbs1)
if [ "${INSTALL_IPROUTE2:-0}" = "1" ]; then
    dpkg-query -W -f='${Status}' iproute2 2>/dev/null | grep -q "install ok installed" \
        || apt_pkgs+=(iproute2)
fi
if [ "${#apt_pkgs[@]}" -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y --no-install-recommends "${apt_pkgs[@]}"
fi

installed="$("$PYTHON" -m pip show mooncake-transfer-engine-non-cuda 2>/dev/null \
    | sed -n 's/^Version: //p' || true)"
if [ "$installed" != "$MOONCAKE_VERSION" ]; then
    "$PYTHON" -m pip install --no-cache-dir "mooncake-transfer-engine-non-cuda==${MOONCAKE_VERSION}"
fi

# Sanity checks: the module imports, the binaries are there, a network namespace can be made.
"$PYTHON" - <<'PY'
import importlib.util, os, ctypes, ctypes.util
import mooncake.store  # noqa: F401  (fails without libibverbs1)
loc = importlib.util.find_spec("mooncake").submodule_search_locations[0]
for name in ("mooncake_master", "mooncake_client"):
    path = os.path.join(loc, name)
    assert os.access(path, os.X_OK), f"missing {path}"
libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
pid = os.fork()
if pid == 0:  # try unshare(CLONE_NEWNET) in a child so this process is untouched
    os._exit(0 if libc.unshare(0x40000000) == 0 else 1)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, "unshare(CLONE_NEWNET) failed: tests need root"
print("mooncake OK:", loc)
PY
