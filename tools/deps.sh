#!/usr/bin/env bash
# Installs what ruda builds with on Debian/Ubuntu, skipping what is present.
#
# CUDA: ruda needs only the toolkit's headers to build its cuda backend and
# NVRTC (and NCCL, for collectives) at run time. With a toolkit at
# /usr/local/cuda nothing more is done. Without one, on a machine that has
# the NVIDIA driver (or with RUDA_CUDA_WHEELS=1), NVIDIA's packages on PyPI
# are downloaded and unpacked into .deps/cuda (nothing system-wide): the
# headers, NVRTC, CCCL, NVTX, and NCCL where there is a driver (or with
# RUDA_CUDA_WHEELS_NCCL=1). CMake then builds against .deps/cuda/root and
# libruda finds NVRTC and NCCL there at run time; a system toolkit found
# later still wins. RUDA_CUDA_WHEELS=0 never downloads; =try (what
# tools/test.sh asks for) downloads where PyPI answers and otherwise goes on
# with the host backend alone (and a toolkit at /usr/local/cuda, if any).
set -euo pipefail
cd "$(dirname "$0")/.."
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

apt_install() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "installing: ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

apt_install build-essential cmake pkg-config liburcu-dev libck-dev libjemalloc-dev libcmocka-dev clang
# Open MPI: libruda_mpi and its multi-process tests; optional to the build
# (RUDA_MPI=0 skips it, and a system without the packages goes on).
if [ "${RUDA_MPI:-1}" != 0 ]; then
  apt_install libopenmpi-dev openmpi-bin || echo "note: Open MPI not installed; libruda_mpi is not built"
fi

# abigail-tools (abidw, abidiff): the ABI stage of tools/test.sh and the
# abi_abidiff test (tests/abi/abidiff.sh); optional (RUDA_ABIGAIL=0 skips
# it; without it that stage says skipped).
if [ "${RUDA_ABIGAIL:-1}" != 0 ]; then
  apt_install abigail-tools || echo "note: abigail-tools not installed; the abidiff stage of tools/test.sh is skipped"
fi

# Python: the package in python/ and its tests (tools/python.sh); optional
# (RUDA_PYTHON=0 skips it; without the packages that stage says skipped).
if [ "${RUDA_PYTHON:-1}" != 0 ]; then
  apt_install python3-dev python3-venv python3-pip python3-pytest python3-numpy ||
    echo "note: Python packages not installed; the Python stage of tools/test.sh is skipped"
fi

# ruda's private jemalloc (tools/jemalloc.sh): built once from jemalloc's
# release sources into .deps/jemalloc, so libruda.so and the Python
# package load by dlopen. Where the download fails, Debian's copy serves
# the C library (not dlopen-able) and the Python package is not built.
if [ "${RUDA_JEMALLOC_FETCH:-1}" != 0 ]; then
  apt_install curl bzip2
  tools/jemalloc.sh fetch ||
    echo "note: ruda's private jemalloc was not built: libruda links Debian's (libruda.so then cannot be dlopened) and the Python package is not built"
fi

# The driver's CUDA version as major (0: no driver).
driver_cuda_major() {
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -n 1 | grep . && return
  fi
  if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then echo 13; else echo 0; fi
}

