//! Random sequences of memory calls run on the host kernel under strace,
//! then replayed by `softmm replay --maps`: every call and each sequence's
//! final mappings must agree with the host's.
//!
//! A runner process (this test binary re-executed, single-threaded) opens
//! three files (read-write, read-only, write-only) and a memfd, then forks
//! one child per sequence. A child runs its sequence with raw system calls
//! inside a 1 MiB window: anonymous and file mappings, private and shared,
//! fixed and noreplace, hints, bad lengths and flags, descriptors it opens
//! itself (read-write, read-only, write-only) whose first use often fails,
//! munmap, mprotect, madvise, mremap with and without `MREMAP_FIXED` /
//! `MREMAP_DONTUNMAP`, shrinks over holes and across VMAs, `mlock`,
//! `mlock2`, `munlock`, `mlockall`, `munlockall`, `MAP_LOCKED`, `mseal` and
//! MDWE (`prctl(PR_SET_MDWE)`), huge and wrapping lengths in every length
//! argument; then it writes its `/proc/self/smaps` to the runner's standard
//! output and exits. Seals and MDWE cannot be undone: each sequence runs in
//! a process of its own (below), so they end with it. The runner has no
//! `CAP_IPC_LOCK` and an 8 MiB memlock limit (see `drop_ipc_lock`). A sequence may fork up to twice
//! (the child runs the rest of the sequence, then the parent) and exec once:
//! every process that reaches the exec writes its maps, then `execve`s this
//! test binary, which runs the rest of the sequence as a new program (a
//! fresh address space; the runner's descriptors and the child's own opens
//! stay open across it, those opened `O_CLOEXEC` do not) and writes its maps
//! at its end. strace (`-f -y -e trace=memory,process,openat,close,...`)
//! records the runner and all of these; the replay forks the runner's softmm
//! address space for each child, exactly as the kernel did, and starts a new
//! one at each `execve`. Every call of every process must agree, and so must
//! the maps each process wrote (at its execve and at its end) with the
//! replay's final maps of that address space: bounds, permissions, offset
//! and the lock and seal flags of smaps' `VmFlags` (`lo`, `lf`, `sl`).
//!
//! Arguments that could touch the runner's own memory outside the window are
//! never generated: a fixed range lies in the window or ends past
//! `TASK_SIZE` (refused before anything is unmapped), a munmap or shrinking
//! mremap length stays in the window or passes `TASK_SIZE` or 2^64 (refused),
//! and an mprotect or madvise walk that leaves the window meets the hole above
//! it. `SOFTMM_REPLAY_SEQUENCES` sets the number of sequences (default 2048,
//! in batches of 64 per strace run); `SOFTMM_REPLAY_SEED` the first seed.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const P: u64 = 4096;
/// The window: 1 MiB at 12 GiB, far from anything the runner maps.
const W: u64 = 0x3_0000_0000;
const W_PAGES: u64 = 256;
const W_END: u64 = W + W_PAGES * P;
const TASK_SIZE: u64 = 0x7fff_ffff_f000;
const RUNNER_ENV: &str = "SOFTMM_REPLAY_RUNNER";
/// Marks the runner's lines among libtest's.
const MARK: &str = "@@softmm@@";
const BATCH: usize = 64;

/// Where a mapping's descriptor comes from.
#[derive(Clone, Copy, Debug)]
enum FdSrc {
    Anon,
    /// Opened by the runner: 0 read-write, 1 read-only, 2 write-only, 3 memfd.
    Inherited(usize),
    /// A slot of the child's own opens (an unopened or closed slot is a
    /// number no descriptor has: `EBADF`).
    Slot(usize),
}

