#!/usr/bin/env python3
"""Reads bench/results/peers.csv (written by bench/peers.sh), prints the table with each
system's figure and Stoa's ratio to the best peer, and draws the bar chart (one panel per
workload, one colour per system).

    bench/report.py peers.csv [peers.png]
"""
import csv
import sys

PEERS = ["gluster", "moosefs", "ceph"]
ORDER = ["stoa", "gluster", "moosefs", "ceph", "local", "bindfs", "memfs"]
COLOURS = {"stoa": "#1f77b4", "gluster": "#d62728", "moosefs": "#2ca02c", "ceph": "#9467bd",
           "local": "#7f7f7f", "bindfs": "#bcbd22", "memfs": "#17becf"}
NAMES = {"stoa": "Stoa", "gluster": "GlusterFS", "moosefs": "MooseFS", "ceph": "CephFS",
         "local": "local dir", "bindfs": "bindfs", "memfs": "FUSE mem"}


def load(path):
    rows = list(csv.DictReader(open(path)))
    systems = [s for s in ORDER if any(r["system"] == s for r in rows)]
    workloads = []
    for r in rows:
        # Keyed by key alone: a label may carry a per-system detail (readdir's time).
        if r["key"] not in [k for k, _, _ in workloads]:
            label = r["label"].split(" (")[0] + " (" + r["label"].split(" (")[1].split(",")[0] + ")" \
                if r["key"] == "readdir" else r["label"]
            workloads.append((r["key"], label, r["unit"]))
    fig = {(r["system"], r["key"]): r for r in rows}
    return systems, workloads, fig


def fmt(v):
    return "-" if v is None else (f"{v:.0f}" if v >= 100 else f"{v:.1f}")


def table(systems, workloads, fig):
    w = max(len(label) for _, label, _ in workloads)
    head = f"{'workload':<{w}}  {'unit':<9}" + "".join(f"{NAMES[s]:>10}" for s in systems)
    lines = [head + f"{'stoa/best peer':>16}"]
    for key, label, unit in workloads:
        vals = {s: float(fig[(s, key)]["median"]) if (s, key) in fig else None for s in systems}
        peers = [vals[s] for s in systems if s in PEERS and vals[s]]
        ratio = f"{vals['stoa'] / max(peers):.2f}" if vals.get("stoa") is not None and peers else "-"
        lines.append(f"{label:<{w}}  {unit:<9}" + "".join(f"{fmt(vals[s]):>10}" for s in systems)
                     + f"{ratio:>16}")
    loads = [float(r["loadavg"]) for r in fig.values()]
    lines.append(f"\nload average (1 min) while measuring: min {min(loads):.1f}, max {max(loads):.1f} "
                 "(per figure in the CSV)")
    notes = sorted({f"{NAMES[r['system']]}: {r['label']}: {r['notes']}" for r in fig.values()
                    if r["notes"] and "summed" not in r["notes"]})
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)


def chart(systems, workloads, fig, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cols = 5
    rows = (len(workloads) + cols - 1) // cols
    f, axes = plt.subplots(rows, cols, figsize=(cols * 3.6, rows * 2.9))
    for ax, (key, label, unit) in zip(axes.flat, workloads):
        vals = [float(fig[(s, key)]["median"]) if (s, key) in fig else 0 for s in systems]
        bars = ax.bar(range(len(systems)), vals, color=[COLOURS[s] for s in systems])
        ax.bar_label(bars, labels=[fmt(v) for v in vals], fontsize=6)
        ax.set_title(label if len(label) < 44 else label[:42] + "...", fontsize=7)
        ax.set_ylabel(unit, fontsize=7)
        ax.set_xticks([])
        ax.tick_params(labelsize=6)
    for ax in list(axes.flat)[len(workloads):]:
        ax.axis("off")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[s]) for s in systems]
    f.legend(handles, [NAMES[s] for s in systems], loc="upper center", bbox_to_anchor=(0.5, 0.975), ncol=len(systems), fontsize=9)
    f.suptitle("Stoa vs peers, same machine, same run (higher is better)", y=0.995, fontsize=10)
    f.tight_layout(rect=(0, 0, 1, 0.95))
    f.savefig(path, dpi=90)


def main():
    systems, workloads, fig = load(sys.argv[1])
    print(table(systems, workloads, fig))
    if len(sys.argv) > 2:
        chart(systems, workloads, fig, sys.argv[2])


if __name__ == "__main__":
    main()
