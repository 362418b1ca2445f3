#!/usr/bin/env python3
"""Draws ruda-bench's JSON (ruda-bench --json FILE ...) as SVG or PNG plots.

  tools/plot.py RESULTS.json [OUTDIR] [--format svg|png]

One figure per benchmark found in the file, named after it in OUTDIR
(default: beside the JSON): launch.svg (launches/s by client threads, ruda
and the raw driver), overlap.svg (achieved kernel concurrency by streams,
against the ideal line), upload.svg (GB/s by size), latency.svg (the
caller's ns per launch, p50 and p99), alloc.svg (create+free pairs/s by
size), graph.svg (us per kernel replayed vs launched one by one),
serve.svg (request round trips/s by threads). Installed as ruda-bench-plot
(ruda-bench --plot DIR runs it). Needs
matplotlib (Debian: python3-matplotlib).
"""
import argparse
import json
import os
import sys

FIGURES = {
    # bench: (x label, y label, log x, title)
    "launch": ("client threads (one stream each)", "launches/s", True, "Kernel launches per second"),
    "overlap": ("streams with kernels at once", "achieved concurrency", True, "Kernels of several streams at once"),
    "upload": ("MiB per upload", "GB/s", True, "Host-to-device uploads"),
    "latency": ("percentile", "ns in the launch call", False, "What one launch costs its caller"),
    "alloc": ("KiB per buffer", "create+free pairs/s", True, "Buffer allocation"),
    "graph": ("kernels in the graph", "us per kernel", True, "Graph replay against one-by-one launches"),
    "profile": ("kernel duration, us", "measured, us (median)", False, "A short kernel timed"),
    "serve": ("client threads (one stream each)", "requests/s", True,
              "Request round trips (64 KiB up, a kernel, 512 B down)"),
}
STYLE = {"ruda": dict(marker="o", color="#4e79a7"), "raw": dict(marker="s", color="#e15759"),
         "ideal": dict(linestyle="--", color="#999999"), "replayed": dict(marker="o", color="#59a14f"),
         "one by one": dict(marker="s", color="#f28e2b")}
LABEL = {"ruda": "ruda", "raw": "raw driver", "ideal": "ideal", "replayed": "ruda graph replay",
         "one by one": "ruda launches one by one"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("outdir", nargs="?")
    ap.add_argument("--format", choices=("svg", "png"), default="svg")
    a = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot.py: needs matplotlib (apt-get install python3-matplotlib)", file=sys.stderr)
        sys.exit(77)  # "skipped" to ctest
    with open(a.results) as f:
        doc = json.load(f)
    outdir = a.outdir or os.path.dirname(os.path.abspath(a.results))
    os.makedirs(outdir, exist_ok=True)
    where = f'{doc.get("machine", "?")}, {doc.get("backend", "?")} backend, {doc.get("date", "")}'
    made = []
    for bench, (xl, yl, logx, title) in FIGURES.items():
        rows = [r for r in doc["rows"] if r["bench"] == bench]
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        variants = [v for v in STYLE if any(r["variant"] == v for r in rows)]
        if bench == "latency":  # bars: p50 and p99 side by side per variant
            xs = sorted({r["x"] for r in rows})
            w = 0.8 / len(variants)
            for i, variant in enumerate(variants):
                vals = [next((r["value"] for r in rows if r["variant"] == variant and r["x"] == x), 0) for x in xs]
                ax.bar([j + i * w for j in range(len(xs))], vals, w, label=LABEL[variant],
                       color=STYLE[variant]["color"])
            ax.set_xticks([j + w * (len(variants) - 1) / 2 for j in range(len(xs))])
            ax.set_xticklabels([f"p{x:g}" for x in xs])
            logx = False
        for variant in variants if bench != "latency" else ():
            pts = sorted((r["x"], r["value"]) for r in rows if r["variant"] == variant)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=LABEL[variant], **STYLE[variant])
        if logx:
            ax.set_xscale("log", base=2)
            xs = sorted({r["x"] for r in rows})
            ax.set_xticks(xs)
            ax.set_xticklabels([f"{x:g}" for x in xs])
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.set_ylim(bottom=0)
        ax.set_title(f"{title}\n{where}", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = os.path.join(outdir, f"{bench}.{a.format}")
        fig.savefig(path)
        plt.close(fig)
        made.append(path)
    if not made:
        sys.exit("plot.py: no ruda-bench rows in " + a.results)
    print("\n".join(made))


if __name__ == "__main__":
    main()
