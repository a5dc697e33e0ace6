//! NUMA memory policy and page migration: `set_mempolicy`, `mbind`,
//! `move_pages` and `migrate_pages` on an address space, with Linux's
//! arguments (`MPOL_*` values of `<numaif.h>`, node masks as arrays of
//! 64-bit words, `maxnode` counting bits plus one).

use crate::{guard, guard64, neg, softmm_mm};

/// The words of a node mask of which Linux's `get_nodes` reads
/// `maxnode - 1` bits; `None` for `NULL`. A `maxnode` whose bit count
/// Linux refuses (or reads nothing of) gets an empty slice, so that no
/// slice is made from a length that cannot be: the call then fails (or
/// succeeds) before reading a word.
///
/// # Safety
///
/// `nmask` is null or valid for reads of `(maxnode - 1 + 63) / 64` words
/// when `1 < maxnode <= 32769` (a page of bits).
unsafe fn node_mask<'a>(nmask: *const u64, maxnode: u64) -> Option<&'a [u64]> {
    if nmask.is_null() {
        return None;
    }
    let bits = maxnode.wrapping_sub(1);
    if bits == 0 || bits > 4096 * 8 {
        return Some(&[]);
    }
    // SAFETY: valid for that many words (the caller's contract).
    Some(unsafe { std::slice::from_raw_parts(nmask, bits.div_ceil(64) as usize) })
}

/// `set_mempolicy(mode, nmask, maxnode)` for the address space (softmm has
/// one task per address space): the policy of later allocations outside
/// VMAs with their own. `mode` may carry `MPOL_F_STATIC_NODES` or
/// `MPOL_F_RELATIVE_NODES`. Linux's errnos in Linux's order: `-EINVAL` (an
/// unknown mode or flag, a mask unsuited to the mode, more than a page of
/// bits, a bit at or above 1024, no node of the arena), `-EFAULT`. `0` on
/// success; nothing changes on error.
///
/// # Safety
///
/// `mm` is null or a live handle; `nmask` is null or valid for reads of
/// `(maxnode - 1 + 63) / 64` 64-bit words.
#[no_mangle]
pub unsafe extern "C" fn softmm_set_mempolicy(mm: *const softmm_mm, mode: i32, nmask: *const u64, maxnode: u64) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm.as_ref() }) else { return -libc::EINVAL };
        // SAFETY: the caller's contract.
        let mask = unsafe { node_mask(nmask, maxnode) };
        mm.inner.set_mempolicy(mode, mask, maxnode).map_or_else(neg, |()| 0)
    })
}

/// `get_mempolicy(mode, nmask, maxnode, addr, flags)`: the address
/// space's policy (or with `MPOL_F_ADDR` the policy of the VMA at `addr`)
/// into `*mode` (if not null) and its nodes into `nmask` (if not null) as a
/// bitmap of `maxnode - 1` bits rounded up to whole words, the words past
/// the arena's node count cleared; with `MPOL_F_NODE` a node instead of the
/// mode, with `MPOL_F_MEMS_ALLOWED` the arena's nodes. Linux's errnos in
/// Linux's order: `-EINVAL` (a mask with `maxnode` below the node count, an
/// unknown or conflicting flag, an address without `MPOL_F_ADDR`,
/// `MPOL_F_NODE` alone without an interleave policy, more than a page of
/// bits), `-EFAULT` (no VMA at `addr`, or the page at it cannot be read).
/// `0` on success.
///
/// # Safety
///
/// `mm` is null or a live handle; `mode` is null or valid for a write;
/// `nmask` is null or valid for writes of `((maxnode - 1 + 63) & ~63) / 64`
/// 64-bit words when that is at most a page of bits.
#[no_mangle]
pub unsafe extern "C" fn softmm_get_mempolicy(
    mm: *const softmm_mm,
    mode: *mut i32,
    nmask: *mut u64,
    maxnode: u64,
    addr: u64,
    flags: u32,
) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm.as_ref() }) else { return -libc::EINVAL };
        let words = (maxnode.wrapping_sub(1).wrapping_add(63) & !63) / 64;
        let mask = if nmask.is_null() {
            None
        } else if words > 4096 / 8 {
            // More than a page: refused before a word is written.
            Some(&mut [][..])
        } else {
            // SAFETY: valid for that many words (the caller's contract).
            Some(unsafe { std::slice::from_raw_parts_mut(nmask, words as usize) })
        };
        match mm.inner.get_mempolicy(mask, maxnode, addr, flags) {
            Ok(m) => {
                // SAFETY: null or valid for a write (the caller's contract).
                if let Some(out) = unsafe { mode.as_mut() } {
                    *out = m;
                }
                0
            }
            Err(e) => neg(e),
        }
    })
}

