//! Choosing addresses: Linux x86-64's `get_unmapped_area`, top-down below
//! `mmap_base` with a bottom-up fallback, hint handling, stack guard gaps and
//! the 2 MiB alignment of large anonymous mappings; and, under
//! [`PlacementPolicy::Arenas`], a first search in the calling thread's arena.
//!
//! # Arenas
//!
//! Under Linux placement every thread's non-fixed mappings are stacked
//! top-down next to one another: consecutive anonymous mappings of two
//! threads merge into one VMA, and each `munmap` splits what another
//! thread's mapping lives in, so no range-parallel writer can keep them
//! apart. CortenMM (SOSP'25, RFC-0003) searches a 1/N slice of the address
//! space per CPU first. Here the slices are [`ARENA_SIZE`] (a PUD entry's
//! span, so two arenas never share a PMD table), aligned, numbered down from
//! the highest one below `mmap_base`; the owner is the calling thread's
//! slot, a small number per live thread ([`thread_slot`]), as Linux's
//! per-mm concurrency ids stand in for CPU numbers. Only where the search
//! starts changes: the arena lies inside the range Linux's top-down search
//! covers, with the same bounds, guard gaps and alignment, so a call fails
//! exactly when Linux's would, and the fallback is Linux's own search.

use crate::error::{Errno, Result};
use crate::pgtable::PMD_SIZE;
use crate::vma::VmaTree;
use crate::{page_align, PAGE_SIZE};

use super::unmap::Reservation;
use super::{MmConfig, PlacementPolicy};

/// Bytes of one placement arena: the span of a PUD entry (1 GiB).
pub(crate) const ARENA_SIZE: u64 = 1 << 30;

/// What kind of object the area is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AreaKind {
    /// Private anonymous memory (may be THP-aligned).
    Anon,
    /// A file or shared anonymous (shmem) mapping.
    Other,
    /// A hugetlbfs mapping with this huge page size.
    Huge(u64),
}

/// The `MAP_*` flags that steer the search.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct AreaFlags {
    /// `MAP_FIXED`: `addr` is taken as is.
    pub(crate) fixed: bool,
    /// `MAP_32BIT`: search bottom-up in `[1 GiB, 2 GiB)`.
    pub(crate) low32: bool,
}

impl AreaFlags {
    /// Only `MAP_FIXED` or not.
    pub(crate) fn fixed(fixed: bool) -> AreaFlags {
        AreaFlags { fixed, low32: false }
    }
}

/// Where x86-64's `find_start_end` puts `MAP_32BIT` mappings (without
/// address randomization): `[1 GiB, 2 GiB)`.
const MAP_32BIT_AREA: (u64, u64) = (0x4000_0000, 0x8000_0000);

/// Linux's `__get_unmapped_area`: the address for a mapping of `len` bytes
/// (page aligned, non-zero) with hint or fixed address `addr`. `ENOMEM` if
/// it does not fit, `EINVAL` for a misaligned fixed hugetlb address, `EPERM`
/// below `mmap_min_addr` (`security_mmap_addr`, for every caller: mmap,
/// mremap moves and expansions).
#[cfg(all(test, not(loom)))]
pub(crate) fn get_unmapped_area(
    cfg: &MmConfig,
    vmas: &VmaTree,
    kind: AreaKind,
    addr: u64,
    len: u64,
    flags: AreaFlags,
) -> Result<u64> {
    get_unmapped_area_avoiding(cfg, Obstacles { vmas, reserved: &[] }, kind, addr, len, flags)
}

/// What a search must not place a mapping on: the VMAs (with the guard gaps
/// below growsdown ones) and the ranges lock-free unmaps still zap
/// ([`super::MmState::reserved`], no guard gap), which the search skips
/// where it meets them instead of searching a copy of the tree with a
/// stand-in VMA per range (no allocation, no `Vma` made under the lock).
#[derive(Clone, Copy)]
pub(crate) struct Obstacles<'a> {
    pub(crate) vmas: &'a VmaTree,
    pub(crate) reserved: &'a [Reservation],
}

impl Obstacles<'_> {
    /// The reserved range overlapping `[a, a + len)`, if any.
    fn reserved_in(&self, a: u64, len: u64) -> Option<&Reservation> {
        self.reserved.iter().find(|r| a < r.end && r.start < a.saturating_add(len))
    }
}

/// [`get_unmapped_area`] that also avoids `obstacles.reserved`: the address
/// a search of the VMAs plus a stand-in VMA per reserved range would find.
pub(crate) fn get_unmapped_area_avoiding(
    cfg: &MmConfig,
    vmas: Obstacles<'_>,
    kind: AreaKind,
    addr: u64,
    len: u64,
    flags: AreaFlags,
) -> Result<u64> {
    if len > cfg.task_size {
        return Err(Errno::NoMem);
    }
    let a = match kind {
        AreaKind::Huge(size) => hugetlb_get_unmapped_area(cfg, vmas, addr, len, size, flags)?,
        AreaKind::Anon if cfg.thp_align && addr == 0 && !flags.fixed && len % PMD_SIZE == 0 => {
            thp_get_unmapped_area(cfg, vmas, len, flags)
                .map_or_else(|| arch_get_unmapped_area_topdown(cfg, vmas, 0, len, flags, PAGE_SIZE), Ok)?
        }
        _ => arch_get_unmapped_area_topdown(cfg, vmas, addr, len, flags, PAGE_SIZE)?,
    };
    if a > cfg.task_size - len {
        return Err(Errno::NoMem);
    }
    if a % PAGE_SIZE != 0 {
        return Err(Errno::Inval);
    }
    if a < cfg.mmap_min_addr {
        return Err(Errno::Perm);
    }
    Ok(a)
}

