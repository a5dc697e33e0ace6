//! `softmm replay`: recorded strace logs replayed cleanly, mismatches
//! reported with line numbers, final maps against the host's, and
//! `replay run`.

use super::*;

fn logs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/logs")
}

fn replay(log: &str, extra: &[&str]) -> Out {
    let path = logs().join(log);
    let mut args = vec!["replay", path.to_str().unwrap()];
    args.extend_from_slice(extra);
    softmm_in(&logs(), &args, Duration::from_secs(30))
}

fn replays_cleanly(log: &str) {
    for mode in ["recorded", "own"] {
        let out = replay(log, &["--addresses", mode]);
        assert_eq!(out.code, Some(0), "{log} --addresses {mode}:\n{}\n{}", out.stdout, out.stderr);
        assert!(out.stdout.contains("OK: 0 mismatches, 0 unparsed lines"), "{}", out.stdout);
        assert!(!out.stdout.contains("MISMATCH"), "{}", out.stdout);
    }
}

#[test]
fn replay_jvm_start() {
    replays_cleanly("java-version.log");
}

#[test]
fn replay_node_worker_threads() {
    replays_cleanly("node-workers.log");
}

#[test]
fn replay_python_threads() {
    replays_cleanly("python-threads.log");
}

#[test]
fn replay_c_realloc() {
    replays_cleanly("c-realloc.log");
    let out = replay("c-realloc.log", &["--maps"]);
    // The buffer grown by mremap was shrunk and unmapped; libc is mapped.
    assert!(out.stdout.contains("/usr/lib/x86_64-linux-gnu/libc.so.6"), "{}", out.stdout);
    assert!(out.stdout.contains("[heap]"), "{}", out.stdout);
    assert!(out.stdout.contains("mremap 7"), "{}", out.stdout);
}

#[test]
fn replay_c_edge_cases() {
    replays_cleanly("c-edge-cases.log");
}

#[test]
fn replay_handwritten_log() {
    replays_cleanly("synthetic.log");
    let out = replay("synthetic.log", &["--maps"]);
    for line in [
        "555555559000-555555569000 rw-p 00000000 00:00 0",
        "7ffff7ddc000-7ffff7dfc000 rw-p 00000000 00:00 0",
        "7ffff7dfe000-7ffff7e00000 r--p 00002000",
        "/data/table.bin",
        "7ffff7e10000-7ffff7e20000 ---p",
    ] {
        assert!(out.stdout.contains(line), "{line} missing in\n{}", out.stdout);
    }
}

#[test]
fn replay_reports_mismatches_with_line_numbers() {
    let dir = scratch("mismatch");
    let log = dir.join("bad.log");
    std::fs::write(
        &log,
        "brk(NULL) = 0x555555559000\n\
         mmap(NULL, 8192, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0) = 0x7ffff7ff0000\n\
         munmap(0x7ffff7ff1000, 4096) = 0\n\
         mprotect(0x7ffff7ff1000, 4096, PROT_READ) = 0\n\
         mmap(NULL, 4096, PROT_READ, BOGUS_FLAG, -1, 0) = 0x1000\n",
    )
    .unwrap();
    let out = softmm_in(&dir, &["replay", log.to_str().unwrap()], Duration::from_secs(10));
    assert_eq!(out.code, Some(1), "{}", out.stdout);
    assert!(
        out.stdout
            .contains("MISMATCH line 4: mprotect(0x7ffff7ff1000, 4096, PROT_READ) = 0 recorded, softmm -1 ENOMEM"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("line 5: cannot parse: unknown flag `BOGUS_FLAG`"), "{}", out.stdout);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `mremap(MREMAP_MAYMOVE | MREMAP_DONTUNMAP)` of part of an anonymous VMA
/// (once ENOMEM, and with `MREMAP_FIXED` a hang).
#[test]
fn replay_mremap_dontunmap_of_part_of_a_vma() {
    replays_cleanly("dontunmap-part-of-vma.log");
}

#[test]
fn replay_descriptors_whose_first_call_fails() {
    // Each descriptor's first mmap fails (ENOMEM, EINVAL, EEXIST, EOVERFLOW
    // with an offset near 2^63, EACCES) and a later one succeeds; strace
    // marks the unlinked files `N</path>(deleted)`.
    replays_cleanly("fd-first-use-fails.log");
}

/// The `/proc/self/maps` lines (start-end perms) of `maps` that start in
/// `[lo, hi)`.
fn maps_in(maps: &str, lo: u64, hi: u64) -> Vec<String> {
    maps.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let range = f.next()?;
            let perms = f.next()?;
            let start = u64::from_str_radix(range.split('-').next()?, 16).ok()?;
            (lo <= start && start < hi && perms.len() == 4).then(|| format!("{range} {perms}"))
        })
        .collect()
}

