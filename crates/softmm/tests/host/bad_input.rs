//! Bad input, compared with the host kernel: for mmap, munmap, mprotect,
//! mremap, madvise and mincore, every argument takes zero, unaligned, huge,
//! wrapping and unknown-bit values and the flags their combinations; each
//! call runs after the same setup on Linux (in the differential runner, see
//! `softmm_testkit::differential::host`) and on softmm, and the errno or result, the maps
//! lines and the residency (`mincore`) after it must agree.
//!
//! The enumeration is deterministic: every class of every argument, and a
//! seeded sample of their products (the random-sequence differential test in
//! `differential.rs` covers sequences). Cases that could change memory of the runner itself on the
//! host (see `host::check_scenario`) run on softmm only, where they must
//! return an error or a result without panicking (with overflow checks on).
//!
//! Also here: the regression tests of configuration validation and of the
//! commit and memlock limits, which need no host.

use softmm_testkit::differential::{host, ops};

use std::sync::Arc;

use ops::{MapLine, Op, Outcome, Scenario};
use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, Errno, Fault, File, MmConfig, OpenFile, PhysConfig, PhysMem};
use softmm::{Overcommit, OvercommitMode};

const P: u64 = 4096;
const TASK_SIZE: u64 = 0x7fff_ffff_f000;
/// The last page of the 64-bit space.
const LAST_PAGE: u64 = !(P - 1);
/// The scenario window: everything below the differential test's usual
/// window top, which holds nothing of the runner's.
const WINDOW: (u64, u64) = (P, ops::DEFAULT_WINDOW.1);
/// Base of the setup mappings: 64 pages below the window's top, whose last
/// pages stay free (an mprotect walk from the window stops there).
const B: u64 = WINDOW.1 - 64 * P;

const MAP_32BIT: i32 = 0x40;
const MAP_ABOVE4G: i32 = 0x80;
const MAP_DROPPABLE: i32 = 0x08;
const MAP_SYNC: i32 = 0x80000;
const MAP_HUGE_2MB: i32 = 21 << 26;
const MAP_HUGE_1GB: i32 = 30 << 26;
const MAP_HUGE_BAD: i32 = 26 << 26;
const MADV_GUARD_INSTALL: i32 = 102;
const MADV_GUARD_REMOVE: i32 = 103;

// ---------------------------------------------------------------------------
// Configuration and limits (no host)
// ---------------------------------------------------------------------------

fn phys() -> Arc<PhysMem> {
    PhysMem::new(PhysConfig::new(8 << 20)).expect("arena")
}

