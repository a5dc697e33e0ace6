//! Choosing addresses: Linux x86-64's `get_unmapped_area`, top-down below
//! `mmap_base` with a bottom-up fallback, hint handling, stack guard gaps and
//! the 2 MiB alignment of large anonymous mappings.

use crate::error::{Errno, Result};
use crate::pgtable::PMD_SIZE;
use crate::vma::VmaTree;
use crate::PAGE_SIZE;

use super::MmConfig;

/// What kind of object the area is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AreaKind {
    /// Private anonymous memory (may be THP-aligned).
    Anon,
    /// A file or shared anonymous (shmem) mapping.
    Other,
}

/// Linux's `__get_unmapped_area`: the address for a mapping of `len` bytes
/// (page aligned, non-zero) with hint or fixed address `addr`.
pub(crate) fn get_unmapped_area(
    cfg: &MmConfig,
    vmas: &VmaTree,
    kind: AreaKind,
    addr: u64,
    len: u64,
    fixed: bool,
) -> Result<u64> {
    if len > cfg.task_size {
        return Err(Errno::NoMem);
    }
    let a = if cfg.thp_align && kind == AreaKind::Anon && addr == 0 && !fixed && len % PMD_SIZE == 0 {
        thp_get_unmapped_area(cfg, vmas, len)
            .map_or_else(|| arch_get_unmapped_area_topdown(cfg, vmas, 0, len, false), Ok)?
    } else {
        arch_get_unmapped_area_topdown(cfg, vmas, addr, len, fixed)?
    };
    if a > cfg.task_size - len {
        return Err(Errno::NoMem);
    }
    if a % PAGE_SIZE != 0 {
        return Err(Errno::Inval);
    }
    Ok(a)
}

/// `__thp_get_unmapped_area`: search for `len + 2 MiB` and align inside it;
/// with a top-down layout an already aligned result moves up by 2 MiB, so the
/// mapping ends as high as it can.
fn thp_get_unmapped_area(cfg: &MmConfig, vmas: &VmaTree, len: u64) -> Option<u64> {
    let len_pad = len.checked_add(PMD_SIZE)?;
    let ret = arch_get_unmapped_area_topdown(cfg, vmas, 0, len_pad, false).ok()?;
    let off_sub = ret.wrapping_neg() & (PMD_SIZE - 1);
    Some(if off_sub == 0 { ret + PMD_SIZE } else { ret + off_sub })
}

/// x86-64's `arch_get_unmapped_area_topdown`.
fn arch_get_unmapped_area_topdown(cfg: &MmConfig, vmas: &VmaTree, addr: u64, len: u64, fixed: bool) -> Result<u64> {
    if len > cfg.task_size - cfg.mmap_min_addr {
        return Err(Errno::NoMem);
    }
    if fixed {
        return Ok(addr);
    }
    if addr != 0 {
        let addr = addr & !(PAGE_SIZE - 1);
        if cfg.task_size - len >= addr {
            let next = vmas.find_from(addr);
            if next.is_none_or(|v| addr + len <= v.start_gap(cfg.stack_guard_gap)) {
                return Ok(addr);
            }
        }
    }
    let low = PAGE_SIZE.max(cfg.mmap_min_addr);
    if let Some(a) = unmapped_area_topdown(vmas, len, low, cfg.mmap_base, cfg.stack_guard_gap) {
        return Ok(a);
    }
    // Bottom-up fallback from TASK_UNMAPPED_BASE.
    let base = (cfg.task_size / 3 + PAGE_SIZE - 1) & !(PAGE_SIZE - 1);
    unmapped_area(vmas, len, base.max(low), cfg.task_size, cfg.stack_guard_gap).ok_or(Errno::NoMem)
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

/// The lowest `a >= low` with `[a, a+len)` in a gap and `a + len <= high`.
fn unmapped_area(vmas: &VmaTree, len: u64, low: u64, high: u64, guard_gap: u64) -> Option<u64> {
    let mut bottom = vmas.find(low).map_or(low, |v| v.end);
    for v in vmas.overlapping(bottom, high) {
        let top = v.start_gap(guard_gap).min(high);
        if top >= bottom && top - bottom >= len {
            return Some(bottom);
        }
        bottom = bottom.max(v.end);
    }
    (high >= bottom && high - bottom >= len).then_some(bottom)
}