#[test]
fn replay_invents_no_memory_where_the_log_proves_none() {
    // Recorded by attaching to a program that mapped its window first (see
    // programs/record-attached.sh); the program printed the window's maps at
    // its end. Same-size and shrinking mremaps past a VMA's end and a
    // multi-VMA move with a hole succeed on Linux without that memory.
    replays_cleanly("pretrace-remap.log");
    let out = replay("pretrace-remap.log", &["--maps"]);
    let host = std::fs::read_to_string(logs().join("pretrace-remap.maps")).expect("host maps");
    let (lo, hi) = (0x3_0000_0000, 0x3_0008_0000);
    assert_eq!(maps_in(&out.stdout, lo, hi), maps_in(&host, lo, hi), "{}", out.stdout);
    // Each placeholder is reported with the line that proved it.
    assert!(out.stdout.contains("placeholder 300008000-300009000 for line 3 (mremap)"), "{}", out.stdout);
    assert!(out.stdout.contains("placeholder 300043000-300045000 for line 7 (mprotect)"), "{}", out.stdout);
    assert!(!out.stdout.contains("munmap 1 ("), "munmap proves nothing:\n{}", out.stdout);
}

/// Compares each process's final mappings in the replay of `log` with the
/// host's `/proc/self/maps` at its exit (`maps`, appended by the preloaded
/// `programs/dumpmaps.c`): every softmm mapping is the host's (range and
/// permissions, and the path of a file mapping), and every host mapping
/// softmm lacks is one no traced call of that program touched (the
/// executable and its bss, ld.so, `[stack]`, `[vdso]`, `[vvar]`,
/// `[vsyscall]`: mapped by the kernel before tracing began). Returns how many
/// processes it compared.
fn final_maps_match_host(log: &str, maps: &str) -> usize {
    let out = replay(log, &["--maps"]);
    let text = std::fs::read_to_string(logs().join(log)).unwrap();
    // The ranges a pid's successful calls named after its last execve.
    let touched = |pid: &str| -> Vec<(u64, u64)> {
        let num = |s: &str| {
            let s = s.trim();
            match s.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16).ok(),
                None => s.parse().ok(),
            }
        };
        let mut out = Vec::new();
        for l in text.lines().filter(|l| l.starts_with(&format!("{pid} "))) {
            if l.contains("execve(") && l.ends_with("= 0") {
                out.clear();
            }
            let Some((call, ret)) = l.rsplit_once(") = ") else { continue };
            let Some(ret) = num(ret.split_whitespace().next().unwrap_or("")) else { continue };
            let Some((name, args)) =
                call.split_whitespace().nth(1).and_then(|_| call[pid.len()..].trim().split_once('('))
            else {
                continue;
            };
            let a: Vec<u64> = args.split(", ").map(|x| num(x).unwrap_or(0)).collect();
            match name {
                "mmap" => out.push((ret, a[1])),
                "munmap" | "mprotect" | "madvise" => out.push((a[0], a[1])),
                "mremap" => out.extend([(a[0], a[1]), (ret, a[2])]),
                _ => {}
            }
        }
        out
    };
    let host = std::fs::read_to_string(logs().join(maps)).unwrap();
    let fields = |l: &str| -> Option<(String, String, String)> {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 5)
            .then(|| (f[0].to_string(), f[1].to_string(), f.get(5..).map(|p| p.join(" ")).unwrap_or_default()))
    };
    let mut compared = 0;
    for block in host.split("== pid ").skip(1) {
        let (pid, lines) = block.split_once('\n').unwrap();
        let host: Vec<(String, String, String)> = lines.lines().filter_map(fields).collect();
        let header = format!("final mappings of pid {pid} ");
        // The last process of that pid: the program that ran last in it.
        let at = out.stdout.rfind(&header).unwrap_or_else(|| panic!("no maps of pid {pid}:\n{}", out.stdout));
        let mine: Vec<(String, String, String)> = out.stdout[at..]
            .lines()
            .skip(1)
            .take_while(|l| !l.is_empty() && !l.starts_with('('))
            .filter_map(fields)
            .collect();
        for (range, perms, path) in &mine {
            assert!(
                host.iter().any(|(r, p, h)| r == range && p == perms && (path.is_empty() || h == path)),
                "{log}: pid {pid}: softmm's {range} {perms} {path} is not the host's:\n{lines}"
            );
        }
        let touched = touched(pid);
        for (range, perms, path) in &host {
            if mine.iter().any(|(r, _, _)| r == range) {
                continue;
            }
            let (s, e) = range.split_once('-').unwrap();
            let (s, e) = (u64::from_str_radix(s, 16).unwrap(), u64::from_str_radix(e, 16).unwrap());
            let pretrace = !touched.iter().any(|&(a, len)| a < e && s < a.saturating_add(len.max(1)));
            assert!(pretrace, "{log}: pid {pid}: the host's {range} {perms} {path} is missing in softmm");
        }
        compared += 1;
    }
    compared
}