#[derive(Clone, Copy, Debug)]
enum Op {
    /// `openat(file, mode)` into a slot.
    Open {
        slot: usize,
        file: usize,
        mode: i32,
    },
    Close {
        slot: usize,
    },
    Mmap {
        addr: u64,
        len: u64,
        prot: i32,
        flags: i32,
        fd: FdSrc,
        off: u64,
    },
    Munmap {
        addr: u64,
        len: u64,
    },
    Mprotect {
        addr: u64,
        len: u64,
        prot: i32,
    },
    Madvise {
        addr: u64,
        len: u64,
        advice: i32,
    },
    Mremap {
        old: u64,
        old_len: u64,
        new_len: u64,
        flags: i32,
        new_addr: u64,
    },
    /// `fork()`: the child runs the rest of the sequence on its copy, then
    /// the parent does on its own.
    Fork,
    /// `execve()` of this test binary: the process writes its maps, then
    /// runs the rest of the sequence as a new program (a fresh address
    /// space, its descriptors but the close-on-exec ones).
    Exec,
    /// `mlock(addr, len)` (`flags` `None`) or `mlock2(addr, len, flags)`.
    Mlock {
        addr: u64,
        len: u64,
        flags: Option<i32>,
    },
    Munlock {
        addr: u64,
        len: u64,
    },
    /// `mlockall(flags)`: never `MCL_CURRENT` with a valid set of flags,
    /// which would lock (or, past the limit, refuse for) the runner's own
    /// memory, which the log does not show.
    Mlockall {
        flags: i32,
    },
    Munlockall,
    /// `mseal(addr, len, flags)` (system call 462): irreversible, like the
    /// rest, for the sequence's own process only.
    Mseal {
        addr: u64,
        len: u64,
        flags: u64,
    },
    /// `prctl(PR_SET_MDWE, arg2, arg3, 0, 0)`, or with `get`
    /// `prctl(PR_GET_MDWE, arg2, 0, 0, 0)`.
    Mdwe {
        get: bool,
        arg2: u64,
        arg3: u64,
    },
}

const SLOTS: usize = 4;
const FILES: usize = 3;

mod gen;
mod runner;

use gen::*;
use runner::*;

// ---------------------------------------------------------------------------
// The runner (on the host, under strace)
// ---------------------------------------------------------------------------

/// The runner's entry point: re-executed by [`run_batch`] under strace, and
/// by a child's [`Op::Exec`] (with [`EXEC_ENV`] set) to run the rest of its
/// sequence as a new program.
#[test]
#[ignore = "entry point of the runner process, run under strace by run_batch"]
fn runner_entry() {
    if let Some(input) = std::env::var_os(RUNNER_ENV) {
        match std::env::var(EXEC_ENV) {
            Ok(state) => exec_main(Path::new(&input), &state),
            Err(_) => runner_main(Path::new(&input)),
        }
    }
}
// ---------------------------------------------------------------------------
// Comparing
// ---------------------------------------------------------------------------

/// The `VmFlags` compared: the lock and seal flags (the host prints more,
/// some of which softmm does not model).
const COMPARED_FLAGS: [&str; 3] = ["lo", "lf", "sl"];

/// `start-end perms offset` of the maps lines that start in the window,
/// each followed by the compared flags of the smaps `VmFlags:` line after
/// it (the host's smaps, the replay's `--maps --vm-flags`).
fn window_lines<'a>(lines: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut out = Vec::new();
    // Whether the last maps line was the window's (its VmFlags follow).
    let mut in_window = false;
    for l in lines {
        if let Some(flags) = l.strip_prefix("VmFlags:") {
            if let (true, Some(last)) = (in_window, out.last_mut()) {
                for f in flags.split_whitespace().filter(|f| COMPARED_FLAGS.contains(f)) {
                    *last += " ";
                    *last += f;
                }
            }
            continue;
        }
        let mut f = l.split_whitespace();
        let (Some(range), Some(perms), Some(off)) = (f.next(), f.next(), f.next()) else { continue };
        let Some(start) = range.split('-').next().and_then(|s| u64::from_str_radix(s, 16).ok()) else { continue };
        if perms.len() != 4 {
            continue;
        }
        in_window = (W..W_END).contains(&start);
        if in_window {
            out.push(format!("{range} {perms} {off}"));
        }
    }
    out
}

struct Batch {
    /// Per sequence: the pid of each of its processes and the host's window
    /// maps at its end, in the order written (a pid that exec'd has two: at
    /// its execve, then at the new program's end).
    host: Vec<Vec<(u64, Vec<String>)>>,
}

