//! `mlock`, `mlock2`, `munlock`, `mlockall`, `munlockall`, `mseal`, MDWE
//! and `CAP_SYS_RAWIO` against the host kernel: each script of calls runs
//! in a forked child of this process (locks, seals and MDWE cannot be
//! undone there) on a window of addresses, with the capabilities and
//! memlock limit the script asks for, and on a softmm address space with
//! the same configuration at the same addresses. Every call's result or
//! errno must match, then the window's mappings: bounds, permissions and
//! the smaps `VmFlags` softmm models (`lo`, `lf`, `sl`, ...).
//!
//! A child after `fork` in this multi-threaded process only makes system
//! calls: its results and its `/proc/self/smaps` go to a shared mapping
//! the parent reads once it exited.

use softmm::uapi::*;
use softmm::*;

const PAGE: u64 = PAGE_SIZE;
/// The window the scripts use, in pages.
const WINDOW_PAGES: u64 = 64;
/// Bytes of smaps text the child can hand back.
const SMAPS_BYTES: usize = 4 << 20;
/// Most calls in a script.
const MAX_OPS: usize = 64;
/// `CAP_IPC_LOCK` and `CAP_SYS_RAWIO`.
const CAP_IPC_LOCK: u32 = 14;
const CAP_SYS_RAWIO: u32 = 17;

/// An address: an offset into the window, or an absolute one.
#[derive(Clone, Copy, Debug)]
pub enum At {
    Rel(u64),
    Abs(u64),
}

/// One call of a script; lengths in bytes.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    Mmap(At, u64, i32, i32),
    Munmap(At, u64),
    Mprotect(At, u64, i32),
    Madvise(At, u64, i32),
    Mremap(At, u64, u64, i32, At),
    Mlock(At, u64),
    Mlock2(At, u64, i32),
    Munlock(At, u64),
    Mlockall(i32),
    Munlockall,
    Mseal(At, u64, u64),
    SetMdwe(u64, u64),
    GetMdwe(u64),
}

/// What a script runs with: the host child's capabilities and limit, the
/// softmm configuration's twins.
#[derive(Clone, Copy, Debug)]
pub struct Creds {
    pub ipc_lock: bool,
    pub sys_rawio: bool,
    pub memlock: u64,
}

impl Creds {
    pub const ROOT: Creds = Creds { ipc_lock: true, sys_rawio: true, memlock: 8 << 20 };
    pub const USER: Creds = Creds { ipc_lock: false, sys_rawio: false, memlock: 8 << 20 };
}

/// A mapping of the window: offsets, perms and the modelled `VmFlags`.
type Mapping = (u64, u64, String, String);

/// The `VmFlags` both sides are compared on (the host sets more: `sd`,
/// `ar`, `mg`, ...).
const COMPARED: [&str; 14] = ["rd", "wr", "ex", "sh", "mr", "mw", "me", "ms", "gd", "lo", "lf", "ac", "dc", "sl"];

fn compared_flags(line: &str) -> String {
    line.split_whitespace().filter(|f| COMPARED.contains(f)).collect::<Vec<_>>().join(" ")
}

fn addr(base: u64, at: At) -> u64 {
    match at {
        At::Rel(o) => base.wrapping_add(o),
        At::Abs(a) => a,
    }
}