#[test]
fn invalid_configs_are_einval_not_panics() {
    let p = phys();
    let d = MmConfig::default();
    let bad: Vec<(&str, MmConfig)> = vec![
        ("mmap_min_addr above task_size", d.clone().mmap_min_addr(d.task_size + P)),
        ("task_size u64::MAX", d.clone().task_size(u64::MAX)),
        ("task_size unaligned", d.clone().task_size(TASK_SIZE - 1)),
        ("task_size above 2^47 - 4096", d.clone().task_size(1 << 47)),
        ("task_size 0", d.clone().task_size(0)),
        ("task_size one page", d.clone().task_size(P).mmap_base(P).start_brk(P)),
        ("fault_around_pages 1 << 60", d.clone().fault_around_pages(1 << 60)),
        ("fault_around_pages 513", d.clone().fault_around_pages(513)),
        ("mmap_base above task_size", d.clone().mmap_base(TASK_SIZE + P)),
        ("mmap_base below mmap_min_addr", d.clone().mmap_base(0)),
        ("mmap_base unaligned", d.clone().mmap_base(d.mmap_base - 1)),
        ("start_brk above task_size", d.clone().start_brk(LAST_PAGE)),
        ("start_brk unaligned", d.clone().start_brk(d.start_brk + 1)),
        ("max_map_count 0", d.clone().max_map_count(0)),
        ("max_map_count above INT_MAX", d.clone().max_map_count(usize::MAX)),
        ("mmap_min_addr unaligned", d.clone().mmap_min_addr(0x1001)),
        ("stack_guard_gap u64::MAX", d.clone().stack_guard_gap(LAST_PAGE)),
    ];
    for (what, cfg) in bad {
        assert_eq!(AddressSpace::new(&p, cfg).err(), Some(Errno::Inval), "{what}");
    }
    // A small valid layout works, and fault_around_pages is clamped as Linux's sysctl does.
    let small = d
        .clone()
        .task_size(256 << 20)
        .mmap_base(192 << 20)
        .start_brk(64 << 20)
        .mmap_min_addr(0x10000)
        .fault_around_pages(100);
    let mm = AddressSpace::new(&p, small).expect("valid");
    assert_eq!(mm.config().fault_around_pages, 64);
    let a = mm.mmap(0, 3 * P, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    assert_eq!(a, (192 << 20) - 3 * P);
    let mm = AddressSpace::new(&p, d.clone().fault_around_pages(0)).expect("valid");
    assert_eq!(mm.config().fault_around_pages, 1);
}

#[test]
fn brk_to_task_size_is_refused_by_the_commit_limit() {
    let p = phys();
    let mm = AddressSpace::new(&p, MmConfig::default().writer_policy(softmm_testkit::common::writer_policy())).unwrap();
    let start = mm.brk(0);
    assert_eq!(mm.brk(TASK_SIZE), start, "a 42 TiB heap is more than the machine has");
    assert_eq!(mm.map_count_for_test(), 0);
    // A heap the size of the arena is allowed by the heuristic (RAM + swap).
    assert_eq!(mm.brk(start + (8 << 20)), start + (8 << 20));
    assert_eq!(p.committed_pages(), 2048);
    assert_eq!(mm.brk(start), start);
    assert_eq!(p.committed_pages(), 0);
}

trait MapCount {
    fn map_count_for_test(&self) -> usize;
}
impl MapCount for AddressSpace {
    fn map_count_for_test(&self) -> usize {
        self.stats().map_count
    }
}

#[test]
fn commit_charges_follow_linux_and_return_to_zero() {
    let p = phys();
    let rw = PROT_READ | PROT_WRITE;
    let anon = MAP_PRIVATE | MAP_ANONYMOUS;
    {
        let mm =
            AddressSpace::new(&p, MmConfig::default().writer_policy(softmm_testkit::common::writer_policy())).unwrap();
        // Heuristic mode: only a single charge above RAM + swap fails.
        assert_eq!(mm.mmap(0, (8 << 20) + P, rw, anon, None, 0), Err(Errno::NoMem));
        assert_eq!(mm.mmap(0, (8 << 20) + P, PROT_READ, anon, None, 0).map(|_| ()), Ok(()), "read-only: no charge");
        assert_eq!(mm.mmap(0, (8 << 20) + P, rw, anon | MAP_NORESERVE, None, 0).map(|_| ()), Ok(()));
        assert_eq!(p.committed_pages(), 0);
        let a = mm.mmap(0, 4 * P, rw, anon, None, 0).unwrap();
        assert_eq!(p.committed_pages(), 4);
        // MAP_FIXED over an accounted mapping charges only the difference.
        mm.mmap(a, 2 * P, rw, anon | MAP_FIXED, None, 0).unwrap();
        assert_eq!(p.committed_pages(), 4);
        mm.mmap(a, 2 * P, PROT_READ, anon | MAP_FIXED, None, 0).unwrap();
        assert_eq!(p.committed_pages(), 2);
        // mprotect making it writable charges; back to read-only (untouched) uncharges.
        mm.mprotect(a, 2 * P, rw).unwrap();
        assert_eq!(p.committed_pages(), 4);
        mm.mprotect(a, P, PROT_READ).unwrap();
        assert_eq!(p.committed_pages(), 3);
        // mremap growth charges the delta; a DONTUNMAP move the whole new
        // range (the source keeps its own charge until it is unmapped).
        let b = mm.mremap(a + P, 3 * P, 5 * P, MREMAP_MAYMOVE, 0).unwrap();
        assert_eq!(p.committed_pages(), 5);
        let c = mm.mremap(b, 5 * P, 5 * P, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, 0).unwrap();
        assert_ne!(b, c);
        assert_eq!(p.committed_pages(), 10);
        mm.munmap(c, 5 * P).unwrap();
        assert_eq!(p.committed_pages(), 5);
        let child = mm.fork().unwrap();
        assert_eq!(p.committed_pages(), 10, "fork charges the child's copy");
        drop(child);
        assert_eq!(p.committed_pages(), 5);
    }
    assert_eq!(p.committed_pages(), 0, "exit uncharges what is left");
}

#[test]
fn never_mode_limits_the_committed_total() {
    let p = phys();
    let rw = PROT_READ | PROT_WRITE;
    let anon = MAP_PRIVATE | MAP_ANONYMOUS;
    // 2048 pages of RAM, ratio 50: a commit limit of 1024 pages, less the
    // admin reserve (3% of 8 MiB: 64 pages) and min(total_vm / 32, user
    // reserve): 942 pages with 600 mapped.
    p.set_overcommit(p.overcommit().mode(OvercommitMode::Never));
    assert_eq!(p.overcommit().commit_limit(), 1024);
    let mm = AddressSpace::new(&p, MmConfig::default().writer_policy(softmm_testkit::common::writer_policy())).unwrap();
    let a = mm.mmap(0, 600 * P, rw, anon, None, 0).unwrap();
    assert_eq!(mm.mmap(0, 400 * P, rw, anon, None, 0), Err(Errno::NoMem));
    assert_eq!(p.committed_pages(), 600);
    assert!(mm.mmap(0, 300 * P, rw, anon, None, 0).is_ok());
    assert_eq!(p.committed_pages(), 900);
    // MAP_NORESERVE is not honoured in never mode.
    assert_eq!(mm.mmap(0, 100 * P, rw, anon | MAP_NORESERVE, None, 0), Err(Errno::NoMem));
    mm.munmap(a, 600 * P).unwrap();
    mm.mmap(0, 500 * P, rw, anon, None, 0).unwrap();
    p.set_overcommit(p.overcommit().mode(OvercommitMode::Always));
    mm.mmap(0, 100_000 * P, rw, anon, None, 0).unwrap();
}

#[test]
fn memlock_limit_refuses_map_locked_and_locked_growth() {
    let p = phys();
    let rw = PROT_READ | PROT_WRITE;
    let locked = MAP_PRIVATE | MAP_ANONYMOUS | MAP_LOCKED;
    let mm = AddressSpace::new(
        &p,
        MmConfig::default().writer_policy(softmm_testkit::common::writer_policy()).memlock_limit(4 * P),
    )
    .unwrap();
    assert_eq!(mm.mmap(0, 5 * P, rw, locked, None, 0), Err(Errno::Again));
    let a = mm.mmap(0, 3 * P, rw, locked, None, 0).unwrap();
    assert_eq!(mm.mremap(a, 3 * P, 5 * P, MREMAP_MAYMOVE, 0), Err(Errno::Again));
    assert_eq!(mm.mremap(a, 3 * P, 4 * P, MREMAP_MAYMOVE, 0).map(|_| ()), Ok(()));
    let mm = AddressSpace::new(
        &p,
        MmConfig::default().writer_policy(softmm_testkit::common::writer_policy()).memlock_limit(0),
    )
    .unwrap();
    assert_eq!(mm.mmap(0, P, rw, locked, None, 0), Err(Errno::Perm), "can_do_mlock");
    let mm = AddressSpace::new(
        &p,
        MmConfig::default().writer_policy(softmm_testkit::common::writer_policy()).memlock_limit(0).cap_ipc_lock(true),
    )
    .unwrap();
    assert!(mm.mmap(0, 5 * P, rw, locked, None, 0).is_ok());
}

// ---------------------------------------------------------------------------
// The host side's machine, as the softmm side must mirror it
// ---------------------------------------------------------------------------

fn sysctl(name: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/sys/vm/{name}"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("/proc/sys/vm/{name}"))
}

fn meminfo_pages(key: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").expect("/proc/meminfo");
    let kb: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix(key)?.trim().strip_suffix("kB")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{key} in /proc/meminfo"));
    kb / 4
}

/// The host's limits, as an unprivileged process sees them.
#[derive(Clone, Copy)]
struct HostLimits {
    mmap_min_addr: u64,
    max_map_count: usize,
    memlock: u64,
    overcommit: Overcommit,
}

fn host_limits() -> HostLimits {
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct we pass.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) }, 0);
    let mut overcommit = Overcommit::for_ram(meminfo_pages("MemTotal:"));
    overcommit.swap_pages = meminfo_pages("SwapTotal:");
    overcommit.mode = match sysctl("overcommit_memory") {
        0 => OvercommitMode::Guess,
        1 => OvercommitMode::Always,
        _ => OvercommitMode::Never,
    };
    overcommit.ratio = sysctl("overcommit_ratio");
    overcommit.kbytes = sysctl("overcommit_kbytes");
    overcommit.admin_reserve_kbytes = sysctl("admin_reserve_kbytes");
    overcommit.user_reserve_kbytes = sysctl("user_reserve_kbytes");
    HostLimits {
        mmap_min_addr: sysctl("mmap_min_addr"),
        max_map_count: sysctl("max_map_count") as usize,
        memlock: if rl.rlim_cur == libc::RLIM_INFINITY { u64::MAX } else { rl.rlim_cur },
        overcommit,
    }
}

