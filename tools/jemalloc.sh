#!/usr/bin/env bash
# ruda's private jemalloc: prefixed ruda_je_ (so it never replaces the
# application's malloc) and with the global-dynamic TLS model, so that
# libruda.so and the Python extension load by dlopen. Debian's copy keeps
# its thread state in initial-exec TLS, which a library loaded after
# start-up cannot get ("cannot allocate memory in static TLS block").
#   tools/jemalloc.sh fetch            jemalloc 5.3.0's release sources from Debian's mirror (else
#                                      GitHub), checked against their SHA-256, built into .deps/jemalloc
#   tools/jemalloc.sh build SRC DEST   builds it from SRC (a git directory, whose tag 5.3.0 is taken, or
#                                      a source tree) in DEST
# CMake uses .deps/jemalloc when it is there (RUDA_JEMALLOC_SOURCE names
# another); tools/deps.sh runs the fetch. Exit 1 when the download or the
# build fails, with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=5.3.0
SHA256=2db82d1e7119df3e71b7640219b6dfe84789bc0537983c3b7ac4f7189aecfeaa # jemalloc-5.3.0.tar.bz2
URLS=("http://deb.debian.org/debian/pool/main/j/jemalloc/jemalloc_${VERSION}.orig.tar.bz2"
      "https://github.com/jemalloc/jemalloc/releases/download/${VERSION}/jemalloc-${VERSION}.tar.bz2")

build() { # SRC DEST
  local src="$1" dest="$2"
  rm -rf "$dest"
  mkdir -p "$dest"
  if [ -f "$src/configure.ac" ]; then cp -a "$src/." "$dest"
  else git --git-dir="$src" archive "$VERSION" | tar -x -C "$dest"; fi
  local conf=./configure
  [ -x "$dest/configure" ] || conf=./autogen.sh # a git tree has no configure script
  (cd "$dest" && $conf --with-jemalloc-prefix=ruda_je_ --with-private-namespace=ruda_je_int_ \
     --disable-initial-exec-tls --disable-cxx --disable-stats --disable-prof --disable-fill \
     --disable-libdl --without-export --disable-shared >ruda-configure.log 2>&1) ||
    { echo "jemalloc.sh: configure failed (log: $dest/ruda-configure.log)" >&2; return 1; }
  (cd "$dest" && make -j"$(nproc)" build_lib_static >ruda-make.log 2>&1) ||
    { echo "jemalloc.sh: make failed (log: $dest/ruda-make.log)" >&2; return 1; }
  [ -f "$dest/lib/libjemalloc_pic.a" ] || return 1
  # Only the archive and the headers that say how it was configured stay.
  local keep
  keep="$(mktemp -d)"
  mkdir -p "$keep/lib" "$keep/include/jemalloc/internal"
  cp "$dest/lib/libjemalloc_pic.a" "$keep/lib/"
  strip --strip-debug "$keep/lib/libjemalloc_pic.a" 2>/dev/null || true
  cp "$dest/include/jemalloc/jemalloc.h" "$keep/include/jemalloc/"
  cp "$dest/include/jemalloc/internal/jemalloc_internal_defs.h" "$keep/include/jemalloc/internal/"
  cp "$dest"/ruda-*.log "$dest/COPYING" "$keep/" 2>/dev/null || true
  rm -rf "$dest"
  mv "$keep" "$dest"
}

case "${1:-}" in
fetch)
  dest=.deps/jemalloc
  if [ -f "$dest/lib/libjemalloc_pic.a" ]; then exit 0; fi
  mkdir -p .deps
  tarball=.deps/jemalloc-${VERSION}.tar.bz2
  if [ ! -f "$tarball" ] || ! echo "$SHA256  $tarball" | sha256sum -c --quiet 2>/dev/null; then
    ok=0
    for u in "${URLS[@]}"; do
      if curl -fsSL --retry 2 --connect-timeout 15 -o "$tarball.part" "$u" 2>/dev/null &&
         echo "$SHA256  $tarball.part" | sha256sum -c --quiet 2>/dev/null; then
        mv "$tarball.part" "$tarball"; ok=1; break
      fi
    done
    rm -f "$tarball.part"
    [ "$ok" = 1 ] || { echo "jemalloc.sh: could not download jemalloc ${VERSION}'s sources (${URLS[*]})" >&2; exit 1; }
  fi
  rm -rf .deps/jemalloc-src
  mkdir -p .deps/jemalloc-src
  tar -xjf "$tarball" -C .deps/jemalloc-src --strip-components=1
  echo "building ruda's private jemalloc ${VERSION} in $dest (once; about a minute)"
  build .deps/jemalloc-src "$dest"
  rm -rf .deps/jemalloc-src ;;
build)
  build "$2" "$3" ;;
*)
  sed -n '2,14p' "$0" >&2; exit 2 ;;
esac
