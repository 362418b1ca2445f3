#!/usr/bin/env bash
# The main job: build ruda and run the multi-thread, multi-stream demo.
# Uses the GPU when one is usable, the host backend otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target ruda_demo >/dev/null
exec build/examples/ruda_demo
