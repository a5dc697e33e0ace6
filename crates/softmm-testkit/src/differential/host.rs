//! Host side of the differential test: runs a [`Scenario`] against the real
//! Linux kernel (x86-64) and records, for each op, its [`Outcome`] and the
//! `/proc/self/maps` lines that intersect the scenario's window.
//!
//! # Contract with the test binary
//!
//! A test binary that calls [`run_on_host`] defines the runner's entry point
//! at its crate root (`tests/<binary>/main.rs`), named exactly so:
//!
//! ```ignore
//! use softmm_testkit::differential::host;
//!
//! #[test]
//! #[ignore]
//! fn host_runner_entry() {
//!     if std::env::var_os(host::RUNNER_ENV).is_some() {
//!         host::host_runner_main()
//!     }
//! }
//! ```
//!
//! [`run_on_host`] never forks the (multithreaded) test process. It re-executes
//! the current test binary (`std::env::current_exe()`) as
//! `<exe> host_runner_entry --exact --ignored --nocapture --test-threads=1`
//! with `SOFTMM_HOST_RUNNER=1`, writes the scenario to its stdin as text
//! lines, and reads the trace back from its stdout: only lines carrying the
//! [`MARK`] prefix are read, so libtest's own output is ignored. The child
//! ends with `_exit(0)` right after writing its trace (libtest never prints
//! a result for it). Without the variable the entry test does nothing, so
//! `cargo test -- --ignored` stays harmless.
//!
//! # What the runner child does
//!
//! 1. Parses the whole input, allocates every buffer it will need (output,
//!    a 1 MiB `/proc/self/maps` buffer, the mincore vector followed by a
//!    `PROT_NONE` guard page), creates the files as memfds filled with
//!    [`file_byte`] via `pwrite`, installs SIGSEGV/SIGBUS handlers.
//! 2. Makes the window's top the place the top-down allocator picks: maps
//!    `PROT_NONE` `MAP_SHARED` fillers of a memfd of their own (so that no
//!    scenario mapping can merge with them) over every gap between `window.1`
//!    and the lower of (`[stack]` start − 256 MiB, `0x7fff_0000_0000`), then
//!    checks with a throw-away `mmap(NULL, 4096)` that it lands at
//!    `window.1 - 4096` (if it lands higher, the free space it found is
//!    filled too, and it tries again). The window must be unmapped.
//!    Consequence: the page at `window.1` is mapped (`PROT_NONE`, shared
//!    file) on the host, and everything below `window.0` is free.
//! 3. Runs the ops with raw syscalls (`libc::syscall`), allocating nothing,
//!    reads `/proc/self/maps` with open/read/close after each op, and streams
//!    the results to fd 1 with `write(2)`.
//!
//! Probes run in the runner process itself, not in a forked grandchild (a
//! fork would lose `MADV_DONTFORK` ranges, zero `MADV_WIPEONFORK` ranges, not
//! fault pages into the runner — which mincore would show — and add the
//! child's anon_vma to every anonymous VMA). The access is a single
//! instruction in `global_asm!`; the signal handler recognises a fault at
//! that instruction, records signal and `si_code`, and resumes at the
//! instruction after it. Any other fault restores the default action and
//! kills the runner (and `run_on_host` panics).
//!
//! x86-64 Linux only.

#![allow(dead_code)]

use super::ops::{file_byte, MapLine, Op, Outcome, Scenario, Trace};
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{compiler_fence, AtomicI32, Ordering};

mod runner;

use runner::die;
pub use runner::host_runner_main;

/// Environment variable that makes `host_runner_entry` act as the runner.
pub const RUNNER_ENV: &str = "SOFTMM_HOST_RUNNER";
/// Name of the `#[test] #[ignore]` function at the test crate's root.
pub const RUNNER_TEST_NAME: &str = "host_runner_entry";
/// Prefix of every line of the runner's output that belongs to the trace.
pub const MARK: &str = "@@SOFTMM-HOST@@ ";

const PAGE: u64 = 4096;
/// Highest end of a user range on x86-64 with 4-level paging.
const TASK_SIZE: u64 = 0x7fff_ffff_f000;
const MAP_FIXED_NOREPLACE: i32 = 0x10_0000;
const MREMAP_FIXED: i32 = 2;

