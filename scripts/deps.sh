#!/usr/bin/env bash
# Installs what Stoa needs to build, run and test on Debian, as root. Idempotent: a
# package already present is not fetched again.
set -euo pipefail

# iproute2 and nftables: the fault tests give every node a network namespace and cut links;
# gdb: a fault-test node that ignores SIGTERM has its thread stacks saved before it is killed.
need=(fuse3 git rsync build-essential attr python3 pkg-config ca-certificates iproute2 nftables gdb)
missing=()
for p in "${need[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "stoa: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
fi
modprobe fuse 2>/dev/null || true
[ -e /dev/fuse ] || { echo "stoa: error: /dev/fuse is missing; this machine cannot mount FUSE filesystems" >&2; exit 1; }

if ! command -v cargo >/dev/null 2>&1; then
    [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "stoa: installing Debian's Rust toolchain (cargo)" >&2
    apt-get install -y -qq cargo >/dev/null
fi
