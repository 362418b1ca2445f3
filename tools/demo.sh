#!/usr/bin/env bash
# The main job: build ruda, run the multi-thread, multi-stream demo, then
# the inference server example (examples/inference_server.c), then its
# asyncio form in Python (examples/asyncio_server.py).
# Uses the GPU when one is usable, the host backend otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target ruda_demo inference_server >/dev/null
build/examples/ruda_demo
build/examples/inference_server
# The same server in Python, on asyncio (python/, examples/asyncio_server.py).
exec tools/python.sh --example
