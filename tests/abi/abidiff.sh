#!/bin/sh
# abidiff.sh LIB [BASELINE]: compares the ABI of the shared library LIB
# (built with debug info) against BASELINE, the ABI of the last release
# (tests/abi/libruda-MAJOR.MINOR.abixml). Both sides are read the same way:
# abidw keeps the types the public headers (include/ruda) define and drops
# the rest, so internal structs, opaque handles included, never count;
# abidiff.suppr names what is deliberately internal on top of that.
#
# Passes (exit 0) when nothing in the release's ABI changed: functions may
# be added (they are listed), a reserved word may be taken by a later field
# the libabigail way (ruda/ruda.h, "Versions and ABI"). Fails (exit 1) on
# any other change abidiff reports: a removed or changed function, a public
# struct that grew, shrank or moved a field, a changed enum value. Such a
# break is what bumps the soname (README, "Versions"); then the new series
# starts its baseline:
#   abidiff.sh --update LIB BASELINE   writes LIB's ABI to BASELINE.
# Exit 77 (skipped, said why) without abidw/abidiff (tools/deps.sh installs
# abigail-tools) or without debug info in LIB.
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
headers="$here/../../include/ruda"
update=0
if [ "${1:-}" = --update ]; then update=1; shift; fi
lib="${1:?usage: abidiff.sh [--update] LIB [BASELINE]}"
base="${2:-}"
if [ -z "$base" ]; then
  # The release series this library belongs to: libruda.so.0.MINOR.
  series="$(readelf -d "$lib" | sed -n 's/.*SONAME.*libruda\.so\.\([0-9.]*\)\].*/\1/p')"
  base="$here/libruda-$series.abixml"
fi
for t in abidw abidiff; do
  command -v "$t" >/dev/null 2>&1 || { echo "skipped: no $t (abigail-tools; tools/deps.sh installs it)"; exit 77; }
done
readelf -S "$lib" | grep -q '\.debug_info' || { echo "skipped: $lib has no debug info (build with -g)"; exit 77; }

# The same reading for the baseline and for LIB: public types only, no
# paths of this checkout, type ids that do not depend on reading order.
dump() {
  abidw --headers-dir "$headers" --drop-private-types --no-corpus-path --no-comp-dir-path --short-locs \
    --type-id-style hash --out-file "$2" "$1"
}
if [ "$update" = 1 ]; then
  dump "$lib" "$base"
  echo "wrote the ABI of $lib to $base"
  exit 0
fi
[ -f "$base" ] || { echo "no baseline $base: a new series writes it with abidiff.sh --update"; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
dump "$lib" "$tmp/new.abixml"
# Added functions and variables are reported but do not fail.
set +e
abidiff --suppressions "$here/abidiff.suppr" --no-added-syms "$base" "$tmp/new.abixml" >"$tmp/report"
rc=$?
abidiff --suppressions "$here/abidiff.suppr" "$base" "$tmp/new.abixml" >"$tmp/full"
set -e
if [ "$rc" -ne 0 ]; then
  cat "$tmp/full"
  # abidiff's status is a bit set: 1 error, 2 usage, 4 change, 8 incompatible.
  if [ $((rc & 3)) -ne 0 ]; then echo "abidiff failed (status $rc)"; exit 1; fi
  echo "$(basename "$lib") breaks the ABI of $(basename "$base") (abidiff status $rc, above):"
  echo "keep the layout (a new field takes a reserved word), or bump the minor version and its baseline"
  exit 1
fi
if grep -q '^ *\[A\]' "$tmp/full"; then echo "added since $(basename "$base"):"; grep '^ *\[A\]' "$tmp/full"; fi
echo "ABI of $(basename "$base") kept by $(basename "$lib")"