// ---------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------

/// One bad-input case: the call under test, run after [`setup`] and followed
/// by a look at the residency and a cleanup.
#[derive(Clone, Debug)]
struct Case {
    op: Op,
}

/// The mappings every case starts from (fixed, inside the window):
/// anonymous read-write with two faulted pages, a shared file mapping
/// right after it, read-only anonymous, `PROT_NONE`, a growsdown stack, a
/// private file mapping at offset 2 pages, and a locked region.
fn setup() -> Vec<Op> {
    let anon = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED;
    let rw = PROT_READ | PROT_WRITE;
    let mm = |addr, len, prot, flags, file, offset| Op::Mmap { addr, len, prot, flags, file, offset };
    vec![
        mm(B, 8 * P, rw, anon, None, 0),
        Op::Probe { addr: B, write: Some(1) },
        Op::Probe { addr: B + P, write: Some(2) },
        mm(B + 8 * P, 4 * P, rw, MAP_SHARED | MAP_FIXED, Some(0), 0),
        mm(B + 16 * P, 4 * P, PROT_READ, anon, None, 0),
        mm(B + 24 * P, 2 * P, PROT_NONE, anon, None, 0),
        mm(B + 32 * P, 4 * P, rw, anon | MAP_GROWSDOWN, None, 0),
        mm(B + 40 * P, 4 * P, rw, MAP_PRIVATE | MAP_FIXED, Some(1), 2 * P),
        mm(B + 48 * P, 2 * P, rw, anon | MAP_LOCKED, None, 0),
    ]
}

