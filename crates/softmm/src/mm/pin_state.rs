//! An address space's pinning state: `write_protect_seq` (which makes
//! gup-fast and `fork` mutually exclusive), `MMF_HAS_PINNED`, and the
//! `pinned_vm` charge of long-term pins against `RLIMIT_MEMLOCK`. These
//! are fields of Linux's `mm_struct`, so they are the core's: `fork` reads
//! them, and the pinning calls (`crate::pin`) set them.
//!
//! # The memlock rule
//!
//! Linux has three conventions (see the reference, section 4.5): VFIO
//! type1 charges `locked_vm`, io_uring charges the *user's* `locked_vm`
//! against the limit and adds to `pinned_vm` unconditionally, and RDMA's
//! `ib_umem_get` charges the address space's `pinned_vm` against
//! `RLIMIT_MEMLOCK`. softmm has no users, so it follows `ib_umem_get`:
//! before any page is pinned, `pinned_vm + npages > RLIMIT_MEMLOCK /
//! PAGE_SIZE` without `CAP_IPC_LOCK` is `ENOMEM`; with it the charge is made
//! but never refused; the unpin returns it. `pinned_vm` is separate from
//! `mlock`'s `locked_vm` (each is checked against the limit alone, as on
//! Linux). Unlike `ib_umem_get`'s add-then-check, the charge is a
//! compare-exchange, so a refused pin never makes a concurrent one fail.
//! Short-term pins (without `FOLL_LONGTERM`) charge nothing.

use super::MmConfig;
use crate::error::{Errno, Result};
use crate::sync::{AtomicBool, AtomicU64, Ordering, SeqCount};
use crate::PAGE_SHIFT;

/// The pinning state of one address space. Pin handles share it (an `Arc`)
/// so that an unpin after the address space died still finds its counter,
/// as Linux's io_uring keeps the `mm` with `mmgrab`.
#[derive(Default)]
pub(crate) struct PinState {
    /// Odd while `fork` write-protects the parent's entries: a gup-fast pin
    /// that sees it odd or changed falls back to the slow path, which waits
    /// for `mmap_lock`.
    pub(crate) write_protect_seq: SeqCount,
    /// `MMF_HAS_PINNED`: set by the first pin, never cleared.
    has_pinned: AtomicBool,
    /// `pinned_vm` in pages.
    pinned_vm: AtomicU64,
}

impl PinState {
    /// Pages charged by live long-term pins.
    pub(crate) fn pinned_vm(&self) -> u64 {
        self.pinned_vm.load(Ordering::Relaxed)
    }

    /// True once anything in the address space was pinned (`MMF_HAS_PINNED`):
    /// only then does `fork` look at pin counts.
    pub(crate) fn has_pinned(&self) -> bool {
        self.has_pinned.load(Ordering::Relaxed)
    }

    /// `mm_set_has_pinned_flag`. Before the pin itself: `fork` reads it under
    /// `mmap_lock`, which the slow path holds, and gup-fast's pins are
    /// ordered against `fork` by `write_protect_seq`.
    pub(crate) fn set_has_pinned(&self) {
        if !self.has_pinned.load(Ordering::Relaxed) {
            self.has_pinned.store(true, Ordering::SeqCst);
        }
    }

    /// Charges `pages` to `pinned_vm`, or `ENOMEM` (nothing charged) if that
    /// would pass `config.memlock_limit` without `cap_ipc_lock`.
    pub(crate) fn account(&self, pages: u64, config: &MmConfig) -> Result<()> {
        if pages == 0 {
            return Ok(());
        }
        let unlimited = config.cap_ipc_lock || config.memlock_limit == u64::MAX;
        let limit = config.memlock_limit >> PAGE_SHIFT;
        let mut cur = self.pinned_vm.load(Ordering::Relaxed);
        loop {
            let new = cur.checked_add(pages).ok_or(Errno::NoMem)?;
            if new > limit && !unlimited {
                return Err(Errno::NoMem);
            }
            match self.pinned_vm.compare_exchange_weak(cur, new, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(now) => cur = now,
            }
        }
    }

    /// Returns a charge made by [`PinState::account`].
    pub(crate) fn unaccount(&self, pages: u64) {
        if pages != 0 {
            let old = self.pinned_vm.fetch_sub(pages, Ordering::Relaxed);
            debug_assert!(old >= pages, "pinned_vm underflow");
        }
    }
}
