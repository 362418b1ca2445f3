#!/usr/bin/env bash
# Fails when a function call runs up the layers: an object file of a lower
# layer that needs a symbol defined by a higher one, a backend that needs
# another backend's, or anything outside a backend that names one of its
# symbols other than its ops table (ruda__<name>_backend, which only
# src/device.c may name: everything else goes through dev->ops). Ranks, low
# to high: base, staging, backends, memory, scheduler, src. The include check
# (check_layers.sh) sees headers; this sees the calls, from the objects of a
# build. A folder with no objects fails (nothing was checked). Last, no
# declaration climbs: a function a layer's header declares is defined in
# that layer (a header of scheduler/ declaring what src/ defines would let
# the scheduler call up without an include pointing up). Inside a folder,
# the files of each group below call one way too: no circle among them
# (a file that calls another is above it).
#   tools/check_calls.sh BUILD/CMakeFiles/ruda_objects.dir SOURCE_ROOT
# Objects whose source is gone (a stale build folder) are ignored.
set -euo pipefail
dir="$1"
src="${2:-$(cd "$(dirname "$0")/.." && pwd)}"
cd "$dir"
command -v nm >/dev/null || { echo "nm not found: skipped"; exit 77; }
rank() { # sets R (no subshell: this runs for every symbol)
  case "$1" in
    ./base/*) R=0 ;;
    ./staging/*) R=1 ;;
    ./backends/*) R=2 ;;
    ./memory/*) R=3 ;;
    ./scheduler/*) R=4 ;;
    ./src/*) R=5 ;;
    *) R=9 ;;
  esac
}
declare -A def
objs=$(find . -name '*.c.o' | sort | while read -r o; do if [ -f "$src/${o%.o}" ]; then echo "$o"; fi; done)
[ -n "$objs" ] || { echo "FAIL: no object files with a source under $src in $dir"; exit 1; }
for o in $objs; do
  for s in $(nm --defined-only "$o" | awk '$2 ~ /[TDBR]/ {print $3}'); do def[$s]=$o; done
done
bad=0
for o in $objs; do
  for s in $(nm -u "$o" | awk '{print $2}'); do
    d=${def[$s]:-}
    [ -n "$d" ] || continue
    up=0
    rank "$d"; rd=$R; rank "$o"
    [ "$rd" -gt "$R" ] && up=1
    # A backend calls only base, staging and its own files.
    if [[ $o == ./backends/* && $d != ./base/* && $d != ./staging/* && ${o%/*} != "${d%/*}" ]]; then up=1; fi
    # Outside its folder a backend is reached through its ops table, named
    # only where the device picks it.
    if [[ $d == ./backends/* && ${o%/*} != "${d%/*}" ]] &&
       ! [[ $o == ./src/device.c.o && $s =~ ^ruda__[a-z]+_backend$ ]]; then up=1; fi
    if [ $up -eq 1 ]; then
      echo "call against the layers: ${o#./} needs $s from ${d#./}"
      bad=1
    fi
  done
done
# Top-level prototypes of the headers (not static inline bodies, not
# macros): function -> the header that declares it.
declare -A decl
while read -r s h; do decl[$s]=$h; done < <(
  cd "$src" && find base staging memory scheduler src backends -name '*.h' 2>/dev/null | sort | xargs -r awk '
    !/^[a-z]/ || /^static|[{]|return/ { next }
    match($0, /[ *]ruda__[a-z0-9_]+\(/) { print substr($0, RSTART + 1, RLENGTH - 2), FILENAME }')
layer() { # sets L: base, staging, memory, scheduler, src or backends/X
  case "$1" in
    backends/*) L=${1#backends/}; L=backends/${L%%/*} ;;
    *) L=${1%%/*} ;;
  esac
}
for o in $objs; do
  for s in $(nm --defined-only "$o" | awk '$2 == "T" {print $3}'); do
    h=${decl[$s]:-}
    [ -n "$h" ] || continue
    layer "${o#./}"; ol=$L; layer "$h"
    if [ "$ol" != "$L" ]; then
      echo "declaration against the layers: $h declares $s, defined in ${o#./}"
      bad=1
    fi
  done
done
# Files inside a folder that call one way (globs under the object folder):
# the stream table below the stream lookup and the reaper, graphs and grace
# periods below the table; memory's assembly over its pools, arena and
# fences (docs/architecture.md).
groups=("scheduler/stream*.c.o scheduler/graph.c.o scheduler/grace.c.o"
        "memory/*.c.o")
for g in "${groups[@]}"; do
  declare -A in_group=()
  members=""
  for pat in $g; do
    for o in ./$pat; do
      [ -f "$o" ] || continue
      in_group[$o]=1
      members="$members $o"
    done
  done
  [ -n "$members" ] || { echo "FAIL: no objects for the one-way group '$g'"; bad=1; continue; }
  edges=""
  for o in $members; do
    edges="$edges $o $o" # every member a node, calls or not
    for s in $(nm -u "$o" | awk '{print $2}'); do
      d=${def[$s]:-}
      if [ -n "$d" ] && [ "$d" != "$o" ] && [ -n "${in_group[$d]:-}" ]; then edges="$edges $o $d"; fi
    done
  done
  # tsort names the files of a circle, one per line after the first.
  if ! loop=$(echo "$edges" | tsort 2>&1 >/dev/null); then
    echo "circle of calls among ${g}: $(echo "$loop" | sed -n 's/^tsort: \.\///p' | tr '\n' ' ')"
    bad=1
  fi
  unset in_group
done
[ $bad -eq 0 ] || { echo "FAIL: calls that run up the layers"; exit 1; }
echo "layers: every call points down ($(echo "$objs" | wc -l) objects)"
