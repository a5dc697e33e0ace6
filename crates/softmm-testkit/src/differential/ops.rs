//! Shared vocabulary of the differential test: the ops a scenario runs, what
//! each op produced, the `/proc/self/maps` lines seen after it, a proptest
//! strategy that generates scenarios, and fixed scenarios taken from the
//! kernel selftests (`tools/testing/selftests/mm/`).
//!
//! [`host`](super::host) runs a scenario on the host kernel.
//!
//! Only `libc`, `std` and `proptest` are used; nothing here refers to softmm.
//!
//! # Rules every scenario follows (the generator and the fixed scenarios do)
//!
//! * Addresses are x86-64 user addresses, pages are 4 KiB.
//! * Every range an op names lies inside `window`, except ranges the kernel
//!   rejects before it looks at any mapping (unaligned address, length that
//!   overflows when rounded up or when added to the address). On the host the
//!   memory right above `window.1` is a mapped `PROT_NONE` filler and the
//!   memory below `window.0` is free, so an op reaching past `window.1` would
//!   see something the model does not have. `host::run_on_host` panics on a
//!   scenario that could modify memory outside the window.
//! * An anonymous `Mmap` (`file: None`) always carries `MAP_ANONYMOUS` in
//!   `flags` (the host passes `flags` verbatim and fd -1).
//! * Non-fixed mmaps with no hint are placed by the kernel top-down from
//!   `window.1`, exactly as if `window.1` were `mmap_base`.

#![allow(dead_code)]

use proptest::prelude::*;

mod kselftest;

pub use kselftest::{kselftest_scenarios, kselftest_scenarios_named};

/// Page size of the host (x86-64).
pub const PAGE: u64 = 4096;
/// 2 MiB, the PMD size.
pub const PMD: u64 = 2 << 20;

pub const PROT_NONE: i32 = libc::PROT_NONE;
pub const PROT_READ: i32 = libc::PROT_READ;
pub const PROT_WRITE: i32 = libc::PROT_WRITE;
pub const PROT_EXEC: i32 = libc::PROT_EXEC;
pub const PROT_RW: i32 = libc::PROT_READ | libc::PROT_WRITE;

pub const MAP_SHARED: i32 = libc::MAP_SHARED;
pub const MAP_PRIVATE: i32 = libc::MAP_PRIVATE;
pub const MAP_SHARED_VALIDATE: i32 = 0x03;
pub const MAP_FIXED: i32 = libc::MAP_FIXED;
pub const MAP_ANONYMOUS: i32 = libc::MAP_ANONYMOUS;
pub const MAP_NORESERVE: i32 = libc::MAP_NORESERVE;
pub const MAP_POPULATE: i32 = libc::MAP_POPULATE;
pub const MAP_FIXED_NOREPLACE: i32 = 0x10_0000;

pub const MREMAP_MAYMOVE: i32 = 1;
pub const MREMAP_FIXED: i32 = 2;
pub const MREMAP_DONTUNMAP: i32 = 4;

pub const MADV_NORMAL: i32 = 0;
pub const MADV_WILLNEED: i32 = 3;
pub const MADV_DONTNEED: i32 = 4;
pub const MADV_FREE: i32 = 8;
pub const MADV_DONTFORK: i32 = 10;
pub const MADV_DOFORK: i32 = 11;
pub const MADV_WIPEONFORK: i32 = 18;
pub const MADV_KEEPONFORK: i32 = 19;
pub const MADV_POPULATE_READ: i32 = 22;
pub const MADV_POPULATE_WRITE: i32 = 23;

pub const SEGV_MAPERR: i32 = 1;
pub const SEGV_ACCERR: i32 = 2;
pub const BUS_ADRERR: i32 = 2;

