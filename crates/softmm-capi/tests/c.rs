//! Builds the C example and the C contract test against the static library
//! and the committed header with the system's C compiler (`$CC`, else
//! `cc`), runs them, and checks what they print; and checks that the
//! pkg-config template gives the flags that build the example.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory (`target/<profile>/deps`) that holds this test and the
/// libraries cargo built for it (cargo copies them up to `target/<profile>`
/// only for `cargo build`, so that copy may be stale here).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    exe.parent().expect("target/<profile>/deps/<test>").to_path_buf()
}

fn static_lib() -> PathBuf {
    let lib = profile_dir().join("libsoftmm_capi.a");
    assert!(lib.exists(), "{} not built (cargo builds it with the crate's tests)", lib.display());
    lib
}

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Compiles `src` (relative to the crate) with `flags` into the executable
/// `c-<name>` (a name per test: tests run in parallel) and returns its path.
fn compile(src: &str, name: &str, flags: &[String]) -> PathBuf {
    let out = profile_dir().join(format!("c-{name}"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let status = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pthread"])
        .arg(manifest_dir().join(src))
        .args(flags)
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(status.success(), "{cc} failed on {src}");
    out
}

fn static_flags() -> Vec<String> {
    vec![
        format!("-I{}", manifest_dir().join("include").display()),
        static_lib().display().to_string(),
        "-ldl".into(),
        "-lm".into(),
    ]
}

fn run(exe: &Path) -> String {
    let out = Command::new(exe).output().expect("run the C program");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{} failed: {:?}\n{stdout}\n{}",
        exe.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn the_c_emulator_example_runs() {
    let out = run(&compile("examples/emulator.c", "emulator", &static_flags()));
    let lines: Vec<&str> = out.lines().collect();
    let signals: Vec<&&str> = lines.iter().filter(|l| l.starts_with("guest signal")).collect();
    assert_eq!(signals.len(), 3, "{out}");
    assert!(signals[0].starts_with("guest signal 11 SEGV_ACCERR"), "store into text: {out}");
    assert!(signals[1].starts_with("guest signal 11 SEGV_MAPERR"), "load from the hole: {out}");
    assert!(signals[2].starts_with("guest signal 11 SEGV_ACCERR"), "jump into data: {out}");
    assert!(lines.contains(&"guest killed: fetch from a non-executable page"), "{out}");
    assert!(lines.contains(&"sum = 55"), "{out}");
    assert!(lines.contains(&"after fork: parent 55, child 99"), "{out}");
    assert!(lines.iter().any(|l| l.ends_with(" [stack]") && l.contains(" rw-p ")), "{out}");
    assert!(lines.iter().any(|l| l.contains(" r-xp ")), "the text page: {out}");
    assert!(lines.contains(&"leaked: 0 frames, 0 page tables, 0 VMAs"), "{out}");
}

#[test]
fn the_c_contract_test_passes() {
    let out = run(&compile("tests/c/contracts.c", "contracts", &static_flags()));
    assert!(out.lines().any(|l| l.ends_with(" passed, 0 failed")), "{out}");
}

/// `softmm.pc.in` with the build tree as its prefix gives the flags that
/// build and link the example (against the shared library, found at run
/// time through `LD_LIBRARY_PATH`).
#[test]
fn the_pkg_config_file_builds_the_example() {
    if Command::new("pkg-config").arg("--version").output().is_err() {
        eprintln!("pkg-config not installed: skipped");
        return;
    }
    let dir = profile_dir().join("pkgconfig-test");
    std::fs::create_dir_all(&dir).unwrap();
    let template = std::fs::read_to_string(manifest_dir().join("softmm.pc.in")).unwrap();
    let pc = template
        .replace("@PREFIX@", &profile_dir().display().to_string())
        .replace("@LIBDIR@", &profile_dir().display().to_string())
        .replace("@INCLUDEDIR@", &manifest_dir().join("include").display().to_string())
        .replace("@VERSION@", env!("CARGO_PKG_VERSION"));
    assert!(!pc.contains('@'), "an unreplaced variable in softmm.pc.in: {pc}");
    std::fs::write(dir.join("softmm.pc"), pc).unwrap();
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", "softmm"])
        .env("PKG_CONFIG_PATH", &dir)
        .output()
        .unwrap();
    assert!(flags.status.success(), "{}", String::from_utf8_lossy(&flags.stderr));
    let flags: Vec<String> = String::from_utf8(flags.stdout).unwrap().split_whitespace().map(String::from).collect();
    assert!(flags.iter().any(|f| f == "-lsoftmm_capi"), "{flags:?}");
    let exe = compile("examples/emulator.c", "emulator-shared", &flags);
    let out = Command::new(&exe).env("LD_LIBRARY_PATH", profile_dir()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("sum = 55"));
}
