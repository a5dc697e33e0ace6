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
    if a < cfg.mmap_min_addr && !cfg.cap_sys_rawio {
        // cap_mmap_addr: below dac_mmap_min_addr only with CAP_SYS_RAWIO.
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

/// The calling thread's slot: its number
/// ([`crate::sync::percpu::this_thread_number`], the lowest no other live
/// thread holds). `None` while the thread is being torn down (the search is
/// then Linux's).
pub(crate) fn thread_slot() -> Option<usize> {
    crate::sync::percpu::this_thread_number()
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
mod tests;