/// What follows each case: residency of the setup area, then everything
/// below the window's top unmapped (the MAP_32BIT area and huge mappings
/// below the setup area included).
fn epilogue() -> Vec<Op> {
    vec![Op::Mincore { addr: B, len: 64 * P }, Op::Munmap { addr: WINDOW.0, len: WINDOW.1 - WINDOW.0 }]
}

/// Addresses: zero, the first page, unaligned, each setup mapping (start and
/// inside), a hole, the window's top page, and values at and past the end
/// of the user address space.
fn addrs() -> Vec<u64> {
    vec![
        0,
        P,
        B,
        B + P,
        B + 1,
        B + 7 * P,
        B + 8 * P,
        B + 14 * P,
        B + 16 * P,
        B + 24 * P,
        B + 32 * P,
        B + 34 * P,
        B + 40 * P,
        B + 48 * P,
        WINDOW.1 - P,
        0x4000_0000,
        TASK_SIZE - P,
        TASK_SIZE,
        1 << 47,
        0xffff_8000_0000_0000,
        LAST_PAGE,
        u64::MAX,
    ]
}

/// Lengths: zero, sub-page, page multiples around the setup mappings, and
/// sizes at and past the address space, `PAGE_ALIGN` wrapping and `u64::MAX`.
fn lens() -> Vec<u64> {
    vec![
        0,
        1,
        P - 1,
        P,
        P + 1,
        3 * P,
        8 * P,
        9 * P,
        64 * P,
        1 << 30,
        1 << 40,
        TASK_SIZE - B,
        TASK_SIZE,
        TASK_SIZE + P,
        1 << 47,
        1 << 63,
        u64::MAX - P + 2,
        LAST_PAGE,
        u64::MAX,
    ]
}

fn prots() -> Vec<i32> {
    let rw = PROT_READ | PROT_WRITE;
    vec![
        PROT_NONE,
        PROT_READ,
        rw,
        rw | PROT_EXEC,
        PROT_WRITE,
        PROT_EXEC,
        0x8, // PROT_SEM
        0x10,
        PROT_GROWSDOWN | rw,
        PROT_GROWSUP | PROT_READ,
        PROT_GROWSDOWN | PROT_GROWSUP,
        0x4000_0000,
        -1,
    ]
}

fn map_flags() -> Vec<i32> {
    let types = [0, MAP_SHARED, MAP_PRIVATE, MAP_SHARED_VALIDATE, MAP_DROPPABLE, 0x5, 0xf];
    let extra = [
        0,
        MAP_FIXED,
        MAP_FIXED_NOREPLACE,
        MAP_GROWSDOWN,
        MAP_LOCKED,
        MAP_NORESERVE,
        MAP_POPULATE,
        MAP_POPULATE | MAP_NONBLOCK,
        MAP_STACK,
        MAP_HUGETLB,
        MAP_HUGETLB | MAP_HUGE_2MB,
        MAP_HUGETLB | MAP_HUGE_1GB,
        MAP_HUGETLB | MAP_HUGE_BAD,
        MAP_HUGE_2MB,
        MAP_32BIT,
        MAP_ABOVE4G,
        MAP_SYNC,
        MAP_UNINITIALIZED,
        MAP_DENYWRITE | MAP_EXECUTABLE,
        0x0800_0000,
        i32::MIN,
    ];
    let mut v = Vec::new();
    for t in types {
        for e in extra {
            v.push(t | e);
        }
    }
    v
}