/// A result as both sides report it: the value (an address as an offset
/// into the window) or the negated errno.
fn rel(base: u64, v: u64, op: &Op) -> i64 {
    match *op {
        Op::Mmap(At::Rel(_), ..) => v.wrapping_sub(base) as i64,
        Op::Mremap(_, _, _, flags, At::Rel(_)) if flags & MREMAP_FIXED != 0 => v.wrapping_sub(base) as i64,
        Op::Mremap(At::Rel(_), _, _, flags, _) if flags & MREMAP_FIXED == 0 => v.wrapping_sub(base) as i64,
        _ => v as i64,
    }
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Runs `ops` in a forked child on the host; the results and the window's
/// mappings.
fn host(creds: Creds, ops: &[Op]) -> (Vec<i64>, Vec<Mapping>) {
    assert!(ops.len() <= MAX_OPS);
    let len = (WINDOW_PAGES * PAGE) as usize;
    // SAFETY: fresh mappings of this test's own; the window is reserved
    // PROT_NONE so no other thread maps into it before the fork.
    let (base, shared) = unsafe {
        let base =
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
        let shared = libc::mmap(
            std::ptr::null_mut(),
            SMAPS_BYTES + MAX_OPS * 8 + 8,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert!(base != libc::MAP_FAILED && shared != libc::MAP_FAILED);
        (base as u64, shared as *mut u8)
    };
    let results = shared.cast::<i64>();
    // SAFETY: the smaps text goes after the results.
    let text = unsafe { shared.add(MAX_OPS * 8 + 8) };
    // SAFETY: the child makes only system calls and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: the child's own address space; raw system calls only.
        unsafe { child(creds, base, ops, results, text) };
    }
    let mut status = 0;
    // SAFETY: our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "host child failed: {status:#x}");
    // SAFETY: the child wrote `ops.len()` results and a NUL-terminated text.
    let res: Vec<i64> = (0..ops.len()).map(|i| unsafe { results.add(i).read() }).collect();
    // SAFETY: as above: the child NUL-terminated the text in the buffer.
    let smaps = unsafe { std::ffi::CStr::from_ptr(text.cast()) }.to_string_lossy().into_owned();
    // SAFETY: our own mappings.
    unsafe {
        libc::munmap(base as *mut _, len);
        libc::munmap(shared.cast(), SMAPS_BYTES + MAX_OPS * 8 + 8);
    }
    (res, parse_smaps(&smaps, base))
}

/// The child's side of [`host`].
///
/// # Safety
/// Only in a forked child: makes system calls and never returns.
unsafe fn child(creds: Creds, base: u64, ops: &[Op], results: *mut i64, text: *mut u8) -> ! {
    // SAFETY: the caller's contract: a forked child, raw system calls on
    // its own memory (the window, the shared results and text).
    unsafe {
        libc::munmap(base as *mut _, (WINDOW_PAGES * PAGE) as usize);
        let rl = libc::rlimit { rlim_cur: creds.memlock, rlim_max: creds.memlock };
        if libc::setrlimit(libc::RLIMIT_MEMLOCK, &rl) != 0 {
            libc::_exit(2);
        }
        let mut hdr = CapHeader { version: 0x2008_0522, pid: 0 };
        let mut data = [CapData { effective: 0, permitted: 0, inheritable: 0 }; 2];
        if libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) != 0 {
            libc::_exit(3);
        }
        for (cap, keep) in [(CAP_IPC_LOCK, creds.ipc_lock), (CAP_SYS_RAWIO, creds.sys_rawio)] {
            if !keep {
                data[0].effective &= !(1 << cap);
                data[0].permitted &= !(1 << cap);
            }
        }
        if libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) != 0 {
            libc::_exit(4);
        }
        for (i, op) in ops.iter().enumerate() {
            let a = |at| addr(base, at) as *mut libc::c_void;
            let r: i64 = match *op {
                Op::Mmap(at, len, prot, flags) => libc::mmap(a(at), len as usize, prot, flags, -1, 0) as i64,
                Op::Munmap(at, len) => libc::munmap(a(at), len as usize) as i64,
                Op::Mprotect(at, len, prot) => libc::mprotect(a(at), len as usize, prot) as i64,
                Op::Madvise(at, len, adv) => libc::madvise(a(at), len as usize, adv) as i64,
                Op::Mremap(at, old, new, flags, to) => libc::syscall(libc::SYS_mremap, a(at), old, new, flags, a(to)),
                Op::Mlock(at, len) => libc::syscall(libc::SYS_mlock, a(at), len),
                Op::Mlock2(at, len, flags) => libc::syscall(libc::SYS_mlock2, a(at), len, flags),
                Op::Munlock(at, len) => libc::syscall(libc::SYS_munlock, a(at), len),
                Op::Mlockall(flags) => libc::syscall(libc::SYS_mlockall, flags),
                Op::Munlockall => libc::syscall(libc::SYS_munlockall),
                Op::Mseal(at, len, flags) => libc::syscall(462, a(at), len, flags),
                Op::SetMdwe(bits, arg3) => libc::syscall(libc::SYS_prctl, PR_SET_MDWE, bits, arg3, 0u64, 0u64),
                Op::GetMdwe(arg2) => libc::syscall(libc::SYS_prctl, PR_GET_MDWE, arg2, 0u64, 0u64, 0u64),
            };
            let r = if r == -1 { -(*libc::__errno_location()) as i64 } else { rel(base, r as u64, op) };
            results.add(i).write(r);
        }
        softmm_testkit::common::read_raw_nul(c"/proc/self/smaps", text, SMAPS_BYTES);
        libc::_exit(0)
    }
}

