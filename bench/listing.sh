#!/usr/bin/env bash
# What looking at a tree costs, on the mount that wrote it and on another: a local 3+3
# `stoa dev` cluster with mounts A and B; each repetition copies a directory tree into A
# with `cp -a`, then times
#   - `ls -lR` and `getfattr -R -d` of the copy on A, which holds every cap of it;
#   - `ls -lR` of it on B: a cold lookup each, whose grant recalls A's caps;
#   - `ls -lR` on A again, which looks each file up anew after those recalls;
#   - `ls -lR` on B again, from the caps it holds now.
# `ls -l` asks every file's attributes and one xattr (`security.selinux`).
#
#   bench/listing.sh [--tree DIR] [--reps N]
#
# Defaults: the tree /usr/share/doc, 3 repetitions; a figure is the median. Results:
# bench/results/listing.csv and the table on stdout. Everything is torn down at exit.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

tree=/usr/share/doc reps=3
while [ $# -gt 0 ]; do
    case $1 in
        --tree) tree=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        *) echo "usage: bench/listing.sh [--tree DIR] [--reps N]" >&2; exit 2 ;;
    esac
done
[ -d "$tree" ] || { echo "bench: $tree is not a directory" >&2; exit 2; }
need_apt attr bc
bench_setup listing-bench

say "starting stoa dev: 3 meta + 3 chunk, mount A, then mount B"
stoa_up "$tmp/cluster" "$tmp/a" 3 3
stoa_mount "$tmp/cluster" "$tmp/b"
on_exit "stop_pid $STOA_MOUNT_PID; fusermount3 -uz '$tmp/b'"

# Seconds COMMAND... takes, its output discarded (getfattr fails on files it may not read).
seconds() {
    local start end
    start=$(date +%s.%N)
    "$@" >/dev/null 2>&1 || true
    end=$(date +%s.%N)
    echo "$end - $start" | bc
}

files=$(find "$tree" | wc -l)
echo "phase,seconds" >"$tmp/times.csv"
for rep in $(seq "$reps"); do
    say "repetition $rep of $reps: cp -a $tree ($files entries) into A, then the listings"
    copy=copy$rep
    cp -a "$tree" "$tmp/a/$copy"
    {
        echo "A ls -lR right after the copy,$(seconds ls -lR "$tmp/a/$copy")"
        echo "A getfattr -R -d right after,$(seconds getfattr -R -d "$tmp/a/$copy")"
        echo "B ls -lR (cold: recalls A's caps),$(seconds ls -lR "$tmp/b/$copy")"
        echo "A ls -lR again (after the recalls),$(seconds ls -lR "$tmp/a/$copy")"
        echo "B ls -lR again (cached),$(seconds ls -lR "$tmp/b/$copy")"
    } >>"$tmp/times.csv"
done

python3 - "$tmp/times.csv" "$out/listing.csv" "$files" "$tree" <<'PY'
import csv, statistics, sys
src, dest, files, tree = sys.argv[1:]
phases = {}
for row in csv.DictReader(open(src)):
    phases.setdefault(row["phase"], []).append(float(row["seconds"]))
with open(dest, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["phase", "entries", "median_s", "us_per_entry", "values_s"])
    print(f"\nlisting {tree} ({files} entries) on stoa dev, medians of {len(next(iter(phases.values())))}")
    print(f"{'phase':<40} {'seconds':>8} {'us/entry':>9}")
    for phase, values in phases.items():
        median = statistics.median(values)
        per = median / int(files) * 1e6
        w.writerow([phase, files, f"{median:.3f}", f"{per:.0f}", " ".join(f"{v:.3f}" for v in values)])
        print(f"{phase:<40} {median:>8.2f} {per:>9.0f}")
PY
echo "bench: wrote $out/listing.csv" >&2
