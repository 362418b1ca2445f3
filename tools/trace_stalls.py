#!/usr/bin/env python3
"""trace_stalls.py - where a RUDA_TRACE run's slow requests waited.

  tools/trace_stalls.py TRACE.json [--gap-ms 2]

Reads the trace-event JSON that RUDA_TRACE writes and prints, per command
kind, the host span and queue-time percentiles (queued: from the client's
submit to the worker's start), each worker's busy share, the worker gaps
longer than --gap-ms, and whether those gaps line up across workers (all
workers idle at once points at something process-wide: a driver lock, an
allocation, the CPU scheduler) or not (one worker behind); then the
longest host spans (on cuda: driver calls that blocked) beside the times
the memory counters grew (device memory, staging page-locked)."""
import argparse
import json
import re
from collections import defaultdict


def pct(v, p):
    return v[min(len(v) - 1, int(len(v) * p))] if v else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--gap-ms", type=float, default=2.0)
    a = ap.parse_args()
    ev = json.load(open(a.trace))["traceEvents"]
    host = [e for e in ev if e.get("ph") == "X" and e.get("pid") == 1]
    dev = [e for e in ev if e.get("ph") == "X" and e.get("pid") == 2]
    print(f"{len(host)} host spans, {len(dev)} device spans")
    for lane, spans in (("host", host), ("device", dev)):
        by = defaultdict(list)
        for e in spans:  # a device span of several commands: "first +n"
            by[re.sub(r" \+\d+$", "", e["name"])].append(e["dur"])
        for name, d in sorted(by.items()):
            d.sort()
            print(f"  {lane:6} {name:24} n={len(d):6} p50 {pct(d, .5):9.1f} p99 {pct(d, .99):9.1f} "
                  f"max {d[-1]:9.1f} us")
    q = sorted(e["args"].get("queued_us", 0.0) for e in host)
    print(f"  queued (submit to worker start): p50 {pct(q, .5):.1f} p99 {pct(q, .99):.1f} "
          f"p99.9 {pct(q, .999):.1f} max {q[-1] if q else 0:.1f} us")
    # Each worker only between its first and last client command: before
    # and after, it idles because its clients had not started or were done
    # (close's own commands come last), which is no stall.
    byw = defaultdict(list)
    for e in host:
        if not str(e["args"].get("stream", "")).startswith("internal"):
            byw[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    print("  each worker from its first to its last client command")
    gaps = []
    for w, l in sorted(byw.items()):
        l.sort()
        span = l[-1][1] - l[0][0]
        busy = sum(b - a for a, b in l)
        g = [(l[i + 1][0] - l[i][1], l[i][1]) for i in range(len(l) - 1)]
        big = [x for x in g if x[0] > a.gap_ms * 1000]
        gaps += [(t, t + d, w) for d, t in big]
        print(f"  worker {w}: {len(l)} commands, busy {100 * busy / span if span else 0:.1f}%, "
              f"{len(big)} gaps > {a.gap_ms} ms, longest {max((x[0] for x in g), default=0) / 1000:.2f} ms")
    # Gaps of several workers overlapping in time.
    gaps.sort()
    shared = 0
    for i, (s, e, w) in enumerate(gaps):
        others = {w2 for s2, e2, w2 in gaps if w2 != w and s2 < e and e2 > s}
        if len(others) >= max(1, len(byw) // 2):
            shared += 1
    print(f"  {len(gaps)} long gaps, {shared} of them overlapping gaps of at least half the other workers")
    for s, e, w in gaps[:12]:
        print(f"    worker {w} idle {s / 1000:.2f} .. {e / 1000:.2f} ms")

    # Driver calls that blocked, and what memory grew meanwhile.
    t0 = min((e["ts"] for e in host), default=0)
    slow = sorted((e for e in host if e["dur"] > a.gap_ms * 1000), key=lambda e: -e["dur"])
    print(f"  {len(slow)} host spans longer than {a.gap_ms} ms; the longest:")
    for e in sorted(slow[:12], key=lambda e: e["ts"]):
        print(f"    {(e['ts'] - t0) / 1000:9.2f} ms  {e['dur'] / 1000:7.2f} ms  worker {e['tid']}  {e['name']}")
    for name in ("device memory held", "staging page-locked"):
        last, grew = None, []
        for e in sorted((e for e in ev if e.get("ph") == "C" and e.get("name") == name), key=lambda e: e["ts"]):
            v = e["args"]["MiB"]
            if last is not None and v > last:
                grew.append(f"{(e['ts'] - t0) / 1000:.1f} ms: {v:.0f}")
            last = v
        if last is not None:
            print(f"  {name} grew at: {', '.join(grew[:16]) or 'never'} (MiB; {last:.0f} at the end)")


if __name__ == "__main__":
    main()
