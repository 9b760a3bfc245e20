#!/usr/bin/env bash
# The one command to try Stoa: installs what it needs, builds, and runs a local cluster
# (3 meta replicas, 3 chunk servers, each its own process on loopback) mounted at
# /mnt/stoa, in the foreground until Ctrl-C. Run it again and the same files are back.
#
#   scripts/dev.sh [--dir DIR] [--mount MNT] [--meta N] [--chunk M]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

dir=/var/lib/stoa-dev
mnt=/mnt/stoa
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --dir) dir="$2"; shift 2 ;;
        --mount) mnt="$2"; shift 2 ;;
        *) args+=("$1"); shift ;;
    esac
done
mkdir -p "$dir"
# A dead mount left by a killed `stoa dev` fails mkdir (ENOTCONN); stoa detaches it.
[ -e "$mnt" ] || grep -qs " $mnt fuse" /proc/mounts || mkdir -p "$mnt"
cargo build --release --quiet --bin stoa
exec target/release/stoa dev --dir "$dir" --mount "$mnt" "${args[@]}"
