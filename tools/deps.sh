#!/usr/bin/env bash
# Installs what ruda builds with on Debian/Ubuntu, skipping what is present.
set -euo pipefail
pkgs=(build-essential cmake pkg-config liburcu-dev libck-dev libjemalloc-dev libcmocka-dev clang)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ ! -f /usr/local/cuda/include/cuda.h ]; then
  echo "note: no CUDA toolkit at /usr/local/cuda; building the host backend only"
fi