fn advices() -> Vec<i32> {
    // 100/101 (HWPOISON, SOFT_OFFLINE) are left out: they need privileges the
    // runner drops, and poisoning memory is not a thing to try by accident.
    let mut v: Vec<i32> = (0..=27).collect();
    v.extend([MADV_GUARD_INSTALL, MADV_GUARD_REMOVE, 104, 1000, -1]);
    v
}

/// A small deterministic generator (xorshift) for sampling products.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[(self.next() % v.len() as u64) as usize]
    }
}

/// Every case of the deterministic part: each argument class of each call
/// with the others at a typical value, and a seeded sample of the products.
fn enumerate() -> Vec<Case> {
    let mut cases = Vec::new();
    let mut push = |op: Op| {
        // Populating a huge mapping takes as long on both sides as it is big
        // (a TiB of zero-page faults): left out, not a bad-input question.
        let populates = matches!(op, Op::Mmap { flags, len, .. }
            if flags & (MAP_POPULATE | MAP_LOCKED) != 0 && len > 64 << 20);
        if !populates {
            cases.push(Case { op });
        }
    };
    let (addrs, lens, prots, flags, advices) = (addrs(), lens(), prots(), map_flags(), advices());
    let anon = MAP_PRIVATE | MAP_ANONYMOUS;
    let rw = PROT_READ | PROT_WRITE;
    for &addr in &addrs {
        for &len in &lens {
            push(Op::Munmap { addr, len });
            push(Op::Mincore { addr, len });
            push(Op::Mprotect { addr, len, prot: PROT_READ });
            push(Op::Madvise { addr, len, advice: libc::MADV_DONTNEED });
            push(Op::Mmap { addr, len, prot: rw, flags: anon, file: None, offset: 0 });
            push(Op::Mmap { addr, len, prot: rw, flags: anon | MAP_FIXED, file: None, offset: 0 });
            push(Op::Mmap { addr, len, prot: rw, flags: MAP_SHARED, file: Some(0), offset: 0 });
        }
        for &prot in &prots {
            for len in [P, 3 * P, 10 * P] {
                push(Op::Mprotect { addr, len, prot });
            }
        }
        for &advice in &advices {
            push(Op::Madvise { addr, len: 2 * P, advice });
        }
    }
    let hint = B + 56 * P;
    for &f in &flags {
        for (addr, len) in [(0, 3 * P), (hint, P), (B + 2 * P, 2 * P), (0, 2 << 20), (B + 1, P)] {
            let anon_file = if f & MAP_ANONYMOUS == 0 { [None, Some(0), Some(7)] } else { [None, None, None] };
            for file in anon_file {
                let fl = if file.is_none() { f | MAP_ANONYMOUS } else { f };
                push(Op::Mmap { addr, len, prot: rw, flags: fl, file, offset: 0 });
            }
            push(Op::Mmap { addr, len, prot: rw, flags: f, file: Some(0), offset: 0 });
        }
    }
    for offset in [1, P, 1 << 40, (1 << 63) - P, (1 << 63) - 4 * P, 1 << 63, LAST_PAGE] {
        for len in [P, 4 * P, 1 << 40] {
            for (flags, file) in
                [(MAP_SHARED, Some(0)), (MAP_PRIVATE, Some(0)), (anon, None), (MAP_SHARED | MAP_ANONYMOUS, None)]
            {
                push(Op::Mmap { addr: 0, len, prot: PROT_READ, flags, file, offset });
            }
        }
    }
    for len in [1 << 35, 1 << 40, (1 << 45) + P, 1 << 46] {
        for prot in [PROT_READ, rw] {
            for flags in [anon, anon | MAP_NORESERVE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, anon | MAP_32BIT] {
                push(Op::Mmap { addr: 0, len, prot, flags, file: None, offset: 0 });
            }
        }
    }
    // mremap: each argument over its classes, and a seeded sample of the product.
    let old_addrs =
        [B, B + P, B + 8 * P, B + 16 * P, B + 24 * P, B + 32 * P, B + 40 * P, B + 48 * P, B + 14 * P, 0, B + 1];
    let old_lens = [0, P, 2 * P, 8 * P, 9 * P, 1 << 46, TASK_SIZE, u64::MAX - P + 2, LAST_PAGE];
    let new_lens = [0, 1, P, 2 * P, 4 * P, 16 * P, 1 << 30, 1 << 40, TASK_SIZE, TASK_SIZE + P, u64::MAX];
    let mr_flags = [
        0,
        MREMAP_MAYMOVE,
        MREMAP_FIXED,
        MREMAP_FIXED | MREMAP_MAYMOVE,
        MREMAP_DONTUNMAP,
        MREMAP_DONTUNMAP | MREMAP_MAYMOVE,
        MREMAP_DONTUNMAP | MREMAP_FIXED | MREMAP_MAYMOVE,
        8,
        -1,
    ];
    let new_addrs = [0, P, B, B + 4 * P, B + 1, B + 56 * P, WINDOW.1 - 2 * P, 0x4000_0000, TASK_SIZE - P, TASK_SIZE];
    for &old_addr in &old_addrs {
        for &flags in &mr_flags {
            for &new_addr in &new_addrs {
                push(Op::Mremap { old_addr, old_len: 2 * P, new_len: 2 * P, flags, new_addr });
            }
        }
        for &old_len in &old_lens {
            for &new_len in &new_lens {
                push(Op::Mremap { old_addr, old_len, new_len, flags: MREMAP_MAYMOVE, new_addr: 0 });
            }
        }
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..3000 {
        push(Op::Mremap {
            old_addr: rng.pick(&old_addrs),
            old_len: rng.pick(&old_lens),
            new_len: rng.pick(&new_lens),
            flags: rng.pick(&mr_flags),
            new_addr: rng.pick(&new_addrs),
        });
    }
    for _ in 0..1500 {
        let file = rng.pick(&[None, Some(0), Some(1)]);
        let f = rng.pick(&flags);
        push(Op::Mmap {
            addr: rng.pick(&addrs),
            len: rng.pick(&lens),
            prot: rng.pick(&prots),
            flags: if file.is_none() { f | MAP_ANONYMOUS } else { f & !MAP_ANONYMOUS },
            file,
            offset: rng.pick(&[0, P, 3 * P, 1 << 40, LAST_PAGE]),
        });
        push(Op::Mprotect { addr: rng.pick(&addrs), len: rng.pick(&lens), prot: rng.pick(&prots) });
        push(Op::Madvise { addr: rng.pick(&addrs), len: rng.pick(&lens), advice: rng.pick(&advices) });
    }
    cases
}

/// Whether the host's 2 MiB or 1 GiB pool has pages no mapping reserved,
/// read once (the comparison assumes `nr_hugepages = 0`, as softmm's arena).
fn host_hugetlb_pool_in_use() -> bool {
    static IN_USE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *IN_USE.get_or_init(|| {
        ["hugepages-2048kB", "hugepages-1048576kB"].iter().any(|d| {
            let read = |f: &str| {
                std::fs::read_to_string(format!("/sys/kernel/mm/hugepages/{d}/{f}"))
                    .ok()
                    .and_then(|s| s.trim().parse::<u64>().ok())
                    .unwrap_or(0)
            };
            read("free_hugepages") > read("resv_hugepages")
        })
    })
}

/// Cases known to differ for a reason outside this test's reach, with why.
fn excluded(op: &Op) -> Option<&'static str> {
    match *op {
        // softmm's arena here has no huge page pool; the host's may have
        // free pages while another process (a test or the lab) holds a
        // reservation, and then hugetlb mappings succeed there.
        Op::Mmap { flags, .. } if flags & MAP_HUGETLB != 0 && host_hugetlb_pool_in_use() => {
            Some("the host's huge page pool has free pages (another process reserved them)")
        }
        // Linux's IS_ERR_VALUE quirk: a MAP_FIXED address in the last 4095
        // bytes of the 64-bit space comes back from get_unmapped_area
        // unchanged and is taken for an error code, so the errno is
        // -addr (EPERM for u64::MAX, ENOENT for u64::MAX - 1, ...).
        Op::Mmap { addr, flags, .. } if flags & (MAP_FIXED | MAP_FIXED_NOREPLACE) != 0 && addr > u64::MAX - 4095 => {
            Some("IS_ERR_VALUE result of a fixed address in the last page of 2^64")
        }
        // mincore checks access_ok(vec, pages) first: whether a vector of
        // `pages` bytes fits below TASK_SIZE depends on where the runner's
        // buffer lies, which softmm's slice has no notion of.
        Op::Mincore { len, .. } if len >= 1 << 32 => Some("mincore's access_ok of the host's vector"),
        // Above the window lie the runner's own pages (its stack is resident).
        Op::Mincore { addr, .. } if (WINDOW.1..TASK_SIZE).contains(&addr) => Some("residency of the runner's memory"),
        _ => None,
    }
}