/// One system call (or one memory access) of a scenario.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `file`: `None` = anonymous (fd -1; `flags` carries `MAP_ANONYMOUS`);
    /// `Some(i)` = the i-th test file (a memfd on the host), opened `O_RDWR`.
    Mmap {
        addr: u64,
        len: u64,
        prot: i32,
        flags: i32,
        file: Option<usize>,
        offset: u64,
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
    Mremap {
        old_addr: u64,
        old_len: u64,
        new_len: u64,
        flags: i32,
        new_addr: u64,
    },
    Madvise {
        addr: u64,
        len: u64,
        advice: i32,
    },
    Ftruncate {
        file: usize,
        len: u64,
    },
    /// Probe one byte: read it (`write: None`) or write the given byte.
    Probe {
        addr: u64,
        write: Option<u8>,
    },
    /// mincore over `[addr, addr + len)`.
    Mincore {
        addr: u64,
        len: u64,
    },
    /// `mlock2(addr, len, MLOCK_ONFAULT)`: locks without populating (a
    /// populating `mlock` of a window-sized range would fault in more than
    /// a model's arena holds). Always inside the window: a lock's walk
    /// past it would lock the host's fillers.
    MlockOnfault {
        addr: u64,
        len: u64,
    },
    /// `munlock(addr, len)`, inside the window likewise.
    Munlock {
        addr: u64,
        len: u64,
    },
    /// `mseal(addr, len, 0)`: irreversible, but only for the runner of
    /// this one scenario.
    Mseal {
        addr: u64,
        len: u64,
    },
    /// `prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0)`: from then
    /// on no mapping may gain `PROT_EXEC` or be writable and executable.
    SetMdwe,
}

/// What one op produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Syscall return value (mmap/mremap: the address; 0 for the others).
    Ok(u64),
    /// errno.
    Err(i32),
    /// Probe read succeeded with this byte, or probe write succeeded (the byte written).
    Read(u8),
    /// Probe got SIGSEGV with this si_code (SEGV_MAPERR = 1, SEGV_ACCERR = 2).
    Segv(i32),
    /// Probe got SIGBUS with this si_code (BUS_ADRERR = 2).
    Bus(i32),
    /// mincore vector (low bit of each byte only).
    Mincore(Vec<u8>),
}

/// One line of `/proc/self/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapLine {
    pub start: u64,
    pub end: u64,
    /// e.g. `"rw-p"`.
    pub perms: String,
    /// The offset column. The kernel prints 0 for VMAs without a file; for a
    /// shared anonymous mapping (shmem-backed, `/dev/zero (deleted)`) it
    /// prints the page offset into the shmem object.
    pub offset: u64,
    /// Inode column is 0. NOTE: shared anonymous mappings have an inode
    /// (they are shmem files), so they show `anon == false`.
    pub anon: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scenario {
    /// `[window.0, window.1)`, page aligned; `window.1` acts as `mmap_base`.
    pub window: (u64, u64),
    /// Sizes in bytes. File i's byte at offset k is initially [`file_byte`]`(i, k)`.
    pub files: Vec<u64>,
    pub ops: Vec<Op>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    /// One per op: its outcome and the maps lines intersecting the window
    /// after it (not clipped to the window).
    pub steps: Vec<(Outcome, Vec<MapLine>)>,
}

/// Initial content of test file `file` at byte offset `k`.
pub fn file_byte(file: usize, k: u64) -> u8 {
    k.wrapping_mul(7).wrapping_add((file as u64).wrapping_mul(13)).wrapping_add(1) as u8
}

/// Default window: 1 GiB at 32 TiB, 2 MiB aligned, far from anything the
/// kernel places on its own in a normal x86-64 process.
pub const DEFAULT_WINDOW: (u64, u64) = (0x2000_0000_0000, 0x2000_4000_0000);