/// The window's mappings in smaps text.
fn parse_smaps(text: &str, base: u64) -> Vec<Mapping> {
    let end = base + WINDOW_PAGES * PAGE;
    let mut out: Vec<Mapping> = Vec::new();
    let mut current: Option<Mapping> = None;
    for line in text.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if let Some(mut m) = current.take() {
                m.3 = compared_flags(flags);
                out.push(m);
            }
            continue;
        }
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else { continue };
        let Some((s, e)) = range.split_once('-') else { continue };
        let (Ok(s), Ok(e)) = (u64::from_str_radix(s, 16), u64::from_str_radix(e, 16)) else { continue };
        current = (s >= base && e <= end).then(|| (s - base, e - base, perms.to_string(), String::new()));
    }
    out
}

/// Runs `ops` on a softmm address space configured as `creds` say.
fn softmm(creds: Creds, base: u64, ops: &[Op]) -> (Vec<i64>, Vec<Mapping>) {
    let phys = PhysMem::new(PhysConfig::new(64 << 20)).unwrap();
    let config =
        MmConfig::default().memlock_limit(creds.memlock).cap_ipc_lock(creds.ipc_lock).cap_sys_rawio(creds.sys_rawio);
    let mm = AddressSpace::new(&phys, config).unwrap();
    let res = ops
        .iter()
        .map(|op| {
            let a = |at| addr(base, at);
            let r: std::result::Result<u64, Errno> = match *op {
                Op::Mmap(at, len, prot, flags) => mm.mmap(a(at), len, prot, flags, None, 0),
                Op::Munmap(at, len) => mm.munmap(a(at), len).map(|()| 0),
                Op::Mprotect(at, len, prot) => mm.mprotect(a(at), len, prot).map(|()| 0),
                Op::Madvise(at, len, adv) => mm.madvise(a(at), len, adv).map(|()| 0),
                Op::Mremap(at, old, new, flags, to) => mm.mremap(a(at), old, new, flags, a(to)),
                Op::Mlock(at, len) => mm.mlock(a(at), len).map(|()| 0),
                Op::Mlock2(at, len, flags) => mm.mlock2(a(at), len, flags).map(|()| 0),
                Op::Munlock(at, len) => mm.munlock(a(at), len).map(|()| 0),
                Op::Mlockall(flags) => mm.mlockall(flags).map(|()| 0),
                Op::Munlockall => mm.munlockall().map(|()| 0),
                Op::Mseal(at, len, flags) => mm.mseal(a(at), len, flags).map(|()| 0),
                Op::SetMdwe(bits, arg3) => mm.prctl_set_mdwe(bits, arg3, 0, 0).map(|()| 0),
                Op::GetMdwe(arg2) => mm.prctl_get_mdwe(arg2, 0, 0, 0),
            };
            match r {
                Ok(v) => rel(base, v, op),
                Err(e) => -(e.code() as i64),
            }
        })
        .collect();
    let end = base + WINDOW_PAGES * PAGE;
    let maps = mm
        .maps()
        .into_iter()
        .filter(|m| m.start >= base && m.end <= end)
        .map(|m| (m.start - base, m.end - base, m.perms.clone(), compared_flags(&m.vm_flags)))
        .collect();
    (res, maps)
}

