#!/bin/sh
# check_symbols.sh LIB LIST: every function LIST names is still exported by
# the shared library LIB. LIST (symbols-MAJOR.MINOR.txt) is what the series
# promised: within a minor version of 0.x (a major version from 1.0) no
# function goes away; removing one bumps the version, whose soname and
# find_package compatibility change with it, and starts a new list.
# Functions exported beyond the list are named, not failed: add them to it.
set -eu
lib="$1" list="$2"
[ -f "$list" ] || { echo "no $list: a new version starts its list from the previous one's"; exit 1; }
have="$(mktemp)"
trap 'rm -f "$have"' EXIT
nm -D --defined-only "$lib" | awk '$2 == "T" { print $3 }' | sort -u >"$have"
missing="$(sort -u "$list" | comm -23 - "$have")"
if [ -n "$missing" ]; then
  echo "$lib no longer exports what $(basename "$list") promises:"
  echo "$missing" | sed 's/^/  /'
  echo "keep them, or bump the version (CMakeLists.txt project(VERSION)) and start a new list"
  exit 1
fi
extra="$(sort -u "$list" | comm -13 - "$have")"
[ -z "$extra" ] || { echo "exported but not in $(basename "$list") (add them):"; echo "$extra" | sed 's/^/  /'; }
echo "all $(wc -l <"$list") functions of $(basename "$list") exported"
