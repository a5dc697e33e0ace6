#!/usr/bin/env bash
# Builds softmm's C library and installs it under PREFIX (default /usr/local):
#   PREFIX/lib/libsoftmm.so.VERSION, its SONAME link and libsoftmm.so,
#   PREFIX/lib/libsoftmm.a, PREFIX/include/softmm.h,
#   PREFIX/lib/pkgconfig/softmm.pc and softmm-static.pc,
#   PREFIX/lib/cmake/softmm/softmmConfig.cmake (find_package(softmm)).
# A program built with `pkg-config --cflags --libs softmm` or CMake's
# softmm::softmm runs without LD_LIBRARY_PATH (the run path points at
# PREFIX/lib); softmm-static / softmm::softmm_static link the archive.
#
# The build uses the `capi` profile (release, no debug info) in
# CARGO_TARGET_DIR, else a cache directory outside the checkout. With
# SOFTMM_CAPI_LIBS=DIR it builds nothing and installs libsoftmm_capi.{so,a}
# from DIR instead (the test of this script does that with its own build).
set -euo pipefail
prefix=${1:-/usr/local}
root=$(cd "$(dirname "$0")/.." && pwd)
crate=$root/crates/softmm-capi
if [[ -n ${SOFTMM_CAPI_LIBS:-} ]]; then
  libs=$SOFTMM_CAPI_LIBS
else
  target=${CARGO_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/softmm/target}
  CARGO_TARGET_DIR=$target cargo build --profile capi -p softmm-capi --manifest-path "$root/Cargo.toml"
  libs=$target/capi
fi
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$crate/Cargo.toml" | head -n 1)
major=${version%%.*}
minor=${version#*.}
minor=${minor%%.*}
# The SONAME build.rs gives the library.
if [[ $major == 0 ]]; then abi=0.$minor; else abi=$major; fi
libdir=$prefix/lib
install -d "$libdir/pkgconfig" "$libdir/cmake/softmm" "$prefix/include"
install -m 755 "$libs/libsoftmm_capi.so" "$libdir/libsoftmm.so.$version"
ln -sf "libsoftmm.so.$version" "$libdir/libsoftmm.so.$abi"
ln -sf "libsoftmm.so.$abi" "$libdir/libsoftmm.so"
install -m 644 "$libs/libsoftmm_capi.a" "$libdir/libsoftmm.a"
# The archive holds the standard library's objects with their debug
# sections, which the profile's strip does not reach (24 MB -> 16 MB).
if command -v strip >/dev/null; then strip --strip-debug "$libdir/libsoftmm.a"; fi
install -m 644 "$crate/include/softmm.h" "$prefix/include/"
fill() {
  sed -e "s|@PREFIX@|$prefix|" -e "s|@LIBDIR@|$libdir|" -e "s|@INCLUDEDIR@|$prefix/include|" \
    -e "s|@VERSION@|$version|" -e "s|@ABI@|$abi|" "$1" >"$2"
}
fill "$crate/softmm.pc.in" "$libdir/pkgconfig/softmm.pc"
fill "$crate/softmm-static.pc.in" "$libdir/pkgconfig/softmm-static.pc"
fill "$crate/cmake/softmmConfig.cmake.in" "$libdir/cmake/softmm/softmmConfig.cmake"
fill "$crate/cmake/softmmConfigVersion.cmake.in" "$libdir/cmake/softmm/softmmConfigVersion.cmake"
echo "installed softmm $version under $prefix"
