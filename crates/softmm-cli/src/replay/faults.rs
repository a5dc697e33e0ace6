//! The page faults of a recording (`perf record -e
//! exceptions:page_fault_user`), placed among the log's calls.
//!
//! strace cannot see page faults; `perf` can, per thread, with the address
//! and the x86 error code (whence read, write or fetch). The two tools'
//! clocks do not agree: strace's `-t`/`-ttt` stamps are `CLOCK_REALTIME`,
//! perf's are its own `perf_clock` (the scheduler clock, close to but not
//! `CLOCK_MONOTONIC` unless recorded with `-k`), and strace stamps a call
//! when it handles the stop, after the thread entered the kernel. A fault and
//! the `mmap` before it are often a microsecond apart, closer than any
//! alignment of the two clocks. So the faults are not placed by time: the
//! recording also takes the `syscalls:sys_enter_*` tracepoints of the calls
//! the replay orders faults against ([`ANCHORS`]), in perf's own stream, and
//! a thread's k-th anchor call in perf is its k-th anchor call in the log.
//! A user page fault happens in user mode, so it lies strictly between two
//! of its thread's system calls: placing it before the thread's next anchor
//! call is exact. Across threads, perf's one clock orders a fault against
//! other threads' calls: the replay runs a thread's pending faults that
//! perf saw before another thread's call entered the kernel before that
//! call (a fault another thread's later `munmap` would otherwise refuse).

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use softmm::Access;

use super::parse::Record;

/// The calls faults are placed against: the memory calls the replay runs,
/// and the process calls that change which address space a thread's next
/// fault goes to (`execve`, a fork's parent's copy-on-write) or end it.
pub const ANCHORS: &[&str] = &[
    "mmap",
    "munmap",
    "mprotect",
    "mremap",
    "brk",
    "madvise",
    "execve",
    "execveat",
    "clone",
    "clone3",
    "fork",
    "vfork",
    "exit",
    "exit_group",
];

/// The `perf record` events `--run` records (and one records by hand):
/// every user page fault, and the entry of each of [`ANCHORS`].
pub fn perf_events() -> Vec<String> {
    let mut v = vec!["exceptions:page_fault_user".to_string()];
    v.extend(ANCHORS.iter().map(|c| format!("syscalls:sys_enter_{c}")));
    v
}

/// The `perf record` command line, for messages and `--help`.
pub fn perf_line() -> String {
    let ev: Vec<String> = perf_events().iter().map(|e| format!("-e {e}")).collect();
    format!("perf record -q {} -o PERF_DATA -- strace ...", ev.join(" "))
}

/// One recorded user page fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageFault {
    /// The faulting address (recorded addresses).
    pub addr: u64,
    /// What the access was, from the error code.
    pub access: Access,
}

/// The x86 page-fault error code's access: an instruction fetch
/// (`X86_PF_INSTR`, bit 4), else a write (`X86_PF_WRITE`, bit 1), else a
/// read.
pub fn access_of(error_code: u64) -> Access {
    if error_code & 0x10 != 0 {
        Access::Execute
    } else if error_code & 0x2 != 0 {
        Access::Write
    } else {
        Access::Read
    }
}

/// One event of a perf script.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Fault(PageFault),
    /// `sys_enter_NAME`.
    Enter(String),
}

/// The faults of a recording, by thread, each before a call of its thread.
#[derive(Debug, Default)]
pub struct Faults {
    /// Per tid: for each of its anchor calls in the log, in order, the
    /// faults just before it; the last entry holds the faults after its
    /// last anchor call.
    pub by_tid: HashMap<u64, Vec<Vec<PageFault>>>,
    /// perf's time of each fault of `by_tid`, in the same places.
    pub times: HashMap<u64, Vec<Vec<f64>>>,
    /// perf's time of the entry of each anchor call of each thread.
    pub enters: HashMap<u64, Vec<f64>>,
    /// The thread that stands for a log without pids (the one perf shows
    /// making the most calls).
    pub pidless_tid: Option<u64>,
    /// Faults in all.
    pub total: usize,
    /// Faults of threads the log does not show (the tracer's own, `perf`'s).
    pub other_threads: usize,
    /// Where a thread's calls in the two recordings disagree: the thread's
    /// faults after that point are dropped, and the report says so.
    pub disagreements: Vec<String>,
}