# Unpacks NVIDIA's CUDA wheels for major version $1 (12 or 13) into
# .deps/cuda and merges them into one toolkit-like tree, .deps/cuda/root
# (include/, include/cccl/ or include/cuda/std, lib/). $2: 1 adds NCCL.
# $3: pip's retries. Returns 1 when the download fails.
cuda_wheels() {
  local major="$1" nccl="$2" retries="$3" dest=.deps/cuda
  if [ -f "$dest/root/include/cuda.h" ] && [ -f "$dest/root/include/nvrtc.h" ] &&
     [ -f "$dest/root/include/nvtx3/nvToolsExt.h" ] &&
     { [ "$nccl" = 0 ] || [ -f "$dest/nvidia/nccl/include/nccl.h" ]; }; then
    return
  fi
  apt_install python3-pip || return 1
  local pkgs
  if [ "$major" -ge 13 ]; then
    pkgs=("nvidia-cuda-runtime==13.0.*" "nvidia-cuda-nvrtc==13.0.*" "nvidia-cuda-cccl==13.0.*" "nvidia-nvtx==13.0.*")
    [ "$nccl" = 1 ] && pkgs+=(nvidia-nccl-cu13)
  else
    pkgs=(nvidia-cuda-runtime-cu12 nvidia-cuda-nvrtc-cu12 nvidia-cuda-cccl-cu12 nvidia-nvtx-cu12)
    [ "$nccl" = 1 ] && pkgs+=(nvidia-nccl-cu12)
  fi
  echo "no CUDA toolkit at /usr/local/cuda: fetching ${pkgs[*]} from PyPI into $dest"
  rm -rf "$dest/wheels" "$dest/root"
  mkdir -p "$dest/wheels" "$dest/root/include" "$dest/root/lib"
  if ! python3 -m pip download -q --no-deps --only-binary=:all: --retries "$retries" --timeout 30 \
       -d "$dest/wheels" "${pkgs[@]}"; then
    rm -rf "$dest/wheels" "$dest/root"
    return 1
  fi
  for w in "$dest"/wheels/*.whl; do python3 -m zipfile -e "$w" "$dest"; done
  # One tree: CUDA 13's wheels share nvidia/cu13, CUDA 12's have one
  # folder per package.
  for d in "$dest"/nvidia/cu13 "$dest"/nvidia/cuda_runtime "$dest"/nvidia/cuda_nvrtc "$dest"/nvidia/cuda_cccl \
    "$dest"/nvidia/nvtx; do
    [ -d "$d/include" ] && cp -a "$d/include/." "$dest/root/include/"
    [ -d "$d/lib" ] && cp -a "$d/lib/." "$dest/root/lib/"
    rm -rf "$d"
  done
  rm -rf "$dest/wheels"
  [ -f "$dest/root/include/cuda.h" ] && [ -f "$dest/root/include/nvrtc.h" ] || {
    echo "deps.sh: the CUDA wheels did not hold cuda.h and nvrtc.h" >&2; rm -rf "$dest/root"; return 1; }
}

# RUDA_CUDA_TOOLKIT: where a system toolkit would be (tests point it away).
if [ ! -f "${RUDA_CUDA_TOOLKIT:-/usr/local/cuda}/include/cuda.h" ]; then
  major="$(driver_cuda_major)"
  want="${RUDA_CUDA_WHEELS:-auto}"
  if [ "$want" = 1 ] || [ "$want" = try ] || { [ "$want" = auto ] && [ "$major" -gt 0 ]; }; then
    nccl="${RUDA_CUDA_WHEELS_NCCL:-$([ "$major" -gt 0 ] && echo 1 || echo 0)}"
    [ "$major" -gt 0 ] || major=13
    if [ "$want" = try ]; then
      if cuda_wheels "$major" "$nccl" 1; then
        echo "CUDA headers and NVRTC from NVIDIA's wheels (CUDA $major) in .deps/cuda"
      else
        echo "note: could not download NVIDIA's CUDA wheels from PyPI and there is no toolkit at /usr/local/cuda:"
        echo "      building the host backend only (the cuda backend and its mock-driver tests are not built);"
        echo "      RUDA_CUDA_WHEELS=0 skips the download"
      fi
    else
      cuda_wheels "$major" "$nccl" 5 || {
        echo "deps.sh: downloading NVIDIA's CUDA wheels from PyPI failed; RUDA_CUDA_WHEELS=0 builds the host backend only" >&2
        exit 1
      }
      echo "CUDA headers and NVRTC from NVIDIA's wheels (CUDA $major) in .deps/cuda"
    fi
  else
    echo "note: no CUDA toolkit at /usr/local/cuda and no NVIDIA driver; building the host backend only"
  fi
fi
