#!/usr/bin/env python3
"""trace_svg's default window shows the work, not the syncs around it: a
trace whose run ends in a burst of short syncs (denser than the launches)
is drawn from the launches. Also: -h explains --from and --span.
Arguments: TRACE_SVG WORK_DIR."""
import json
import os
import subprocess
import sys

tool, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
events = [{"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "ruda worker 0"}}]
for i in range(20):  # the run: a launch every 50 us from 1000 us on
    events.append({"name": "k", "cat": "launch", "ph": "X", "pid": 1, "tid": 1, "ts": 1000 + 50 * i, "dur": 40,
                   "args": {"stream": "stream 0", "cmd": i + 1}})
for i in range(100):  # the close: a sync every microsecond
    events.append({"name": "sync", "cat": "sync", "ph": "X", "pid": 1, "tid": 1, "ts": 9000 + i, "dur": 0.5,
                   "args": {"stream": "stream 0", "cmd": 100 + i}})
trace, svg = os.path.join(work, "t.json"), os.path.join(work, "t.svg")
with open(trace, "w") as f:
    json.dump({"traceEvents": events}, f)
subprocess.run([sys.executable, tool, trace, svg], check=True)
out = open(svg).read()
if "from 1.000 ms after open" not in out or out.count("<rect") < 10:
    sys.exit("the default window missed the launches:\n" + out[:600])
helptext = subprocess.run([sys.executable, tool, "-h"], check=True, capture_output=True, text=True).stdout
for word in ("--from US", "--span US", "microseconds after the device opened", "default 400"):
    if word not in helptext:
        sys.exit(f"-h does not say {word!r}:\n{helptext}")
print("window and help ok")