// ---------------------------------------------------------------------------
// Running both sides
// ---------------------------------------------------------------------------

const FILES: [u64; 2] = [16 * P, 16 * P];

/// Builds scenarios of at most `per` host-safe cases each; returns them and
/// the cases that may only run on softmm.
fn batch(cases: &[Case], per: usize) -> (Vec<(Scenario, Vec<usize>)>, Vec<Case>) {
    let mut out = Vec::new();
    let mut softmm_only = Vec::new();
    let mut ops = Vec::new();
    let mut at = Vec::new();
    for c in cases {
        let mut case_ops = setup();
        case_ops.push(c.op.clone());
        case_ops.extend(epilogue());
        let alone = Scenario { window: WINDOW, files: FILES.to_vec(), ops: case_ops.clone() };
        if host::check_scenario(&alone).is_err() || excluded(&c.op).is_some() {
            softmm_only.push(c.clone());
            continue;
        }
        at.push(ops.len() + setup().len());
        ops.extend(case_ops);
        if at.len() == per {
            out.push((
                Scenario { window: WINDOW, files: FILES.to_vec(), ops: std::mem::take(&mut ops) },
                std::mem::take(&mut at),
            ));
        }
    }
    if !at.is_empty() {
        out.push((Scenario { window: WINDOW, files: FILES.to_vec(), ops }, at));
    }
    (out, softmm_only)
}