/// Checks the comparability rule of the module docs: every range an op names
/// (page-rounded; the hint range of a non-fixed mmap too) and every probed
/// address lies inside the window, unless the kernel rejects the range
/// outright (unaligned address where alignment is required, length 0, length
/// that overflows when page-rounded or added to the address). Ops outside
/// the window would see the host's fillers (or its own memory), which a model
/// does not have. `scenario_strategy` and `kselftest_scenarios` pass it.
pub fn check_in_window(s: &Scenario) -> Result<(), String> {
    let (lo, hi) = s.window;
    let inside = |addr: u64, len: u64, aligned_only: bool| -> bool {
        if len == 0 || (aligned_only && addr % PAGE != 0) {
            return true;
        }
        let start = addr & !(PAGE - 1);
        let Some(alen) = len.checked_add(addr - start).and_then(|l| l.checked_add(PAGE - 1)) else {
            return true;
        };
        match start.checked_add(alen & !(PAGE - 1)) {
            None => true,
            Some(end) => start >= lo && end <= hi,
        }
    };
    for (i, op) in s.ops.iter().enumerate() {
        let ok = match *op {
            Op::Mmap { addr: 0, .. } => true,
            Op::Mmap { addr, len, flags, .. } => inside(addr, len, flags & (MAP_FIXED | MAP_FIXED_NOREPLACE) != 0),
            Op::Munmap { addr, len }
            | Op::Mprotect { addr, len, .. }
            | Op::Madvise { addr, len, .. }
            | Op::Mincore { addr, len } => inside(addr, len, true),
            // A lock rounds an unaligned start down: never exempt.
            Op::MlockOnfault { addr, len } | Op::Munlock { addr, len } => inside(addr, len, false),
            Op::Mseal { addr, len } => inside(addr, len, true),
            Op::SetMdwe => true,
            Op::Mremap { old_addr, old_len, new_len, flags, new_addr } => {
                inside(old_addr, old_len, true)
                    && (flags & MREMAP_FIXED == 0 || inside(new_addr, new_len, true))
                    && (flags & (MREMAP_FIXED | MREMAP_DONTUNMAP) != 0
                        || old_addr % PAGE != 0
                        || inside(old_addr, new_len, true))
            }
            Op::Probe { addr, .. } => addr >= lo && addr < hi,
            Op::Ftruncate { .. } => true,
        };
        if !ok {
            return Err(format!("op {i} ({op:?}) reaches outside the window {lo:#x}..{hi:#x}"));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// proptest strategy
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
struct Ctx {
    lo: u64,
    top: u64,
    /// Largest distance from the top, in pages, an op may start at.
    max_k: u64,
    nfiles: usize,
    file_pages: [u64; 3],
}

/// Start of a range, in pages below the top of the window. Small distances
/// dominate so that ops keep hitting the mappings that no-hint mmaps place at
/// the top; a few 2 MiB-aligned anchors (when `window.1` is 2 MiB aligned)
/// give room to 2 MiB-sized fixed mappings.
fn k_pages(ctx: Ctx) -> BoxedStrategy<u64> {
    prop_oneof![
        8 => 1u64..=32,
        4 => 1u64..=96,
        1 => 1u64..=256,
        1 => prop::sample::select(vec![512u64, 768, 1024, 1536, 2048]),
    ]
    .prop_map(move |k| k.min(ctx.max_k))
    .boxed()
}

fn len_pages() -> BoxedStrategy<u64> {
    prop_oneof![
        8 => 1u64..=4,
        4 => 1u64..=16,
        1 => 1u64..=64,
        1 => prop::sample::select(vec![512u64, 1024]),
    ]
    .boxed()
}

/// A page-aligned `(addr, len)` with `addr + len <= window.1`.
fn range_in(ctx: Ctx) -> BoxedStrategy<(u64, u64)> {
    (k_pages(ctx), len_pages()).prop_map(move |(k, l)| (ctx.top - k * PAGE, l.min(k) * PAGE)).boxed()
}

/// Bad `(addr, len)` the kernel rejects (or treats as a no-op) before it
/// touches any mapping: unaligned address, zero length, wrapping lengths.
fn bad_range(ctx: Ctx) -> BoxedStrategy<(u64, u64)> {
    let wrap = move |a: u64, j: u64| (u64::MAX - a).wrapping_add(1).wrapping_add(j * PAGE);
    prop_oneof![
        // Unaligned address; rounded up (as a hint) it still ends in the window.
        (range_in(ctx), 1u64..PAGE).prop_map(move |((a, l), o)| {
            let a = if a - PAGE >= ctx.lo { a - PAGE } else { a };
            (a + o, l)
        }),
        range_in(ctx).prop_map(|(a, _)| (a, 0)),
        (range_in(ctx), prop::sample::select(vec![0u64, 1, 2, 16])).prop_map(move |((a, _), sel)| {
            let len = match sel {
                0 => u64::MAX,
                1 => u64::MAX - (PAGE - 1),
                2 => wrap(a, 0),
                _ => wrap(a, 1),
            };
            (a, len)
        }),
    ]
    .boxed()
}

fn any_range(ctx: Ctx) -> BoxedStrategy<(u64, u64)> {
    prop_oneof![12 => range_in(ctx), 1 => bad_range(ctx)].boxed()
}

fn prot() -> BoxedStrategy<i32> {
    prop_oneof![
        8 => Just(PROT_RW),
        4 => Just(PROT_READ),
        2 => Just(PROT_NONE),
        1 => Just(PROT_READ | PROT_EXEC),
        1 => Just(PROT_WRITE),
        1 => Just(PROT_RW | PROT_EXEC),
    ]
    .boxed()
}

/// Mostly valid prot, a small rate of invalid bits.
fn any_prot() -> BoxedStrategy<i32> {
    prop_oneof![
        20 => prot(),
        1 => Just(0x10),
        1 => Just(0x8 | PROT_READ),
        1 => Just(libc::PROT_GROWSDOWN | PROT_READ),
        1 => Just(0x40 | PROT_RW),
    ]
    .boxed()
}

fn share() -> BoxedStrategy<i32> {
    // MAP_SHARED_VALIDATE is EINVAL for anonymous mappings (only file mappings validate).
    prop_oneof![10 => Just(MAP_PRIVATE), 4 => Just(MAP_SHARED), 1 => Just(MAP_SHARED_VALIDATE)].boxed()
}

fn extra_flags() -> BoxedStrategy<i32> {
    prop_oneof![
        24 => Just(0),
        3 => Just(MAP_NORESERVE),
        3 => Just(MAP_POPULATE),
        // Unknown bits: ignored by MAP_PRIVATE/MAP_SHARED, EOPNOTSUPP with MAP_SHARED_VALIDATE.
        1 => Just(0x20_0000),
        1 => Just(0x100_0000),
    ]
    .boxed()
}

#[derive(Clone, Copy, Debug)]
enum Place {
    NoHint,
    Hint,
    Fixed,
    NoReplace,
}

fn place() -> BoxedStrategy<Place> {
    prop_oneof![
        4 => Just(Place::NoHint),
        2 => Just(Place::Hint),
        3 => Just(Place::Fixed),
        3 => Just(Place::NoReplace),
    ]
    .boxed()
}

fn place_flags(p: Place) -> i32 {
    match p {
        Place::NoHint | Place::Hint => 0,
        Place::Fixed => MAP_FIXED,
        Place::NoReplace => MAP_FIXED_NOREPLACE,
    }
}

fn mmap_anon(ctx: Ctx) -> BoxedStrategy<Op> {
    (place(), any_range(ctx), len_pages(), any_prot(), share(), extra_flags())
        .prop_map(move |(p, (a, l), nl, prot, share, extra)| {
            let (addr, len) = match p {
                Place::NoHint => (0, nl * PAGE),
                _ => (a, l),
            };
            let flags = share | MAP_ANONYMOUS | place_flags(p) | extra;
            Op::Mmap { addr, len, prot, flags, file: None, offset: 0 }
        })
        .boxed()
}

fn mmap_file(ctx: Ctx) -> BoxedStrategy<Op> {
    let nfiles = ctx.nfiles;
    (
        0..nfiles,
        place(),
        (k_pages(ctx), 1u64..=32),
        prop_oneof![5 => Just(PROT_RW), 3 => Just(PROT_READ), 1 => Just(PROT_NONE)],
        prop_oneof![5 => Just(MAP_SHARED), 5 => Just(MAP_PRIVATE), 1 => Just(MAP_SHARED_VALIDATE)],
        (0u64..=34, prop_oneof![12 => Just(0u64), 1 => 1u64..PAGE]),
        prop_oneof![12 => Just(0i32), 1 => Just(MAP_POPULATE), 1 => Just(0x20_0000)],
    )
        .prop_map(move |(fi, p, (k, l), prot, share, (opg, obytes), extra)| {
            let len = l.min(k) * PAGE;
            let addr = match p {
                Place::NoHint => 0,
                _ => ctx.top - k * PAGE,
            };
            let fp = ctx.file_pages[fi];
            // Mostly offsets inside the file, sometimes past its end.
            let off_pages = if opg <= 30 { opg % (fp + 1) } else { fp + opg - 30 };
            Op::Mmap {
                addr,
                len: if matches!(p, Place::NoHint) { l * PAGE } else { len },
                prot,
                flags: share | place_flags(p) | extra,
                file: Some(fi),
                offset: off_pages * PAGE + obytes,
            }
        })
        .boxed()
}

fn mmap_any(ctx: Ctx) -> BoxedStrategy<Op> {
    prop_oneof![3 => mmap_anon(ctx), 1 => mmap_file(ctx)].boxed()
}

fn munmap(ctx: Ctx) -> BoxedStrategy<Op> {
    any_range(ctx).prop_map(|(addr, len)| Op::Munmap { addr, len }).boxed()
}

fn mprotect(ctx: Ctx) -> BoxedStrategy<Op> {
    (any_range(ctx), any_prot()).prop_map(|((addr, len), prot)| Op::Mprotect { addr, len, prot }).boxed()
}

fn madvise(ctx: Ctx) -> BoxedStrategy<Op> {
    let advice = prop_oneof![
        4 => Just(MADV_DONTNEED),
        2 => Just(MADV_FREE),
        2 => Just(MADV_WILLNEED),
        2 => Just(MADV_POPULATE_READ),
        2 => Just(MADV_POPULATE_WRITE),
        2 => Just(MADV_DONTFORK),
        1 => Just(MADV_DOFORK),
        2 => Just(MADV_WIPEONFORK),
        1 => Just(MADV_KEEPONFORK),
        1 => Just(MADV_NORMAL),
        1 => Just(999),
    ];
    (any_range(ctx), advice).prop_map(|((addr, len), advice)| Op::Madvise { addr, len, advice }).boxed()
}

fn ftruncate(ctx: Ctx) -> BoxedStrategy<Op> {
    (0..ctx.nfiles, 0u64..=40, prop_oneof![8 => Just(0u64), 1 => 1u64..PAGE, 1 => Just(u64::MAX)])
        .prop_map(|(file, pages, extra)| {
            let len = if extra == u64::MAX { u64::MAX } else { pages * PAGE + extra };
            Op::Ftruncate { file, len }
        })
        .boxed()
}

fn probe(ctx: Ctx) -> BoxedStrategy<Op> {
    (k_pages(ctx), prop_oneof![3 => Just(0u64), 1 => Just(PAGE - 1), 2 => 0u64..PAGE], prop::option::of(any::<u8>()))
        .prop_map(move |(k, off, write)| Op::Probe { addr: ctx.top - k * PAGE + off, write })
        .boxed()
}

fn mincore(ctx: Ctx) -> BoxedStrategy<Op> {
    any_range(ctx).prop_map(|(addr, len)| Op::Mincore { addr, len }).boxed()
}

#[derive(Clone, Copy, Debug)]
enum RemapKind {
    Shrink,
    Same,
    Grow,
    GrowMayMove,
    FixedMove,
    DontUnmap,
    DontUnmapFixed,
    Bad,
}

fn mremap(ctx: Ctx) -> BoxedStrategy<Op> {
    let kind = prop_oneof![
        3 => Just(RemapKind::Shrink),
        1 => Just(RemapKind::Same),
        3 => Just(RemapKind::Grow),
        3 => Just(RemapKind::GrowMayMove),
        3 => Just(RemapKind::FixedMove),
        2 => Just(RemapKind::DontUnmap),
        1 => Just(RemapKind::DontUnmapFixed),
        1 => Just(RemapKind::Bad),
    ];
    (kind, range_in(ctx), range_in(ctx), any::<u64>(), 0u64..8)
        .prop_map(move |(kind, (oa, ol), (na, nl), r, bad)| {
            let op = |old_addr, old_len, new_len, flags, new_addr| Op::Mremap {
                old_addr,
                old_len,
                new_len,
                flags,
                new_addr,
            };
            let room = ctx.top - oa; // largest new_len that stays in the window
            match kind {
                RemapKind::Shrink => op(oa, ol, PAGE * (1 + r % (ol / PAGE)), 0, 0),
                RemapKind::Same => op(oa, ol, ol, 0, 0),
                RemapKind::Grow | RemapKind::GrowMayMove => {
                    let want = ol + PAGE * (1 + r % 16);
                    let flags = if matches!(kind, RemapKind::Grow) { 0 } else { MREMAP_MAYMOVE };
                    op(oa, ol, want.min(room), flags, 0)
                }
                RemapKind::FixedMove => op(oa, ol, nl, MREMAP_MAYMOVE | MREMAP_FIXED, na),
                RemapKind::DontUnmap => op(oa, ol, ol, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, 0),
                RemapKind::DontUnmapFixed => {
                    let l = ol.min(ctx.top - na);
                    op(oa, l, l, MREMAP_MAYMOVE | MREMAP_DONTUNMAP | MREMAP_FIXED, na)
                }
                RemapKind::Bad => match bad {
                    0 => op(oa, ol, nl, MREMAP_FIXED, na),    // FIXED without MAYMOVE
                    1 => op(oa, ol, ol, MREMAP_DONTUNMAP, 0), // DONTUNMAP without MAYMOVE
                    2 => op(oa, ol, ol + PAGE, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, 0), // sizes differ
                    3 => op(oa, ol, ol, MREMAP_MAYMOVE | 8, 0), // unknown flag
                    4 => op(oa, 0, ol, MREMAP_MAYMOVE, 0),    // old_len 0
                    5 => op(oa, ol, 0, MREMAP_MAYMOVE, 0),    // new_len 0
                    6 => op(oa + 1 + r % (PAGE - 1), ol, ol, MREMAP_MAYMOVE, 0), // unaligned
                    _ => op(oa, ol, ol, MREMAP_MAYMOVE | MREMAP_FIXED, oa), // overlapping fixed
                },
            }
        })
        .boxed()
}

/// Locks, unlocks and seals of ranges inside the window, and MDWE.
fn lock_seal(ctx: Ctx) -> BoxedStrategy<Op> {
    prop_oneof![
        3 => range_in(ctx).prop_map(|(addr, len)| Op::MlockOnfault { addr, len }),
        2 => range_in(ctx).prop_map(|(addr, len)| Op::Munlock { addr, len }),
        2 => range_in(ctx).prop_map(|(addr, len)| Op::Mseal { addr, len }),
        1 => Just(Op::SetMdwe),
    ]
    .boxed()
}

fn op_strategy(ctx: Ctx) -> BoxedStrategy<Op> {
    prop_oneof![
        6 => mmap_anon(ctx),
        3 => mmap_file(ctx),
        3 => munmap(ctx),
        4 => mprotect(ctx),
        4 => mremap(ctx),
        4 => madvise(ctx),
        1 => ftruncate(ctx),
        6 => probe(ctx),
        2 => mincore(ctx),
        2 => lock_seal(ctx),
    ]
    .boxed()
}

/// Makes an op aim at (part of) a range an earlier op mapped at a known
/// address, so that most ops hit existing mappings.
#[derive(Clone, Copy, Debug)]
struct RefSel {
    pick: u32,
    how: u8,
    off: u64,
}

fn ref_sel() -> BoxedStrategy<RefSel> {
    (any::<u32>(), 0u8..14, any::<u64>()).prop_map(|(pick, how, off)| RefSel { pick, how, off }).boxed()
}

fn page_ok(ctx: Ctx, a: u64, l: u64) -> bool {
    a % PAGE == 0 && l % PAGE == 0 && l > 0 && a >= ctx.lo && a.checked_add(l).is_some_and(|e| e <= ctx.top)
}

/// Remembers ranges mapped at addresses known in advance (fixed, no-replace,
/// hinted mmaps and MREMAP_FIXED targets).
fn note_range(ctx: Ctx, op: &Op, known: &mut Vec<(u64, u64)>) {
    match *op {
        Op::Mmap { addr, len, .. } if addr != 0 && page_ok(ctx, addr, len) => known.push((addr, len)),
        Op::Mremap { new_addr, new_len, flags, .. } if flags & MREMAP_FIXED != 0 && page_ok(ctx, new_addr, new_len) => {
            known.push((new_addr, new_len))
        }
        _ => {}
    }
}

/// A sub-range (or a slight overhang) of the known range `(a, l)`.
fn sub_range(ctx: Ctx, a: u64, l: u64, how: u8) -> (u64, u64) {
    let half = (l / 2) & !(PAGE - 1);
    match how {
        0..=3 => (a, l),
        4 => (a, PAGE),
        5 => (a + l - PAGE, PAGE),
        6 | 7 if l >= 3 * PAGE => (a + PAGE, l - 2 * PAGE),
        8 if half > 0 => (a, half),
        9 if half > 0 => (a + half, l - half),
        10 => {
            let s = a.saturating_sub(PAGE).max(ctx.lo);
            let e = (a + l + PAGE).min(ctx.top);
            (s, e - s)
        }
        11 => {
            let e = (a + l + 2 * PAGE).min(ctx.top);
            let s = if l > PAGE { a + PAGE } else { a };
            (s, e - s)
        }
        _ => (a, l),
    }
}

fn retarget(ctx: Ctx, op: &mut Op, sel: RefSel, known: &[(u64, u64)]) {
    if known.is_empty() {
        return;
    }
    let (a, l) = known[sel.pick as usize % known.len()];
    let (sa, sl) = sub_range(ctx, a, l, sel.how);
    let room = ctx.top - sa;
    match op {
        // Leave deliberately bad ranges alone.
        Op::Mmap { addr, len, .. } if *addr != 0 && page_ok(ctx, *addr, *len) => {
            *addr = sa;
            *len = sl;
        }
        Op::Munmap { addr, len }
        | Op::Mprotect { addr, len, .. }
        | Op::Madvise { addr, len, .. }
        | Op::Mincore { addr, len }
        | Op::MlockOnfault { addr, len }
        | Op::Munlock { addr, len }
        | Op::Mseal { addr, len }
            if page_ok(ctx, *addr, *len) =>
        {
            *addr = sa;
            *len = sl;
        }
        Op::Probe { addr, .. } => *addr = sa + sel.off % sl,
        Op::Mremap { old_addr, old_len, new_len, flags, new_addr }
            if page_ok(ctx, *old_addr, *old_len) && *new_len > 0 =>
        {
            let f = *flags;
            if f == MREMAP_MAYMOVE | MREMAP_FIXED {
                *old_addr = sa;
                *old_len = sl;
            } else if f == MREMAP_MAYMOVE | MREMAP_DONTUNMAP | MREMAP_FIXED {
                let l2 = sl.min(ctx.top - *new_addr);
                *old_addr = sa;
                *old_len = l2;
                *new_len = l2;
            } else if f == MREMAP_MAYMOVE | MREMAP_DONTUNMAP && *old_len == *new_len {
                *old_addr = sa;
                *old_len = sl;
                *new_len = sl;
            } else if f == 0 || f == MREMAP_MAYMOVE {
                let delta = *new_len as i64 - *old_len as i64;
                *old_addr = sa;
                *old_len = sl;
                *new_len = ((sl as i64 + delta).max(PAGE as i64) as u64).min(room);
            }
        }
        _ => {}
    }
}

/// Scenarios of 10–40 ops with 1–3 files of 1–32 pages each.
///
/// `window` must be page aligned and at least 16 MiB; make `window.1` 2 MiB
/// aligned to see the THP alignment of 2 MiB-multiple anonymous mmaps the
/// same way on both sides. See the module docs for the rules the generated
/// ops follow.
/// Drops `MREMAP_DONTUNMAP` from the moves of a scenario that locks.
///
/// Linux 6.18 (the host) lets an unfaulted anonymous `MREMAP_DONTUNMAP`
/// move merge with its own kept source, and then clears the lock of the
/// whole merged VMA, the part the call never moved included. Linux 6.12's
/// `copy_vma` forbids that self-merge (`keep_source`), and softmm follows
/// 6.12 (`tests/semantics/lock_seal.rs`,
/// `a_dontunmap_move_keeps_its_locked_source_apart_as_linux_6_12`).
fn without_dontunmap_where_locked(ops: &mut [Op]) {
    if ops.iter().any(|op| matches!(op, Op::MlockOnfault { .. })) {
        for op in ops {
            if let Op::Mremap { flags, .. } = op {
                *flags &= !MREMAP_DONTUNMAP;
            }
        }
    }
}

pub fn scenario_strategy(window: (u64, u64)) -> impl Strategy<Value = Scenario> {
    assert!(window.0 % PAGE == 0 && window.1 % PAGE == 0, "window must be page aligned");
    assert!(window.1 > window.0 && window.1 - window.0 >= 16 << 20, "window must be at least 16 MiB");
    prop::collection::vec(1u64..=32, 1..=3).prop_flat_map(move |file_pages| {
        let mut fp = [1u64; 3];
        fp[..file_pages.len()].copy_from_slice(&file_pages);
        let ctx = Ctx {
            lo: window.0,
            top: window.1,
            max_k: ((window.1 - window.0) / PAGE).min(4096),
            nfiles: file_pages.len(),
            file_pages: fp,
        };
        let files: Vec<u64> = file_pages.iter().map(|p| p * PAGE).collect();
        (
            prop::collection::vec(mmap_any(ctx), 1..=3),
            prop::collection::vec((op_strategy(ctx), prop::option::weighted(0.6, ref_sel())), 9..=37),
        )
            .prop_map(move |(mut ops, rest)| {
                let mut known: Vec<(u64, u64)> = Vec::new();
                for op in &ops {
                    note_range(ctx, op, &mut known);
                }
                for (mut op, sel) in rest {
                    if let Some(sel) = sel {
                        retarget(ctx, &mut op, sel, &known);
                    }
                    note_range(ctx, &op, &mut known);
                    ops.push(op);
                }
                without_dontunmap_where_locked(&mut ops);
                Scenario { window, files: files.clone(), ops }
            })
    })
}