/// Replays `log` cleanly and returns the `process pid ...` lines of its report.
fn process_lines(log: &str) -> Vec<String> {
    replays_cleanly(log);
    let out = replay(log, &[]);
    out.stdout.lines().filter(|l| l.starts_with("process pid ")).map(str::to_string).collect()
}

#[test]
fn replay_shell_pipeline_one_address_space_per_program() {
    // `sh -c 'seq 1000 | sort -n | tail -1'`: sh forks three children that
    // exec; each program's brk(NULL) and mprotect of its own image once
    // mismatched in a single address space.
    let procs = process_lines("pipeline.log");
    for prog in ["`sh -c seq 1000 | sort -n | tail -1`", "`seq 1000`", "`sort -n`", "`tail -1`"] {
        assert!(procs.iter().any(|l| l.contains(prog) && l.contains("0 mismatches")), "{prog} in {procs:#?}");
    }
    assert_eq!(procs.len(), 4, "{procs:#?}");
    // seq, sort and tail (sh exits without running destructors).
    assert_eq!(final_maps_match_host("pipeline.log", "pipeline.maps"), 3);
}

#[test]
fn replay_gcc_compile() {
    // gcc vforks cc1 and as (after failed execve's along PATH).
    let procs = process_lines("gcc-compile.log");
    assert_eq!(procs.len(), 3, "{procs:#?}");
    assert!(procs.iter().any(|l| l.contains("`as --64")), "{procs:#?}");
    assert!(procs.iter().any(|l| l.contains("cc1") || l.contains("/usr/lib/gcc/")), "{procs:#?}");
    assert_eq!(final_maps_match_host("gcc-compile.log", "gcc-compile.maps"), 3);
}

#[test]
fn replay_program_started_through_a_wrapper_script() {
    // programs/wrapper.sh: a subshell fork without exec, then exec of
    // python3.11 with four threads (clone3 CLONE_VM|CLONE_THREAD).
    let procs = process_lines("wrapper-python.log");
    assert!(procs.iter().any(|l| l.contains("`programs/wrapper.sh python3.11") && l.contains("ended by execve")));
    assert!(procs.iter().any(|l| l.contains("`/usr/bin/python3.11 programs/alloc_threads.py`")), "{procs:#?}");
    let out = replay("wrapper-python.log", &[]);
    assert!(out.stdout.contains("3 processes, 2 with memory calls"), "{}", out.stdout);
    assert_eq!(final_maps_match_host("wrapper-python.log", "wrapper-python.maps"), 1);
}

#[test]
fn replay_fork_child_replays_against_its_copy_of_the_parent() {
    // programs/fork_exec.c: the fork child unmaps half of its copy of the
    // parent's mapping and protects the rest; the parent's stays whole (its
    // MAP_FIXED_NOREPLACE over it is EEXIST, its mprotect of it succeeds).
    let procs = process_lines("fork-exec.log");
    assert!(procs.iter().any(|l| l.contains("(fork of pid 3818 at line 20")), "{procs:#?}");
    assert!(procs.iter().any(|l| l.contains("`true` (execve")), "{procs:#?}");
    let out = replay("fork-exec.log", &["--maps"]);
    assert!(out.stdout.contains("final mappings of pid 3819 `./fork_exec` (at its end):"), "{}", out.stdout);
    // The child's half, read-only, as it left it.
    assert!(out.stdout.contains("7f296d5b5000-7f296d5bd000 r--p"), "{}", out.stdout);
}