// ---------------------------------------------------------------------------
// Parent side
// ---------------------------------------------------------------------------

/// Runs `s` in a fresh runner process and returns its trace (one step per op).
///
/// Panics, with the runner's stderr and stdout, if the runner fails; panics
/// before starting it if an op could modify memory outside the window (see
/// [`check_scenario`]). Takes a few milliseconds per scenario.
pub fn run_on_host(s: &Scenario) -> Trace {
    run_on_host_with(s, &HostOptions::default()).0
}

/// How the runner process is set up beyond the defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostOptions {
    /// Drop every capability before the ops run, so that the kernel treats
    /// the runner as an ordinary process (`mmap_min_addr`, `RLIMIT_MEMLOCK`
    /// and the overcommit reserves apply as they do to one).
    pub unprivileged: bool,
    /// Start the runner with `ADDR_NO_RANDOMIZE`, so that the layouts the
    /// kernel picks outside the window (the `MAP_32BIT` area, the bottom-up
    /// fallback base) are Linux's fixed ones.
    pub no_aslr: bool,
}

/// A mapping of the runner outside the window, after its setup: what a model
/// must have mapped there to place mappings as the host does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutsideVma {
    pub start: u64,
    pub end: u64,
    /// The `[stack]`: grows down and keeps a guard gap below it.
    pub stack: bool,
}