/// `__thp_get_unmapped_area`: search for `len + 2 MiB` and align inside it;
/// with a top-down layout an already aligned result moves up by 2 MiB, so the
/// mapping ends as high as it can.
fn thp_get_unmapped_area(cfg: &MmConfig, vmas: Obstacles<'_>, len: u64, flags: AreaFlags) -> Option<u64> {
    let len_pad = len.checked_add(PMD_SIZE)?;
    let ret = arch_get_unmapped_area_topdown(cfg, vmas, 0, len_pad, flags, PAGE_SIZE).ok()?;
    let off_sub = ret.wrapping_neg() & (PMD_SIZE - 1);
    Some(if off_sub == 0 { ret + PMD_SIZE } else { ret + off_sub })
}

/// x86-64's `arch_get_unmapped_area_topdown`, its searches aligned to
/// `align` (a power of two, `PAGE_SIZE` or more: Linux's `align_mask` is
/// `align - PAGE_SIZE`, set for hugetlb files by `get_align_mask`; the
/// hint is the caller's to align).
fn arch_get_unmapped_area_topdown(
    cfg: &MmConfig,
    vmas: Obstacles<'_>,
    addr: u64,
    len: u64,
    flags: AreaFlags,
    align: u64,
) -> Result<u64> {
    // requested length too big for entire address space
    if len > cfg.task_size {
        return Err(Errno::NoMem);
    }
    if flags.fixed {
        return Ok(addr);
    }
    if flags.low32 {
        // arch_get_unmapped_area with find_start_end's MAP_32BIT window,
        // bottom-up and with no fallback outside it.
        let (begin, end) = MAP_32BIT_AREA;
        if len > end {
            return Err(Errno::NoMem);
        }
        if addr != 0 {
            let addr = page_align(addr);
            if end - len >= addr
                && vmas.vmas.find_from(addr).is_none_or(|v| addr + len <= v.start_gap(cfg.stack_guard_gap))
                && vmas.reserved_in(addr, len).is_none()
            {
                return Ok(addr);
            }
        }
        let low = begin.max(cfg.min_addr());
        return unmapped_area(vmas, len, low, end, cfg.stack_guard_gap, align).ok_or(Errno::NoMem);
    }
    if addr != 0 {
        let addr = addr & !(PAGE_SIZE - 1);
        if cfg.task_size - len >= addr {
            let next = vmas.vmas.find_from(addr);
            if next.is_none_or(|v| addr + len <= v.start_gap(cfg.stack_guard_gap))
                && vmas.reserved_in(addr, len).is_none()
            {
                return Ok(addr);
            }
        }
    }
    let low = PAGE_SIZE.max(cfg.min_addr());
    if cfg.placement == PlacementPolicy::Arenas {
        // Inside [low, mmap_base): any room found here is room the search
        // below would have found too, so arenas never turn ENOMEM into
        // success (nor the reverse: the search below still runs).
        if let Some((bottom, top)) = thread_slot().and_then(|slot| arena(cfg, slot)) {
            if let Some(a) = unmapped_area_topdown_aligned(vmas, len, bottom, top, cfg.stack_guard_gap, align) {
                return Ok(a);
            }
        }
    }
    if let Some(a) = unmapped_area_topdown_aligned(vmas, len, low, cfg.mmap_base, cfg.stack_guard_gap, align) {
        return Ok(a);
    }
    // Bottom-up fallback from TASK_UNMAPPED_BASE.
    let base = (cfg.task_size / 3 + PAGE_SIZE - 1) & !(PAGE_SIZE - 1);
    unmapped_area(vmas, len, base.max(low), cfg.task_size, cfg.stack_guard_gap, align).ok_or(Errno::NoMem)
}

/// The arena `[bottom, top)` of thread slot `slot` in `cfg`'s layout: the
/// `slot % n`-th of the `n` aligned [`ARENA_SIZE`] slices between the
/// lowest address a search may return and `mmap_base`, counted down from
/// the highest; `None` when not even one fits.
pub(crate) fn arena(cfg: &MmConfig, slot: usize) -> Option<(u64, u64)> {
    let low = PAGE_SIZE.max(cfg.min_addr()).next_multiple_of(ARENA_SIZE);
    let high = cfg.mmap_base & !(ARENA_SIZE - 1);
    let n = high.checked_sub(low)? / ARENA_SIZE;
    if n == 0 {
        return None;
    }
    let top = high - (slot as u64 % n) * ARENA_SIZE;
    Some((top - ARENA_SIZE, top))
}

