//! Builds the C example and the C contract test against the static library
//! and the committed header with the system's C compiler (`$CC`, else
//! `cc`), runs them, and checks what they print; and installs the library
//! with `scripts/install-capi.sh` into a fresh prefix, from which a new C
//! project builds and runs with pkg-config and with CMake.

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
    assert!(signals[0].ends_with("write of 8 bytes"), "the fault's access: {out}");
    assert!(signals[2].ends_with("fetch of 4 bytes"), "the fault's access: {out}");
    assert!(signals[1].starts_with("guest signal 11 SEGV_MAPERR"), "load from the hole: {out}");
    assert!(signals[2].starts_with("guest signal 11 SEGV_ACCERR"), "jump into data: {out}");
    assert!(lines.contains(&"guest killed: fetch from a non-executable page"), "{out}");
    assert!(lines.contains(&"sum = 55"), "{out}");
    let smc: Vec<&&str> = lines.iter().filter(|l| l.starts_with("self-modifying code: store of 8 bytes")).collect();
    assert_eq!(smc.len(), 1, "the guest's store to its code is seen once: {out}");
    assert!(lines.contains(&"smc: r5 = 7 after 2 translations"), "the new code ran, translated anew: {out}");
    assert!(lines.contains(&"dirty pages: 0 2"), "the pages the guest stored to, not the one it read: {out}");
    assert!(lines.contains(&"snapshot: 2 pages, page 2 holds 42"), "{out}");
    let stops: Vec<&&str> = lines.iter().filter(|l| l.starts_with("watchpoint: ")).collect();
    assert_eq!(
        stops,
        [&"watchpoint: write of 8 bytes at 0x40, pc 0x4", &"watchpoint: write of 8 bytes at 0x40, pc 0x14"],
        "each store to the watched bytes, and only those: {out}"
    );
    assert!(lines.contains(&"watched: r4 = 5, [data + 64] = 6"), "{out}");
    assert!(
        lines.contains(&"host memory: host sees 0xc0ffee, guest sees 7, released 0 then 1"),
        "guest and host see each other's stores, the release runs once at the munmap: {out}"
    );
    assert!(lines.contains(&"mmio: uart printed \"hi\", status 2"), "the device served the guest: {out}");
    assert!(lines.contains(&"mmio: released 1"), "released with its last mapping: {out}");
    assert!(lines.contains(&"after fork: parent 55, child 99"), "{out}");
    assert!(lines.iter().any(|l| l.ends_with(" [stack]") && l.contains(" rw-p ")), "{out}");
    assert!(lines.iter().any(|l| l.contains(" r-xp ")), "the text page: {out}");
    assert!(lines.iter().any(|l| l.starts_with("cpu: ") && !l.starts_with("cpu: 0 faults")), "{out}");
    assert!(lines.contains(&"leaked: 0 frames, 0 page tables, 0 VMAs"), "{out}");
}

#[test]
fn the_c_contract_test_passes() {
    let out = run(&compile("tests/c/contracts.c", "contracts", &static_flags()));
    assert!(out.lines().any(|l| l.ends_with(" passed, 0 failed")), "{out}");
}

/// The C programs of `docs/embedding.md` (its ```` ```c ```` blocks with a
/// `main`; the others are fragments) build and exit with 0.
#[test]
fn the_embedding_guides_c_programs_run() {
    let guide = std::fs::read_to_string(manifest_dir().join("../../docs/embedding.md")).unwrap();
    let programs: Vec<&str> = guide
        .split("```c\n")
        .skip(1)
        .filter_map(|block| block.split("```").next())
        .filter(|code| code.contains("int main("))
        .collect();
    assert!(programs.len() >= 2, "the guide's C programs: {}", programs.len());
    for (i, code) in programs.iter().enumerate() {
        let src = profile_dir().join(format!("guide-{i}.c"));
        std::fs::write(&src, code).unwrap();
        run(&compile(src.to_str().unwrap(), &format!("guide-{i}"), &static_flags()));
    }
}

