#!/usr/bin/env bash
# Installs the VIA C library for C programs: builds libvipl (release) and
# places include/vipl.h (and the extensions' vipl_ext.h), libvipl.so, libvipl.a and a pkg-config file
# vipl.pc under PREFIX (default /usr/local), so that
#   cc prog.c $(pkg-config --cflags --libs vipl)
# works (with PKG_CONFIG_PATH=PREFIX/lib/pkgconfig for a private prefix).
#
# Usage: scripts/install-vipl.sh [PREFIX]
set -euo pipefail
cd "$(dirname "$0")/.."
prefix="${1:-/usr/local}"
prefix="$(mkdir -p "$prefix" && cd "$prefix" && pwd)"

cargo build --release -p vipl
target="$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"

install -d "$prefix/include" "$prefix/lib/pkgconfig"
install -m 644 include/vipl.h "$prefix/include/vipl.h"
install -m 644 include/vipl_ext.h "$prefix/include/vipl_ext.h"
install -m 755 "$target/release/libvipl.so" "$prefix/lib/libvipl.so"
install -m 644 "$target/release/libvipl.a" "$prefix/lib/libvipl.a"
cat > "$prefix/lib/pkgconfig/vipl.pc" <<PC
prefix=$prefix
includedir=\${prefix}/include
libdir=\${prefix}/lib

Name: vipl
Description: VIA 1.0 VI Provider Library (via-rs)
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lvipl
Libs.private: -lpthread -ldl -lm
PC
echo "installed vipl $version under $prefix"