/// The calling thread's slot: the lowest number no other live thread holds,
/// taken at its first call and given back when it exits. `None` while the
/// thread is being torn down (its thread-locals may be gone already; the
/// search is then Linux's).
///
/// The only shared write is the slot table's lock, at a thread's first
/// arena placement and at its exit, never per call.
pub(crate) fn thread_slot() -> Option<usize> {
    slot::current()
}

/// Thread slots. Plain `std` state, not the `crate::sync` shim: a slot only
/// chooses where a search starts, no protocol depends on it, and a loom
/// model's threads may all share one.
mod slot {
    use std::collections::BTreeSet;
    use std::sync::Mutex;

    /// Numbers given back by exited threads, and the next never used one.
    static SLOTS: Mutex<Slots> = Mutex::new(Slots { freed: BTreeSet::new(), next: 0 });

    struct Slots {
        freed: BTreeSet<usize>,
        next: usize,
    }

    /// The slot a thread holds, given back when the thread-local is dropped.
    struct Held(usize);

    impl Held {
        fn take() -> Held {
            let mut slots = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
            let n = match slots.freed.pop_first() {
                Some(n) => n,
                None => {
                    slots.next += 1;
                    slots.next - 1
                }
            };
            Held(n)
        }
    }

    impl Drop for Held {
        fn drop(&mut self) {
            SLOTS.lock().unwrap_or_else(|e| e.into_inner()).freed.insert(self.0);
        }
    }

    std::thread_local! {
        static SLOT: Held = Held::take();
    }

    pub(super) fn current() -> Option<usize> {
        SLOT.try_with(|h| h.0).ok()
    }
}

/// `hugetlb_get_unmapped_area` (Linux 6.13+): the length and a fixed
/// address must be multiples of the huge page size (`EINVAL`), a hint is
/// rounded *up* to it (`ALIGN`), and the rest is the arch's search with the
/// huge page size as alignment, `MAP_32BIT`'s window included. (Up to 6.12,
/// x86-64 had a function of its own that rounded the hint down and ignored
/// `MAP_32BIT`.)
fn hugetlb_get_unmapped_area(
    cfg: &MmConfig,
    vmas: Obstacles<'_>,
    addr: u64,
    len: u64,
    size: u64,
    flags: AreaFlags,
) -> Result<u64> {
    if len % size != 0 {
        return Err(Errno::Inval);
    }
    if flags.fixed && addr % size != 0 {
        return Err(Errno::Inval);
    }
    // ALIGN wraps to 0 (no hint) at the top of the address space.
    let hint = if flags.fixed { addr } else { addr.wrapping_add(size - 1) & !(size - 1) };
    arch_get_unmapped_area_topdown(cfg, vmas, hint, len, flags, size)
}

/// `vm_unmapped_area` top-down with an alignment: the highest `align`-aligned
/// `a` with `[a, a+len)` in a gap between `low` and `high`, found as Linux
/// does, by searching for `len` plus the alignment's slack and aligning
/// inside the gap found.
fn unmapped_area_topdown_aligned(
    vmas: Obstacles<'_>,
    len: u64,
    low: u64,
    high: u64,
    guard_gap: u64,
    align: u64,
) -> Option<u64> {
    let padded = len.checked_add(align - PAGE_SIZE)?;
    // The highest gap of the VMAs; one that overlaps a reserved range
    // means no fit above the range's start (every fit is at or below the
    // one found), so search again below it. Each try lowers `high` past a
    // reserved range: at most one try per range.
    let mut high = high;
    let a = loop {
        let a = unmapped_area_topdown(vmas.vmas, padded, low, high, guard_gap)?;
        match vmas.reserved_in(a, padded) {
            None => break a,
            Some(r) => high = r.start,
        }
    };
    // The gap's top is `a + padded`; the highest aligned start below it.
    Some((a + padded - len) & !(align - 1))
}

/// The highest `a` with `[a, a+len)` in a gap between VMAs (respecting guard
/// gaps below growsdown VMAs), `low <= a` and `a + len <= high`.
pub(crate) fn unmapped_area_topdown(vmas: &VmaTree, len: u64, low: u64, high: u64, guard_gap: u64) -> Option<u64> {
    let mut top = vmas.first_starting_at(high).map_or(high, |n| high.min(n.start_gap(guard_gap)));
    for v in vmas.rev_starting_before(high) {
        let bottom = v.end.max(low);
        if top >= bottom && top - bottom >= len {
            return Some(top - len);
        }
        top = v.start_gap(guard_gap).min(high);
    }
    (top >= low && top - low >= len).then(|| top - len)
}

/// `vm_unmapped_area` bottom-up: the lowest `align`-aligned `a >= low`
/// with `[a, a+len)` in a gap and `a + len <= high`, found by searching for
/// `len` plus the alignment's slack (`align - PAGE_SIZE`, none for 4 KiB)
/// and aligning up inside the gap found.
fn unmapped_area(vmas: Obstacles<'_>, len: u64, low: u64, high: u64, guard_gap: u64, align: u64) -> Option<u64> {
    let padded = len.checked_add(align - PAGE_SIZE)?;
    // As `unmapped_area_topdown_aligned`, upwards: a gap found overlapping
    // a reserved range means no fit below its end.
    let mut low = low;
    loop {
        let a = unmapped_area_vmas(vmas.vmas, padded, low, high, guard_gap)?;
        match vmas.reserved_in(a, padded) {
            None => return Some(a.next_multiple_of(align)),
            Some(r) => low = r.end,
        }
    }
}

