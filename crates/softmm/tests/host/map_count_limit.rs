//! A flag change (`mprotect`, `madvise`, `mlock`, `mseal`) of part of a VMA
//! when the address space is at or one below `max_map_count`, compared with
//! the host kernel.
//!
//! Linux's `vma_modify` (mm/vma.c) first tries a merge, which adds no VMA
//! and checks no limit; otherwise it splits the head, then the tail, each
//! `split_vma` refusing with `ENOMEM` once `map_count >= max_map_count`.
//! So one map below the limit, a change in the middle of a VMA leaves the
//! head split off and fails (`madvise` turns the `ENOMEM` into `EAGAIN`),
//! and at the limit, a change that merges with a neighbour succeeds.
//!
//! Both sides are brought to the limit the same way: single pages mapped
//! apart until `mmap` refuses (`map_count` is then `max_map_count + 1`,
//! since `do_mmap` refuses only above it), then `k` of them unmapped.

use softmm::uapi::*;
use softmm::{AddressSpace, MmConfig, PhysConfig, PhysMem};

const P: u64 = 4096;
/// Pages of the window the ops see.
const WINDOW_PAGES: u64 = 16;
/// Address space reserved for the fill pages (one page in two is mapped).
const FILL_PAGES: u64 = 2 * 70_000;
const TEXT_BYTES: usize = 1 << 20;

#[derive(Clone, Copy, Debug)]
enum Call {
    Mprotect(u64, u64, i32),
    Madvise(u64, u64, i32),
    Mlock(u64, u64),
    Mseal(u64, u64),
}

/// The window's maps lines: (start page, end page, perms).
type Lines = Vec<(u64, u64, String)>;

/// `[0, 4)` read-write and `[4, 8)` read-only anonymous, in pages.
fn setup_ops() -> [(u64, u64, i32); 2] {
    [(0, 4 * P, PROT_READ | PROT_WRITE), (4 * P, 4 * P, PROT_READ)]
}

/// The host: in a forked child, the setup, the fill, `k` fill pages
/// unmapped, the call; its result (or -errno) and the window's lines.
fn on_host(k: u64, call: Call) -> (i64, Lines) {
    // SAFETY: fresh mappings of this test's own, reserved PROT_NONE so no
    // other thread maps into them before the fork.
    let (base, fill, shared) = unsafe {
        let none = |len: u64| {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        let base = none(WINDOW_PAGES * P);
        let fill = none(FILL_PAGES * P);
        let shared = libc::mmap(
            std::ptr::null_mut(),
            TEXT_BYTES + 8,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert!(base != libc::MAP_FAILED && fill != libc::MAP_FAILED && shared != libc::MAP_FAILED);
        (base as u64, fill as u64, shared as *mut u8)
    };
    // SAFETY: the child makes raw system calls only and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: the child's own address space.
        unsafe {
            libc::munmap(base as *mut _, (WINDOW_PAGES * P) as usize);
            libc::munmap(fill as *mut _, (FILL_PAGES * P) as usize);
            for (off, len, prot) in setup_ops() {
                let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED;
                if libc::mmap((base + off) as *mut _, len as usize, prot, flags, -1, 0) == libc::MAP_FAILED {
                    libc::_exit(2);
                }
            }
            let mut n = 0;
            loop {
                let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE;
                let at = fill + 2 * n * P;
                if 2 * n >= FILL_PAGES {
                    libc::_exit(3);
                }
                if libc::mmap(at as *mut _, P as usize, libc::PROT_READ, flags, -1, 0) == libc::MAP_FAILED {
                    break;
                }
                n += 1;
            }
            for i in 1..=k {
                libc::munmap((fill + 2 * (n - i) * P) as *mut _, P as usize);
            }
            let r = match call {
                Call::Mprotect(o, l, prot) => libc::mprotect((base + o) as *mut _, l as usize, prot) as i64,
                Call::Madvise(o, l, adv) => libc::madvise((base + o) as *mut _, l as usize, adv) as i64,
                Call::Mlock(o, l) => libc::mlock((base + o) as *const _, l as usize) as i64,
                Call::Mseal(o, l) => libc::syscall(462, base + o, l, 0u64),
            };
            let r = if r == -1 { -(*libc::__errno_location()) as i64 } else { r };
            shared.cast::<i64>().write(r);
            // The fill is far from the window: unmapping it changes nothing
            // there, and keeps the maps text short.
            libc::munmap(fill as *mut _, (FILL_PAGES * P) as usize);
            softmm_testkit::common::read_raw_nul(c"/proc/self/maps", shared.add(8), TEXT_BYTES);
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "host child failed: {status:#x}");
    // SAFETY: the child wrote the result and a NUL-terminated text.
    let (r, text) = unsafe {
        (shared.cast::<i64>().read(), std::ffi::CStr::from_ptr(shared.add(8).cast()).to_string_lossy().into_owned())
    };
    let end = base + WINDOW_PAGES * P;
    let lines = text
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (s, e) = f.next()?.split_once('-')?;
            let (s, e) = (u64::from_str_radix(s, 16).ok()?, u64::from_str_radix(e, 16).ok()?);
            let perms = f.next()?.to_string();
            (s >= base && e <= end).then(|| ((s - base) / P, (e - base) / P, perms))
        })
        .collect();
    // SAFETY: our own mappings.
    unsafe {
        libc::munmap(base as *mut _, (WINDOW_PAGES * P) as usize);
        libc::munmap(fill as *mut _, (FILL_PAGES * P) as usize);
        libc::munmap(shared.cast(), TEXT_BYTES + 8);
    }
    (r, lines)
}

