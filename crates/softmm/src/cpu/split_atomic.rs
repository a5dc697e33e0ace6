//! Atomics that are not naturally aligned, under
//! [`AtomicAlignment::Split`](crate::AtomicAlignment::Split): x86's split
//! locks, for guests (x86 emulators) whose `lock` instructions may be
//! unaligned or cross a page.
//!
//! # What is atomic with respect to what
//!
//! * **Inside one naturally aligned 8-byte word** (a `u16` at offset 3, a
//!   `u32` at offset 2): a compare-and-swap loop on that word, the scalar's
//!   bytes replaced and the others kept. Atomic with respect to every
//!   access of softmm to those bytes (each is atomic at some width, and any
//!   store to the word between the load and the CAS fails the CAS), as the
//!   hardware's cache-line lock is. Cost: one or a few CAS of the word.
//! * **Across two words or two pages**: both pages are translated for the
//!   access (their TLB entries held in one section, no call into softmm
//!   between the two translations), then the bytes are read, computed and
//!   written under the split lock, one lock for the whole process (as the
//!   bus lock is one for the machine: split atomics of two address spaces
//!   sharing a page exclude each other too). Atomic with respect to every
//!   other split atomic. **Not** with respect to another thread's aligned
//!   atomic or plain store to the same bytes: such a store may land
//!   between the read and the write and be lost, or be seen half, where
//!   x86's bus lock excludes every access. A guest that mixes aligned and
//!   split atomics on the same bytes (rare: Linux's `split_lock_detect`
//!   warns about split locks at all) gets each byte from one of the
//!   writes. Cost: the lock (uncontended: two atomic RMWs of one line
//!   every guest thread shares), two translations, byte-wise copies.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Cpu, Scalar};
use crate::error::Fault;
use crate::fault::Access;
use crate::PAGE_SIZE;

/// The split lock: serialises the split atomics that cross a word,
/// process-wide (x86's bus lock). Held only for the bytes' read, compute
/// and write, inside an access section, with no call into softmm: never
/// across anything that blocks.
/// `std`'s, also under loom: the split path is not modelled (arena bytes
/// are host atomics that loom does not see).
static SPLIT_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Cpu {
    /// The unaligned atomic on the `T` at `addr` for `access`, inside a
    /// section: `rmw(old)` gives the value to store (`None`: none, as a
    /// load or a failed compare) and the result. `rmw` may be called more
    /// than once (a CAS loop); its last call's result is returned.
    pub(super) fn split_atomic<T: Scalar, R>(
        &mut self,
        addr: u64,
        access: Access,
        rmw: impl Fn(T) -> (Option<T>, R),
    ) -> Result<R, Fault> {
        let n = T::SIZE;
        let off = (addr % 8) as usize;
        if off + n <= 8 {
            return self.word_atomic(addr, off, access, rmw);
        }
        // In this page, and in the next.
        let first = ((PAGE_SIZE - addr % PAGE_SIZE) as usize).min(n);
        loop {
            let p1 = self.lookup(addr, first, access)?;
            let faults = self.stats.fault.faults;
            let p2 = if first < n { self.lookup(addr + first as u64, n - first, access)? } else { p1 };
            if self.stats.fault.faults != faults {
                // The second page faulted: the thread called into softmm,
                // which may have dropped the first translation. Again.
                continue;
            }
            // Nothing panics under it; a poisoned lock is still the lock.
            let _bus = SPLIT_LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let mut b = [0u8; 8];
            // SAFETY: `p1` is valid for the `first` bytes left in its page
            // and `p2` for the rest in the next (each from `lookup` in this
            // section, with no call into softmm since: no fault between
            // them, checked); the section keeps both frames allocated;
            // arena memory is only ever accessed atomically.
            unsafe {
                crate::access::copy_from_host(p1, &mut b[..first]);
                if first < n {
                    crate::access::copy_from_host(p2, &mut b[first..n]);
                }
            }
            let (new, r) = rmw(T::from_raw(u64::from_le_bytes(b)));
            if let Some(new) = new {
                let b = new.to_raw().to_le_bytes();
                // SAFETY: as for the load.
                unsafe {
                    crate::access::copy_to_host(&b[..first], p1);
                    if first < n {
                        crate::access::copy_to_host(&b[first..n], p2);
                    }
                }
            }
            return Ok(r);
        }
    }

    /// [`Cpu::split_atomic`] for a scalar inside the aligned word at
    /// `addr - off`: a CAS loop on the word.
    fn word_atomic<T: Scalar, R>(
        &mut self,
        addr: u64,
        off: usize,
        access: Access,
        rmw: impl Fn(T) -> (Option<T>, R),
    ) -> Result<R, Fault> {
        let n = T::SIZE;
        let p = self.lookup(addr, n, access)?;
        // SAFETY: the word holding `[p, p + n)` (which `off + n <= 8` keeps
        // in it) is 8-aligned and in the same arena frame (frames are page
        // aligned, a page word aligned); the section keeps the frame
        // allocated while the reference lives, in this call; arena memory is
        // only ever accessed atomically.
        let word = unsafe { &*(p.wrapping_sub(off) as *const AtomicU64) };
        let mask = (u64::MAX >> (64 - 8 * n)) << (8 * off);
        let mut cur = word.load(Ordering::SeqCst);
        loop {
            let v = u64::from_le(cur);
            let (new, r) = rmw(T::from_raw(v >> (8 * off)));
            let Some(new) = new else { return Ok(r) };
            let next = ((v & !mask) | ((new.to_raw() << (8 * off)) & mask)).to_le();
            // Lock-free: a failure means another access changed the word;
            // not under any lock.
            match word.compare_exchange_weak(cur, next, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return Ok(r),
                Err(now) => cur = now,
            }
        }
    }
}