/// `scripts/install-capi.sh` into a fresh prefix, with this build's
/// libraries (`SOFTMM_CAPI_LIBS`: no second build); returns the prefix,
/// one per `tag` (tests run in parallel).
fn install(tag: &str) -> PathBuf {
    let prefix = profile_dir().join(format!("install-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&prefix);
    let script = manifest_dir().join("../../scripts/install-capi.sh");
    let out = Command::new("bash").arg(&script).arg(&prefix).env("SOFTMM_CAPI_LIBS", profile_dir()).output().unwrap();
    assert!(out.status.success(), "install-capi.sh: {}", String::from_utf8_lossy(&out.stderr));
    prefix
}

/// Runs `exe` with no `LD_LIBRARY_PATH`: the installed program must find
/// its library by itself. Returns its output.
fn run_alone(exe: &Path) -> String {
    let out = Command::new(exe).env_remove("LD_LIBRARY_PATH").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}: {}\n{stdout}", exe.display(), String::from_utf8_lossy(&out.stderr));
    stdout
}

/// The shared libraries `exe` needs (`DT_NEEDED`), where `readelf` is
/// installed.
fn needed(exe: &Path) -> Option<Vec<String>> {
    let out = Command::new("readelf").arg("-d").arg(exe).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    Some(
        text.lines()
            .filter(|l| l.contains("(NEEDED)"))
            .filter_map(|l| Some(l.split('[').nth(1)?.trim_end_matches(']').to_string()))
            .collect(),
    )
}

fn pkg_config(prefix: &Path, package: &str) -> Vec<String> {
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", package])
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
        .output()
        .unwrap();
    assert!(flags.status.success(), "{}", String::from_utf8_lossy(&flags.stderr));
    String::from_utf8(flags.stdout).unwrap().split_whitespace().map(String::from).collect()
}

/// The installed library, as a new C project finds it: with pkg-config,
/// shared (the run path finds it: no `LD_LIBRARY_PATH`) and static (no
/// `libsoftmm.so` needed at all), each building and running the example
/// emulator and the version check; the shared object's SONAME is the
/// versioned one its links name.
#[test]
fn the_installed_library_builds_and_runs_with_pkg_config() {
    if Command::new("pkg-config").arg("--version").output().is_err() {
        eprintln!("pkg-config not installed: skipped");
        return;
    }
    let prefix = install("pkg-config");
    let version = env!("CARGO_PKG_VERSION");
    let lib = prefix.join("lib");
    for name in [format!("libsoftmm.so.{version}"), "libsoftmm.so".into(), "libsoftmm.a".into()] {
        assert!(lib.join(&name).exists(), "{name} not installed");
    }
    let shared = pkg_config(&prefix, "softmm");
    assert!(shared.iter().any(|f| f == "-lsoftmm"), "{shared:?}");
    let exe = compile("examples/emulator.c", "emulator-installed", &shared);
    assert!(run_alone(&exe).contains("sum = 55"));
    let check = compile("tests/c/version.c", "version-installed", &shared);
    assert!(run_alone(&check).contains("version ok"), "{}", run_alone(&check));
    let statik = pkg_config(&prefix, "softmm-static");
    let exe_static = compile("examples/emulator.c", "emulator-installed-static", &statik);
    assert!(run_alone(&exe_static).contains("sum = 55"));
    match (needed(&exe), needed(&exe_static)) {
        (Some(dynamic), Some(statically)) => {
            let abi = if version.starts_with("0.") {
                version.rsplit_once('.').unwrap().0.to_string()
            } else {
                version.split('.').next().unwrap().to_string()
            };
            assert!(
                dynamic.contains(&format!("libsoftmm.so.{abi}")),
                "the SONAME is not the versioned one: {dynamic:?}"
            );
            assert!(!statically.iter().any(|l| l.starts_with("libsoftmm")), "the static link needs {statically:?}");
        }
        _ => eprintln!("readelf not installed: the SONAME was not checked"),
    }
    std::fs::remove_dir_all(&prefix).unwrap();
}

/// The installed CMake package: `find_package(softmm 0.1)` and the two
/// imported targets build the example, which runs with no environment.
#[test]
fn the_installed_library_builds_and_runs_with_cmake() {
    if Command::new("cmake").arg("--version").output().is_err() {
        eprintln!("cmake not installed: skipped");
        return;
    }
    let prefix = install("cmake");
    let project = prefix.join("project");
    std::fs::create_dir_all(&project).unwrap();
    let (major, minor) = (env!("CARGO_PKG_VERSION_MAJOR"), env!("CARGO_PKG_VERSION_MINOR"));
    let example = manifest_dir().join("examples/emulator.c");
    std::fs::write(
        project.join("CMakeLists.txt"),
        format!(
            "cmake_minimum_required(VERSION 3.16)\nproject(app C)\nfind_package(softmm {major}.{minor} REQUIRED)\n\
             add_executable(app_shared {e})\ntarget_link_libraries(app_shared PRIVATE softmm::softmm)\n\
             add_executable(app_static {e})\ntarget_link_libraries(app_static PRIVATE softmm::softmm_static)\n",
            e = example.display()
        ),
    )
    .unwrap();
    let build = project.join("build");
    let configure = Command::new("cmake")
        .arg("-S")
        .arg(&project)
        .arg("-B")
        .arg(&build)
        .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display()))
        .output()
        .unwrap();
    assert!(configure.status.success(), "{}", String::from_utf8_lossy(&configure.stderr));
    let make = Command::new("cmake").arg("--build").arg(&build).output().unwrap();
    assert!(
        make.status.success(),
        "{}{}",
        String::from_utf8_lossy(&make.stdout),
        String::from_utf8_lossy(&make.stderr)
    );
    for app in ["app_shared", "app_static"] {
        assert!(run_alone(&build.join(app)).contains("sum = 55"), "{app}");
    }
    // A version the package cannot satisfy is refused.
    let newer = Command::new("cmake")
        .arg("-S")
        .arg(&project)
        .arg("-B")
        .arg(project.join("build-newer"))
        .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display()))
        .output()
        .unwrap();
    assert!(newer.status.success());
    std::fs::write(
        project.join("CMakeLists.txt"),
        format!(
            "cmake_minimum_required(VERSION 3.16)\nproject(app C)\nfind_package(softmm {} REQUIRED)\n",
            major.parse::<u32>().unwrap() + 1
        ),
    )
    .unwrap();
    let refused = Command::new("cmake")
        .arg("-S")
        .arg(&project)
        .arg("-B")
        .arg(project.join("build-refused"))
        .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display()))
        .output()
        .unwrap();
    assert!(!refused.status.success(), "a newer major version was accepted");
    std::fs::remove_dir_all(&prefix).unwrap();
}