/// `mbind(start, len, mode, nmask, maxnode, flags)`: gives the VMAs of the
/// range their own policy, with `MPOL_MF_STRICT`, `MPOL_MF_MOVE` and
/// `MPOL_MF_MOVE_ALL` (which needs `cap_sys_nice`, else `-EPERM`) as in
/// Linux. Linux's errnos: `-EINVAL`, `-EFAULT` (a hole, or no VMA),
/// `-EIO` (strict and a page could not be placed), `-ENOMEM`, `-EPERM`.
///
/// # Safety
///
/// As `softmm_set_mempolicy`.
#[no_mangle]
pub unsafe extern "C" fn softmm_mbind(
    mm: *const softmm_mm,
    start: u64,
    len: u64,
    mode: i32,
    nmask: *const u64,
    maxnode: u64,
    flags: u32,
) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm.as_ref() }) else { return -libc::EINVAL };
        // SAFETY: the caller's contract.
        let mask = unsafe { node_mask(nmask, maxnode) };
        mm.inner.mbind(start, len, mode, mask, maxnode, flags).map_or_else(neg, |()| 0)
    })
}

/// `move_pages(pid, count, pages, nodes, status, flags)`: moves the page
/// at each of the `count` addresses to the node at the same index of
/// `nodes`, or with `nodes` `NULL` only reports each page's node; each
/// outcome goes to `status` (a node, or `-EFAULT`, `-ENOENT`, `-EACCES`,
/// `-EBUSY`). Returns 0, the number of pages that could not be moved (a
/// positive value, as Linux), or `-errno`: `-EINVAL` (flags other than
/// `MPOL_MF_MOVE`/`MPOL_MF_MOVE_ALL`), `-EPERM` (`MPOL_MF_MOVE_ALL`
/// without `cap_sys_nice`), `-ENODEV` (a node the arena does not have),
/// `-ENOMEM`, `-EFAULT` (a `NULL` array with a nonzero `count`).
///
/// # Safety
///
/// `mm` is null or a live handle; `pages` and `status` are valid for
/// `count` elements, `nodes` null or valid for `count` elements.
#[no_mangle]
pub unsafe extern "C" fn softmm_move_pages(
    mm: *const softmm_mm,
    count: u64,
    pages: *const u64,
    nodes: *const i32,
    status: *mut i32,
    flags: i32,
) -> i64 {
    guard64(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm.as_ref() }) else { return -i64::from(libc::EINVAL) };
        let efault = -i64::from(libc::EFAULT);
        // No array of `count` 8-byte elements fits an address space past
        // this: such a count cannot describe the caller's arrays.
        let Some(n) = usize::try_from(count).ok().filter(|&n| n <= isize::MAX as usize / 8) else { return efault };
        if n > 0 && (pages.is_null() || status.is_null()) {
            // The flags and the capability are checked before the arrays
            // are read, as Linux's `kernel_move_pages` does: asked of no
            // page, the call checks them only.
            return match mm.inner.move_pages(&[], (!nodes.is_null()).then_some(&[][..]), &mut [], flags as u32) {
                Ok(_) => efault,
                Err(e) => i64::from(neg(e)),
            };
        }
        let (pages, status) = if n == 0 {
            (&[][..], &mut [][..])
        } else {
            // SAFETY: not null and valid for `n` elements (the caller's
            // contract); Rust's and C's arrays do not alias (the caller's
            // arrays are distinct, `pages` is only read).
            unsafe { (std::slice::from_raw_parts(pages, n), std::slice::from_raw_parts_mut(status, n)) }
        };
        let nodes = if nodes.is_null() {
            None
        } else if n == 0 {
            Some(&[][..])
        } else {
            // SAFETY: valid for `n` elements (the caller's contract).
            Some(unsafe { std::slice::from_raw_parts(nodes, n) })
        };
        match mm.inner.move_pages(pages, nodes, status, flags as u32) {
            Ok(v) => v as i64,
            Err(e) => i64::from(neg(e)),
        }
    })
}

