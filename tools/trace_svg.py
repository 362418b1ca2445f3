#!/usr/bin/env python3
"""Draws a RUDA_TRACE file (Chrome trace-event JSON) as an SVG timeline:
one lane per worker (and, on cuda, one per worker's stream on the device),
one box per command, coloured by kind.

  ruda-trace-svg TRACE.json OUT.svg [--from US] [--span US] [--title T]
  (tools/trace_svg.py in the source tree)

--from: start of the window in microseconds since the device opened
(default: the window of --span that starts the most work: launches,
copies, graphs, collectives, not the syncs and waits around them);
--span: its width (default 400 us). Standard library only.
"""
import argparse
import html
import json

COLOURS = {"launch": "#4e79a7", "write": "#f28e2b", "read": "#59a14f", "copy": "#edc948",
           "sync": "#9c9c9c", "wait": "#e15759", "mark": "#b07aa1", "graph": "#76b7b2",
           "stamp": "#bab0ac", "collective": "#ff9da7"}


def busiest(ts, span):
    """Start of the window of width span holding the most command starts."""
    best, best_n, j = ts[0], 0, 0
    for i, t in enumerate(ts):
        while ts[j] < t - span:
            j += 1
        if i - j + 1 > best_n:
            best, best_n = ts[j], i - j + 1
    return best


# Commands that are the work itself; a window is chosen by these alone, so
# a run's closing syncs (many, short) do not pull it to the end.
WORK = {"launch", "write", "read", "copy", "graph", "collective"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="a RUDA_TRACE file")
    ap.add_argument("out", help="the SVG to write")
    ap.add_argument("--from", dest="start", type=float, metavar="US",
                    help="window start, microseconds after the device opened (default: the busiest window)")
    ap.add_argument("--span", type=float, default=400.0, metavar="US", help="window width (default 400)")
    ap.add_argument("--title", default="", help="a title above the lanes")
    a = ap.parse_args()

    with open(a.trace) as f:
        events = json.load(f)["traceEvents"]
    # A lane is (process, thread): process 1 the workers, 2 the device.
    lanes = {(e.get("pid", 1), e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    errors = [e for e in events if e.get("ph") == "i"]
    if not spans:
        raise SystemExit("trace_svg: no commands in " + a.trace)
    ts = sorted(e["ts"] for e in spans if e.get("cat") in WORK) or sorted(e["ts"] for e in spans)
    start = a.start if a.start is not None else busiest(ts, a.span)
    end = start + a.span
    used = sorted({(e.get("pid", 1), e["tid"]) for e in spans if e["ts"] < end and e["ts"] + e["dur"] > start})

    left, width, lane_h, top = 190, 900, 26, 40
    height = top + lane_h * len(used) + 60
    scale = width / a.span
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 20}" height="{height}" '
           'font-family="sans-serif" font-size="11">',
           f'<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{left}" y="20" font-size="13">{html.escape(a.title)}</text>']
    for row, lane in enumerate(used):
        y = top + row * lane_h
        out.append(f'<text x="4" y="{y + 17}">{html.escape(lanes.get(lane, str(lane)))}</text>')
        out.append(f'<line x1="{left}" y1="{y + lane_h - 2}" x2="{left + width}" y2="{y + lane_h - 2}" '
                   'stroke="#eee"/>')
        for e in spans:
            if (e.get("pid", 1), e["tid"]) != lane or e["ts"] >= end or e["ts"] + e["dur"] <= start:
                continue
            x0 = left + max(0.0, e["ts"] - start) * scale
            x1 = left + min(a.span, e["ts"] + e["dur"] - start) * scale
            w = max(0.8, x1 - x0)
            kind = e["args"].get("kind", e.get("cat")) if e.get("cat") == "device" else e.get("cat")
            colour = COLOURS.get(kind, "#333")
            tip = f'{e["name"]} ({e["args"].get("stream", "")}, cmd {e["args"].get("cmd", "")}, {e["dur"]:.1f} us)'
            out.append(f'<rect x="{x0:.2f}" y="{y + 3}" width="{w:.2f}" height="{lane_h - 8}" fill="{colour}">'
                       f'<title>{html.escape(tip)}</title></rect>')
            if w > 7 * len(e["name"]):
                out.append(f'<text x="{x0 + 2:.2f}" y="{y + 17}" fill="white">{html.escape(e["name"])}</text>')
        for e in errors:
            if (e.get("pid", 1), e["tid"]) == lane and start <= e["ts"] < end:
                x = left + (e["ts"] - start) * scale
                out.append(f'<text x="{x:.2f}" y="{y + 12}" fill="red" font-weight="bold">!</text>')
    axis_y = top + lane_h * len(used) + 12
    out.append(f'<text x="{left + width}" y="20" text-anchor="end">from {start / 1000:.3f} ms after open</text>')
    for i in range(5):
        x = left + width * i / 4
        out.append(f'<line x1="{x:.1f}" y1="{axis_y - 6}" x2="{x:.1f}" y2="{axis_y}" stroke="black"/>')
        out.append(f'<text x="{x:.1f}" y="{axis_y + 12}" text-anchor="middle">+{a.span * i / 4:.0f} us</text>')
    x = left
    for name, colour in COLOURS.items():
        if any(e.get("cat") == name or e["args"].get("kind") == name for e in spans):
            out.append(f'<rect x="{x}" y="{axis_y + 24}" width="10" height="10" fill="{colour}"/>')
            out.append(f'<text x="{x + 14}" y="{axis_y + 33}">{name}</text>')
            x += 20 + 7 * len(name)
    out.append("</svg>")
    with open(a.out, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
