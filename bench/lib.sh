#!/usr/bin/env bash
# Shared by bench/*.sh: build stoa, run cleanup steps in reverse order on exit, start and
# stop `stoa dev` clusters, show progress. Sourced, not run.

cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/deps.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
STOA=$PWD/target/release/stoa

# Cleanup steps, run last-in first-out by the EXIT trap, each allowed to fail.
cleanups=()
on_exit() { cleanups+=("$*"); }
run_cleanups() {
    local i
    for ((i = ${#cleanups[@]} - 1; i >= 0; i--)); do eval "${cleanups[$i]}" >/dev/null 2>&1 || true; done
}
trap run_cleanups EXIT
trap 'exit 130' INT TERM

say() { printf '\n== %s (load %s)\n' "$*" "$(cut -d' ' -f1 /proc/loadavg)" >&2; }

# apt-get install of the missing packages among "$@" (apt-get update once when needed).
need_apt() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "bench: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 || {
        apt-get update -qq
        apt-get install -y -qq "${missing[@]}" >/dev/null
    }
}

# warm_memory MIB: just before a timed phase that moves a file of MIB through a
# replicated system, fills four times that of page cache (three replicas and the
# client's pages; at most half the memory available) with a file under $tmp and deletes
# it unwritten. A virtual machine's host takes back memory the guest freed a few seconds
# before, and the guest's next use of it faults into the host on every page: on this
# project's VM a 3 GiB dd into a file ran at 510 MB/s after 15 s idle and at 4.5 GB/s
# right after another, and a 256 MiB fio write through `stoa dev` at 228-248 MiB/s
# cold against 345-458 warmed (2026-12-06). Without it a phase measured the host's
# memory as much as the system, and each system paid for the idle time before it.
warm_memory() {
    local want=$((4 * $1)) avail
    avail=$(awk '/^MemAvailable:/ {print int($2 / 2048)}' /proc/meminfo)
    dd if=/dev/zero of="$tmp/warm" bs=1M count="$(( want < avail ? want : avail ))" status=none
    rm -f "$tmp/warm"
}

# Stops the process PID with SIGTERM, then SIGKILL after 30 s.
stop_pid() {
    local pid=$1 i
    kill -TERM "$pid" 2>/dev/null || return 0
    for i in $(seq 300); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
}

# Waits until MNT is a mount point, at most SECS seconds.
wait_mount() {
    local mnt=$1 secs=${2:-120} i
    for i in $(seq $((secs * 5))); do mountpoint -q "$mnt" && return 0; sleep 0.2; done
    echo "bench: $mnt not mounted after $secs s" >&2
    return 1
}

# stoa_up DIR MNT META CHUNK: a `stoa dev` cluster in the background, mounted at MNT.
# Sets STOA_DEV_PID.
stoa_up() {
    local dir=$1 mnt=$2 meta=$3 chunk=$4
    mkdir -p "$dir" "$mnt"
    "$STOA" dev --dir "$dir" --mount "$mnt" --meta "$meta" --chunk "$chunk" >"$dir.log" 2>&1 &
    STOA_DEV_PID=$!
    on_exit "stop_pid $STOA_DEV_PID; fusermount3 -uz '$mnt'"
    wait_mount "$mnt" 120 || { tail -20 "$dir.log" >&2; return 1; }
}

# stoa_mount DIR MNT: another mount of the `stoa dev` cluster in DIR, at MNT, in the
# background (its log in MNT.log). Sets STOA_MOUNT_PID; the caller stops it.
stoa_mount() {
    local dir=$1 mnt=$2
    mkdir -p "$mnt"
    "$STOA" mount --dir "$dir" "$mnt" >"$mnt.log" 2>&1 &
    STOA_MOUNT_PID=$!
    wait_mount "$mnt" 60 || { tail -20 "$mnt.log" >&2; stop_pid "$STOA_MOUNT_PID"; return 1; }
}

# bench_setup NAME: builds stoa, makes a temp dir under /var/tmp that goes at exit (sets
# `tmp`) and the results dir (sets `out`).
bench_setup() {
    cargo build --release --quiet --bin stoa
    tmp=$(mktemp -d "/var/tmp/stoa-$1.XXXXXX")
    on_exit "rm -rf '$tmp'"
    out=bench/results
    mkdir -p "$out"
}
