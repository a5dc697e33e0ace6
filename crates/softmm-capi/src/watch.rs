//! Write watches and the dirty log (`AddressSpace::write_watch`,
//! `dirty_log`): what a translating emulator needs to see self-modifying
//! code, and a snapshot needs to know which pages were written.

use softmm::{WatchAccess, WatchMode};

use crate::cpu::{owned, softmm_cpu};
use crate::mm::mm_ref;
use crate::{guard, neg, softmm_mm};

/// `softmm_mm_write_watch` mode: a store to a watched page is not made;
/// the access returns `SOFTMM_FAULTED` with a `softmm_fault` of `signo` 0
/// and `code` [`SOFTMM_EVENT_WRITE_WATCH`].
pub const SOFTMM_WATCH_NOTIFY: u32 = 1;
/// `softmm_mm_write_watch` mode: a store is made and marks its page for
/// `softmm_mm_get_dirty_log`.
pub const SOFTMM_WATCH_LOG: u32 = 2;

/// The most pages an address space may watch at once.
pub const SOFTMM_MAX_WATCHED_PAGES: u64 = softmm::MAX_WATCHED_PAGES;

/// `softmm_fault.code` when `signo` is 0 (an embedder's event, not a guest
/// signal): a store to a page watched with [`SOFTMM_WATCH_NOTIFY`], not
/// made; `addr` is the store's first byte in the watched page.
pub const SOFTMM_EVENT_WRITE_WATCH: i32 = 1;

/// `softmm_fault.code` when `signo` is 0: an access that overlaps a
/// watchpoint of its kind ([`softmm_mm_watchpoint_insert`]), not made;
/// `addr` is the access's first byte in the page that holds the
/// watchpoint, `access`, `access_addr` and `size` say what it was.
pub const SOFTMM_EVENT_WATCHPOINT: i32 = 2;

/// The most watchpoints an address space may hold at once.
pub const SOFTMM_MAX_WATCHPOINTS: usize = softmm::MAX_WATCHPOINTS;

/// The modes of a `mode` mask, or `None` for 0 or an unknown bit.
fn modes(mode: u32) -> Option<Vec<WatchMode>> {
    if mode == 0 || mode & !(SOFTMM_WATCH_NOTIFY | SOFTMM_WATCH_LOG) != 0 {
        return None;
    }
    let pick = |bit, m| (mode & bit != 0).then_some(m);
    Some(
        [pick(SOFTMM_WATCH_NOTIFY, WatchMode::Notify), pick(SOFTMM_WATCH_LOG, WatchMode::Log)]
            .into_iter()
            .flatten()
            .collect(),
    )
}

/// Watches the stores to the pages of `[addr, addr + len)` in `mode`
/// (`SOFTMM_WATCH_NOTIFY`, `SOFTMM_WATCH_LOG`, or both), whatever is
/// mapped there now or later, without changing what the guest sees (its
/// mappings, `mprotect` results and faults). In force for every CPU when
/// the call returns. A notify store is reported after the fault handling
/// a write needs (the guest's `SIGSEGV` first) and before the store:
/// unwatch (or not) and retry it. `0`; `-EINVAL` for a `NULL` handle, a
/// bad `mode`, an `addr` not page aligned, or a range past the user
/// address space; `-ENOMEM` past `SOFTMM_MAX_WATCHED_PAGES` watched pages.
/// A failed call changes nothing.
///
/// # Safety
///
/// `mm` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_mm_write_watch(mm: *const softmm_mm, addr: u64, len: u64, mode: u32) -> i32 {
    // SAFETY: null or live (the caller's contract).
    unsafe { each_mode(mm, mode, |mm, m| mm.write_watch(addr, len, m)) }
}

/// Removes `mode` from the watches of `[addr, addr + len)` (removing
/// `SOFTMM_WATCH_LOG` drops the pages' dirty bits). Errors as
/// [`softmm_mm_write_watch`].
///
/// # Safety
///
/// `mm` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_mm_write_unwatch(mm: *const softmm_mm, addr: u64, len: u64, mode: u32) -> i32 {
    // SAFETY: null or live (the caller's contract).
    unsafe { each_mode(mm, mode, |mm, m| mm.write_unwatch(addr, len, m)) }
}

/// Runs `f` for each mode of the C `mode` mask, in order, on `mm`'s
/// address space: `0`, or the first error (only the first mode can fail:
/// the second finds the range checked and its pages counted); `-EINVAL`
/// for a `NULL` handle or a bad mask.
///
/// # Safety
///
/// `mm` is null or a live handle.
unsafe fn each_mode(
    mm: *const softmm_mm,
    mode: u32,
    f: impl Fn(&softmm::AddressSpace, WatchMode) -> softmm::Result<()>,
) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -libc::EINVAL };
        let Some(modes) = modes(mode) else { return -libc::EINVAL };
        for m in modes {
            if let Err(e) = f(mm, m) {
                return neg(e);
            }
        }
        0
    })
}

/// The dirty log of `[addr, addr + len)` into `bits` (`nwords` words):
/// bit `i % 64` of `bits[i / 64]` is set if page `i` of the range is
/// logged and was stored to since its log was last cleared; the rest of
/// the range's bits are cleared. With `clear` non-zero, the marks are
/// cleared and the next store to each page marks it again. Copy the pages
/// after the call (a store under way lands before it returns). `0`;
/// `-EINVAL` for a `NULL` handle, an `addr` not page aligned, a range past
/// the user address space, or fewer than `ceil(pages / 64)` words;
/// `-EFAULT` for a `NULL` `bits` with a non-empty range.
///
/// # Safety
///
/// `mm` is null or a live handle; `bits` is valid for `nwords` words of
/// writes.
#[no_mangle]
pub unsafe extern "C" fn softmm_mm_get_dirty_log(
    mm: *const softmm_mm,
    addr: u64,
    len: u64,
    bits: *mut u64,
    nwords: usize,
    clear: i32,
) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -libc::EINVAL };
        let words: &mut [u64] = if nwords == 0 {
            &mut []
        } else if bits.is_null() {
            return -libc::EFAULT;
        } else {
            // SAFETY: valid for `nwords` words of writes (the caller's contract).
            unsafe { std::slice::from_raw_parts_mut(bits, nwords) }
        };
        mm.dirty_log(addr, len, words, clear != 0).map_or_else(neg, |()| 0)
    })
}

