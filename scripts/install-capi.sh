#!/usr/bin/env bash
# Builds softmm's C library and installs it with its header and pkg-config
# file under PREFIX (default /usr/local):
#   PREFIX/lib/libsoftmm_capi.{a,so}, PREFIX/include/softmm.h,
#   PREFIX/lib/pkgconfig/softmm.pc
# so that `cc app.c $(pkg-config --cflags --libs softmm)` builds against it.
set -euo pipefail
prefix=${1:-/usr/local}
root=$(cd "$(dirname "$0")/.." && pwd)
cargo build --release -p softmm-capi --manifest-path "$root/Cargo.toml"
target=${CARGO_TARGET_DIR:-$root/target}/release
crate=$root/crates/softmm-capi
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$crate/Cargo.toml" | head -n 1)
install -d "$prefix/lib/pkgconfig" "$prefix/include"
install -m 644 "$target/libsoftmm_capi.a" "$prefix/lib/"
install -m 755 "$target/libsoftmm_capi.so" "$prefix/lib/"
install -m 644 "$crate/include/softmm.h" "$prefix/include/"
sed -e "s|@PREFIX@|$prefix|" -e "s|@LIBDIR@|$prefix/lib|" -e "s|@INCLUDEDIR@|$prefix/include|" \
  -e "s|@VERSION@|$version|" "$crate/softmm.pc.in" >"$prefix/lib/pkgconfig/softmm.pc"
echo "installed softmm $version under $prefix"