/// The lowest `a >= low` with `[a, a+padded)` in a gap between the VMAs
/// and `a + padded <= high`.
fn unmapped_area_vmas(vmas: &VmaTree, padded: u64, low: u64, high: u64, guard_gap: u64) -> Option<u64> {
    let mut bottom = vmas.find(low).map_or(low, |v| v.end);
    for v in vmas.overlapping(bottom, high) {
        let top = v.start_gap(guard_gap).min(high);
        if top >= bottom && top - bottom >= padded {
            return Some(bottom);
        }
        bottom = bottom.max(v.end);
    }
    (high >= bottom && high - bottom >= padded).then_some(bottom)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::phys::{PhysConfig, PhysMem};
    use crate::vma::VmFlags;
    use crate::vma::Vma;

    const MIB: u64 = 1 << 20;
    const RW: VmFlags = VmFlags::READ.union(VmFlags::WRITE).union(VmFlags::MAYREAD).union(VmFlags::MAYWRITE);
    /// The default `mmap_base`: 128 MiB below `TASK_SIZE`, not 2 MiB aligned.
    const BASE: u64 = crate::mm::TASK_SIZE - 128 * MIB;

    /// A tiny arena: VMAs only need it for their accounting.
    fn phys() -> Arc<PhysMem> {
        PhysMem::new(PhysConfig::new(64 << 10)).unwrap()
    }

    /// A tree holding a read-write VMA `[start, end)` for each pair, with `VM_GROWSDOWN` added where asked.
    fn tree(phys: &Arc<PhysMem>, vmas: &[(u64, u64, bool)]) -> VmaTree {
        let mut t = VmaTree::default();
        for &(start, end, growsdown) in vmas {
            let flags = if growsdown { RW | VmFlags::GROWSDOWN } else { RW };
            t.insert(Vma::new(phys, start, end, flags, 0, None, None));
        }
        t
    }

    /// A small address space: 256 MiB `TASK_SIZE`, `mmap_base` at 192 MiB, a 1 MiB stack guard gap.
    fn small() -> MmConfig {
        MmConfig {
            task_size: 256 * MIB,
            mmap_base: 192 * MIB,
            mmap_min_addr: 0x1_0000,
            stack_guard_gap: MIB,
            ..MmConfig::default()
        }
    }

    /// `get_unmapped_area` for a non-THP object (a file or shared mapping).
    fn area(cfg: &MmConfig, t: &VmaTree, addr: u64, len: u64, fixed: bool) -> Result<u64> {
        get_unmapped_area(cfg, t, AreaKind::Other, addr, len, AreaFlags::fixed(fixed))
    }

    #[test]
    fn empty_space_maps_just_below_mmap_base() {
        let cfg = MmConfig::default();
        let t = VmaTree::default();
        assert_eq!(area(&cfg, &t, 0, 0x1000, false), Ok(BASE - 0x1000));
        assert_eq!(area(&cfg, &t, 0, 3 * MIB, false), Ok(BASE - 3 * MIB));
        let cfg = small();
        assert_eq!(area(&cfg, &t, 0, 0x5000, false), Ok(192 * MIB - 0x5000));
    }

    #[test]
    fn top_down_takes_the_highest_gap_that_fits() {
        let p = phys();
        let cfg = small();
        // [188M, 192M) is used; below it a 2 MiB hole [186M, 188M) above [180M, 186M).
        let t = tree(&p, &[(188 * MIB, 192 * MIB, false), (180 * MIB, 186 * MIB, false)]);
        assert_eq!(area(&cfg, &t, 0, MIB, false), Ok(187 * MIB), "the top of the highest hole");
        assert_eq!(area(&cfg, &t, 0, 2 * MIB, false), Ok(186 * MIB), "a hole exactly as long");
        assert_eq!(area(&cfg, &t, 0, 2 * MIB + 0x1000, false), Ok(180 * MIB - 2 * MIB - 0x1000));
        // A VMA above mmap_base does not matter to the top-down search.
        let t = tree(&p, &[(200 * MIB, 210 * MIB, false), (191 * MIB, 195 * MIB, false)]);
        assert_eq!(area(&cfg, &t, 0, MIB, false), Ok(190 * MIB), "below the VMA straddling mmap_base");
    }

    #[test]
    fn top_down_keeps_the_guard_gap_below_a_stack() {
        let p = phys();
        let cfg = small();
        // A growsdown stack at [190M, 192M) reserves [189M, 190M) as its guard gap (vm_start_gap).
        let t = tree(&p, &[(190 * MIB, 192 * MIB, true)]);
        assert_eq!(area(&cfg, &t, 0, 0x1000, false), Ok(189 * MIB - 0x1000));
        // A plain VMA there gets no gap.
        let t = tree(&p, &[(190 * MIB, 192 * MIB, false)]);
        assert_eq!(area(&cfg, &t, 0, 0x1000, false), Ok(190 * MIB - 0x1000));
    }

    #[test]
    fn free_hint_is_honoured_even_above_mmap_base() {
        let p = phys();
        let cfg = small();
        let t = tree(&p, &[(100 * MIB, 110 * MIB, false)]);
        assert_eq!(area(&cfg, &t, 50 * MIB, MIB, false), Ok(50 * MIB));
        assert_eq!(area(&cfg, &t, 99 * MIB, MIB, false), Ok(99 * MIB), "ends exactly at the next VMA");
        assert_eq!(area(&cfg, &t, 110 * MIB, MIB, false), Ok(110 * MIB), "starts exactly at a VMA's end");
        assert_eq!(area(&cfg, &t, 200 * MIB, MIB, false), Ok(200 * MIB));
        assert_eq!(area(&cfg, &t, 255 * MIB, MIB, false), Ok(255 * MIB), "ends exactly at TASK_SIZE");
        // An unaligned hint is rounded down to its page.
        assert_eq!(area(&cfg, &t, 50 * MIB + 0x123, 0x1000, false), Ok(50 * MIB));
    }

    #[test]
    fn occupied_or_impossible_hint_falls_back_to_top_down() {
        let p = phys();
        let cfg = small();
        let t = tree(&p, &[(100 * MIB, 110 * MIB, false), (150 * MIB, 160 * MIB, true)]);
        let top_down = Ok(192 * MIB - MIB);
        assert_eq!(area(&cfg, &t, 105 * MIB, MIB, false), top_down, "inside a VMA");
        assert_eq!(area(&cfg, &t, 99 * MIB + 0x1000, MIB, false), top_down, "overlaps the next VMA");
        // The stack at 150M keeps [149M, 150M) free as its guard gap.
        let page_top_down = Ok(192 * MIB - 0x1000);
        assert_eq!(area(&cfg, &t, 150 * MIB - 0x1000, 0x1000, false), page_top_down, "in a stack's guard gap");
        assert_eq!(area(&cfg, &t, 148 * MIB + 0x1000, MIB, false), top_down, "reaches into the guard gap");
        assert_eq!(area(&cfg, &t, 148 * MIB, MIB, false), Ok(148 * MIB), "ends where the guard gap starts");
        assert_eq!(area(&cfg, &t, 255 * MIB + 0x1000, MIB, false), top_down, "would cross TASK_SIZE");
    }

    #[test]
    fn map_fixed_is_taken_as_is_over_existing_vmas() {
        let p = phys();
        let cfg = small();
        let t = tree(&p, &[(100 * MIB, 110 * MIB, false)]);
        // MAP_FIXED replaces whatever is there: no address checking.
        assert_eq!(area(&cfg, &t, 105 * MIB, MIB, true), Ok(105 * MIB));
        assert_eq!(area(&cfg, &t, 255 * MIB, MIB, true), Ok(255 * MIB));
        assert_eq!(area(&cfg, &t, 255 * MIB + 0x1000, MIB, true), Err(Errno::NoMem), "past TASK_SIZE");
        assert_eq!(area(&cfg, &t, 100 * MIB + 0x10, 0x1000, true), Err(Errno::Inval), "not page aligned");
        // A fixed 2 MiB anonymous mapping is not moved for THP alignment.
        let anon = get_unmapped_area(&cfg, &t, AreaKind::Anon, 101 * MIB, 2 * MIB, AreaFlags::fixed(true));
        assert_eq!(anon, Ok(101 * MIB));
    }

    #[test]
    fn bottom_up_fallback_when_below_mmap_base_is_full() {
        let p = phys();
        let cfg = small();
        let t = tree(&p, &[(0x1_0000, 192 * MIB, false)]);
        // Linux retries bottom-up from TASK_UNMAPPED_BASE (TASK_SIZE / 3) when top-down fails.
        assert_eq!(area(&cfg, &t, 0, MIB, false), Ok(192 * MIB));
        let t = tree(&p, &[(0x1_0000, 192 * MIB, false), (192 * MIB, 200 * MIB, true)]);
        assert_eq!(area(&cfg, &t, 0, MIB, false), Ok(200 * MIB), "the lowest free address above the base");
    }

    #[test]
    fn enomem_when_nothing_fits() {
        let p = phys();
        let cfg = small();
        let full = tree(&p, &[(0x1_0000, 256 * MIB, false)]);
        assert_eq!(area(&cfg, &full, 0, 0x1000, false), Err(Errno::NoMem));
        assert_eq!(area(&cfg, &full, 50 * MIB, 0x1000, false), Err(Errno::NoMem), "occupied hint");
        assert_eq!(
            get_unmapped_area(&cfg, &full, AreaKind::Anon, 0, 2 * MIB, AreaFlags::fixed(false)),
            Err(Errno::NoMem)
        );
        let t = VmaTree::default();
        assert_eq!(area(&cfg, &t, 0, 256 * MIB + 0x1000, false), Err(Errno::NoMem), "longer than TASK_SIZE");
        assert_eq!(area(&cfg, &t, 0, 256 * MIB, false), Err(Errno::NoMem), "longer than above mmap_min_addr");
        // Exactly the room between mmap_min_addr and mmap_base.
        assert_eq!(area(&cfg, &t, 0, 192 * MIB - 0x1_0000, false), Ok(0x1_0000));
        // One page more: neither top-down below mmap_base nor bottom-up from TASK_UNMAPPED_BASE
        // (TASK_SIZE / 3) has room, though the whole space would.
        assert_eq!(area(&cfg, &t, 0, 192 * MIB - 0x1_0000 + 0x1000, false), Err(Errno::NoMem));
        // Free space below mmap_min_addr is never used.
        let t = tree(&p, &[(0x2_0000, 256 * MIB, false)]);
        assert_eq!(area(&cfg, &t, 0, 0x1_0000, false), Ok(0x1_0000));
        assert_eq!(area(&cfg, &t, 0, 0x2_0000, false), Err(Errno::NoMem));
    }

    #[test]
    fn anonymous_2mib_multiples_are_2mib_aligned_without_a_hint() {
        let cfg = MmConfig::default();
        let t = VmaTree::default();
        for len in [2 * MIB, 4 * MIB, 6 * MIB] {
            let a = get_unmapped_area(&cfg, &t, AreaKind::Anon, 0, len, AreaFlags::fixed(false)).unwrap();
            assert_eq!(a % (2 * MIB), 0, "len {len:#x} at {a:#x}");
            // The highest aligned start that still ends below mmap_base.
            assert_eq!(a, (BASE - len) & !(2 * MIB - 1), "len {len:#x}");
        }
        // Neither other lengths, nor file/shared mappings, nor hinted ones, nor with THP alignment off.
        let unaligned = BASE - 2 * MIB;
        assert_ne!(unaligned % (2 * MIB), 0);
        assert_eq!(
            get_unmapped_area(&cfg, &t, AreaKind::Anon, 0, 3 * MIB, AreaFlags::fixed(false)),
            Ok(BASE - 3 * MIB)
        );
        assert_eq!(get_unmapped_area(&cfg, &t, AreaKind::Other, 0, 2 * MIB, AreaFlags::fixed(false)), Ok(unaligned));
        let hint = 0x7000_0000_1000;
        assert_eq!(get_unmapped_area(&cfg, &t, AreaKind::Anon, hint, 2 * MIB, AreaFlags::fixed(false)), Ok(hint));
        let off = MmConfig { thp_align: false, ..MmConfig::default() };
        assert_eq!(get_unmapped_area(&off, &t, AreaKind::Anon, 0, 2 * MIB, AreaFlags::fixed(false)), Ok(unaligned));
    }

    #[test]
    fn hugetlb_hints_round_up_and_map_32bit_keeps_to_its_window() {
        let p = phys();
        let cfg = MmConfig::default();
        let huge = |t: &VmaTree, addr: u64, low32: bool| {
            get_unmapped_area(&cfg, t, AreaKind::Huge(2 * MIB), addr, 2 * MIB, AreaFlags { fixed: false, low32 })
        };
        let t = VmaTree::default();
        assert_eq!(huge(&t, 0x7000_0000_1000, false), Ok(0x7000_0020_0000), "rounded up");
        // A hint whose rounding wraps is no hint, as Linux's ALIGN: the
        // highest aligned room below mmap_base.
        assert_eq!(huge(&t, u64::MAX - 0xfff, false), Ok((BASE - 2 * MIB) & !(2 * MIB - 1)));
        assert_eq!(huge(&t, 0, true), Ok(1 << 30), "the window's bottom");
        // Padded to the next 2 MiB boundary above a small mapping; a 2 MiB
        // gap that is not aligned does not fit, and nothing is found outside.
        let t = tree(&p, &[((1 << 30), (1 << 30) + 0x1000, false)]);
        assert_eq!(huge(&t, 0, true), Ok((1 << 30) + 2 * MIB));
        let t = tree(&p, &[((1 << 30), (1 << 30) + 0x1000, false), ((1 << 30) + 2 * MIB + 0x1000, 2 << 30, false)]);
        assert_eq!(huge(&t, 0, true), Err(Errno::NoMem));
        let small = get_unmapped_area(&cfg, &t, AreaKind::Other, 0, 2 * MIB, AreaFlags { fixed: false, low32: true });
        assert_eq!(small, Ok((1 << 30) + 0x1000), "the same gap holds a small mapping");
    }

    #[test]
    fn thp_alignment_of_an_aligned_gap_ends_at_its_top() {
        // With mmap_base 2 MiB aligned, the padded search returns an aligned address, which
        // __thp_get_unmapped_area moves up by 2 MiB so the mapping ends at mmap_base.
        let cfg = small();
        let t = VmaTree::default();
        assert_eq!(get_unmapped_area(&cfg, &t, AreaKind::Anon, 0, 2 * MIB, AreaFlags::fixed(false)), Ok(190 * MIB));
        assert_eq!(get_unmapped_area(&cfg, &t, AreaKind::Anon, 0, 4 * MIB, AreaFlags::fixed(false)), Ok(188 * MIB));
    }

    const GIB: u64 = 1 << 30;

    /// The default layout under arena placement.
    fn arenas() -> MmConfig {
        MmConfig { placement: PlacementPolicy::Arenas, ..MmConfig::default() }
    }

    /// Every search of the calling thread under `cfg`, against Linux's on the same tree.
    fn both(
        cfg: &MmConfig,
        t: &VmaTree,
        kind: AreaKind,
        addr: u64,
        len: u64,
        flags: AreaFlags,
    ) -> (Result<u64>, Result<u64>) {
        let linux = MmConfig { placement: PlacementPolicy::Linux, ..cfg.clone() };
        (get_unmapped_area(cfg, t, kind, addr, len, flags), get_unmapped_area(&linux, t, kind, addr, len, flags))
    }

    #[test]
    fn arenas_are_aligned_gib_slices_below_mmap_base_counted_down() {
        let cfg = MmConfig::default();
        let high = cfg.mmap_base & !(GIB - 1);
        assert_eq!(arena(&cfg, 0), Some((high - GIB, high)));
        assert_eq!(arena(&cfg, 5), Some((high - 6 * GIB, high - 5 * GIB)));
        let n = ((high - GIB) / GIB) as usize; // the lowest slice starts at 1 GiB (mmap_min_addr rounded up)
        assert_eq!(arena(&cfg, n - 1), Some((GIB, 2 * GIB)));
        assert_eq!(arena(&cfg, n), arena(&cfg, 0), "slots wrap around");
        // No whole aligned slice between mmap_min_addr and mmap_base: no arena.
        assert_eq!(arena(&small(), 0), None);
        let two = MmConfig { task_size: 4 * GIB, mmap_base: 3 * GIB + 0x5000, ..MmConfig::default() };
        assert_eq!(arena(&two, 0), Some((2 * GIB, 3 * GIB)));
        assert_eq!(arena(&two, 1), Some((GIB, 2 * GIB)));
        assert_eq!(arena(&two, 2), Some((2 * GIB, 3 * GIB)));
    }

    #[test]
    fn a_thread_keeps_its_slot_and_threads_alive_together_hold_different_ones() {
        let mine = thread_slot().unwrap();
        assert_eq!(thread_slot(), Some(mine));
        let barrier = std::sync::Barrier::new(4);
        let slots: Vec<usize> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        let slot = thread_slot().unwrap();
                        barrier.wait(); // all four alive at once
                        slot
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut all = slots.clone();
        all.push(mine);
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 5, "{slots:?} and {mine}");
    }

    #[test]
    fn arenas_search_the_thread_arena_top_down_first() {
        let p = phys();
        let cfg = arenas();
        let (bottom, top) = arena(&cfg, thread_slot().unwrap()).unwrap();
        let t = VmaTree::default();
        let (a, _) = both(&cfg, &t, AreaKind::Other, 0, 0x3000, AreaFlags::default());
        assert_eq!(a, Ok(top - 0x3000));
        // THP alignment and hugetlb alignment inside the arena.
        let (a, _) = both(&cfg, &t, AreaKind::Anon, 0, 4 * MIB, AreaFlags::default());
        assert_eq!(a, Ok(top - 4 * MIB));
        let (a, _) = both(&cfg, &t, AreaKind::Huge(2 * MIB), 0, 2 * MIB, AreaFlags::default());
        assert_eq!(a, Ok(top - 2 * MIB));
        // A stack above the arena keeps its guard gap, which reaches into it.
        let t = tree(&p, &[(top, top + MIB, true)]);
        let (a, _) = both(&cfg, &t, AreaKind::Other, 0, 0x1000, AreaFlags::default());
        assert_eq!(a, Ok(top - cfg.stack_guard_gap - 0x1000));
        // A stack inside the arena too.
        let t = tree(&p, &[(top - MIB, top, true)]);
        let (a, _) = both(&cfg, &t, AreaKind::Other, 0, 0x1000, AreaFlags::default());
        assert_eq!(a, Ok(top - MIB - cfg.stack_guard_gap - 0x1000));
        // Room only at the arena's bottom.
        let t = tree(&p, &[(bottom + 0x2000, top, false)]);
        let (a, _) = both(&cfg, &t, AreaKind::Other, 0, 0x2000, AreaFlags::default());
        assert_eq!(a, Ok(bottom));
    }

    #[test]
    fn arenas_change_nothing_but_where_the_search_starts() {
        let p = phys();
        let cfg = arenas();
        let (bottom, top) = arena(&cfg, thread_slot().unwrap()).unwrap();
        let no = AreaFlags::default();
        let cases: Vec<(VmaTree, AreaKind, u64, u64, AreaFlags)> = vec![
            // A full arena: Linux's search, whatever it finds.
            (tree(&p, &[(bottom, top, false)]), AreaKind::Other, 0, 0x1000, no),
            (tree(&p, &[(bottom + 0x1000, top, false)]), AreaKind::Other, 0, 0x2000, no),
            (tree(&p, &[(bottom, top, false)]), AreaKind::Anon, 0, 2 * MIB, no),
            // Longer than an arena.
            (VmaTree::default(), AreaKind::Other, 0, GIB + 0x1000, no),
            // A free hint, an occupied one, MAP_FIXED, MAP_32BIT.
            (VmaTree::default(), AreaKind::Other, 0x1234_5000, 0x1000, no),
            (tree(&p, &[(bottom, top, false)]), AreaKind::Other, bottom, 0x1000, no),
            (VmaTree::default(), AreaKind::Other, 0x1234_5000, 0x1000, AreaFlags::fixed(true)),
            (VmaTree::default(), AreaKind::Other, 0, 0x1000, AreaFlags { fixed: false, low32: true }),
            (VmaTree::default(), AreaKind::Huge(2 * MIB), 0, 2 * MIB, AreaFlags { fixed: false, low32: true }),
            // Nothing fits anywhere.
            (tree(&p, &[(0x1000, crate::mm::TASK_SIZE, false)]), AreaKind::Other, 0, 0x1000, no),
            (VmaTree::default(), AreaKind::Other, 0, crate::mm::TASK_SIZE, no),
        ];
        for (i, (t, kind, addr, len, flags)) in cases.iter().enumerate() {
            let (a, linux) = both(&cfg, t, *kind, *addr, *len, *flags);
            assert_eq!(a, linux, "case {i}");
        }
        // An occupied hint: the arena, where Linux goes below mmap_base.
        let t = tree(&p, &[(0x1234_5000, 0x1234_6000, false)]);
        let (a, linux) = both(&cfg, &t, AreaKind::Other, 0x1234_5000, 0x1000, no);
        assert_eq!((a, linux), (Ok(top - 0x1000), Ok(cfg.mmap_base - 0x1000)));
    }

    #[test]
    fn thp_alignment_falls_back_to_an_exact_fit() {
        let p = phys();
        let cfg = small();
        // The only room below mmap_base is an aligned 2 MiB hole [100M, 102M): no room for the
        // padding, so Linux retries without it and the mapping fills the hole.
        let t = tree(&p, &[(0x1_0000, 100 * MIB, false), (102 * MIB, 256 * MIB, false)]);
        assert_eq!(get_unmapped_area(&cfg, &t, AreaKind::Anon, 0, 2 * MIB, AreaFlags::fixed(false)), Ok(100 * MIB));
        // An unaligned 2 MiB hole still fits the mapping, unaligned.
        let t = tree(&p, &[(0x1_0000, 100 * MIB + 0x1000, false), (102 * MIB + 0x1000, 256 * MIB, false)]);
        assert_eq!(
            get_unmapped_area(&cfg, &t, AreaKind::Anon, 0, 2 * MIB, AreaFlags::fixed(false)),
            Ok(100 * MIB + 0x1000)
        );
    }

    /// Skipping reserved ranges in place finds the address the search of a
    /// copy of the tree with a stand-in VMA per range (the old
    /// `AddressSpace::placement_view`, now gone) found, for every kind of search: top-down with
    /// and without THP alignment, hints, hugetlb, `MAP_32BIT`'s bottom-up
    /// window and the bottom-up fallback.
    #[test]
    fn skipping_reserved_ranges_in_place_finds_what_stand_ins_found() {
        let p = phys();
        let cfg = small();
        let vmas = [(188 * MIB, 190 * MIB, false), (150 * MIB, 170 * MIB, false), (60 * MIB, 61 * MIB, false)];
        let reserved_sets: [&[(u64, u64)]; 5] = [
            &[],
            &[(186 * MIB, 188 * MIB)],
            &[(190 * MIB, 191 * MIB), (180 * MIB, 186 * MIB)],
            &[(171 * MIB, 172 * MIB), (176 * MIB, 187 * MIB), (140 * MIB, 149 * MIB)],
            &[(62 * MIB, 150 * MIB), (170 * MIB, 188 * MIB), (1024 * MIB + 4096, 1100 * MIB)],
        ];
        let big = MmConfig { task_size: 4096 * MIB, mmap_base: 192 * MIB, ..small() };
        for reserved in reserved_sets {
            let t = tree(&p, &vmas);
            let mut stand_ins = t.clone();
            for &(start, end) in reserved {
                stand_ins.insert(Vma::new(&p, start, end, VmFlags::empty(), 0, None, None));
            }
            let res: Vec<_> = reserved.iter().map(|&(s, e)| crate::mm::unmap::Reservation::for_test(s, e)).collect();
            let obstacles = Obstacles { vmas: &t, reserved: &res };
            for cfg in [&cfg, &big] {
                for len in [PAGE_SIZE, 2 * MIB, 3 * MIB, 10 * MIB, 40 * MIB] {
                    for hint in [0, 100 * MIB, 185 * MIB, 187 * MIB, 1030 * MIB] {
                        for kind in [AreaKind::Anon, AreaKind::Other, AreaKind::Huge(2 * MIB)] {
                            for low32 in [false, true] {
                                let flags = AreaFlags { fixed: false, low32 };
                                let want = get_unmapped_area(cfg, &stand_ins, kind, hint, len, flags);
                                let got = get_unmapped_area_avoiding(cfg, obstacles, kind, hint, len, flags);
                                assert_eq!(
                                    got, want,
                                    "reserved {reserved:x?}, len {len:#x}, hint {hint:#x}, {kind:?}, low32 {low32}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
