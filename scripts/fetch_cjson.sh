#!/usr/bin/env bash
# fetch_cjson.sh — brings cJSON along to a machine without a package registry (the lent GPU machine).
# On a machine with Debian's registry: downloads the libcjson1 and libcjson-dev packages and unpacks them
# into .deps/cjson (git-ignored), where CMake finds them through pkg-config:
#   a libcjson.pc with libdir and includedir under $PWD/.deps/cjson/usr on PKG_CONFIG_PATH
#   export LD_LIBRARY_PATH=$PWD/.deps/cjson/usr/lib/x86_64-linux-gnu
# (scripts/gpu_test.sh sets these up, with a copy of the .pc whose libdir and includedir point into the unpacked tree). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
root=.deps/cjson
if [ -f "$root/usr/include/cjson/cJSON.h" ]; then exit 0; fi
mkdir -p .deps/debs "$root"
if ! ls .deps/debs/libcjson1_*.deb >/dev/null 2>&1; then
  (cd .deps/debs && apt-get download libcjson1 libcjson-dev) >&2 || {
    echo "fetch_cjson: apt-get download failed (run 'apt-get update' first, on a machine with Debian's registry)" >&2
    exit 1
  }
fi
for deb in .deps/debs/libcjson*.deb; do dpkg-deb -x "$deb" "$root"; done
echo "fetch_cjson: cJSON unpacked into $root" >&2
