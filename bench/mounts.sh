#!/usr/bin/env bash
# What coherence costs a mount that works alone: the same `stoa bench` run on mount A of a
# local 3+3 `stoa dev` cluster, first with A the only mount, then with a second mount B of
# the same cluster that has listed and stated the root (so it holds caps there) and stays
# idle. A file or directory only one mount uses keeps its caps and its caches, so the two
# columns should agree within the noise; the ratio column is "with B / alone".
#
#   bench/mounts.sh [--reps N] [--rounds N] [--quick]
#
# Each round runs A alone, then mounts B, runs A again and unmounts B; a figure is the
# median of all repetitions of all rounds.
#
# Results: bench/results/mounts.csv and the table on stdout. Everything is torn down at exit.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

reps=3 rounds=2
sizes=(--files 2000 --dirs 200 --seq-mib 256 --rand-mib 64 --rand-ops 2000 --small-files 500 --study-ops 500)
while [ $# -gt 0 ]; do
    case $1 in
        --reps) reps=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --quick) reps=1 rounds=1 sizes=(--quick); shift ;;
        *) echo "usage: bench/mounts.sh [--reps N] [--rounds N] [--quick]" >&2; exit 2 ;;
    esac
done
bench_setup mounts-bench

say "starting stoa dev: 3 meta + 3 chunk, mount A"
stoa_up "$tmp/cluster" "$tmp/a" 3 3

bench_a() {
    "$STOA" bench "$tmp/a" --only seq,rand,meta,small,study,locks --workers 1 --reps "$reps" \
        "${sizes[@]}" --csv "$1" >&2
}

# A first, unrecorded pass: the first files and chunks of a new cluster cost more (new
# chunk directories, cold caches), which would count against the first column.
say "warm-up pass (not recorded)"
"$STOA" bench "$tmp/a" --quick --reps 1 --quiet >/dev/null

# B comes and goes between rounds, so drift of the machine (page cache, the chunk
# servers' files, the load) falls on both columns alike.
mount_b() {
    stoa_mount "$tmp/cluster" "$tmp/b" || exit 1
    MOUNT_B_PID=$STOA_MOUNT_PID
    ls -la "$tmp/b" >/dev/null
    stat "$tmp/b" >/dev/null
}
MOUNT_B_PID=
on_exit "fusermount3 -uz '$tmp/b'"
on_exit '[ -n "$MOUNT_B_PID" ] && stop_pid "$MOUNT_B_PID"'
for round in $(seq "$rounds"); do
    say "round $round of $rounds: mount A alone"
    bench_a "$tmp/alone.$round.csv"
    say "round $round of $rounds: mounting B (same cluster), which lists and stats the root, then stays idle"
    mount_b
    bench_a "$tmp/with_b.$round.csv"
    stop_pid "$MOUNT_B_PID"
    MOUNT_B_PID=
    fusermount3 -uz "$tmp/b" 2>/dev/null || true
done

python3 - "$tmp" "$rounds" "$out/mounts.csv" "$(uname -r)" "$(nproc)" <<'PY'
import csv, statistics, sys
tmp, rounds, dest, kernel, cpus = sys.argv[1:]

def load(kind):
    """key -> (label, unit, every value of every round)."""
    rows = {}
    for r in range(1, int(rounds) + 1):
        for row in csv.DictReader(open(f"{tmp}/{kind}.{r}.csv")):
            _, _, values = rows.setdefault(row["key"], (row["label"], row["unit"], []))
            values.extend(float(v) for v in row["values"].split())
    return rows

alone, with_b = load("alone"), load("with_b")
print(f"\none mount vs two (same cluster, {cpus} cores, Linux {kernel}); medians of {rounds} rounds")
print(f"{'workload':<48} {'A alone':>12} {'A with B':>12} {'ratio':>7}  unit")
with open(dest, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["key", "label", "unit", "alone", "with_b", "ratio", "values_alone", "values_with_b"])
    for key, (label, unit, va) in alone.items():
        if key not in with_b:
            continue
        vb = with_b[key][2]
        a, b = statistics.median(va), statistics.median(vb)
        ratio = b / a if a else float("nan")
        print(f"{label[:48]:<48} {a:>12.0f} {b:>12.0f} {ratio:>7.2f}  {unit}")
        w.writerow([key, label, unit, f"{a:.3f}", f"{b:.3f}", f"{ratio:.2f}",
                    " ".join(f"{v:.0f}" for v in va), " ".join(f"{v:.0f}" for v in vb)])
print(f"\nwritten: {dest}")
PY
