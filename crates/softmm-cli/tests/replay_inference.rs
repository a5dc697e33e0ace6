//! What the replay infers from a log beyond the memory calls: descriptors
//! without `mmap` (`ENODEV`), resource limits, unlinked files' names,
//! memfds as files of their own, hugetlb memfds and the hugetlb pool.

use std::path::{Path, PathBuf};
use std::process::Command;

fn logs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/logs")
}

struct Out {
    code: Option<i32>,
    stdout: String,
}

fn softmm(args: &[&str]) -> Out {
    let o = Command::new(env!("CARGO_BIN_EXE_softmm")).args(args).current_dir(logs()).output().expect("run softmm");
    let stderr = String::from_utf8_lossy(&o.stderr);
    Out { code: o.status.code(), stdout: format!("{}{stderr}", String::from_utf8_lossy(&o.stdout)) }
}

/// A log written by hand to a file of its own.
fn log_file(name: &str, text: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("softmm-replay-inference-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    let p = d.join(name);
    std::fs::write(&p, text).expect("write log");
    p
}

/// `programs/inference.c`, recorded as root with `softmm replay --run`
/// (its faults kept as `perf script` text of the log's threads): `mmap` of
/// a pipe (both ends), an eventfd, a socket, a directory (with and without
/// `O_DIRECTORY`) and `/dev/null` fails with `ENODEV`, or with the error
/// Linux finds first (`EACCES` for a write-only end, `EINVAL` for length
/// 0); a file unlinked between two mappings is named `(deleted)` in both;
/// two memfds of one name are two files; `RLIMIT_MEMLOCK` lowered before a
/// fork and exec, and a `MAP_LOCKED` mapping past it that succeeded: root's
/// `CAP_IPC_LOCK`. With the faults the final maps are the real ones.
#[test]
fn a_recorded_log_of_files_without_mmap_unlinked_files_memfds_and_limits() {
    let out = softmm(&[
        "replay",
        "inference.log",
        "--faults",
        "inference.faults",
        "--compare-maps",
        "inference.maps",
        "--maps",
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stdout);
    assert!(out.stdout.contains("where traced calls made them: 0 differences"), "{}", out.stdout);
    assert!(out.stdout.contains("past RLIMIT_MEMLOCK 16384: taken for CAP_IPC_LOCK (root)"), "{}", out.stdout);
    let deleted = out.stdout.lines().filter(|l| l.ends_with("/tmp/softmm-inference-file (deleted)")).count();
    assert_eq!(deleted, 4, "both mappings of each process:\n{}", out.stdout);
    // Two memfds named x in each process: four files, four inodes.
    let inodes: std::collections::BTreeSet<&str> = out
        .stdout
        .lines()
        .filter(|l| l.ends_with("/memfd:x (deleted)"))
        .filter_map(|l| l.split_whitespace().nth(4))
        .collect();
    assert_eq!(inodes.len(), 4, "{}", out.stdout);
}

/// `RLIMIT_MEMLOCK` and `RLIMIT_STACK` set before a fork and exec apply to
/// the new program's address space: a `MAP_LOCKED` mapping past the limit
/// fails with `EAGAIN`, and a stack fault past the stack limit does not
/// grow the stack (the real maps show it grown by the first fault only).
#[test]
fn limits_set_before_an_exec_apply_to_the_new_program() {
    let log = log_file(
        "limits.log",
        "7 prlimit64(0, RLIMIT_MEMLOCK, {rlim_cur=16*1024, rlim_max=16*1024}, NULL) = 0\n\
         7 setrlimit(RLIMIT_STACK, {rlim_cur=64*1024, rlim_max=RLIM_INFINITY}) = 0\n\
         7 prlimit64(0, RLIMIT_AS, {rlim_cur=1024*1024*1024, rlim_max=RLIM64_INFINITY}, NULL) = 0\n\
         7 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLD, child_tidptr=0x7f) = 8\n\
         8 execve(\"/bin/t\", [\"t\"], 0x1 /* 1 vars */) = 0\n\
         8 brk(NULL) = 0x555555559000\n\
         8 mmap(0x7f0000400000, 16384, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED|MAP_GROWSDOWN, -1, 0) = 0x7f0000400000\n\
         8 mmap(NULL, 32768, PROT_READ, MAP_PRIVATE|MAP_ANONYMOUS|MAP_LOCKED, -1, 0) = -1 EAGAIN (Resource temporarily unavailable)\n\
         8 exit_group(0) = ?\n\
         7 exit_group(0) = ?\n",
    );
    let faults = log_file(
        "limits.faults",
        "8 1.0: syscalls:sys_enter_execve: filename: 0x1\n\
         8 1.1: syscalls:sys_enter_brk: brk: 0x0\n\
         8 1.2: syscalls:sys_enter_mmap: addr: 0x7f0000400000\n\
         8 1.3: exceptions:page_fault_user: address=0x7f00003f8010 ip=0x1 error_code=0x6\n\
         8 1.4: exceptions:page_fault_user: address=0x7f00003e0000 ip=0x1 error_code=0x6\n",
    );
    let maps = log_file("limits.maps", "7f00003f8000-7f0000404000 rw-p 00000000 00:00 0\n");
    let (log, faults, maps) = (log.to_str().unwrap(), faults.to_str().unwrap(), maps.to_str().unwrap());
    let out = softmm(&["replay", log, "--faults", faults, "--compare-maps", maps]);
    assert_eq!(out.code, Some(0), "{}", out.stdout);
    assert!(out.stdout.contains("1 raised a signal in softmm"), "{}", out.stdout);
    assert!(out.stdout.contains("pid 7: RLIMIT_STACK = 65536 at line 2"), "{}", out.stdout);
    assert!(out.stdout.contains("RLIMIT_AS = 1073741824 at line 3: not modelled by softmm"), "{}", out.stdout);
}

/// `memfd_create(MFD_HUGETLB)` is a hugetlbfs file (an offset that is not
/// a huge page's is `EINVAL`), anonymous `MAP_HUGETLB` works, and the pool
/// is sized from the log; `--hugepages` sets it (one page is too few here).
#[test]
fn hugetlb_memfds_and_the_pool() {
    let log = log_file(
        "hugetlb.log",
        "9 brk(NULL) = 0x555555559000\n\
         9 memfd_create(\"hx\", MFD_HUGETLB) = 3</memfd:hx>(deleted)\n\
         9 mmap(NULL, 4096, PROT_READ, MAP_SHARED, 3</memfd:hx>(deleted), 0x1000) = -1 EINVAL (Invalid argument)\n\
         9 mmap(0x7f0000600000, 2097152, PROT_READ|PROT_WRITE, MAP_SHARED|MAP_FIXED, 3</memfd:hx>(deleted), 0) = 0x7f0000600000\n\
         9 mmap(0x7f0000a00000, 2097152, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_HUGETLB|MAP_FIXED, -1, 0) = 0x7f0000a00000\n",
    );
    let log = log.to_str().unwrap();
    let out = softmm(&["replay", log, "--maps"]);
    assert_eq!(out.code, Some(0), "{}", out.stdout);
    assert!(out.stdout.contains("hugetlb pool: 2 huge pages of 2 MiB"), "{}", out.stdout);
    assert!(out.stdout.contains("7f0000600000-7f0000800000 rw-s 00000000"), "{}", out.stdout);
    let out = softmm(&["replay", log, "--hugepages", "1"]);
    assert_eq!(out.code, Some(1), "{}", out.stdout);
    assert!(
        out.stdout.contains("MAP_HUGETLB|MAP_FIXED, -1, 0) = 0x7f0000a00000 recorded, softmm -1 ENOMEM"),
        "{}",
        out.stdout
    );
}

/// An anonymous `MAP_HUGETLB` mapping that failed with `ENOMEM` shows the
/// recording host's pool ran out: the pool is then the most huge pages the
/// log held at once (here one, as `hugetlb_madv_vs_map` records it with
/// `vm.nr_hugepages` 1), not the sum of every mapping, so the refused
/// mapping is refused in softmm too, and a mapping after the `munmap` fits.
#[test]
fn hugetlb_pool_that_ran_out() {
    let log = log_file(
        "hugetlb-ran-out.log",
        "9 brk(NULL) = 0x555555559000\n\
         9 mmap(NULL, 2097152, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_HUGETLB, -1, 0) = 0x7f0000a00000\n\
         10 mmap(NULL, 2097152, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_HUGETLB, -1, 0) = -1 ENOMEM (Cannot allocate memory)\n\
         9 munmap(0x7f0000a00000, 2097152) = 0\n\
         9 mmap(NULL, 2097152, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_HUGETLB, -1, 0) = 0x7f0000a00000\n\
         10 mmap(NULL, 2097152, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_HUGETLB, -1, 0) = -1 ENOMEM (Cannot allocate memory)\n",
    );
    let out = softmm(&["replay", log.to_str().unwrap()]);
    assert_eq!(out.code, Some(0), "{}", out.stdout);
    assert!(out.stdout.contains("hugetlb pool: 1 huge pages of 2 MiB"), "{}", out.stdout);
}

/// A successful `mseal` proves its whole range was mapped (Linux 6.12's
/// `check_mm_seal` refuses a hole with `ENOMEM`): on memory mapped before
/// tracing began (the executable's segments, as `seal_elf` seals them) it
/// gets a placeholder, sealed, so a later `mprotect` there is `EPERM` as
/// recorded.
#[test]
fn mseal_on_pretrace_memory() {
    let log = log_file(
        "mseal-pretrace.log",
        "9 brk(NULL) = 0x555555559000\n\
         9 syscall_0x1ce(0x555555550000, 0x2000, 0, 0, 0, 0) = 0\n\
         9 mprotect(0x555555551000, 4096, PROT_READ|PROT_WRITE) = -1 EPERM (Operation not permitted)\n",
    );
    let out = softmm(&["replay", log.to_str().unwrap()]);
    assert_eq!(out.code, Some(0), "{}", out.stdout);
    assert!(out.stdout.contains("placeholder 555555550000-555555552000 for line 2 (mseal)"), "{}", out.stdout);
}
