//! Gives the shared library the SONAME it is installed under
//! (`scripts/install-capi.sh`): `libsoftmm.so.MAJOR` from 1.0 on, and
//! `libsoftmm.so.0.MINOR` before (where Cargo's semver makes every minor
//! release incompatible), as cargo-c names them.
fn main() {
    let major = env!("CARGO_PKG_VERSION_MAJOR");
    let abi = if major == "0" { format!("0.{}", env!("CARGO_PKG_VERSION_MINOR")) } else { major.to_string() };
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libsoftmm.so.{abi}");
    println!("cargo:rerun-if-changed=build.rs");
}