#[test]
fn replay_without_process_lines_starts_a_program_at_brk_null() {
    // The old `-e trace=mmap,...` set: no execve or clone lines. Each
    // program's first call, brk(NULL), starts a new address space.
    let procs = process_lines("pipeline-memory-only.log");
    assert_eq!(procs.len(), 4, "{procs:#?}");
    let out = replay("pipeline-memory-only.log", &[]);
    assert!(out.stdout.contains("no process lines in the log"), "{}", out.stdout);
    assert_eq!(out.stdout.matches(": a new program, a new address space").count(), 3, "{}", out.stdout);
}

#[test]
fn replay_open_modes_from_descriptor_lines() {
    // programs/open_modes.c: one file opened read-write, read-only,
    // write-only and O_PATH; a reused descriptor number; a dup; a memfd; a
    // fork child; an exec that keeps one descriptor and closes another.
    replays_cleanly("open-modes.log");
    let out = replay("open-modes.log", &[]);
    assert!(out.stdout.contains("open modes from the log's descriptor lines (close 5, dup 2, memfd_create 1, open 9)"));
    // Without the descriptor lines the modes are inferred from the memory
    // calls: the ENOMEM of an mprotect adding write over a hole shows the
    // descriptor was writable (it once came out EACCES), but the reused
    // number's read-only mode and the O_PATH descriptor cannot be told.
    let dir = scratch("modes");
    let log = dir.join("stripped.log");
    let text = std::fs::read_to_string(logs().join("open-modes.log")).unwrap();
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| !["openat(", "close(", "dup(", "memfd_create("].iter().any(|c| l.contains(c)))
        .collect();
    std::fs::write(&log, kept.join("\n")).unwrap();
    let out = softmm_in(&dir, &["replay", log.to_str().unwrap()], Duration::from_secs(30));
    assert!(out.stdout.contains("no descriptor lines in the log: open modes inferred"), "{}", out.stdout);
    let mismatches: Vec<&str> = out.stdout.lines().filter(|l| l.starts_with("MISMATCH")).collect();
    assert_eq!(mismatches.len(), 2, "{}", out.stdout);
    assert!(mismatches[0].contains("mprotect(0x300020000, 8192, PROT_READ|PROT_WRITE) = -1 EACCES recorded, softmm 0"));
    assert!(mismatches[1].contains("7</tmp/softmm-modes-0tHu26>, 0) = -1 EBADF recorded"), "{mismatches:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn replay_run_records_and_replays_at_once() {
    if Command::new("strace").arg("-V").output().is_err() {
        eprintln!("strace is not installed: replay_run_without_strace_is_a_clear_error covers --run");
        return;
    }
    let dir = scratch("run");
    let saved = dir.join("saved.log");
    let args = ["replay", "--run", "--save", saved.to_str().unwrap(), "--", "sh", "-c", "seq 100 | sort -n | tail -1"];
    let out = softmm_in(&dir, &args, Duration::from_secs(60));
    if out.stderr.contains("strace wrote no log") {
        eprintln!("strace cannot trace here: {}", out.stderr);
        return;
    }
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout.starts_with("100\nrecorded `sh -c seq 100 | sort -n | tail -1` (exit status 0)"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("from the log's process lines"), "{}", out.stdout);
    assert!(out.stdout.contains("open modes from the log's descriptor lines"), "{}", out.stdout);
    for prog in ["`seq 100`", "`sort -n`", "`tail -1`"] {
        assert!(out.stdout.contains(prog), "{prog} in {}", out.stdout);
    }
    assert!(out.stdout.contains("OK: 0 mismatches, 0 unparsed lines"), "{}", out.stdout);
    let log = std::fs::read_to_string(&saved).expect("the saved log");
    assert!(log.contains("execve(\"/usr/bin/sort\"") || log.contains("execve(\"/bin/sort\""), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn replay_run_without_strace_is_a_clear_error() {
    let dir = scratch("nostrace");
    let out = Command::new(env!("CARGO_BIN_EXE_softmm"))
        .args(["replay", "--run", "--", "true"])
        .env("PATH", &dir)
        .output()
        .expect("spawn softmm");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("strace is not installed (or not on PATH)"), "{err}");
    assert!(err.contains("-e trace=memory,process,open,openat,creat,close,dup,dup2,dup3,memfd_create"), "{err}");
    // A log and --run together, or --run without a command, are usage errors.
    let out = softmm_in(&dir, &["replay", "x.log", "--run", "--", "true"], Duration::from_secs(10));
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    let out = softmm_in(&dir, &["replay", "--run"], Duration::from_secs(10));
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}