/// Reads the fault stream at `path`: a `perf.data` file (converted with
/// `perf script`) or the text `perf script` wrote.
pub fn read(path: &Path) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !bytes.starts_with(b"PERFILE") {
        return Ok(String::from_utf8_lossy(&bytes).into_owned());
    }
    let out = Command::new("perf")
        .args(["script", "-F", "tid,time,event,trace", "-i"])
        .arg(path)
        .output()
        .map_err(|e| format!("`perf script` to read {}: {e} ({})", path.display(), INSTALL))?;
    if !out.status.success() {
        return Err(format!(
            "perf script -i {} failed ({}): {}",
            path.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// What to install when `perf` is missing.
pub const INSTALL: &str = "perf is in Debian's `linux-perf` package (Ubuntu: `linux-tools-common` and \
                           `linux-tools-$(uname -r)`), and needs kernel.perf_event_paranoid <= 1 or root \
                           for tracepoints";

/// Parses a perf script: lines `[comm] TID[/TID] [[CPU]] TIME: EVENT: FIELDS`
/// (the default output, or `-F tid,time,event,trace`). Other lines
/// (headers, comments, other events) are skipped.
fn parse_script(text: &str) -> Vec<(u64, f64, Event)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let toks: Vec<&str> = line.split_whitespace().collect();
        let Some(e) = toks
            .iter()
            .position(|t| t.starts_with("exceptions:page_fault_user") || t.starts_with("syscalls:sys_enter_"))
        else {
            continue;
        };
        // The tid: the last number before the event that is not the time
        // (`123.456:`) nor the CPU (`[001]`); `pid/tid` gives the tid.
        let Some(tid) = toks[..e].iter().rev().find_map(|t| {
            let t = t.rsplit('/').next().unwrap_or(t);
            (!t.is_empty() && t.bytes().all(|b| b.is_ascii_digit())).then(|| t.parse::<u64>().ok()).flatten()
        }) else {
            continue;
        };
        // perf's time (`123.456789:`), the same clock for every thread;
        // unknown: never before another thread's call.
        let time = e.checked_sub(1).and_then(|i| toks[i].trim_end_matches(':').parse::<f64>().ok());
        let time = time.unwrap_or(f64::INFINITY);
        let ev = toks[e].trim_end_matches(':');
        if let Some(name) = ev.strip_prefix("syscalls:sys_enter_") {
            out.push((tid, time, Event::Enter(name.to_string())));
            continue;
        }
        let field = |k: &str| {
            toks[e + 1..].iter().find_map(|t| t.strip_prefix(k)).and_then(|v| {
                let v = v.trim_end_matches(',');
                let h = v.strip_prefix("0x").unwrap_or(v);
                u64::from_str_radix(h, 16).ok()
            })
        };
        if let (Some(addr), Some(code)) = (field("address="), field("error_code=")) {
            out.push((tid, time, Event::Fault(PageFault { addr, access: access_of(code) })));
        }
    }
    out
}

/// The call name a record has in perf's tracepoints (`clone3`, `exit_group`,
/// ...): the name the log wrote.
pub fn anchor_name(r: &Record) -> Option<&str> {
    let name = &r.text[..r.text.find('(')?];
    ANCHORS.contains(&name).then_some(name)
}

/// Places the faults of `script` (a perf script's text) among `records`.
pub fn place(script: &str, records: &[Record]) -> Faults {
    // Each thread's anchor calls in the log, in order.
    let mut calls: HashMap<u64, Vec<&str>> = HashMap::new();
    for r in records {
        if let (Some(pid), Some(name)) = (r.pid, anchor_name(r)) {
            calls.entry(pid).or_default().push(name);
        }
    }
    let single = {
        // A log without pids: its one thread is whichever perf shows
        // making the most anchor calls.
        let pidless = records.iter().any(|r| r.pid.is_none());
        pidless.then(|| records.iter().filter_map(anchor_name).collect::<Vec<&str>>())
    };
    let events = parse_script(script);
    let mut f = Faults::default();
    let tid_of_single = single.as_ref().and_then(|_| {
        let mut n: HashMap<u64, usize> = HashMap::new();
        for (t, _, e) in &events {
            if matches!(e, Event::Enter(_)) {
                *n.entry(*t).or_default() += 1;
            }
        }
        n.into_iter().max_by_key(|&(t, c)| (c, std::cmp::Reverse(t))).map(|(t, _)| t)
    });
    if let (Some(s), Some(t)) = (single, tid_of_single) {
        calls.insert(t, s);
        f.pidless_tid = Some(t);
    }
    // Per tid: the index of its next anchor call, or None once the two
    // recordings disagreed.
    let mut next: HashMap<u64, Option<usize>> = HashMap::new();
    for (tid, time, e) in events {
        let Some(seq) = calls.get(&tid) else {
            if matches!(e, Event::Fault(_)) {
                f.total += 1;
                f.other_threads += 1;
            }
            continue;
        };
        let slots = f.by_tid.entry(tid).or_insert_with(|| vec![Vec::new(); seq.len() + 1]);
        let times = f.times.entry(tid).or_insert_with(|| vec![Vec::new(); seq.len() + 1]);
        let k = next.entry(tid).or_insert(Some(0));
        match e {
            Event::Fault(pf) => {
                f.total += 1;
                if let Some(k) = *k {
                    slots[k].push(pf);
                    times[k].push(time);
                }
            }
            Event::Enter(name) => {
                let Some(i) = *k else { continue };
                // A tracepoint of a call strace did not log for this tid
                // (an execve that failed before strace saw it, say) that is
                // not the log's next call: a disagreement.
                if seq.get(i).is_some_and(|&n| n == name) {
                    *k = Some(i + 1);
                    f.enters.entry(tid).or_default().push(time);
                } else {
                    f.disagreements.push(format!(
                        "thread {tid}: perf's call {} is {name}, the log's is {}; its later faults are dropped",
                        i + 1,
                        seq.get(i).copied().unwrap_or("none")
                    ));
                    *k = None;
                }
            }
        }
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::parse::parse;

    #[test]
    fn error_codes() {
        assert_eq!(access_of(0x14), Access::Execute);
        assert_eq!(access_of(0x6), Access::Write);
        assert_eq!(access_of(0x7), Access::Write);
        assert_eq!(access_of(0x4), Access::Read);
    }

    /// Both of perf script's formats; faults before a thread's first call,
    /// between its calls and after its last; the tracer's own faults and
    /// calls are not the log's.
    #[test]
    fn faults_are_placed_before_their_threads_next_call() {
        let log = parse(
            "7 execve(\"./t\", [\"./t\"], 0x1 /* 1 vars */) = 0\n\
             7 brk(NULL) = 0x1000000\n\
             8 mmap(NULL, 8192, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0) = 0x7f0000000000\n\
             7 exit_group(0) = ?\n",
        );
        let script = "strace 5 [000] 1.0: exceptions:page_fault_user: address=0x5000 ip=0x1 error_code=0x6\n\
                      strace 5 [000] 1.1: syscalls:sys_enter_mmap: addr: 0x0\n\
                      strace 7 [000] 1.2: exceptions:page_fault_user: address=0x6000 ip=0x1 error_code=0x4\n\
                      strace 7 [000] 1.3: syscalls:sys_enter_execve: filename: 0x1\n\
                      7 2.0: exceptions:page_fault_user: address=0x7000 ip=0x7000 error_code=0x14\n\
                      7 2.1: syscalls:sys_enter_brk: brk: 0x00000000\n\
                      t 8 [001] 2.2: syscalls:sys_enter_mmap: addr: 0x0\n\
                      t 8 [001] 2.3: exceptions:page_fault_user: address=0x7f0000001000 ip=0x1 error_code=0x6\n\
                      t 7 [000] 2.4: exceptions:page_fault_user: address=0x1000000 ip=0x1 error_code=0x7\n\
                      t 7 [000] 2.5: syscalls:sys_enter_exit_group: error_code: 0x0\n";
        let f = place(script, &log.records);
        assert_eq!((f.total, f.other_threads), (5, 1));
        assert!(f.disagreements.is_empty(), "{:?}", f.disagreements);
        let pf = |addr, access| PageFault { addr, access };
        assert_eq!(
            f.by_tid[&7],
            vec![
                vec![pf(0x6000, Access::Read)],
                vec![pf(0x7000, Access::Execute)],
                vec![pf(0x1000000, Access::Write)],
                vec![]
            ]
        );
        assert_eq!(f.by_tid[&8], vec![vec![], vec![pf(0x7f0000001000, Access::Write)]]);
    }

    #[test]
    fn a_call_perf_saw_and_the_log_did_not_drops_the_threads_later_faults() {
        let log = parse("7 brk(NULL) = 0x1000000\n7 munmap(0x1000, 4096) = 0\n");
        let script = "7 1.0: syscalls:sys_enter_brk: brk: 0x0\n\
                      7 1.1: syscalls:sys_enter_mmap: addr: 0x0\n\
                      7 1.2: exceptions:page_fault_user: address=0x5000 ip=0x1 error_code=0x6\n";
        let f = place(script, &log.records);
        assert_eq!(f.disagreements.len(), 1, "{:?}", f.disagreements);
        assert!(f.disagreements[0].contains("perf's call 2 is mmap, the log's is munmap"));
        assert!(f.by_tid[&7].iter().all(Vec::is_empty));
        assert_eq!(f.total, 1);
    }
}