/// Runs `seqs` under strace; `None` when strace is missing or cannot trace
/// (no sequence wrote its maps). A runner that stops part way panics.
fn run_batch(dir: &Path, seqs: &[Vec<Op>]) -> Option<Batch> {
    let input = dir.join("ops.txt");
    std::fs::write(&input, encode(seqs)).expect("ops file");
    let log = dir.join("runner.strace");
    let out = Command::new("strace")
        .args([
            "-f",
            "-y",
            "-e",
            "trace=memory,process,openat,close,dup,dup2,dup3,memfd_create,setrlimit,prlimit64,prctl",
            "-o",
        ])
        .arg(&log)
        .arg(std::env::current_exe().expect("current_exe"))
        .args(["runner_entry", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(RUNNER_ENV, &input)
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut host: Vec<Vec<(u64, Vec<String>)>> = vec![Vec::new(); seqs.len()];
    let mut blocks = 0;
    let mut rest = stdout.as_ref();
    while let Some(at) = rest.find(MARK) {
        let block = &rest[at + MARK.len()..];
        let end = block.find("@@end").expect("block end");
        let mut lines = block[..end].lines();
        let head: Vec<&str> = lines.next()?.split_whitespace().collect();
        let (i, pid): (usize, u64) = (head.get(1)?.parse().ok()?, head.get(3)?.parse().ok()?);
        host.get_mut(i)?.push((pid, window_lines(lines)));
        blocks += 1;
        rest = &block[end..];
    }
    if blocks == 0 {
        eprintln!("runner did not run under strace ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr));
        return None;
    }
    assert!(
        !host.iter().any(Vec::is_empty),
        "runner did not finish under strace ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Some(Batch { host })
}

/// Replays a batch's log; returns the failures (empty if all agree), the
/// number of memory calls the sequences' processes made and the number of
/// programs they exec'd.
fn check_batch(dir: &Path, first_seed: u64, seqs: &[Vec<Op>], b: &Batch) -> (Vec<String>, usize, usize) {
    let log = dir.join("runner.strace");
    let out = Command::new(env!("CARGO_BIN_EXE_softmm"))
        .args(["replay", "--maps", "--vm-flags"])
        .arg(&log)
        .output()
        .expect("softmm replay");
    let report = String::from_utf8_lossy(&out.stdout);
    // Kept with the log if the batch fails (see `keep_failed`).
    let _ = std::fs::write(dir.join("replay.txt"), report.as_bytes());
    let forks: Vec<u64> = b.host.iter().flatten().map(|&(pid, _)| pid).collect();
    // Calls of the sequences' processes (an exec'd program's include its
    // start-up: the dynamic loader, the Rust runtime, libtest).
    let child_calls: usize = report
        .lines()
        .filter_map(|l| {
            let pid: u64 = l.strip_prefix("process pid ")?.split(' ').next()?.parse().ok()?;
            forks.contains(&pid).then_some(())?;
            l.split("): ").nth(1)?.split(' ').next()?.parse::<usize>().ok()
        })
        .sum();
    let mut failures = Vec::new();
    for (i, procs) in b.host.iter().enumerate() {
        let seed = first_seed + i as u64;
        let mut f = String::new();
        let mut pids: Vec<u64> = procs.iter().map(|&(p, _)| p).collect();
        pids.dedup();
        for pid in pids {
            let host: Vec<&Vec<String>> = procs.iter().filter(|&&(p, _)| p == pid).map(|(_, m)| m).collect();
            for m in report.lines().filter(|l| l.starts_with("MISMATCH") && l.contains(&format!("(pid {pid})"))) {
                f += &format!("  {m}\n");
            }
            // The replay's address spaces of this pid, in order. It omits a
            // process that made no memory call before its execve (its maps
            // are its parent's), so the lists are matched from the end.
            let header = format!("final mappings of pid {pid} ");
            let mine: Vec<Vec<String>> = report
                .match_indices(&header)
                .map(|(at, _)| window_lines(report[at..].lines().skip(1).take_while(|l| !l.is_empty())))
                .collect();
            let skip = host.len().checked_sub(mine.len()).filter(|&d| d == 0 || (d == 1 && host.len() == 2));
            match skip {
                Some(d) => {
                    for (k, (h, m)) in host[d..].iter().zip(&mine).enumerate() {
                        if *h != m {
                            let which = if k + d + 1 < host.len() { "at its execve" } else { "at its end" };
                            f += &format!("  maps of pid {pid} {which} differ\n  host:   {h:?}\n  softmm: {m:?}\n");
                        }
                    }
                }
                None => {
                    f += &format!(
                        "  pid {pid}: {} address spaces on the host, {} in the replay\n",
                        host.len(),
                        mine.len()
                    )
                }
            }
        }
        if !f.is_empty() {
            let pids: Vec<u64> = procs.iter().map(|&(p, _)| p).collect();
            failures.push(format!("seed {seed} (pids {pids:?}):\n{f}  sequence: {:?}\n", seqs[i]));
        }
    }
    let other: Vec<&str> = report
        .lines()
        .filter(|l| {
            (l.starts_with("MISMATCH") && !forks.iter().any(|p| l.contains(&format!("(pid {p})"))))
                || l.contains("cannot parse")
        })
        .collect();
    if !other.is_empty() {
        failures.push(format!("runner lines:\n{}", other.join("\n")));
    }
    let execs = report
        .lines()
        .filter(|l| {
            l.strip_prefix("process pid ")
                .and_then(|r| r.split(' ').next()?.parse::<u64>().ok())
                .is_some_and(|pid| forks.contains(&pid) && l.contains("(execve at line "))
        })
        .count();
    (failures, child_calls, execs)
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn scratch() -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("softmm-replay-random-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// Copies a failed batch's files (`ops.txt`, the sequences; `runner.strace`,
/// the host's log; `replay.txt`, the replay's report) out of the scratch
/// directory, which the next batch reuses and the end removes, into one
/// named after the batch, and says where: a failure that depends on how
/// strace interleaved the processes' lines (the machine's load) may not
/// come back when the seed is run again.
fn keep_failed(dir: &Path, first_seed: u64) -> String {
    let kept = std::env::temp_dir().join(format!("softmm-replay-failed-{}-seed{first_seed}", std::process::id()));
    let _ = std::fs::remove_dir_all(&kept);
    let copied = std::fs::create_dir_all(&kept).is_ok()
        && ["ops.txt", "runner.strace", "replay.txt"].iter().all(|f| std::fs::copy(dir.join(f), kept.join(f)).is_ok());
    if copied {
        format!(
            "batch from seed {first_seed}: its files are kept in {d}; replay the log with `softmm replay --maps \
             {d}/runner.strace`",
            d = kept.display()
        )
    } else {
        format!("batch from seed {first_seed}: its files could not be kept in {}", kept.display())
    }
}

/// Runs the sequences of `seeds` and returns their failures.
fn run_seeds(seeds: &[u64]) -> Option<Vec<String>> {
    let dir = scratch();
    let mut failures = Vec::new();
    let (mut calls, mut execs) = (0, 0);
    for chunk in seeds.chunks(BATCH) {
        let seqs: Vec<Vec<Op>> = chunk.iter().map(|&s| gen_sequence(s)).collect();
        let b = run_batch(&dir, &seqs)?;
        let (f, c, e) = check_batch(&dir, chunk[0], &seqs, &b);
        calls += c;
        execs += e;
        if !f.is_empty() {
            failures.push(keep_failed(&dir, chunk[0]));
        }
        failures.extend(f);
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "{} sequences ({calls} memory calls in their processes, {execs} programs exec'd by them) recorded on the host \
         and replayed; {} differ",
        seeds.len(),
        failures.len()
    );
    Some(failures)
}

/// Sequences that once differed (minimized), in the encoding of [`encode`].
const REGRESSIONS: &[(&str, &str)] = &[
    (
        // The replay placed a non-fixed MAP_SHARED_VALIDATE mapping with
        // MAP_FIXED_NOREPLACE, which MAP_SHARED_VALIDATE refuses (EOPNOTSUPP).
        "MAP_SHARED_VALIDATE without a fixed address, anywhere and at a hint",
        "mmap 0 5000 0 3 i 0 2000\nmmap 300010000 4000 1 3 i 1 0\nmmap 0 2000 5 3 i 3 1000\n",
    ),
    (
        // strace omits mremap's fifth argument without MREMAP_FIXED; Linux
        // refuses a MREMAP_DONTUNMAP hint overlapping the source (EINVAL)
        // before it looks for the source VMA (EFAULT).
        "MREMAP_DONTUNMAP with a hint overlapping an unmapped source",
        "mremap 300055000 7000 7000 5 300055000\n",
    ),
    (
        "MREMAP_DONTUNMAP with a hint overlapping a mapped source, then a free hint",
        "mmap 300050000 10000 3 32 a 0 0\nmremap 300050000 4000 4000 5 300052000\n\
         mremap 300050000 4000 4000 5 300080000\n",
    ),
    (
        // strace writes a fork's result after the lines of a child that ran
        // first; when that child had already exited, the replay set it up a
        // second time at the result (an extra address space for its pid,
        // which the check saw once it compared every address space of a
        // pid). Found with the first exec'd programs (seeds 137 and 236 of
        // 256), whose forks come from libtest's test thread.
        "a nested fork child that exits before its fork returns, in an exec'd program",
        "mmap 300010000 2000 3 32 a 0 0\nexec\nmmap 300020000 2000 3 32 a 0 0\nfork\nfork\nmunmap 300020000 1000\n",
    ),
    (
        // Seed 590, once, on a loaded machine: the child ran before its
        // fork's result was written and reopened the parent's write-only
        // descriptor read-write; the replay gave those lines a table of
        // their own, replaced by a copy of the parent's at the result, and
        // refused the exec'd program's shared read mappings (EACCES). Here
        // the host's order depends on scheduling; the replay's unit test
        // `descriptors_a_child_opens_before_its_fork_returns_are_its_own`
        // has the failing lines.
        "a fork child reopens its parent's write-only descriptor read-write, execs and maps it shared",
        "open 0 0 1\nfork\nclose 0\nopen 0 0 2\nexec\nmmap 0 3000 1 1 s 0 1000\nmmap 300010000 2000 3 11 s 0 0\n",
    ),
    (
        // A lock of 2^64 - 4095 bytes locks nothing and succeeds; the
        // replay took it for a lock past the limit, so for CAP_IPC_LOCK,
        // and a later lock refused for the limit (ENOMEM) failed on its
        // wrapping range (EINVAL) instead.
        "a lock whose length rounds to nothing, then one whose range wraps",
        "mlock 3000f6000 fffffffffffff001\nmlock 30005f000 fffffffcfffa2000\n",
    ),
    (
        // MDWE outlives execve unless PR_MDWE_NO_INHERIT: the exec'd
        // program could not gain PROT_EXEC on the host, and could in the
        // replay.
        "MDWE set before an exec, then a mapping made executable",
        "setmdwe 1 0\nexec\nmmap 300010000 2000 1 32 a 0 0\nmprotect 300010000 1000 5\ngetmdwe 0\nsetmdwe 3 0\n",
    ),
];

#[test]
fn past_differences_replay_like_the_host() {
    if Command::new("strace").arg("-V").output().is_err() {
        eprintln!("strace is not installed: skipped");
        return;
    }
    let dir = scratch();
    let seqs: Vec<Vec<Op>> = REGRESSIONS.iter().map(|(_, ops)| decode(&format!("seq\n{ops}")).remove(0)).collect();
    let Some(b) = run_batch(&dir, &seqs) else {
        eprintln!("strace cannot trace here: skipped");
        return;
    };
    let (mut failures, _, _) = check_batch(&dir, 0, &seqs, &b);
    if !failures.is_empty() {
        failures.push(keep_failed(&dir, 0));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let named: Vec<String> = failures
        .iter()
        .map(|f| match f.strip_prefix("seed ").and_then(|r| r.split(' ').next()?.parse::<usize>().ok()) {
            Some(i) => format!("{}: {f}", REGRESSIONS.get(i).map_or("?", |r| r.0)),
            // The runner's lines, where the batch's files are kept.
            None => f.clone(),
        })
        .collect();
    assert!(named.is_empty(), "{}", named.join("\n"));
}

/// Found by `random_sequences_replay_like_the_host` (seed 7291 of 10,000):
/// Linux merges adjacent VMAs only if they map the same open file
/// (`is_mergeable_vma` compares `vm_file`, one per `open`); softmm compared
/// the file itself, so two opens of one file mapped side by side with
/// contiguous offsets became one VMA. Fixed: a VMA keeps its open
/// (`OpenFile`'s identity) and merges compare it.
#[test]
fn vmas_of_two_opens_of_one_file_stay_apart() {
    if Command::new("strace").arg("-V").output().is_err() {
        return;
    }
    let dir = scratch();
    let seqs = decode("seq\nmmap 300010000 2000 1 12 i 1 0\nopen 0 1 0\nmmap 300012000 2000 1 12 s 0 2000\n");
    let Some(b) = run_batch(&dir, &seqs) else { return };
    let (failures, _, _) = check_batch(&dir, 0, &seqs, &b);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn random_sequences_replay_like_the_host() {
    if Command::new("strace").arg("-V").output().is_err() {
        eprintln!("strace is not installed: skipped");
        return;
    }
    let n = env_u64("SOFTMM_REPLAY_SEQUENCES", 2048);
    let first = env_u64("SOFTMM_REPLAY_SEED", 1);
    let seeds: Vec<u64> = (first..first + n).collect();
    let Some(failures) = run_seeds(&seeds) else {
        eprintln!("strace cannot trace here: skipped");
        return;
    };
    let _ = std::io::stderr().flush();
    assert!(failures.is_empty(), "{} of {n} sequences differ:\n{}", failures.len(), failures.join("\n"));
}
