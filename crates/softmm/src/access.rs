//! The kinds of guest access ([`Access`]), and copies between guest frames
//! and Rust memory.
//!
//! Guest memory may be written by other guest threads at any time, so softmm
//! touches it only with relaxed atomic accesses: word-sized for the aligned
//! middle of a range, byte-sized at its edges. A race between guest threads is
//! then the guest program's race, never undefined behaviour in softmm.
//! (Under Miri, which does not model mixed-size atomics, every access is a byte.)
//!
//! The copies take a raw pointer whose range they cannot check, so they are
//! `unsafe fn`s; each caller says why its range is live arena memory.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// The kind of access that faulted. More kinds may come, so a `match` on it
/// needs a wildcard arm.
///
/// Permissions are x86-64's with NX: a page that is mapped at all is
/// readable (`PROT_WRITE` alone and `PROT_EXEC` alone included, as Linux's
/// x86-64 `protection_map` makes them without protection keys), writable
/// only with `PROT_WRITE`, and executable only with `PROT_EXEC`
/// (`READ_IMPLIES_EXEC` is off for 64-bit programs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
#[repr(u8)]
pub enum Access {
    /// A load.
    Read = 1,
    /// A store.
    Write = 2,
    /// An instruction fetch (x86's `X86_PF_INSTR`): faults with
    /// `SEGV_ACCERR` on a page mapped without `PROT_EXEC`.
    Execute = 4,
}

impl Access {
    /// The access as a bit of a TLB entry's permission mask (the
    /// discriminants are distinct bits).
    #[inline]
    pub(crate) const fn bit(self) -> u8 {
        self as u8
    }
}

/// Copy in words where alignment allows.
const WORDS: bool = !cfg!(miri);

/// Copies `dst.len()` bytes from the arena at `src` into `dst`.
///
/// # Safety
///
/// `[src, src + dst.len())` must be valid for reads until the call returns,
/// and others may access it only atomically meanwhile. Arena memory is both
/// for as long as its `PhysMem` lives (the arena is unmapped only when the
/// last reference goes, and is only ever accessed atomically). That the
/// frame is still the one the caller means, not freed and reused, is a
/// matter of correctness, which each caller ensures, not of safety.
pub(crate) unsafe fn copy_from_host(src: *const u8, dst: &mut [u8]) {
    let mut i = 0;
    let n = dst.len();
    while i < n {
        let p = src.wrapping_add(i);
        if WORDS && p.addr() % 8 == 0 && n - i >= 8 {
            // SAFETY: `p` is 8-aligned and `[p, p+8)` is inside the range the
            // caller guarantees valid and atomically accessed (`# Safety`).
            let w = unsafe { &*(p as *const AtomicU64) }.load(Ordering::Relaxed);
            dst[i..i + 8].copy_from_slice(&w.to_ne_bytes());
            i += 8;
        } else {
            // SAFETY: `p` is inside the caller's range (`# Safety`).
            dst[i] = unsafe { &*(p as *const AtomicU8) }.load(Ordering::Relaxed);
            i += 1;
        }
    }
}

/// Copies `src` into the arena at `dst`.
///
/// # Safety
///
/// As [`copy_from_host`], for `[dst, dst + src.len())` and writes.
pub(crate) unsafe fn copy_to_host(src: &[u8], dst: *mut u8) {
    let mut i = 0;
    let n = src.len();
    while i < n {
        let p = dst.wrapping_add(i);
        if WORDS && p.addr() % 8 == 0 && n - i >= 8 {
            let w = u64::from_ne_bytes(src[i..i + 8].try_into().expect("8 bytes"));
            // SAFETY: as in `copy_from_host`.
            unsafe { &*(p as *const AtomicU64) }.store(w, Ordering::Relaxed);
            i += 8;
        } else {
            // SAFETY: as in `copy_from_host`.
            unsafe { &*(p as *const AtomicU8) }.store(src[i], Ordering::Relaxed);
            i += 1;
        }
    }
}

/// Fills `len` bytes of the arena at `dst` with `byte`.
///
/// # Safety
///
/// As [`copy_from_host`], for `[dst, dst + len)` and writes.
pub(crate) unsafe fn fill_host(dst: *mut u8, byte: u8, len: usize) {
    let word = u64::from_ne_bytes([byte; 8]);
    let mut i = 0;
    while i < len {
        let p = dst.wrapping_add(i);
        if WORDS && p.addr() % 8 == 0 && len - i >= 8 {
            // SAFETY: as in `copy_from_host`.
            unsafe { &*(p as *const AtomicU64) }.store(word, Ordering::Relaxed);
            i += 8;
        } else {
            // SAFETY: as in `copy_from_host`.
            unsafe { &*(p as *const AtomicU8) }.store(byte, Ordering::Relaxed);
            i += 1;
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn copies_roundtrip_at_every_alignment() {
        let mut host = vec![0u64; 8];
        let base = host.as_mut_ptr() as *mut u8;
        for off in 0..8 {
            for len in 0..40 {
                let src: Vec<u8> = (0..len as u8).map(|b| b.wrapping_mul(37).wrapping_add(off as u8)).collect();
                let mut back = vec![0xaa; len];
                // SAFETY: `off + len < 48 <= 64`: every range lies in `host`,
                // which nothing else accesses.
                unsafe {
                    copy_to_host(&src, base.wrapping_add(off));
                    copy_from_host(base.wrapping_add(off), &mut back);
                }
                assert_eq!(back, src);
                // SAFETY: as above.
                unsafe {
                    fill_host(base.wrapping_add(off), 0x5c, len);
                    copy_from_host(base.wrapping_add(off), &mut back);
                }
                assert!(back.iter().all(|&b| b == 0x5c));
            }
        }
    }
}