/// Runs `ops` on both sides and compares.
#[track_caller]
pub fn same_as_host(creds: Creds, ops: &[Op]) {
    let (hres, hmaps) = host(creds, ops);
    // The window's host address: any free one works for softmm too.
    let base = 0x7f00_0000_0000;
    let (sres, smaps) = softmm(creds, base, ops);
    for (i, op) in ops.iter().enumerate() {
        assert_eq!(sres[i], hres[i], "call {i} {op:?} (creds {creds:?}): softmm {} host {}", sres[i], hres[i]);
    }
    if smaps != hmaps {
        eprintln!("SOFTMM {smaps:#?}\nHOST {hmaps:#?}");
    }
    assert_eq!(smaps, hmaps, "maps after {ops:?} (creds {creds:?})");
}

const ANON_FIXED: i32 = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED;
const RW: i32 = PROT_READ | PROT_WRITE;
const P: u64 = PAGE;

fn r(o: u64) -> At {
    At::Rel(o)
}

#[test]
fn mlock_splits_merges_and_counts_as_linux() {
    for creds in [Creds::ROOT, Creds::USER] {
        same_as_host(
            creds,
            &[
                Op::Mmap(r(0), 8 * P, RW, ANON_FIXED),
                Op::Mlock(r(2 * P + 100), P), // unaligned: the page of the start
                Op::Mlock2(r(5 * P), 2 * P, MLOCK_ONFAULT),
                Op::Mlock2(r(0), P, 2), // EINVAL
                Op::Munlock(r(5 * P), P),
                Op::Mlock(r(0), 8 * P), // merged into one
                Op::Munlock(r(0), 8 * P),
                Op::Mlock(r(6 * P), 4 * P), // ENOMEM past the end; the VMA part stays locked
                Op::Mmap(r(12 * P), P, PROT_NONE, ANON_FIXED),
                Op::Mlock(r(12 * P), P), // PROT_NONE: locked, then ENOMEM from the populate
                Op::Mlock2(r(12 * P), P, MLOCK_ONFAULT),
                Op::Mlock(r(20 * P), P),                 // unmapped
                Op::Munlock(r(11 * P), 2 * P),           // a hole at the start
                Op::Mlock(At::Abs(u64::MAX - P), 3 * P), // wraps: EINVAL
                Op::Madvise(r(0), P, MADV_DONTNEED),
                Op::Mlock(r(0), P),
                Op::Madvise(r(0), P, MADV_DONTNEED), // EINVAL on a locked VMA
                Op::Madvise(r(0), P, MADV_DONTNEED_LOCKED),
            ],
        );
    }
}

#[test]
fn the_memlock_limit_as_linux() {
    let small = Creds { memlock: 4 * P, ..Creds::USER };
    same_as_host(
        small,
        &[
            Op::Mmap(r(0), 8 * P, RW, ANON_FIXED),
            Op::Mlock(r(0), 3 * P),
            Op::Mlock(r(0), 5 * P),                              // ENOMEM: 3 + 5 > 4 ...
            Op::Mlock(r(2 * P), 2 * P),                          // ... but the locked pages count once
            Op::Mmap(r(16 * P), P, RW, ANON_FIXED | MAP_LOCKED), // EAGAIN
            Op::Munlock(r(0), 8 * P),
            Op::Mmap(r(16 * P), 2 * P, RW, ANON_FIXED | MAP_LOCKED),
            Op::Mremap(r(16 * P), 2 * P, 6 * P, 0, r(0)), // EAGAIN: the locked VMA grows past
        ],
    );
    let none = Creds { memlock: 0, ..Creds::USER };
    same_as_host(
        none,
        &[
            Op::Mmap(r(0), 2 * P, RW, ANON_FIXED),
            Op::Mlock(r(0), P),       // EPERM
            Op::Mlockall(MCL_FUTURE), // EPERM
            Op::Munlock(r(0), P),
            Op::Munlockall,
            Op::Mmap(r(4 * P), P, RW, ANON_FIXED | MAP_LOCKED), // EPERM
        ],
    );
}

