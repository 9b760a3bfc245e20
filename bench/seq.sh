#!/usr/bin/env bash
# Sequential throughput through the mount of a local 3+3 `stoa dev` cluster (replica 3):
# 1 GiB written in 1 MiB blocks with an fsync at the end, page caches dropped, read back.
# The same on the local disk, in the same run, gives the ceiling and the ratio. Each
# figure is the median of REPS runs (every run's figure is printed too).
#
#   bench/seq.sh [SIZE_MIB] [REPS]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
size_mib=${1:-1024}
reps=${2:-3}
bench_setup seq
mkdir -p "$tmp/local"
stoa_up "$tmp/cluster" "$tmp/mnt" 3 3

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
on_exit "rm -f '$src'"

run() {
    local dir=$1 w r
    warm_memory "$size_mib"
    w=$(rate if="$src" of="$dir/seq.bin" conv=fsync)
    sync; echo 3 >/proc/sys/vm/drop_caches
    warm_memory "$size_mib"
    r=$(rate if="$dir/seq.bin" of=/dev/null)
    rm -f "$dir/seq.bin"
    echo "$w $r"
}

# Runs alternate between the mount and the local disk, so drift falls on both alike.
stoa_runs=() local_runs=()
for i in $(seq "$reps"); do
    echo "seq.sh: run $i of $reps" >&2
    stoa_runs+=("$(run "$tmp/mnt")")
    local_runs+=("$(run "$tmp/local")")
done
# median WHICH RUNS...: the median write (WHICH=1) or read (2) figure.
median() {
    local which=$1
    shift
    printf '%s\n' "$@" | cut -d' ' -f"$which" | python3 -c "
import statistics, sys
print(f'{statistics.median(float(x) for x in sys.stdin):.0f}')"
}
sw=$(median 1 "${stoa_runs[@]}") sr=$(median 2 "${stoa_runs[@]}")
lw=$(median 1 "${local_runs[@]}") lr=$(median 2 "${local_runs[@]}")
printf '%-28s %10s %10s   (median of %s)\n' "sequential, ${size_mib} MiB" "write MiB/s" "read MiB/s" "$reps"
printf '%-28s %10s %10s   runs: %s\n' "stoa (3 meta, 3 chunk, r3)" "$sw" "$sr" "$(IFS=,; echo "${stoa_runs[*]}")"
printf '%-28s %10s %10s   runs: %s\n' "local disk (1 copy)" "$lw" "$lr" "$(IFS=,; echo "${local_runs[*]}")"
python3 -c "print(f'stoa / local: write {$sw/$lw:.2f}, read {$sr/$lr:.2f}')"
