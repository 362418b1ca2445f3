#!/bin/sh
# check_headers.sh - the public headers as users meet them.
#
#   check_headers.sh compile CC CXX WORK_DIR INCLUDE_DIR...
#     Every ruda/*.h under the include dirs, each alone and all together,
#     passes `-fsyntax-only -Wall -Wextra -Wpedantic -Werror` as C11 (CC)
#     and as C++17 (CXX); then a C++ file naming every exported function
#     is compiled and must reference each one unmangled (extern "C").
#     Exits 77 (skipped) when CXX is empty or missing.
#   check_headers.sh documented INCLUDE_DIR...
#     Every exported declaration directly follows its own comment, which
#     states its thread safety and whether it blocks.
set -eu

headers() {
  for d in "$@"; do
    for h in "$d"/ruda/*.h; do
      [ -e "$h" ] || continue
      # ruda/mpi.h needs <mpi.h>: compiled only when an include dir has it.
      if [ "$(basename "$h")" = mpi.h ] && [ "${with_mpi:-1}" = 0 ]; then continue; fi
      echo "$h"
    done
  done
}

# The names of the functions declared RUDA_EXTERN in the given files.
exported() {
  sed -n 's/^RUDA_EXTERN[^(]*[ *]\(ruda_[a-z0-9_]*\)(.*/\1/p' "$@" | sort -u
}

mode=$1
shift
case $mode in
compile)
  cc=$1 cxx=$2 work=$3
  shift 3
  if [ -z "$cxx" ] || ! command -v "$cxx" >/dev/null 2>&1; then
    echo "no C++ compiler: skipped"
    exit 77
  fi
  rm -rf "$work"
  mkdir -p "$work"
  incs=""
  with_mpi=0
  for d in "$@"; do
    incs="$incs -I$d"
    [ -e "$d/mpi.h" ] && with_mpi=1
  done
  all="$work/all.h"
  : >"$all"
  fail=0
  check() { # check FILE: compile one C and one C++ translation unit
    printf '#include "%s"\ntypedef int ruda_abi_not_empty;\n' "$1" >"$work/tu.c"
    cp "$work/tu.c" "$work/tu.cpp"
    # shellcheck disable=SC2086
    if ! "$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only $incs "$work/tu.c"; then
      echo "FAIL (C11): $1"
      fail=1
    fi
    # shellcheck disable=SC2086
    if ! "$cxx" -std=c++17 -Wall -Wextra -Wpedantic -Werror -fsyntax-only $incs "$work/tu.cpp"; then
      echo "FAIL (C++17): $1"
      fail=1
    fi
  }
  n=0
  for h in $(headers "$@"); do
    rel=ruda/$(basename "$h")
    check "$rel"
    printf '#include "%s"\n#include "%s"\n' "$rel" "$rel" >>"$all" # twice: include guards
    n=$((n + 1))
  done
  if [ "$n" -eq 0 ]; then
    echo "no headers found under $*"
    exit 1
  fi
  check "$all"

  # Linkage: a C++ unit referring to every exported function must refer to
  # the plain C symbol. A declaration outside extern "C" gets a mangled one.
  names=$(exported $(headers "$@"))
  {
    echo "#include \"$all\""
    echo 'void ruda_abi_sink(void (*)());'
    echo 'void ruda_abi_refs() {'
    for f in $names; do echo "  ruda_abi_sink(reinterpret_cast<void (*)()>(&$f));"; done
    echo '}'
  } >"$work/link.cpp"
  # shellcheck disable=SC2086
  "$cxx" -std=c++17 -Wall -Wextra -Werror $incs -c "$work/link.cpp" -o "$work/link.o"
  undefined=$(nm -u "$work/link.o" | awk '{print $NF}')
  for f in $names; do
    if ! echo "$undefined" | grep -qx "$f"; then
      echo "FAIL (linkage): $f is not declared extern \"C\" for C++"
      fail=1
    fi
  done
  echo "$n headers, $(echo "$names" | wc -w) exported functions checked"
  exit $fail
  ;;
documented)
  fail=0
  n=0
  for h in $(headers "$@"); do
    n=$((n + 1))
    # Each RUDA_EXTERN declaration directly follows its own comment, and
    # the comment states the contract (ruda/ruda.h, Conventions): thread
    # safety ("thread-safe", "not thread-safe on ...") and blocking
    # ("non-blocking", "blocks"). An empty comment (or one of punctuation
    # only) documents nothing.
    awk -v file="$h" '
      {
        line = $0
        if (!incomment && line ~ /\/\*/) { incomment = 1; text = "" }
        if (incomment) {
          t = line
          gsub(/\/\*|\*\/|\*/, " ", t)
          text = text " " t
          if (line ~ /\*\/[ \t]*$/) { incomment = 0; ended = NR; said = tolower(text) }
          else if (line ~ /\*\//) incomment = 0
        }
      }
      /^RUDA_EXTERN/ {
        where = file ":" NR ": "
        if (ended != NR - 1) { print where "undocumented: " $0; bad = 1; next }
        if (said !~ /[a-z][a-z]/) { print where "empty comment: " $0; bad = 1; next }
        if (said !~ /thread-safe/) { print where "no thread safety (thread-safe / not thread-safe on ...): " $0; bad = 1 }
        if (said !~ /non-blocking|blocks|blocking/) { print where "no blocking contract (non-blocking / blocks): " $0; bad = 1 }
      }
      END { exit bad }
    ' "$h" || fail=1
  done
  if [ "$n" -eq 0 ]; then
    echo "no headers found under $*"
    exit 1
  fi
  [ $fail -eq 0 ] && echo "$n headers: every exported function documented"
  exit $fail
  ;;
*)
  echo "usage: $0 compile CC CXX WORK_DIR INCLUDE_DIR... | documented INCLUDE_DIR..."
  exit 2
  ;;
esac
