#!/bin/sh
# abidiff_detects.sh [ROOT]: the ABI check (abidiff.sh) itself, on planted
# changes. A copy of the source tree ROOT (default: this checkout) builds
# libruda.so, whose ABI becomes the baseline; then, one build each:
#  - what must pass: internal fields added to the opaque handles' bodies,
#    a reserved word of ruda_config taken by a new setting the way the
#    header says, a new function;
#  - what must fail: ruda_config growing by a field, a field of
#    ruda_launch_desc widened from 32 to 64 bits.
# Exit 0 when each is judged as it should be, 1 otherwise, 77 where
# abidiff.sh skips (no abigail-tools, no debug info).
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "${1:-$here/../..}" && pwd)"
command -v abidiff >/dev/null 2>&1 && command -v abidw >/dev/null 2>&1 ||
  { echo "skipped: no abidiff/abidw (abigail-tools; tools/deps.sh installs it)"; exit 77; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
src="$tmp/src"
mkdir -p "$src"
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$root" && git ls-files -co --exclude-standard -z | xargs -0 tar -cf - 2>/dev/null) | tar -xf - -C "$src"
else
  (cd "$root" && tar -cf - --exclude='./build*' --exclude=./.deps .) | tar -xf - -C "$src"
fi
# The planted copy checks with this checkout's rules, not the copy's.
check="$here/abidiff.sh"
jobs="${RUDA_ABI_JOBS:-2}"
cmake -S "$src" -B "$src/b" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRUDA_BUILD_TESTS=OFF -DRUDA_BUILD_BENCH=OFF \
  >"$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; exit 1; }
build() { cmake --build "$src/b" -j"$jobs" --target ruda >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; exit 1; }; }
build
lib="$src/b/libruda.so"
set +e
sh "$check" --update "$lib" "$tmp/base.abixml"
rc=$?
set -e
[ "$rc" -eq 0 ] || exit "$rc"
for f in include/ruda/ruda.h src/device.h scheduler/graph.h base/error.h src/version.c; do cp "$src/$f" "$tmp/orig.$(echo "$f" | tr / _)"; done
restore() { for f in include/ruda/ruda.h src/device.h scheduler/graph.h base/error.h src/version.c; do cp "$tmp/orig.$(echo "$f" | tr / _)" "$src/$f"; done; }
# plant FILE SED-SCRIPT: edits FILE of the copy; fails if nothing changed.
plant() {
  cp "$src/$1" "$tmp/before"
  sed -i "$2" "$src/$1"
  if cmp -s "$tmp/before" "$src/$1"; then echo "the plant in $1 did not apply ($2)"; exit 1; fi
}
# judge NAME WANT(0|1) [TEXT]: runs the check; its status must be WANT and
# its report must hold TEXT.
fails=0
judge() {
  build
  set +e
  sh "$check" "$lib" "$tmp/base.abixml" >"$tmp/out" 2>&1
  got=$?
  set -e
  if [ "$got" -ne "$2" ] || { [ -n "${3:-}" ] && ! grep -q "$3" "$tmp/out"; }; then
    echo "FAIL: $1: the check exited $got (want $2${3:+, a report naming $3}):"
    sed 's/^/    /' "$tmp/out"
    fails=1
  else
    echo "ok: $1: exit $got$([ "$2" -eq 1 ] && echo ", the report names $3")"
  fi
  restore
}

plant src/device.h 's/^struct ruda_device {/&\n  int planted_internal;/'
plant scheduler/graph.h 's/^struct ruda_graph {/&\n  int planted_internal;/'
plant base/error.h 's/^struct ruda_error {/&\n  int planted_internal;/'
plant include/ruda/ruda.h 's/^    uint32_t lanes;  /    uint32_t planted_setting;\n&/'
plant include/ruda/ruda.h 's/^RUDA_EXTERN const char \*ruda_version_string(void);/&\n\/* Planted. Thread-safe, non-blocking. *\/\nRUDA_EXTERN int ruda_planted_new(void);/'
printf 'int ruda_planted_new(void) { return 1; }\n' >>"$src/src/version.c"
judge "internal fields, a reserved word taken, a new function" 0 ruda_planted_new

plant include/ruda/ruda.h 's/^} ruda_config;/  int planted_growth;\n&/'
judge "ruda_config grown by a field" 1 "struct ruda_config"

plant include/ruda/ruda.h 's/^  uint32_t shared_mem;  /  uint64_t shared_mem;  /'
judge "a field of ruda_launch_desc widened" 1 "struct ruda_launch_desc"
exit "$fails"