/// `migrate_pages(pid, maxnode, old_nodes, new_nodes)`: moves the pages on
/// the nodes of `old_nodes` to the nodes of `new_nodes` at the same
/// position. Returns the number of pages that did not move, or `-errno`:
/// `-EINVAL`/`-EFAULT` for the masks (as `softmm_set_mempolicy`),
/// `-EPERM` for a new node outside the arena without `cap_sys_nice`,
/// `-EINVAL` if no new node is the arena's, `-ENOMEM`.
///
/// # Safety
///
/// `mm` is null or a live handle; `old_nodes` and `new_nodes` are null or
/// valid for reads of `(maxnode - 1 + 63) / 64` 64-bit words.
#[no_mangle]
pub unsafe extern "C" fn softmm_migrate_pages(
    mm: *const softmm_mm,
    maxnode: u64,
    old_nodes: *const u64,
    new_nodes: *const u64,
) -> i64 {
    guard64(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm.as_ref() }) else { return -i64::from(libc::EINVAL) };
        // SAFETY: the caller's contract.
        let (old, new) = unsafe { (node_mask(old_nodes, maxnode), node_mask(new_nodes, maxnode)) };
        match mm.inner.migrate_pages(maxnode, old, new) {
            Ok(v) => v as i64,
            Err(e) => i64::from(neg(e)),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{softmm_mm_free, softmm_mm_new, softmm_mmap, softmm_phys_free, softmm_phys_new_config};

    #[test]
    fn pages_move_between_nodes_with_linuxs_errnos() {
        let mut pc = std::mem::MaybeUninit::uninit();
        let mut phys = std::ptr::null_mut();
        let mut mm = std::ptr::null_mut();
        // SAFETY: valid outputs; handles live until freed below.
        unsafe {
            assert_eq!(crate::softmm_phys_config_default(pc.as_mut_ptr()), 0);
            let mut pc = pc.assume_init();
            pc.bytes = 4 << 20;
            pc.nodes = 2;
            assert_eq!(softmm_phys_new_config(&pc, &mut phys), 0);
            assert_eq!(softmm_mm_new(phys, &mut mm), 0);
            let node1 = [0b10u64];
            assert_eq!(softmm_set_mempolicy(mm, 99, node1.as_ptr(), 3), -libc::EINVAL, "unknown mode");
            assert_eq!(softmm_set_mempolicy(mm, softmm::MPOL_BIND, std::ptr::null(), 3), -libc::EINVAL, "empty bind");
            assert_eq!(
                softmm_set_mempolicy(mm, softmm::MPOL_BIND, node1.as_ptr(), 0),
                -libc::EINVAL,
                "maxnode 0 wraps"
            );
            assert_eq!(softmm_set_mempolicy(mm, softmm::MPOL_BIND, node1.as_ptr(), 3), 0);
            let rw = libc::PROT_READ | libc::PROT_WRITE;
            let a = softmm_mmap(
                mm,
                0,
                4096,
                rw,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                std::ptr::null(),
                0,
            ) as u64;
            let mut status = [-1i32];
            assert_eq!(softmm_move_pages(mm, 1, &a, std::ptr::null(), status.as_mut_ptr(), 0), 0);
            assert_eq!(status, [1], "bound to node 1");
            assert_eq!(softmm_move_pages(mm, 1, &a, &0, status.as_mut_ptr(), 0), 0);
            assert_eq!(status, [0], "moved");
            assert_eq!(softmm_move_pages(mm, 1, &a, &7, status.as_mut_ptr(), 0), -i64::from(libc::ENODEV));
            assert_eq!(softmm_move_pages(mm, 1, &a, &0, status.as_mut_ptr(), 0x8), -i64::from(libc::EINVAL));
            assert_eq!(
                softmm_move_pages(mm, 1, std::ptr::null(), &0, status.as_mut_ptr(), 0),
                -i64::from(libc::EFAULT)
            );
            assert_eq!(softmm_move_pages(mm, u64::MAX, &a, &0, status.as_mut_ptr(), 0), -i64::from(libc::EFAULT));
            let (node0, node1) = ([1u64], [2u64]);
            assert_eq!(softmm_migrate_pages(mm, 3, node0.as_ptr(), node1.as_ptr()), 0);
            assert_eq!(softmm_move_pages(mm, 1, &a, std::ptr::null(), status.as_mut_ptr(), 0), 0);
            assert_eq!(status, [1], "migrated back");
            assert_eq!(softmm_mbind(mm, a, 4096, softmm::MPOL_BIND, node0.as_ptr(), 3, softmm::MPOL_MF_MOVE), 0);
            assert_eq!(softmm_move_pages(mm, 1, &a, std::ptr::null(), status.as_mut_ptr(), 0), 0);
            assert_eq!(status, [0], "mbind moved it");
            let all = softmm::MPOL_MF_MOVE_ALL;
            assert_eq!(softmm_mbind(mm, a, 4096, softmm::MPOL_BIND, node1.as_ptr(), 3, all), -libc::EPERM);
            assert_eq!(softmm_mbind(std::ptr::null(), a, 4096, 0, std::ptr::null(), 0, 0), -libc::EINVAL);
            softmm_mm_free(mm);
            softmm_phys_free(phys);
        }
    }
}