#[test]
fn mlockall_and_munlockall_as_linux() {
    // With CAP_IPC_LOCK (the host process maps far more than any limit);
    // MCL_ONFAULT, so that the host child does not fault its whole image in.
    same_as_host(
        Creds::ROOT,
        &[
            Op::Mlockall(0),
            Op::Mlockall(MCL_ONFAULT),
            Op::Mlockall(8),
            Op::Mmap(r(0), 4 * P, RW, ANON_FIXED),
            Op::Mlockall(MCL_CURRENT | MCL_ONFAULT),
            Op::Mmap(r(8 * P), 2 * P, RW, ANON_FIXED), // not locked: no MCL_FUTURE
            Op::Mlockall(MCL_FUTURE | MCL_ONFAULT),
            Op::Mmap(r(12 * P), 2 * P, RW, ANON_FIXED), // locked on fault
            Op::Mmap(r(14 * P), 2 * P, PROT_READ, ANON_FIXED),
            Op::Munlock(r(12 * P), P),
            Op::Munlockall,
            Op::Mmap(r(20 * P), 2 * P, RW, ANON_FIXED),
            Op::Mlockall(MCL_FUTURE),
            Op::Mmap(r(24 * P), 2 * P, RW, ANON_FIXED), // locked and populated
            Op::Munlockall,
        ],
    );
}

#[test]
fn mseal_refuses_as_linux() {
    const RO: i32 = PROT_READ;
    same_as_host(
        Creds::USER,
        &[
            Op::Mmap(r(0), 8 * P, RO, ANON_FIXED),
            Op::Mmap(r(8 * P), 4 * P, RW, ANON_FIXED),
            Op::Mseal(r(0), P, 1),        // EINVAL: flags
            Op::Mseal(r(1), P, 0),        // EINVAL: unaligned
            Op::Mseal(r(0), u64::MAX, 0), // EINVAL: rounds past 2^64
            Op::Mseal(r(0), 0, 0),
            Op::Mseal(r(10 * P), 8 * P, 0), // ENOMEM: a hole, nothing sealed
            Op::Mseal(r(2 * P), 2 * P, 0),
            Op::Mseal(r(2 * P), 2 * P, 0), // again
            Op::Munmap(r(0), 8 * P),       // EPERM, nothing unmapped
            Op::Munmap(r(3 * P), P),
            Op::Munmap(r(6 * P), P),                 // not sealed
            Op::Mmap(r(2 * P), P, RW, ANON_FIXED),   // EPERM over a sealed VMA
            Op::Mprotect(r(0), 4 * P, RW),           // the first VMA changes, then EPERM
            Op::Mprotect(r(2 * P), P, RO),           // EPERM even with no change
            Op::Madvise(r(2 * P), P, MADV_DONTNEED), // read-only anonymous: EPERM
            Op::Madvise(r(2 * P), P, MADV_WILLNEED),
            Op::Madvise(r(2 * P), P, MADV_DONTFORK),
            Op::Madvise(r(0), 4 * P, MADV_FREE), // the first VMA freed, then EPERM
            Op::Mremap(r(2 * P), P, 2 * P, MREMAP_MAYMOVE, r(0)), // EPERM
            Op::Mremap(r(2 * P), 2 * P, P, 0, r(0)), // EPERM
            Op::Mremap(r(2 * P), P, P, MREMAP_MAYMOVE | MREMAP_FIXED, r(30 * P)), // EPERM
            Op::Mremap(r(8 * P), P, P, MREMAP_MAYMOVE | MREMAP_FIXED, r(2 * P)), // EPERM: the target
            Op::Mseal(r(8 * P), 2 * P, 0),       // writable anonymous: discards allowed
            Op::Madvise(r(8 * P), P, MADV_DONTNEED),
            Op::Mlock(r(8 * P), P), // locks are not refused
            Op::Munlock(r(8 * P), P),
        ],
    );
}

