#!/usr/bin/env python3
"""Draws ruda-bench's JSON (ruda-bench --json FILE ...) as SVG or PNG plots.

  tools/plot.py RESULTS.json [OUTDIR] [--format svg|png]

One figure per benchmark found in the file, named after it in OUTDIR
(default: beside the JSON): launch.svg (launches/s by client threads, ruda
and the raw driver), overlap.svg (achieved kernel concurrency by streams,
against the ideal line), upload.svg (GB/s by size). Needs matplotlib
(Debian: python3-matplotlib).
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
}
STYLE = {"ruda": dict(marker="o", color="#4e79a7"), "raw": dict(marker="s", color="#e15759"),
         "ideal": dict(linestyle="--", color="#999999")}
LABEL = {"ruda": "ruda", "raw": "raw driver", "ideal": "ideal"}


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
        sys.exit("plot.py: needs matplotlib (apt-get install python3-matplotlib)")
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
        for variant in ("ruda", "raw", "ideal"):
            pts = sorted((r["x"], r["value"]) for r in rows if r["variant"] == variant)
            if pts:
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