/// softmm laid out like the runner: its mappings outside the window mirrored
/// as `PROT_NONE` placeholders (the stack growing down), `mmap_base` at the
/// window's top, and the host's limits.
fn softmm_for(outside: &[host::OutsideVma], lim: &HostLimits) -> (Arc<PhysMem>, Arc<AddressSpace>) {
    let phys = PhysMem::new(PhysConfig::new(32 << 20)).expect("arena");
    phys.set_overcommit(lim.overcommit);
    let cfg = MmConfig::default()
        .writer_policy(softmm_testkit::common::writer_policy())
        .mmap_base(WINDOW.1)
        .mmap_min_addr(lim.mmap_min_addr)
        // The host kernel's CONFIG_LSM_MMAP_MIN_ADDR (65536, as distributions
        // build it): hints below it are rounded up to it.
        .lsm_mmap_min_addr(65536)
        .max_map_count(lim.max_map_count)
        .memlock_limit(lim.memlock);
    let mm = AddressSpace::new(&phys, cfg).expect("valid config");
    for v in outside {
        let flags = if v.stack { MAP_PRIVATE | MAP_ANONYMOUS | MAP_GROWSDOWN } else { MAP_SHARED | MAP_ANONYMOUS }
            | MAP_FIXED
            | MAP_NORESERVE;
        mm.mmap(v.start, v.end - v.start, PROT_NONE, flags, None, 0).expect("placeholder of a host mapping");
    }
    (phys, mm)
}

fn apply(mm: &AddressSpace, cpu: &mut Cpu, files: &[Arc<File>], mincore_cap: usize, op: &Op) -> Outcome {
    let errno = |r: softmm::Result<u64>| match r {
        Ok(v) => Outcome::Ok(v),
        Err(e) => Outcome::Err(e.code()),
    };
    match *op {
        Op::Mmap { addr, len, prot, flags, file, offset } => {
            // An index with no file stands for a closed descriptor.
            let of = file.and_then(|i| files.get(i)).map(OpenFile::read_write);
            if file.is_some() && of.is_none() && flags & MAP_ANONYMOUS == 0 {
                return Outcome::Err(libc::EBADF);
            }
            errno(mm.mmap(addr, len, prot, flags, of.as_ref(), offset))
        }
        Op::Munmap { addr, len } => errno(mm.munmap(addr, len).map(|()| 0)),
        Op::Mprotect { addr, len, prot } => errno(mm.mprotect(addr, len, prot).map(|()| 0)),
        Op::Mremap { old_addr, old_len, new_len, flags, new_addr } => {
            errno(mm.mremap(old_addr, old_len, new_len, flags, new_addr))
        }
        Op::Madvise { addr, len, advice } => errno(mm.madvise(addr, len, advice).map(|()| 0)),
        Op::MlockOnfault { addr, len } => errno(mm.mlock2(addr, len, MLOCK_ONFAULT).map(|()| 0)),
        Op::Munlock { addr, len } => errno(mm.munlock(addr, len).map(|()| 0)),
        Op::Mseal { addr, len } => errno(mm.mseal(addr, len, 0).map(|()| 0)),
        Op::SetMdwe => errno(mm.prctl_set_mdwe(PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0).map(|()| 0)),
        Op::Ftruncate { file, len } => errno(files[file].set_len(len).map(|()| 0)),
        Op::Mincore { addr, len } => {
            let mut v = vec![0u8; mincore_cap];
            match mm.mincore(addr, len, &mut v) {
                Ok(()) => {
                    v.truncate(len.div_ceil(P).min(mincore_cap as u64) as usize);
                    Outcome::Mincore(v.iter().map(|b| b & 1).collect())
                }
                Err(e) => Outcome::Err(e.code()),
            }
        }
        Op::Probe { addr, write } => {
            let r = match write {
                None => cpu.read_u8(addr),
                Some(b) => cpu.write_u8(addr, b).map(|()| b),
            };
            match r {
                Ok(b) => Outcome::Read(b),
                Err(Fault::Segv { code, .. }) => Outcome::Segv(code.code()),
                Err(Fault::Bus { .. }) => Outcome::Bus(ops::BUS_ADRERR),
                Err(f) => panic!("unexpected fault {f:?} probing {addr:#x}"),
            }
        }
    }
}

