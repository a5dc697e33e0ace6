//! The committed `include/softmm.h` is what cbindgen makes of the sources
//! now. `SOFTMM_BLESS=1 cargo test -p softmm-capi --test header` rewrites it.

#[test]
fn the_committed_header_is_current() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let config = cbindgen::Config::from_file(format!("{dir}/cbindgen.toml")).expect("cbindgen.toml");
    // cbindgen follows `mod` declarations from the crate root: naming the
    // modules too would declare every function twice.
    let builder = cbindgen::Builder::new().with_config(config).with_src(format!("{dir}/src/lib.rs"));
    let mut generated = Vec::new();
    builder.generate().expect("cbindgen parses the sources").write(&mut generated);
    let path = format!("{dir}/include/softmm.h");
    if std::env::var_os("SOFTMM_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write the header");
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/softmm.h is stale: run `SOFTMM_BLESS=1 cargo test -p softmm-capi --test header` and commit it"
    );
}