/// Number of pages under a write watch, in either mode; `-EINVAL` for a
/// `NULL` handle.
///
/// # Safety
///
/// `mm` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_mm_write_watched_pages(mm: *const softmm_mm) -> i64 {
    crate::guard64(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -i64::from(libc::EINVAL) };
        mm.write_watched_pages() as i64
    })
}

/// Inserts a watchpoint (QEMU's `cpu_watchpoint_insert`): an access
/// through any CPU of a kind in `access_mask` (`SOFTMM_ACCESS_READ`,
/// `_WRITE`, `_FETCH`, or'ed) whose bytes overlap `[addr, addr + len)`
/// returns `SOFTMM_FAULTED` before it is made, with a `softmm_fault` of
/// `signo` 0 and `code` [`SOFTMM_EVENT_WATCHPOINT`], after the guest's own
/// faults. Any length and alignment; in force for every CPU when the call
/// returns; the guest sees nothing of it. Resume with
/// [`softmm_cpu_pass_watchpoint`] or remove it. `0`; `-EINVAL` for a
/// `NULL` handle, a bad mask, `len` 0 or a range past the user address
/// space; `-ENOSPC` past `SOFTMM_MAX_WATCHPOINTS`.
///
/// # Safety
///
/// `mm` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_mm_watchpoint_insert(
    mm: *const softmm_mm,
    addr: u64,
    len: u64,
    access_mask: u32,
) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -libc::EINVAL };
        let Some(mask) = WatchAccess::from_bits(access_mask) else { return -libc::EINVAL };
        mm.watchpoint_insert(addr, len, mask).map_or_else(neg, |()| 0)
    })
}

/// Removes one watchpoint inserted with the same `addr`, `len` and
/// `access_mask`. `-ENOENT` if there is none; `-EINVAL` as
/// [`softmm_mm_watchpoint_insert`].
///
/// # Safety
///
/// `mm` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_mm_watchpoint_remove(
    mm: *const softmm_mm,
    addr: u64,
    len: u64,
    access_mask: u32,
) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -libc::EINVAL };
        let Some(mask) = WatchAccess::from_bits(access_mask) else { return -libc::EINVAL };
        mm.watchpoint_remove(addr, len, mask).map_or_else(neg, |()| 0)
    })
}

/// Lets the next access of `cpu` that hits a watchpoint be made, once (how
/// an emulator resumes the instruction that reported
/// `SOFTMM_EVENT_WATCHPOINT`). `-EINVAL` for `NULL`, `-EPERM` from another
/// thread, `-EBUSY` while a section of the CPU is open.
///
/// # Safety
///
/// `cpu` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_cpu_pass_watchpoint(cpu: *mut softmm_cpu) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        match unsafe { owned(cpu) } {
            Ok(mut c) => {
                c.cpu.pass_watchpoint();
                0
            }
            Err(e) => e,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::*;

    #[test]
    fn a_bad_mode_or_handle_is_einval_and_changes_nothing() {
        let mut phys = std::ptr::null_mut();
        let mut mm = std::ptr::null_mut();
        // SAFETY: valid out pointers; the handles are freed below.
        unsafe {
            assert_eq!(softmm_phys_new(1 << 20, &mut phys), 0);
            assert_eq!(softmm_mm_new(phys, &mut mm), 0);
            assert_eq!(softmm_mm_write_watch(std::ptr::null(), 0x10000, 4096, SOFTMM_WATCH_LOG), -libc::EINVAL);
            for bad in [0, 4, SOFTMM_WATCH_LOG | 8] {
                assert_eq!(softmm_mm_write_watch(mm, 0x10000, 4096, bad), -libc::EINVAL);
                assert_eq!(softmm_mm_write_unwatch(mm, 0x10000, 4096, bad), -libc::EINVAL);
            }
            assert_eq!(softmm_mm_write_watch(mm, 0x10001, 4096, SOFTMM_WATCH_LOG), -libc::EINVAL);
            assert_eq!(softmm_mm_write_watched_pages(mm), 0);
            assert_eq!(softmm_mm_write_watch(mm, 0x10000, 8192, SOFTMM_WATCH_LOG | SOFTMM_WATCH_NOTIFY), 0);
            assert_eq!(softmm_mm_write_watched_pages(mm), 2);
            let mut w = [u64::MAX; 1];
            assert_eq!(softmm_mm_get_dirty_log(mm, 0x10000, 8192, std::ptr::null_mut(), 1, 0), -libc::EFAULT);
            assert_eq!(softmm_mm_get_dirty_log(mm, 0x10000, 8192, w.as_mut_ptr(), 0, 0), -libc::EINVAL);
            assert_eq!(softmm_mm_get_dirty_log(mm, 0x10000, 8192, w.as_mut_ptr(), 1, 1), 0);
            assert_eq!(w, [0]);
            assert_eq!(softmm_mm_write_unwatch(mm, 0x10000, 8192, SOFTMM_WATCH_LOG | SOFTMM_WATCH_NOTIFY), 0);
            assert_eq!(softmm_mm_write_watched_pages(mm), 0);
            softmm_mm_free(mm);
            softmm_phys_free(phys);
        }
    }
}