/// The same steps on softmm, with a small `max_map_count`.
fn on_softmm(k: u64, call: Call) -> (i64, Lines) {
    let phys = PhysMem::new(PhysConfig::new(16 << 20)).unwrap();
    let config = MmConfig::default().max_map_count(64).writer_policy(softmm_testkit::common::writer_policy());
    let mm = AddressSpace::new(&phys, config).unwrap();
    let base = 0x2000_0000_0000u64;
    let fill = 0x3000_0000_0000u64;
    for (off, len, prot) in setup_ops() {
        mm.mmap(base + off, len, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, None, 0).unwrap();
    }
    let mut n = 0;
    while mm.mmap(fill + 2 * n * P, P, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, None, 0).is_ok() {
        n += 1;
    }
    for i in 1..=k {
        mm.munmap(fill + 2 * (n - i) * P, P).unwrap();
    }
    let r = match call {
        Call::Mprotect(o, l, prot) => mm.mprotect(base + o, l, prot),
        Call::Madvise(o, l, adv) => mm.madvise(base + o, l, adv),
        Call::Mlock(o, l) => mm.mlock(base + o, l),
        Call::Mseal(o, l) => mm.mseal(base + o, l, 0),
    };
    let r = match r {
        Ok(()) => 0,
        Err(e) => -(e.code() as i64),
    };
    let lines = mm
        .maps()
        .into_iter()
        .filter(|m| m.start >= base && m.end <= base + WINDOW_PAGES * P)
        .map(|m| ((m.start - base) / P, (m.end - base) / P, m.perms.clone()))
        .collect();
    (r, lines)
}

#[test]
fn a_flag_change_at_the_map_count_limit_matches_the_host() {
    let cases = [
        // One below the limit: the head split succeeds, the tail's fails.
        (2, Call::Mprotect(5 * P, P, PROT_NONE)),
        (2, Call::Madvise(5 * P, P, MADV_DONTFORK)),
        (2, Call::Mlock(5 * P, P)),
        (2, Call::Mseal(5 * P, P)),
        // At the limit: a change that merges with the previous VMA adds
        // no VMA and succeeds.
        (1, Call::Mprotect(4 * P, P, PROT_READ | PROT_WRITE)),
    ];
    let mut diffs = Vec::new();
    for (k, call) in cases {
        let host = on_host(k, call);
        let mine = on_softmm(k, call);
        eprintln!("k={k} {call:?}\n  host   {host:?}\n  softmm {mine:?}");
        if host != mine {
            diffs.push(format!("k={k} {call:?}: host {host:?}, softmm {mine:?}"));
        }
    }
    assert!(diffs.is_empty(), "softmm differs from the host:\n{}", diffs.join("\n"));
}