#[test]
fn mdwe_as_linux() {
    const RX: i32 = PROT_READ | PROT_EXEC;
    const RWX: i32 = PROT_READ | PROT_WRITE | PROT_EXEC;
    same_as_host(
        Creds::USER,
        &[
            Op::GetMdwe(0),
            Op::GetMdwe(1), // EINVAL
            Op::Mmap(r(0), 2 * P, RX, ANON_FIXED),
            Op::Mmap(r(4 * P), 2 * P, PROT_READ, ANON_FIXED),
            Op::SetMdwe(PR_MDWE_NO_INHERIT, 0),       // EINVAL alone
            Op::SetMdwe(4, 0),                        // EINVAL
            Op::SetMdwe(PR_MDWE_REFUSE_EXEC_GAIN, 1), // EINVAL
            Op::SetMdwe(PR_MDWE_REFUSE_EXEC_GAIN, 0),
            Op::SetMdwe(PR_MDWE_REFUSE_EXEC_GAIN, 0), // the same again
            Op::SetMdwe(PR_MDWE_REFUSE_EXEC_GAIN | PR_MDWE_NO_INHERIT, 0), // EPERM
            Op::SetMdwe(0, 0),                        // EPERM: cannot be cleared
            Op::GetMdwe(0),
            Op::Mmap(r(8 * P), P, RWX, ANON_FIXED), // EACCES
            Op::Mmap(r(8 * P), P, RX, ANON_FIXED),
            Op::Mprotect(r(4 * P), P, RX), // EACCES: gains exec
            Op::Mprotect(r(0), P, RWX),    // EACCES: writable and exec
            Op::Mprotect(r(0), P, PROT_READ),
            Op::Mprotect(r(0), 2 * P, RX), // the first page gains exec: EACCES
            Op::Mprotect(r(P), P, PROT_EXEC),
        ],
    );
}

#[test]
fn cap_sys_rawio_maps_below_mmap_min_addr_as_linux() {
    let low = |o| At::Abs(o);
    for creds in [Creds::ROOT, Creds::USER] {
        same_as_host(
            creds,
            &[
                Op::Mmap(low(0), P, RW, ANON_FIXED), // EPERM without the capability
                Op::Munmap(low(0), P),
                Op::Mmap(low(0), P, RW, ANON_FIXED | MAP_FIXED_NOREPLACE),
                Op::Munmap(low(0), P),
                Op::Mmap(r(0), P, RW, ANON_FIXED),
                Op::Mremap(r(0), P, P, MREMAP_MAYMOVE | MREMAP_FIXED, low(0)),
                Op::Munmap(low(0), P),
            ],
        );
    }
}

#[test]
fn seals_and_locks_across_several_vmas_as_linux() {
    const RO: i32 = PROT_READ;
    same_as_host(
        Creds::USER,
        &[
            Op::Mmap(r(0), 4 * P, RO, ANON_FIXED),
            Op::Mmap(r(4 * P), 4 * P, RW, ANON_FIXED),
            Op::Mseal(r(4 * P), 2 * P, 0),
            // The unsealed first VMA, then the sealed one: EPERM.
            Op::Munmap(r(2 * P), 4 * P),
            Op::Mmap(r(2 * P), 4 * P, RO, ANON_FIXED),
            Op::Mremap(r(0), 2 * P, 2 * P, MREMAP_MAYMOVE | MREMAP_FIXED, r(3 * P)),
            // Locks over sealed VMAs are allowed, and split them.
            Op::Mlock(r(3 * P), 2 * P),
            Op::Mlock2(r(5 * P), P, MLOCK_ONFAULT),
            Op::Munlock(r(0), 8 * P),
            // A locked VMA moved with MREMAP_DONTUNMAP: the source keeps
            // its range, unlocked.
            Op::Mmap(r(16 * P), 2 * P, RW, ANON_FIXED),
            Op::Mlock(r(16 * P), 2 * P),
            Op::Mremap(r(16 * P), 2 * P, 2 * P, MREMAP_MAYMOVE | MREMAP_DONTUNMAP | MREMAP_FIXED, r(24 * P)),
            Op::Mremap(r(24 * P), 2 * P, 4 * P, MREMAP_MAYMOVE | MREMAP_FIXED, r(32 * P)),
            Op::Mseal(r(32 * P), 4 * P, 0),
            Op::Mprotect(r(32 * P), 4 * P, RW), // EPERM even with no change
        ],
    );
}

