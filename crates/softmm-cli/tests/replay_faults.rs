//! `softmm replay --run` with page faults against the host: a small C
//! program (`tests/data/faults.c`) whose final mappings depend on which of
//! its VMAs were written (anon_vma), recorded with strace and perf, dumps
//! its own `/proc/self/maps` before it exits; the replay with its faults
//! must end with the same mappings where traced calls made them, and the
//! replay without them must not (so the comparison can fail). Skipped, with
//! the reason printed, where `cc`, `strace` or `perf` is missing or may not
//! trace.

use std::path::{Path, PathBuf};
use std::process::Command;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("softmm-replay-faults-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn softmm(args: &[&str]) -> Out {
    let o = Command::new(env!("CARGO_BIN_EXE_softmm")).args(args).output().expect("run softmm");
    Out {
        code: o.status.code(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// Builds `tests/data/NAME.c` into `dir`, or says why not.
fn build(dir: &Path, name: &str) -> Result<PathBuf, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(format!("{name}.c"));
    let exe = dir.join(name);
    let o = Command::new("cc").arg("-O1").arg("-o").arg(&exe).arg(&src).output().map_err(|e| format!("cc: {e}"))?;
    if !o.status.success() {
        return Err(format!("cc failed: {}", String::from_utf8_lossy(&o.stderr)));
    }
    Ok(exe)
}

#[test]
fn a_replay_with_faults_ends_with_the_real_maps() {
    let dir = scratch("maps");
    let exe = match build(&dir, "faults") {
        Ok(e) => e,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let (log, maps) = (dir.join("t.log"), dir.join("t.maps"));
    let (log_s, maps_s) = (log.to_str().unwrap(), maps.to_str().unwrap());
    let run =
        softmm(&["replay", "--run", "--save", log_s, "--compare-maps", maps_s, "--", exe.to_str().unwrap(), maps_s]);
    if run.stderr.contains("strace") && run.code == Some(2) {
        eprintln!("skipped: {}", run.stderr.trim());
        return;
    }
    if let Some(l) = run.stdout.lines().find(|l| l.starts_with("no page faults recorded")) {
        eprintln!("skipped: {l}");
        return;
    }
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("where traced calls made them: 0 differences"), "{}", run.stdout);
    assert!(run.stdout.contains("0 raised a signal in softmm"), "{}", run.stdout);
    // The same from the saved recording, given separately.
    let perf = dir.join("t.perf.data");
    let again = softmm(&["replay", log_s, "--faults", perf.to_str().unwrap(), "--compare-maps", maps_s]);
    assert_eq!(again.code, Some(0), "{}\n{}", again.stdout, again.stderr);
    // Without the faults, the two written neighbours merge: the
    // comparison names them.
    let without = softmm(&["replay", log_s, "--compare-maps", maps_s]);
    assert_eq!(without.code, Some(1), "{}", without.stdout);
    assert!(without.stdout.contains("MISMATCH final maps: real"), "{}", without.stdout);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--faults` reads `perf script` text as well as `perf.data`; a fault
/// stream that disagrees with the log is reported, not silently misplaced.
#[test]
fn faults_from_a_script_written_by_hand() {
    let dir = scratch("script");
    let log = dir.join("t.log");
    std::fs::write(
        &log,
        "7 brk(NULL) = 0x555555559000\n\
         7 mmap(0x7f0000000000, 16384, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED, -1, 0) = 0x7f0000000000\n\
         7 mmap(0x7f0000010000, 16384, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED, -1, 0) = 0x7f0000010000\n\
         7 mremap(0x7f0000010000, 16384, 16384, MREMAP_MAYMOVE|MREMAP_FIXED, 0x7f0000004000) = 0x7f0000004000\n\
         7 exit_group(0) = ?\n",
    )
    .unwrap();
    // Both written before the move: two anon_vmas, which Linux does not
    // merge; a fetch from the moved, non-executable VMA.
    let script = dir.join("t.script");
    std::fs::write(
        &script,
        "t 7 [000] 1.0: syscalls:sys_enter_brk: brk: 0x0\n\
         t 7 [000] 1.1: syscalls:sys_enter_mmap: addr: 0x7f0000000000\n\
         t 7 [000] 1.2: exceptions:page_fault_user: address=0x7f0000000010 ip=0x1 error_code=0x6\n\
         t 7 [000] 1.3: syscalls:sys_enter_mmap: addr: 0x7f0000010000\n\
         t 7 [000] 1.4: exceptions:page_fault_user: address=0x7f0000011000 ip=0x1 error_code=0x4\n\
         t 7 [000] 1.5: exceptions:page_fault_user: address=0x7f0000010008 ip=0x1 error_code=0x7\n\
         t 7 [000] 1.6: syscalls:sys_enter_mremap: addr: 0x7f0000010000\n\
         t 7 [000] 1.7: exceptions:page_fault_user: address=0x7f0000004000 ip=0x7f0000004000 error_code=0x15\n\
         t 7 [000] 1.8: syscalls:sys_enter_exit_group: error_code: 0x0\n",
    )
    .unwrap();
    let real = dir.join("t.maps");
    std::fs::write(
        &real,
        "7f0000000000-7f0000004000 rw-p 00000000 00:00 0\n7f0000004000-7f0000008000 rw-p 00000000 00:00 0\n",
    )
    .unwrap();
    let (log_s, script_s, real_s) = (log.to_str().unwrap(), script.to_str().unwrap(), real.to_str().unwrap());
    let out = softmm(&["replay", log_s, "--faults", script_s, "--compare-maps", real_s]);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("4 replayed (1 read, 2 write, 1 fetch)"), "{}", out.stdout);
    assert!(out.stdout.contains("1 raised a signal in softmm"), "{}", out.stdout);
    assert!(out.stdout.contains("Execute at 0x7f0000004000: SIGSEGV (AccErr)"), "{}", out.stdout);
    let without = softmm(&["replay", log_s, "--compare-maps", real_s]);
    assert_eq!(without.code, Some(1), "{}", without.stdout);
    // A stream whose calls are not the log's.
    std::fs::write(&script, "t 7 [000] 1.0: syscalls:sys_enter_munmap: addr: 0x0\n").unwrap();
    let out = softmm(&["replay", log_s, "--faults", script_s]);
    assert!(out.stdout.contains("thread 7: perf's call 1 is munmap, the log's is brk"), "{}", out.stdout);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fault that perf saw before another thread's `munmap` entered the
/// kernel is replayed before it, though its own thread's next call comes
/// after the `munmap` in the log (found replaying Node's worker threads:
/// 125 such faults raised SIGSEGV in softmm before).
#[test]
fn a_fault_before_another_threads_munmap_is_replayed_before_it() {
    let dir = scratch("order");
    let log = dir.join("t.log");
    std::fs::write(
        &log,
        "7 brk(NULL) = 0x555555559000\n\
         7 mmap(0x7f0000000000, 16384, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED, -1, 0) = 0x7f0000000000\n\
         8 munmap(0x7f0000000000, 16384) = 0\n\
         7 mmap(0x7f0000100000, 4096, PROT_READ, MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED, -1, 0) = 0x7f0000100000\n",
    )
    .unwrap();
    let script = dir.join("t.script");
    std::fs::write(
        &script,
        "7 1.0: syscalls:sys_enter_brk: brk: 0x0\n\
         7 1.1: syscalls:sys_enter_mmap: addr: 0x7f0000000000\n\
         7 1.2: exceptions:page_fault_user: address=0x7f0000000010 ip=0x1 error_code=0x6\n\
         8 1.3: syscalls:sys_enter_munmap: addr: 0x7f0000000000\n\
         7 1.4: exceptions:page_fault_user: address=0x7f0000001000 ip=0x1 error_code=0x6\n\
         7 1.5: syscalls:sys_enter_mmap: addr: 0x7f0000100000\n",
    )
    .unwrap();
    let out = softmm(&["replay", log.to_str().unwrap(), "--faults", script.to_str().unwrap()]);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    // The first before the munmap; the second after it, as on the host
    // (where it took SIGSEGV).
    assert!(out.stdout.contains("2 replayed (0 read, 2 write, 0 fetch)"), "{}", out.stdout);
    assert!(out.stdout.contains("1 raised a signal in softmm"), "{}", out.stdout);
    assert!(out.stdout.contains("Write at 0x7f0000001000: SIGSEGV (MapErr)"), "{}", out.stdout);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The default arena has a frame for every recorded fault: a program that
/// writes 96 MiB it never unmaps replays without a signal (found replaying
/// a JVM's 1.1 GiB young generation: 281k of its 294k faults raised
/// `SIGBUS` in softmm, the arena being sized for the populating calls
/// only).
#[test]
fn the_arena_holds_a_page_for_every_recorded_fault() {
    let dir = scratch("arena");
    let log = dir.join("t.log");
    const PAGES: u64 = 24 << 10;
    std::fs::write(
        &log,
        format!(
            "7 mmap(0x7f0000000000, {}, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED, -1, 0) = \
             0x7f0000000000\n7 exit_group(0) = ?\n",
            PAGES * 4096
        ),
    )
    .unwrap();
    let mut script = String::from("t 7 [000] 1.0: syscalls:sys_enter_mmap: addr: 0x7f0000000000\n");
    for i in 0..PAGES {
        script.push_str(&format!(
            "t 7 [000] 1.1: exceptions:page_fault_user: address={:#x} ip=0x1 error_code=0x6\n",
            0x7f00_0000_0000u64 + i * 4096
        ));
    }
    script.push_str("t 7 [000] 1.2: syscalls:sys_enter_exit_group: error_code: 0x0\n");
    let path = dir.join("t.script");
    std::fs::write(&path, script).unwrap();
    let out = softmm(&["replay", log.to_str().unwrap(), "--faults", path.to_str().unwrap()]);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains(&format!("{PAGES} replayed (0 read, {PAGES} write, 0 fetch)")), "{}", out.stdout);
    assert!(out.stdout.contains("0 raised a signal in softmm"), "{}", out.stdout);
    let _ = std::fs::remove_dir_all(&dir);
}
