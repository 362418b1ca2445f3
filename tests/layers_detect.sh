#!/usr/bin/env bash
# Proves the layer checks catch what they are for: each case plants one
# violation in a temporary copy of the tree (or of the build's objects),
# and the check must fail naming it; the unplanted copy must pass and an
# empty folder must fail.
#   tests/layers_detect.sh include SOURCE_ROOT
#   tests/layers_detect.sh calls SOURCE_ROOT OBJECT_DIR
set -uo pipefail
mode="$1" root="$2" objs="${3:-}"
tools="$root/tools"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
expect() { # expect pass|fail PATTERN -- command...
  local want="$1" pat="$2"
  shift 3
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [ "$want" = pass ] && [ $rc -ne 0 ]; then
    echo "FAIL: expected a pass: $*"; echo "$out"; fails=1
  elif [ "$want" = fail ] && { [ $rc -ne 1 ] || ! grep -q -- "$pat" <<< "$out"; }; then
    echo "FAIL: expected exit 1 naming '$pat' (got $rc): $*"; echo "$out"; fails=1
  else
    echo "ok: $want${pat:+ ($pat)}"
  fi
}
copy_tree() { # a fresh copy of the layered sources in $tmp/$1
  rm -rf "$tmp/$1"; mkdir -p "$tmp/$1"
  (cd "$root" && cp -r base staging memory scheduler src backends "$tmp/$1/")
}
mkdir -p "$tmp/empty"
case "$mode" in
include)
  copy_tree t
  expect pass "" -- "$tools/check_layers.sh" "$tmp/t"
  echo '#include "scheduler/sched.h"' >> "$tmp/t/memory/arena.c"
  expect fail 'memory/arena.c includes "scheduler/sched.h"' -- "$tools/check_layers.sh" "$tmp/t"
  copy_tree t
  echo '#include "memory/memory.h"' >> "$tmp/t/backends/host/host_backend.c"
  expect fail 'host_backend.c includes "memory/memory.h"' -- "$tools/check_layers.sh" "$tmp/t"
  copy_tree t
  echo '#include "backends/host/host_backend.h"' >> "$tmp/t/src/api.c"
  expect fail 'src/api.c includes "backends/host/host_backend.h"' -- "$tools/check_layers.sh" "$tmp/t"
  copy_tree t
  echo '#include "pool.h"' >> "$tmp/t/memory/arena.c"
  expect fail 'unrooted include in memory/arena.c' -- "$tools/check_layers.sh" "$tmp/t"
  expect fail 'no sources' -- "$tools/check_layers.sh" "$tmp/empty"
  ;;
calls)
  command -v nm >/dev/null && command -v cc >/dev/null || { echo "nm or cc not found: skipped"; exit 77; }
  plant() { # plant DIR/FILE.c CODE: a fresh copy of sources and objects plus one planted object
    copy_tree s
    rm -rf "$tmp/o"; cp -r "$objs" "$tmp/o"
    mkdir -p "$tmp/o/$(dirname "$1")"
    printf '%s\n' "$2" > "$tmp/s/$1"
    cc -c -o "$tmp/o/$1.o" "$tmp/s/$1"
  }
  copy_tree s
  expect pass "" -- "$tools/check_calls.sh" "$objs" "$tmp/s"
  plant base/planted.c 'unsigned long ruda__arena_trim(void *, unsigned long, unsigned long);
void ruda__planted(void) { ruda__arena_trim(0, 0, 0); }'
  expect fail 'base/planted.c.o needs ruda__arena_trim from memory/arena.c.o' -- "$tools/check_calls.sh" "$tmp/o" "$tmp/s"
  plant base/planted.c 'extern const char ruda__host_backend[];
const void *ruda__planted(void) { return ruda__host_backend; }'
  expect fail 'base/planted.c.o needs ruda__host_backend' -- "$tools/check_calls.sh" "$tmp/o" "$tmp/s"
  plant scheduler/planted.c 'extern const char ruda__host_backend[];
const void *ruda__planted(void) { return ruda__host_backend; }'
  expect fail 'scheduler/planted.c.o needs ruda__host_backend' -- "$tools/check_calls.sh" "$tmp/o" "$tmp/s"
  plant backends/host/planted.c 'int ruda__pools_check_layout(const void *, unsigned);
int ruda__planted(void) { return ruda__pools_check_layout(0, 0); }'
  expect fail 'backends/host/planted.c.o needs ruda__pools_check_layout' -- "$tools/check_calls.sh" "$tmp/o" "$tmp/s"
  plant src/planted.c 'void ruda__planted_up(void) {}'
  echo 'void ruda__planted_up(void);' >> "$tmp/s/scheduler/sched.h"
  expect fail 'scheduler/sched.h declares ruda__planted_up, defined in src/planted.c.o' -- "$tools/check_calls.sh" "$tmp/o" "$tmp/s"
  # A circle inside a folder: the grace periods calling the stream table
  # that calls them.
  plant scheduler/grace.c 'void ruda__streams_each(void *, void (*)(void *, void *), void *);
void ruda__grace_advance(void *g) { ruda__streams_each(g, 0, 0); }
int ruda__grace_passed(const void *g, unsigned long s) { return g == 0 && s == 0; }'
  expect fail 'circle of calls among scheduler/stream\*.c.o scheduler/graph.c.o scheduler/grace.c.o: .*stream_table.c.o' -- "$tools/check_calls.sh" "$tmp/o" "$tmp/s"
  expect fail 'no object files' -- "$tools/check_calls.sh" "$tmp/empty" "$tmp/s"
  ;;
*) echo "usage: $0 include|calls SOURCE_ROOT [OBJECT_DIR]"; exit 2 ;;
esac
exit $fails
