#!/usr/bin/env bash
# Builds ruda with AddressSanitizer+UndefinedBehaviorSanitizer and with
# ThreadSanitizer, and runs the whole test suite under each.
#
#   tests/run_sanitizers.sh [asan] [tsan]      (default: both)
#
# Build directories: $RUDA_SANITIZER_BUILD_ROOT/build-asan and build-tsan
# (default root: the repository). Extra CMake arguments: $RUDA_CMAKE_ARGS.
# Any leak, race, memory error or undefined behaviour fails the test it
# happened in; the script fails if any test did.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
root="${RUDA_SANITIZER_BUILD_ROOT:-$repo}"
jobs="$(nproc)"
kinds=("$@")
[ ${#kinds[@]} -eq 0 ] && kinds=(asan tsan)

# Reports go to stderr, which ctest shows for failed tests.
export ASAN_OPTIONS="detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:abort_on_error=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
if [ -f "$repo/tests/tsan.supp" ]; then
  TSAN_OPTIONS="$TSAN_OPTIONS:suppressions=$repo/tests/tsan.supp"
fi
# The tests choose their own settings; a tester's RUDA_* must not leak in.
for v in $(env | sed -n 's/^\(RUDA_[A-Z_]*\)=.*/\1/p'); do
  [ "$v" = RUDA_SANITIZER_BUILD_ROOT ] || [ "$v" = RUDA_CMAKE_ARGS ] || unset "$v"
done

status=0
for kind in "${kinds[@]}"; do
  # Debug for ASan as tools/test.sh builds it (one build-asan serves both);
  # TSan is too slow unoptimized.
  case "$kind" in
    asan) flag=-DRUDA_ASAN=ON type=Debug ;;
    tsan) flag=-DRUDA_TSAN=ON type=RelWithDebInfo ;;
    *) echo "unknown sanitizer '$kind' (asan|tsan)" >&2; exit 2 ;;
  esac
  dir="$root/build-$kind"
  echo "== $kind: building in $dir"
  # shellcheck disable=SC2086
  cmake -S "$repo" -B "$dir" -DRUDA_WERROR=ON -DRUDA_BUILD_TESTS=ON "$flag" -DCMAKE_BUILD_TYPE="$type" \
    ${RUDA_CMAKE_ARGS:-} >/dev/null
  cmake --build "$dir" -j"$jobs" >/dev/null
  echo "== $kind: running the tests"
  ctest --test-dir "$dir" --output-on-failure --no-tests=error -j"$jobs" || status=1
done
exit $status
