#!/usr/bin/env bash
# The metadata benchmark of issue 3, in one run: Stoa with 3 meta replicas against Stoa
# with 1 (3 chunk servers each), the same workloads (creates, stats, renames, unlinks,
# readdir, mkdir/rmdir from 1 and 8 workers; the metadata-study table), the 3/1 ratio
# per row; readdir of one directory of 100k entries on each; then failover: under a metadata churn on the 3-replica cluster, kill -9 of the
# meta leader, and the longest gap between completed operations.
#
#   bench/meta.sh [--files N] [--dirs N] [--study-ops N] [--reps N] [--readdir N] [--churn SECS] [--quick]
#
# Results: bench/results/meta.csv and the table on stdout. Everything is torn down at exit.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

files=2000 dirs=300 study=300 reps=3 big=100000 churn=20
while [ $# -gt 0 ]; do
    case $1 in
        --files) files=$2; shift 2 ;;
        --dirs) dirs=$2; shift 2 ;;
        --study-ops) study=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --readdir) big=$2; shift 2 ;;
        --churn) churn=$2; shift 2 ;;
        --quick) files=100 dirs=20 study=50 reps=1 big=1000 churn=10; shift ;;
        *) echo "usage: bench/meta.sh [--files N] [--dirs N] [--study-ops N] [--reps N] [--readdir N] [--churn SECS] [--quick]" >&2; exit 2 ;;
    esac
done
bench_setup meta-bench

say "starting stoa dev: 3 meta + 3 chunk, and 1 meta + 3 chunk"
stoa_up "$tmp/r3" "$tmp/m3" 3 3
dev3=$STOA_DEV_PID
stoa_up "$tmp/r1" "$tmp/m1" 1 3

args=(--only meta,study --workers 1,8 --files "$files" --dirs "$dirs" --study-ops "$study" --reps "$reps")
for n in 1 3; do
    say "metadata workloads on $n meta replica(s): ${args[*]}"
    "$STOA" bench "$tmp/m$n" "${args[@]}" --csv "$tmp/meta$n.csv"
done
# After both tables: the clusters' background work after 100k creates (snapshots,
# compaction) must not fall into the other cluster's figures.
for n in 1 3; do
    say "readdir of $big entries in one directory on $n meta replica(s)"
    "$STOA" bench "$tmp/m$n" --only meta --workers 1 --files "$big" --dirs 1 --reps 1 --csv "$tmp/big$n.csv"
done

say "failover: ${churn} s of create+stat+unlink from 8 workers on 3 replicas; kill -9 of the meta leader after 5 s"
"$STOA" bench "$tmp/m3" --churn "$churn" --workers 8 --csv "$tmp/churn.csv" &
churn_pid=$!
on_exit "kill $churn_pid"
sleep 5
leader=$("$STOA" status --dir "$tmp/r3" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["meta"]["leader"])')
pid=$(python3 -c 'import json,sys
f = json.load(open(sys.argv[1]))
print(next(n["pid"] for n in f["nodes"] if n["role"] == "meta" and n["id"] == int(sys.argv[2])))' "$tmp/r3/cluster.json" "$leader")
echo "bench: kill -9 meta leader $leader (pid $pid) at $(date +%T.%N | cut -c1-12)" >&2
kill -KILL "$pid"
wait "$churn_pid"

python3 - "$tmp/meta3.csv" "$tmp/meta1.csv" "$tmp/churn.csv" "$out/meta.csv" "$leader" "$tmp/big3.csv" "$tmp/big1.csv" <<'PY'
import csv, sys
r3 = {r["key"]: r for r in csv.DictReader(open(sys.argv[1]))}
r1 = {r["key"]: r for r in csv.DictReader(open(sys.argv[2]))}
for table, path in ((r3, sys.argv[6]), (r1, sys.argv[7])):
    listing = next(r for r in csv.DictReader(open(path)) if r["key"] == "readdir")
    table["readdir.big"] = dict(listing, key="readdir.big")
churn = next(csv.DictReader(open(sys.argv[3])))
rows = []
for key, a in r3.items():
    b = r1[key]
    ratio = float(a["median"]) / float(b["median"]) if float(b["median"]) else float("nan")
    rows.append([key, a["label"], a["unit"], a["median"], b["median"], f"{ratio:.2f}", a["loadavg"], b["loadavg"]])
with open(sys.argv[4], "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["key", "label", "unit", "meta3", "meta1", "ratio_3_to_1", "loadavg3", "loadavg1"])
    w.writerows(rows)
    w.writerow(["failover.churn", churn["label"] + f", kill -9 of leader {sys.argv[5]}", "ops/s",
                churn["median"], "", "", churn["loadavg"], ""])
    w.writerow(["failover.max_gap", "longest gap between completed operations", "ms",
                churn["max_gap_ms"], "", "", churn["loadavg"], ""])
    w.writerow(["failover.errors", "errors seen by the application", "count", churn["errors"], "", "", churn["loadavg"], ""])
fmt = lambda v: f"{float(v):.0f}" if float(v) >= 100 else f"{float(v):.1f}"
width = max(len(r[1]) for r in rows)
print(f"\n{'workload':<{width}}  {'unit':<9} {'3 meta':>9} {'1 meta':>9} {'3/1':>6}  {'load':>5}")
for r in rows:
    print(f"{r[1]:<{width}}  {r[2]:<9} {fmt(r[3]):>9} {fmt(r[4]):>9} {r[5]:>6}  {r[6]:>5}")
print(f"\nfailover (kill -9 of meta leader {sys.argv[5]} under {churn['label']}):")
print(f"  longest gap between completed operations: {float(churn['max_gap_ms']):.0f} ms; "
      f"throughput {float(churn['median']):.0f} ops/s; errors seen by the application: {churn['errors']}; load {churn['loadavg']}")
PY
echo "bench: results in $out/meta.csv" >&2