/// [`run_on_host`] with `opts`; also returns the runner's mappings outside
/// the window (below `TASK_SIZE`) as they were after its setup.
pub fn run_on_host_with(s: &Scenario, opts: &HostOptions) -> (Trace, Vec<OutsideVma>) {
    if let Err(e) = check_scenario(s) {
        panic!("scenario not safe to run on the host: {e}\n{s:?}");
    }
    let input = encode_scenario(s, opts);
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args([RUNNER_TEST_NAME, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(RUNNER_ENV, "1")
        .env_remove("RUST_TEST_THREADS")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if opts.no_aslr {
        use std::os::unix::process::CommandExt;
        // SAFETY: personality(2) is async-signal-safe and touches no memory of
        // the parent; it only sets the persona the exec'd runner starts with.
        unsafe {
            cmd.pre_exec(|| {
                libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong);
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().expect("spawning the host runner (current test binary)");
    let mut stdin = child.stdin.take().expect("child stdin");
    let writer = std::thread::spawn(move || {
        // A runner that dies early closes the pipe; the error then shows in its output.
        let _ = stdin.write_all(input.as_bytes());
    });
    let out = child.wait_with_output().expect("waiting for the host runner");
    let _ = writer.join();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let fail = |why: &str| -> ! {
        panic!(
            "host runner failed: {why}\nstatus: {:?}\n--- stderr ---\n{stderr}\n--- stdout ---\n{stdout}",
            out.status
        )
    };
    if !out.status.success() {
        fail("the runner exited with a failure (see its stderr)");
    }
    let outside = parse_outside(&stdout);
    match parse_trace(&stdout) {
        Ok(t) if t.steps.len() == s.ops.len() => (t, outside),
        Ok(t) => fail(&format!("{} steps for {} ops", t.steps.len(), s.ops.len())),
        Err(e) => fail(&e),
    }
}

/// The `setup vma` lines of the runner's output.
fn parse_outside(stdout: &str) -> Vec<OutsideVma> {
    let mut v = Vec::new();
    for raw in stdout.lines() {
        let Some(pos) = raw.find(MARK) else { continue };
        let mut t = raw[pos + MARK.len()..].split_ascii_whitespace();
        if (t.next(), t.next()) != (Some("setup"), Some("vma")) {
            continue;
        }
        if let (Ok(start), Ok(end), Some(g)) = (hex(t.next()), hex(t.next()), t.next()) {
            v.push(OutsideVma { start, end, stack: g == "s" });
        }
    }
    v
}

/// Checks that no op can modify memory outside `s.window` on the host (where
/// the runner's own memory is): fixed mmaps (`MAP_FIXED` without
/// `MAP_FIXED_NOREPLACE`), munmap, mprotect, madvise, the old range of mremap
/// and the new range of `MREMAP_FIXED`, and write probes must stay inside the
/// window unless the kernel rejects the range outright (unaligned address,
/// length 0, length overflowing when page-rounded or added to the address).
pub fn check_scenario(s: &Scenario) -> Result<(), String> {
    let (lo, hi) = s.window;
    if lo % PAGE != 0 || hi % PAGE != 0 || lo >= hi || hi > TASK_SIZE {
        return Err(format!("bad window {lo:#x}..{hi:#x}"));
    }
    let outside = |addr: u64, len: u64| -> bool {
        if len == 0 || addr % PAGE != 0 {
            return false;
        }
        let Some(alen) = len.checked_add(PAGE - 1).map(|v| v & !(PAGE - 1)) else {
            return false;
        };
        match addr.checked_add(alen) {
            None => false,
            Some(end) => !(addr >= lo && end <= hi),
        }
    };
    for (i, op) in s.ops.iter().enumerate() {
        let bad = match *op {
            Op::Mmap { addr, len, flags, .. } => {
                flags & libc::MAP_FIXED != 0
                    && flags & MAP_FIXED_NOREPLACE == 0
                    && outside(addr, len)
                    && !past_task_size(addr, len)
            }
            // munmap refuses a range past TASK_SIZE (EINVAL) before anything.
            Op::Munmap { addr, len } => outside(addr, len) && !(addr > TASK_SIZE || len > TASK_SIZE - addr),
            // Nothing is mapped at or above TASK_SIZE. The runner checks at run
            // time that an mprotect walk leaving the window upwards meets a
            // hole first (see `Runner::guard`).
            Op::Mprotect { addr, len, prot } => {
                outside(addr, len)
                    && addr < TASK_SIZE
                    && addr >= hi
                    && prot & !(libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC | 0x8) == 0
            }
            Op::Madvise { addr, len, .. } => outside(addr, len) && addr < TASK_SIZE,
            // The old range is only touched within the VMA found at old_addr,
            // and a shrink's unmap is checked like munmap's.
            Op::Mremap { old_addr, old_len, new_len, flags, new_addr } => {
                let moves_range = flags & MREMAP_FIXED != 0 && old_len == new_len;
                let shrink_outside = new_len < old_len && {
                    let start = old_addr.wrapping_add(page_up(new_len));
                    let len = page_up(old_len).wrapping_sub(page_up(new_len));
                    !(start > TASK_SIZE || len > TASK_SIZE - start) && outside(start, len)
                };
                (old_addr < TASK_SIZE && old_addr >= hi && outside(old_addr, old_len))
                    || (moves_range && old_addr < TASK_SIZE && outside(old_addr, old_len))
                    || shrink_outside
                    || (flags & MREMAP_FIXED != 0 && outside(new_addr, new_len) && !past_task_size(new_addr, new_len))
            }
            Op::Probe { addr, write: Some(_) } => !(addr >= lo && addr < hi),
            Op::Ftruncate { .. } | Op::Probe { .. } | Op::Mincore { .. } | Op::SetMdwe => false,
            // A lock's walk does not stop at the window's end, and rounds an
            // unaligned start down: the whole rounded range stays inside.
            Op::MlockOnfault { addr, len } | Op::Munlock { addr, len } => {
                let start = addr & !(PAGE - 1);
                let end = page_up(len.wrapping_add(addr - start)).checked_add(start);
                len != 0 && !end.is_some_and(|e| start >= lo && e <= hi)
            }
            // mseal changes nothing unless the whole range is mapped.
            Op::Mseal { addr, len } => outside(addr, len),
        };
        if bad {
            return Err(format!("op {i} ({op:?}) may modify memory outside the window"));
        }
    }
    Ok(())
}

/// `PAGE_ALIGN` (wrapping).
fn page_up(len: u64) -> u64 {
    len.wrapping_add(PAGE - 1) & !(PAGE - 1)
}

/// A fixed range the kernel refuses before it unmaps anything: its rounded
/// length is 0 (refused) or it ends past `TASK_SIZE` (`ENOMEM`/`EINVAL`).
fn past_task_size(addr: u64, len: u64) -> bool {
    let alen = page_up(len);
    alen == 0 || alen > TASK_SIZE || addr > TASK_SIZE - alen
}

fn encode_scenario(s: &Scenario, opts: &HostOptions) -> String {
    let mut o = String::new();
    o.push_str(&format!("window {:x} {:x}\n", s.window.0, s.window.1));
    if opts.unprivileged {
        o.push_str("unprivileged\n");
    }
    for f in &s.files {
        o.push_str(&format!("file {f:x}\n"));
    }
    for op in &s.ops {
        let line = match *op {
            Op::Mmap { addr, len, prot, flags, file, offset } => {
                let f = match file {
                    None => "-".to_string(),
                    Some(i) => format!("{i:x}"),
                };
                format!("mmap {addr:x} {len:x} {:x} {:x} {f} {offset:x}", prot as u32, flags as u32)
            }
            Op::Munmap { addr, len } => format!("munmap {addr:x} {len:x}"),
            Op::Mprotect { addr, len, prot } => format!("mprotect {addr:x} {len:x} {:x}", prot as u32),
            Op::Mremap { old_addr, old_len, new_len, flags, new_addr } => {
                format!("mremap {old_addr:x} {old_len:x} {new_len:x} {:x} {new_addr:x}", flags as u32)
            }
            Op::Madvise { addr, len, advice } => format!("madvise {addr:x} {len:x} {:x}", advice as u32),
            Op::Ftruncate { file, len } => format!("ftruncate {file:x} {len:x}"),
            Op::Probe { addr, write: None } => format!("probe {addr:x} -"),
            Op::Probe { addr, write: Some(b) } => format!("probe {addr:x} {b:x}"),
            Op::Mincore { addr, len } => format!("mincore {addr:x} {len:x}"),
            Op::MlockOnfault { addr, len } => format!("mlockonfault {addr:x} {len:x}"),
            Op::Munlock { addr, len } => format!("munlock {addr:x} {len:x}"),
            Op::Mseal { addr, len } => format!("mseal {addr:x} {len:x}"),
            Op::SetMdwe => "setmdwe".to_string(),
        };
        o.push_str(&line);
        o.push('\n');
    }
    o.push_str("end\n");
    o
}

fn hex(t: Option<&str>) -> Result<u64, String> {
    let t = t.ok_or("missing field")?;
    u64::from_str_radix(t, 16).map_err(|e| format!("bad hex {t:?}: {e}"))
}

fn hex32(t: Option<&str>) -> Result<i32, String> {
    let v = hex(t)?;
    u32::try_from(v).map(|v| v as i32).map_err(|_| format!("{v:#x} does not fit 32 bits"))
}

fn decode_scenario(input: &str) -> Result<(Scenario, bool), String> {
    let mut unprivileged = false;
    let mut window = None;
    let mut files = Vec::new();
    let mut ops = Vec::new();
    let mut ended = false;
    for line in input.lines() {
        let mut t = line.split_ascii_whitespace();
        let Some(kw) = t.next() else { continue };
        let op = match kw {
            "window" => {
                window = Some((hex(t.next())?, hex(t.next())?));
                continue;
            }
            "file" => {
                files.push(hex(t.next())?);
                continue;
            }
            "unprivileged" => {
                unprivileged = true;
                continue;
            }
            "end" => {
                ended = true;
                break;
            }
            "mmap" => {
                let addr = hex(t.next())?;
                let len = hex(t.next())?;
                let prot = hex32(t.next())?;
                let flags = hex32(t.next())?;
                let file = match t.next() {
                    Some("-") => None,
                    f => Some(hex(f)? as usize),
                };
                let offset = hex(t.next())?;
                Op::Mmap { addr, len, prot, flags, file, offset }
            }
            "munmap" => Op::Munmap { addr: hex(t.next())?, len: hex(t.next())? },
            "mprotect" => Op::Mprotect { addr: hex(t.next())?, len: hex(t.next())?, prot: hex32(t.next())? },
            "mremap" => Op::Mremap {
                old_addr: hex(t.next())?,
                old_len: hex(t.next())?,
                new_len: hex(t.next())?,
                flags: hex32(t.next())?,
                new_addr: hex(t.next())?,
            },
            "madvise" => Op::Madvise { addr: hex(t.next())?, len: hex(t.next())?, advice: hex32(t.next())? },
            "ftruncate" => Op::Ftruncate { file: hex(t.next())? as usize, len: hex(t.next())? },
            "probe" => {
                let addr = hex(t.next())?;
                let write = match t.next() {
                    Some("-") => None,
                    b => Some(hex(b)? as u8),
                };
                Op::Probe { addr, write }
            }
            "mincore" => Op::Mincore { addr: hex(t.next())?, len: hex(t.next())? },
            "mlockonfault" => Op::MlockOnfault { addr: hex(t.next())?, len: hex(t.next())? },
            "munlock" => Op::Munlock { addr: hex(t.next())?, len: hex(t.next())? },
            "mseal" => Op::Mseal { addr: hex(t.next())?, len: hex(t.next())? },
            "setmdwe" => Op::SetMdwe,
            other => return Err(format!("unknown input line {other:?}")),
        };
        ops.push(op);
    }
    if !ended {
        return Err("input not terminated by `end`".into());
    }
    Ok((Scenario { window: window.ok_or("no window line")?, files, ops }, unprivileged))
}

fn parse_trace(stdout: &str) -> Result<Trace, String> {
    let mut steps = Vec::new();
    let mut cur: Option<(Outcome, Vec<MapLine>)> = None;
    let mut done = false;
    for raw in stdout.lines() {
        let Some(pos) = raw.find(MARK) else { continue };
        let line = &raw[pos + MARK.len()..];
        let mut t = line.split_ascii_whitespace();
        let kw = t.next().unwrap_or("");
        let dec = |t: Option<&str>| -> Result<i32, String> {
            t.ok_or("missing field")?.parse::<i32>().map_err(|e| format!("{line:?}: {e}"))
        };
        let outcome = match kw {
            "setup" => continue,
            "ok" => Outcome::Ok(hex(t.next())?),
            "err" => Outcome::Err(dec(t.next())?),
            "read" => Outcome::Read(hex(t.next())? as u8),
            "segv" => Outcome::Segv(dec(t.next())?),
            "bus" => Outcome::Bus(dec(t.next())?),
            "mincore" => {
                let n = hex(t.next())? as usize;
                let bits = t.next().unwrap_or("");
                if bits.len() != n {
                    return Err(format!("mincore vector of {} for {n} pages", bits.len()));
                }
                Outcome::Mincore(bits.bytes().map(|c| u8::from(c == b'1')).collect())
            }
            "map" => {
                let (_, maps) = cur.as_mut().ok_or("map line outside a step")?;
                let start = hex(t.next())?;
                let end = hex(t.next())?;
                let perms = t.next().ok_or("missing perms")?.to_string();
                let offset = hex(t.next())?;
                let anon = t.next() == Some("a");
                maps.push(MapLine { start, end, perms, offset, anon });
                continue;
            }
            "step" => {
                steps.push(cur.take().ok_or("step end without outcome")?);
                continue;
            }
            "done" => {
                done = true;
                break;
            }
            other => return Err(format!("unknown trace line {other:?}")),
        };
        if cur.is_some() {
            return Err("outcome inside an unfinished step".into());
        }
        cur = Some((outcome, Vec::new()));
    }
    if !done {
        return Err("no complete trace: is `host_runner_entry` at the test crate's root, calling host_runner_main() when SOFTMM_HOST_RUNNER is set?".into());
    }
    Ok(Trace { steps })
}

// ---------------------------------------------------------------------------
// Probe instructions and fault handler
// ---------------------------------------------------------------------------

std::arch::global_asm!(
    ".pushsection .text.softmm_host_probe,\"ax\",@progbits",
    ".p2align 4",
    ".globl softmm_host_probe_read",
    "softmm_host_probe_read:",
    "    xor eax, eax",
    ".globl softmm_host_probe_read_insn",
    "softmm_host_probe_read_insn:",
    "    movzx eax, byte ptr [rdi]",
    ".globl softmm_host_probe_read_resume",
    "softmm_host_probe_read_resume:",
    "    ret",
    ".p2align 4",
    ".globl softmm_host_probe_write",
    "softmm_host_probe_write:",
    ".globl softmm_host_probe_write_insn",
    "softmm_host_probe_write_insn:",
    "    mov byte ptr [rdi], sil",
    ".globl softmm_host_probe_write_resume",
    "softmm_host_probe_write_resume:",
    "    ret",
    ".popsection",
);

unsafe extern "C" {
    /// Reads the byte at `addr`; returns it zero-extended (0 after a fault).
    fn softmm_host_probe_read(addr: u64) -> u32;
    /// Writes the low byte of `val` at `addr`.
    fn softmm_host_probe_write(addr: u64, val: u32);
    static softmm_host_probe_read_insn: u8;
    static softmm_host_probe_read_resume: u8;
    static softmm_host_probe_write_insn: u8;
    static softmm_host_probe_write_resume: u8;
}

static FAULT_SIG: AtomicI32 = AtomicI32::new(0);
static FAULT_CODE: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: installed with SA_SIGINFO, so the kernel passes a valid siginfo
    // and ucontext; we only read/modify the saved registers of the faulting
    // thread, which the kernel restores on return from the handler.
    unsafe {
        let uc = &mut *(ctx as *mut libc::ucontext_t);
        let rip = &mut uc.uc_mcontext.gregs[libc::REG_RIP as usize];
        let at = *rip as usize;
        let resume = if at == &raw const softmm_host_probe_read_insn as usize {
            &raw const softmm_host_probe_read_resume as usize
        } else if at == &raw const softmm_host_probe_write_insn as usize {
            &raw const softmm_host_probe_write_resume as usize
        } else {
            // Not ours: let the default action kill the runner on return.
            libc::signal(sig, libc::SIG_DFL);
            return;
        };
        FAULT_SIG.store(sig, Ordering::SeqCst);
        FAULT_CODE.store((*info).si_code, Ordering::SeqCst);
        *rip = resume as i64;
    }
}

fn install_fault_handlers() {
    for sig in [libc::SIGSEGV, libc::SIGBUS] {
        // SAFETY: plain sigaction with a zeroed struct and a valid handler.
        let r = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_fault as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if r != 0 {
            die("sigaction failed");
        }
    }
}

fn probe(addr: u64, write: Option<u8>) -> Outcome {
    FAULT_SIG.store(0, Ordering::SeqCst);
    FAULT_CODE.store(0, Ordering::SeqCst);
    compiler_fence(Ordering::SeqCst);
    let v = match write {
        // SAFETY: the access is a single instruction whose faults the handler
        // turns into a recorded signal; a read has no other effect.
        None => (unsafe { softmm_host_probe_read(addr) }) as u8,
        Some(b) => {
            // SAFETY: as above; check_scenario (and the runner) only allow
            // write probes inside the window, which holds none of our memory.
            unsafe { softmm_host_probe_write(addr, u32::from(b)) };
            b
        }
    };
    compiler_fence(Ordering::SeqCst);
    match FAULT_SIG.load(Ordering::SeqCst) {
        0 => Outcome::Read(v),
        libc::SIGSEGV => Outcome::Segv(FAULT_CODE.load(Ordering::SeqCst)),
        _ => Outcome::Bus(FAULT_CODE.load(Ordering::SeqCst)),
    }
}

/// Bytes of the mincore result buffer a scenario's child maps (a guard page
/// follows it): enough for its largest `mincore`, at most the window's pages,
/// rounded up to a page, and at most 1 MiB. softmm's side gets a slice of
/// the same length.
pub fn mincore_cap(s: &Scenario) -> usize {
    let window_pages = ((s.window.1 - s.window.0) / PAGE) as usize;
    let want = s
        .ops
        .iter()
        .filter_map(|op| match *op {
            Op::Mincore { len, .. } => Some((len / PAGE + u64::from(len % PAGE != 0)) as usize),
            _ => None,
        })
        .max()
        .unwrap_or(0)
        .min(window_pages)
        // At most 1 MiB: a larger range fails at its first hole long before
        // (or, fully mapped, with EFAULT at the vector's end on both sides).
        .clamp(1, 1 << 20);
    want.div_ceil(PAGE as usize) * PAGE as usize
}