/// A random call of the window for [`random_scripts_agree_with_the_host`]:
/// ranges of whole pages (and some unaligned starts and lengths), fixed
/// targets only, so both sides use the same addresses.
fn random_op(rng: &mut softmm_testkit::common::Rng, creds: Creds) -> Op {
    let page = |rng: &mut softmm_testkit::common::Rng| rng.below(24) * P;
    let len = |rng: &mut softmm_testkit::common::Rng| {
        if rng.one_in(8) {
            rng.below(3 * P)
        } else {
            (1 + rng.below(8)) * P
        }
    };
    let at = |rng: &mut softmm_testkit::common::Rng| r(page(rng) + if rng.one_in(10) { 1 } else { 0 });
    let prot = |rng: &mut softmm_testkit::common::Rng| {
        [PROT_NONE, PROT_READ, RW, PROT_READ | PROT_EXEC][rng.below(4) as usize]
    };
    match rng.below(if creds.ipc_lock { 17 } else { 16 }) {
        // MDWE: set (valid and invalid bits, a stray argument) or read;
        // it refuses later mmaps and mprotects that gain PROT_EXEC.
        13 | 14 => Op::SetMdwe([1, 1, 3, 0, 2, 4][rng.below(6) as usize], u64::from(rng.one_in(10))),
        15 => Op::GetMdwe(u64::from(rng.one_in(10))),
        0 | 1 => Op::Mmap(r(page(rng)), len(rng), prot(rng), ANON_FIXED | if rng.one_in(6) { MAP_LOCKED } else { 0 }),
        2 => Op::Munmap(at(rng), len(rng)),
        3 => Op::Mprotect(at(rng), len(rng), prot(rng)),
        4 => Op::Madvise(
            at(rng),
            len(rng),
            [MADV_DONTNEED, MADV_FREE, MADV_DONTFORK, MADV_WILLNEED][rng.below(4) as usize],
        ),
        5 => Op::Mlock(at(rng), len(rng)),
        6 => Op::Mlock2(at(rng), len(rng), rng.below(2) as i32),
        7 => Op::Munlock(at(rng), len(rng)),
        8 | 9 => Op::Mseal(at(rng), len(rng), u64::from(rng.one_in(12))),
        10 => {
            let (old, new) = (len(rng) & !(P - 1), len(rng) & !(P - 1));
            Op::Mremap(at(rng), old, new, 0, r(0))
        }
        11 => Op::Mremap(at(rng), P, P, MREMAP_MAYMOVE | MREMAP_FIXED, r(page(rng) + 32 * P)),
        12 => Op::Munlockall,
        // 16, with CAP_IPC_LOCK only (MCL_CURRENT locks the whole process).
        _ => Op::Mlockall(
            [MCL_CURRENT | MCL_ONFAULT, MCL_FUTURE | MCL_ONFAULT, MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT]
                [rng.below(3) as usize],
        ),
    }
}

#[test]
fn random_scripts_agree_with_the_host() {
    let seed = softmm_testkit::common::stress_seed(0x5ea1);
    let mut rng = softmm_testkit::common::Rng::new(seed);
    for script in 0..softmm_testkit::common::scaled(150) {
        let creds = [Creds::ROOT, Creds::USER, Creds { memlock: 6 * P, ..Creds::USER }][script as usize % 3];
        let n = 4 + rng.below(24) as usize;
        let ops: Vec<Op> = (0..n).map(|_| random_op(&mut rng, creds)).collect();
        eprintln!("seed {seed:#x} script {script}");
        same_as_host(creds, &ops);
    }
}
