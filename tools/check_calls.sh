#!/usr/bin/env bash
# Fails when a function call runs up the layers: an object file of a lower
# layer that needs a symbol defined by a higher one (or a backend that needs
# another backend's). The include check (check_layers.sh) sees headers; this
# sees the calls, from the objects of a build.
#   tools/check_calls.sh BUILD/CMakeFiles/ruda_objects.dir SOURCE_ROOT
# Objects whose source is gone (a stale build folder) are ignored.
set -euo pipefail
dir="$1"
src="${2:-$(cd "$(dirname "$0")/.." && pwd)}"
cd "$dir"
command -v nm >/dev/null || { echo "nm not found: skipped"; exit 77; }
rank() {
  case "$1" in
    ./base/* | ./backends/*) echo 0 ;;
    ./memory/*) echo 1 ;;
    ./scheduler/*) echo 2 ;;
    ./src/*) echo 3 ;;
    *) echo 9 ;;
  esac
}
declare -A def
objs=$(find . -name '*.c.o' | sort | while read -r o; do [ -f "$src/${o%.o}" ] && echo "$o"; done)
# No objects is a wrong directory or an unbuilt tree, not a clean one.
[ -n "$objs" ] || { echo "FAIL: no object files of $src under $dir"; exit 1; }
for o in $objs; do
  for s in $(nm --defined-only "$o" | awk '$2 ~ /[TDBR]/ {print $3}'); do def[$s]=$o; done
done
bad=0
for o in $objs; do
  for s in $(nm -u "$o" | awk '{print $2}'); do
    d=${def[$s]:-}
    [ -n "$d" ] || continue
    up=0
    [ "$(rank "$d")" -gt "$(rank "$o")" ] && up=1
    # A backend calls only base and its own files.
    if [[ $o == ./backends/* && $d != ./base/* && ${o%/*} != "${d%/*}" ]]; then up=1; fi
    if [ $up -eq 1 ]; then
      echo "upward call: ${o#./} needs $s from ${d#./}"
      bad=1
    fi
  done
done
[ $bad -eq 0 ] || { echo "FAIL: calls that run up the layers"; exit 1; }
echo "layers: every call points down ($(echo "$objs" | wc -l) objects)"
