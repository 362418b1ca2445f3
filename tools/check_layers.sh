#!/usr/bin/env bash
# Fails when an #include runs against ruda's layers (docs/architecture.md):
#
#   src/        API: the public entry points      may include everything below
#   scheduler/  queues, workers, streams, order   base, staging, memory, scheduler
#   memory/     handles, pools, arena, fences     base, memory
#   backends/X  host, cuda: the backend contract  base, staging, backends/X
#   staging/    page-locked arena, copy helpers   base, staging
#   base/       errors, log, sync, contract       base
#
# Every layer may include the public headers (ruda/*.h) and system headers.
# Run by ctest (test "layers"); prints each offending edge.
set -euo pipefail
root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
cd "$root"
allowed() { # layer-of-file included-path
  local from="$1" inc="$2"
  case "$inc" in ruda/*) return 0 ;; esac
  case "$from" in
    base) [[ $inc == base/* ]] ;;
    staging) [[ $inc == base/* || $inc == staging/* ]] ;;
    memory) [[ $inc == base/* || $inc == memory/* ]] ;;
    scheduler) [[ $inc == base/* || $inc == staging/* || $inc == memory/* || $inc == scheduler/* ]] ;;
    src) [[ $inc == base/* || $inc == staging/* || $inc == memory/* || $inc == scheduler/* || $inc == src/* ]] ;;
    backends/*) [[ $inc == base/* || $inc == staging/* || $inc == "$from"/* ]] ;;
    *) return 1 ;;
  esac
}
files=$(find base staging memory scheduler src backends -name '*.[ch]' 2>/dev/null | sort || true)
if [ -z "$files" ]; then
  echo "FAIL: no sources under $root (nothing was checked)"
  exit 1
fi
bad=0
while IFS= read -r f; do
  case "$f" in
    backends/*) layer="backends/$(echo "$f" | cut -d/ -f2)" ;;
    *) layer="${f%%/*}" ;;
  esac
  while IFS= read -r inc; do
    if ! allowed "$layer" "$inc"; then
      echo "layer violation: $f includes \"$inc\" ($layer may not)"
      bad=1
    fi
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
  # Quoted includes must name the layer folder (no ../, no bare names), so
  # this check sees every edge.
  if grep -qE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"(\.\./|[^/"]*")' "$f"; then
    echo "unrooted include in $f (write \"layer/file.h\"):"
    grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"(\.\./|[^/"]*")' "$f" | sed 's/^/  /'
    bad=1
  fi
done <<< "$files"
if [ "$bad" -ne 0 ]; then
  echo "FAIL: includes that run against the layers"
  exit 1
fi
echo "layers: every include points down ($(echo "$files" | wc -l) files)"