fn files_on(phys: &Arc<PhysMem>) -> Vec<Arc<File>> {
    FILES
        .iter()
        .enumerate()
        .map(|(i, &size)| {
            let f = File::create(phys, &format!("/memfd:f{i} (deleted)"), size).expect("file");
            let data: Vec<u8> = (0..size).map(|k| ops::file_byte(i, k)).collect();
            f.write_at(0, &data).expect("fill");
            f
        })
        .collect()
}

fn maps_in_window(mm: &AddressSpace) -> Vec<MapLine> {
    mm.maps()
        .into_iter()
        .filter(|e| e.start < WINDOW.1 && e.end > WINDOW.0)
        .map(|e| MapLine { start: e.start, end: e.end, perms: e.perms, offset: e.offset, anon: e.inode == 0 })
        .collect()
}

/// Runs the batches on both sides; returns a description of each case that
/// differs (the first differing step of a case, and its op).
fn compare_batches(batches: &[(Scenario, Vec<usize>)], lim: &HostLimits) -> Vec<String> {
    let opts = host::HostOptions { unprivileged: true, no_aslr: true };
    let mut diffs = Vec::new();
    for (s, at) in batches {
        let t = std::time::Instant::now();
        let (host, outside) = host::run_on_host_with(s, &opts);
        eprintln!("host batch of {} cases: {:?}", at.len(), t.elapsed());
        let (phys, mm) = softmm_for(&outside, lim);
        let files = files_on(&phys);
        let mut cpu = Cpu::attached(&mm);
        let cap = host::mincore_cap(s);
        let mut case = 0;
        let mut failed_case = usize::MAX;
        for (i, op) in s.ops.iter().enumerate() {
            while case + 1 < at.len() && i >= at[case + 1] - setup().len() {
                case += 1;
            }
            let mine = (apply(&mm, &mut cpu, &files, cap, op), maps_in_window(&mm));
            if mine != host.steps[i] && failed_case != case {
                failed_case = case;
                let bad = &s.ops[at[case]];
                diffs.push(format!(
                    "case {bad:?}\n  step {:+} {op:?}\n  host:   {:?}\n  softmm: {:?}\n  host maps:   {:?}\n  softmm maps: {:?}",
                    i as i64 - at[case] as i64,
                    host.steps[i].0,
                    mine.0,
                    host.steps[i].1,
                    mine.1
                ));
            }
        }
        drop(cpu);
        drop(mm);
        drop(files);
        // Shared anonymous objects return their charge when the last VMA
        // holding them is freed, after a grace period.
        phys.quiesce();
        assert_eq!(phys.committed_pages(), 0, "commit charge leaked");
    }
    diffs
}

#[test]
fn bad_input_matches_the_host() {
    let lim = host_limits();
    let cases = enumerate();
    let (batches, softmm_only) = batch(&cases, 400);
    let compared: usize = batches.iter().map(|b| b.1.len()).sum();
    // Cases the host cannot run safely must still fail or succeed cleanly.
    {
        let (phys, mm) = softmm_for(&[], &lim);
        let files = files_on(&phys);
        let mut cpu = Cpu::attached(&mm);
        for c in &softmm_only {
            for op in setup().iter().chain(std::iter::once(&c.op)).chain(epilogue().iter()) {
                apply(&mm, &mut cpu, &files, 64, op);
            }
        }
    }
    let diffs = compare_batches(&batches, &lim);
    eprintln!(
        "bad input: {} cases, {compared} compared with the host, {} on softmm only, {} differ",
        cases.len(),
        softmm_only.len(),
        diffs.len()
    );
    if !diffs.is_empty() {
        let shown: Vec<&String> = diffs.iter().take(400).collect();
        panic!(
            "{} of {compared} cases differ from the host:\n{}",
            diffs.len(),
            shown.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n")
        );
    }
}
