#!/usr/bin/env bash
# Sequential throughput through the mount of a local 3+3 `stoa dev` cluster (replica 3):
# 1 GiB written in 1 MiB blocks with an fsync at the end, page caches dropped, read back.
# The same on the local disk, in the same run, gives the ceiling and the ratio.
#
#   bench/seq.sh [SIZE_MIB]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
size_mib=${1:-1024}
cargo build --release --quiet --bin stoa

tmp=$(mktemp -d /tmp/stoa-bench.XXXXXX)
mkdir -p "$tmp/mnt" "$tmp/local"
target/release/stoa dev --dir "$tmp/cluster" --mount "$tmp/mnt" >"$tmp/dev.log" 2>&1 &
dev=$!
# Under set -e a failing step would end the trap early: a dead dev left its temp dir.
cleanup() {
    kill "$dev" 2>/dev/null || true
    wait "$dev" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
for _ in $(seq 600); do mountpoint -q "$tmp/mnt" && break; sleep 0.2; done
mountpoint -q "$tmp/mnt" || { cat "$tmp/dev.log"; exit 1; }

# Prints MiB/s of: dd ARGS...
rate() {
    local start end
    start=$(date +%s.%N)
    dd "$@" bs=1M status=none
    end=$(date +%s.%N)
    python3 -c "print(f'{$size_mib / ($end - $start):.0f}')"
}

# Incompressible source data, in memory so that making it costs nothing in the timing.
src=/dev/shm/stoa-bench-src.$$
head -c "$((size_mib << 20))" /dev/urandom >"$src"
trap 'cleanup; rm -f "$src"' EXIT

run() {
    local dir=$1 w r
    w=$(rate if="$src" of="$dir/seq.bin" conv=fsync)
    sync; echo 3 >/proc/sys/vm/drop_caches
    r=$(rate if="$dir/seq.bin" of=/dev/null)
    rm -f "$dir/seq.bin"
    echo "$w $r"
}

read -r sw sr < <(run "$tmp/mnt")
read -r lw lr < <(run "$tmp/local")
printf '%-28s %10s %10s\n' "sequential, ${size_mib} MiB" "write MiB/s" "read MiB/s"
printf '%-28s %10s %10s\n' "stoa (3 meta, 3 chunk, r3)" "$sw" "$sr"
printf '%-28s %10s %10s\n' "local disk (1 copy)" "$lw" "$lr"
python3 -c "print(f'stoa / local: write {$sw/$lw:.2f}, read {$sr/$lr:.2f}')"
