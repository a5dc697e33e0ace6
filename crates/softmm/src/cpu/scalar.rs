//! Guest scalars: the integer types a [`Cpu`](super::Cpu) loads and stores
//! in one access, and the in-page loads and stores behind its accessors.
//!
//! A naturally aligned scalar is one atomic access of its width, so a guest
//! thread never sees half of another's aligned store (x86-64 guarantees the
//! same). An unaligned one inside a page is loaded as the one or two aligned
//! words that hold it (both in the page, since a page is word aligned), and
//! stored as the widest aligned pieces that make it up: no byte loop, and
//! no store ever rewrites a byte outside the scalar (which could undo
//! another thread's store).

use std::sync::atomic::{
    AtomicI16, AtomicI32, AtomicI64, AtomicI8, AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering,
};

/// An integer type that a [`Cpu`](super::Cpu) loads and stores in one
/// access: `u8`, `u16`, `u32`, `u64`, `i8`, `i16`, `i32`, `i64`. Sealed: the
/// accessors rely on its width being 1, 2, 4 or 8 bytes.
pub trait Scalar: sealed::Sealed {}

pub(crate) mod sealed {
    use super::Ordering;

    /// What the accessors need of a scalar. In a private module, so no
    /// other crate can implement (or call) it.
    pub trait Sealed: Copy + Eq + std::fmt::Debug {
        /// Width in bytes: 1, 2, 4 or 8.
        const SIZE: usize;
        /// The atomic of the same width.
        type Atomic;
        /// The value whose little-endian bytes are the low `SIZE` bytes
        /// of `raw`'s little-endian bytes.
        fn from_raw(raw: u64) -> Self;
        /// The inverse of `from_raw`, zero-extended.
        fn to_raw(self) -> u64;
        /// The value with its bytes reversed.
        fn swap_bytes(self) -> Self;
        /// The atomic at `p`.
        ///
        /// # Safety
        ///
        /// `p` is aligned to `SIZE`, and `[p, p + SIZE)` is live arena memory
        /// (only ever accessed atomically) for `'a`.
        unsafe fn atomic<'a>(p: *mut u8) -> &'a Self::Atomic;
        fn load(a: &Self::Atomic, o: Ordering) -> Self;
        fn store(a: &Self::Atomic, v: Self, o: Ordering);
        fn swap(a: &Self::Atomic, v: Self, o: Ordering) -> Self;
        fn compare_exchange(a: &Self::Atomic, c: Self, n: Self, s: Ordering, f: Ordering) -> Result<Self, Self>;
        fn fetch_add(a: &Self::Atomic, v: Self, o: Ordering) -> Self;
        fn fetch_sub(a: &Self::Atomic, v: Self, o: Ordering) -> Self;
        fn fetch_and(a: &Self::Atomic, v: Self, o: Ordering) -> Self;
        fn fetch_or(a: &Self::Atomic, v: Self, o: Ordering) -> Self;
        fn fetch_xor(a: &Self::Atomic, v: Self, o: Ordering) -> Self;
    }
}

macro_rules! scalar {
    ($($t:ty => $atomic:ty),* $(,)?) => {$(
        impl Scalar for $t {}
        impl sealed::Sealed for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            type Atomic = $atomic;
            #[inline]
            fn from_raw(raw: u64) -> Self {
                // Truncation keeps the low bytes, which are the first
                // bytes in little-endian order.
                raw as $t
            }
            #[inline]
            fn to_raw(self) -> u64 {
                // Through the unsigned type of the same width: no sign
                // extension into bytes that are not the scalar's.
                (self as u64) & (u64::MAX >> (64 - 8 * Self::SIZE))
            }
            #[inline]
            fn swap_bytes(self) -> Self {
                <$t>::swap_bytes(self)
            }
            #[inline]
            unsafe fn atomic<'a>(p: *mut u8) -> &'a $atomic {
                // SAFETY: aligned and live for 'a (the caller's contract).
                unsafe { &*(p as *const $atomic) }
            }
            #[inline]
            fn load(a: &$atomic, o: Ordering) -> Self { a.load(o) }
            #[inline]
            fn store(a: &$atomic, v: Self, o: Ordering) { a.store(v, o) }
            #[inline]
            fn swap(a: &$atomic, v: Self, o: Ordering) -> Self { a.swap(v, o) }
            #[inline]
            fn compare_exchange(a: &$atomic, c: Self, n: Self, s: Ordering, f: Ordering) -> Result<Self, Self> {
                a.compare_exchange(c, n, s, f)
            }
            #[inline]
            fn fetch_add(a: &$atomic, v: Self, o: Ordering) -> Self { a.fetch_add(v, o) }
            #[inline]
            fn fetch_sub(a: &$atomic, v: Self, o: Ordering) -> Self { a.fetch_sub(v, o) }
            #[inline]
            fn fetch_and(a: &$atomic, v: Self, o: Ordering) -> Self { a.fetch_and(v, o) }
            #[inline]
            fn fetch_or(a: &$atomic, v: Self, o: Ordering) -> Self { a.fetch_or(v, o) }
            #[inline]
            fn fetch_xor(a: &$atomic, v: Self, o: Ordering) -> Self { a.fetch_xor(v, o) }
        }
    )*};
}

scalar!(
    u8 => AtomicU8, u16 => AtomicU16, u32 => AtomicU32, u64 => AtomicU64,
    i8 => AtomicI8, i16 => AtomicI16, i32 => AtomicI32, i64 => AtomicI64,
);

/// Word accesses where alignment allows (Miri does not model mixed-size
/// atomics: there every access is a byte, as in `crate::access`).
const WORDS: bool = !cfg!(miri);

/// Loads the naturally aligned `n`-byte (1, 2, 4 or 8) little-endian value
/// at `p`, relaxed: one atomic load (bytes under Miri, as `load_in_page`).
///
/// # Safety
///
/// `p` is aligned to `n`, and `[p, p + n)` is live arena memory, only ever
/// accessed atomically, until the call returns.
#[inline(always)]
pub(super) unsafe fn load_aligned(p: *const u8, n: usize) -> u64 {
    debug_assert!(matches!(n, 1 | 2 | 4 | 8) && p.addr() % n == 0);
    if !WORDS {
        // SAFETY: the same contract, which `load_in_page` needs less of.
        return unsafe { load_in_page(p, n) };
    }
    // Each arm: `p` is aligned to the width and `[p, p + n)` is live (the
    // caller's contract).
    match n {
        // SAFETY: see above.
        1 => u64::from(unsafe { &*(p as *const AtomicU8) }.load(Ordering::Relaxed)),
        // SAFETY: see above.
        2 => u64::from(u16::from_le(unsafe { &*(p as *const AtomicU16) }.load(Ordering::Relaxed))),
        // SAFETY: see above.
        4 => u64::from(u32::from_le(unsafe { &*(p as *const AtomicU32) }.load(Ordering::Relaxed))),
        // SAFETY: see above.
        _ => u64::from_le(unsafe { &*(p as *const AtomicU64) }.load(Ordering::Relaxed)),
    }
}

/// Stores the low `n` bytes (1, 2, 4 or 8) of `raw` little-endian at the
/// naturally aligned `p`, relaxed: one atomic store (bytes under Miri).
///
/// # Safety
///
/// As [`load_aligned`].
#[inline(always)]
pub(super) unsafe fn store_aligned(p: *mut u8, raw: u64, n: usize) {
    debug_assert!(matches!(n, 1 | 2 | 4 | 8) && p.addr() % n == 0);
    if !WORDS {
        // SAFETY: the same contract, which `store_in_page` needs less of.
        return unsafe { store_in_page(p, raw, n) };
    }
    match n {
        // SAFETY: as in `load_aligned`.
        1 => unsafe { &*(p as *const AtomicU8) }.store(raw as u8, Ordering::Relaxed),
        // SAFETY: as in `load_aligned`.
        2 => unsafe { &*(p as *const AtomicU16) }.store((raw as u16).to_le(), Ordering::Relaxed),
        // SAFETY: as in `load_aligned`.
        4 => unsafe { &*(p as *const AtomicU32) }.store((raw as u32).to_le(), Ordering::Relaxed),
        // SAFETY: as in `load_aligned`.
        _ => unsafe { &*(p as *const AtomicU64) }.store(raw.to_le(), Ordering::Relaxed),
    }
}

/// Loads the `n`-byte (1, 2, 4 or 8) little-endian value at `p`, relaxed.
///
/// # Safety
///
/// `[p & !7, ((p + n - 1) & !7) + 8)` is live arena memory (in practice:
/// `[p, p + n)` lies in one arena frame, which is word aligned), only ever
/// accessed atomically, until the call returns.
#[inline]
pub(super) unsafe fn load_in_page(p: *const u8, n: usize) -> u64 {
    debug_assert!(matches!(n, 1 | 2 | 4 | 8));
    let off = p.addr() % 8;
    if WORDS && p.addr() % n == 0 {
        // Each arm: `p` is aligned to the width (checked) and `[p, p + n)`
        // is inside the caller's range.
        return match n {
            // SAFETY: see above.
            1 => u64::from(unsafe { &*(p as *const AtomicU8) }.load(Ordering::Relaxed)),
            // SAFETY: see above.
            2 => u64::from(u16::from_le(unsafe { &*(p as *const AtomicU16) }.load(Ordering::Relaxed))),
            // SAFETY: see above.
            4 => u64::from(u32::from_le(unsafe { &*(p as *const AtomicU32) }.load(Ordering::Relaxed))),
            // SAFETY: see above.
            _ => u64::from_le(unsafe { &*(p as *const AtomicU64) }.load(Ordering::Relaxed)),
        };
    }
    if WORDS {
        let w0 = p.wrapping_sub(off);
        let w1 = p.wrapping_add(n - 1).wrapping_sub((p.addr() + n - 1) % 8);
        // SAFETY: `w0` and `w1` are the 8-aligned words holding the first
        // and last byte, inside the caller's range.
        let (lo, hi) = unsafe {
            (
                u64::from_le((*(w0 as *const AtomicU64)).load(Ordering::Relaxed)),
                u64::from_le((*(w1 as *const AtomicU64)).load(Ordering::Relaxed)),
            )
        };
        let both = u128::from(lo) | (u128::from(hi) << 64);
        return ((both >> (8 * off)) as u64) & (u64::MAX >> (64 - 8 * n));
    }
    let mut b = [0u8; 8];
    // SAFETY: `[p, p + n)` is inside the caller's range.
    unsafe { crate::access::copy_from_host(p, &mut b[..n]) };
    u64::from_le_bytes(b)
}

/// Stores the low `n` bytes (1, 2, 4 or 8) of `raw` at `p` in little-endian
/// order, relaxed: one atomic store if `p` is aligned to `n`, else the
/// widest aligned pieces.
///
/// # Safety
///
/// `[p, p + n)` is live arena memory, only ever accessed atomically, until
/// the call returns.
#[inline]
pub(super) unsafe fn store_in_page(p: *mut u8, raw: u64, n: usize) {
    debug_assert!(matches!(n, 1 | 2 | 4 | 8));
    let (mut i, mut v) = (0, raw);
    while i < n {
        let q = p.wrapping_add(i);
        let left = n - i;
        let w = if !WORDS {
            1
        } else if q.addr() % 8 == 0 && left >= 8 {
            8
        } else if q.addr() % 4 == 0 && left >= 4 {
            4
        } else if q.addr() % 2 == 0 && left >= 2 {
            2
        } else {
            1
        };
        // Each arm: `q` is aligned to `w` and `[q, q + w)` lies in
        // `[p, p + n)`, the caller's range.
        match w {
            // SAFETY: see above.
            8 => unsafe { &*(q as *const AtomicU64) }.store(v.to_le(), Ordering::Relaxed),
            // SAFETY: see above.
            4 => unsafe { &*(q as *const AtomicU32) }.store((v as u32).to_le(), Ordering::Relaxed),
            // SAFETY: see above.
            2 => unsafe { &*(q as *const AtomicU16) }.store((v as u16).to_le(), Ordering::Relaxed),
            // SAFETY: see above.
            _ => unsafe { &*(q as *const AtomicU8) }.store(v as u8, Ordering::Relaxed),
        }
        i += w;
        v = v.checked_shr(8 * w as u32).unwrap_or(0);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn in_page_loads_and_stores_roundtrip_at_every_offset_and_width() {
        let mut host = vec![0u64; 4];
        let base = host.as_mut_ptr() as *mut u8;
        for n in [1, 2, 4, 8] {
            for off in 0..=(32 - n) {
                let v = 0x8877_6655_4433_2211u64 & (u64::MAX >> (64 - 8 * n));
                // SAFETY: `[base + off, base + off + n)` and the words that
                // hold it lie in `host`, which nothing else accesses.
                unsafe {
                    crate::access::fill_host(base, 0xee, 32);
                    store_in_page(base.wrapping_add(off), v, n);
                    assert_eq!(load_in_page(base.wrapping_add(off), n), v, "n {n} off {off}");
                    let mut all = [0u8; 32];
                    crate::access::copy_from_host(base, &mut all);
                    assert_eq!(&all[off..off + n], &v.to_le_bytes()[..n]);
                    assert!(all[..off].iter().chain(&all[off + n..]).all(|&b| b == 0xee), "n {n} off {off}");
                }
            }
        }
    }

    #[test]
    fn raw_values_keep_only_their_own_bytes() {
        use sealed::Sealed;
        assert_eq!((-1i16).to_raw(), 0xffff);
        assert_eq!(i16::from_raw(0xffff), -1);
        assert_eq!((-2i8).to_raw(), 0xfe);
        assert_eq!(u32::from_raw(0x1_2345_6789), 0x2345_6789);
        assert_eq!((-1i64).to_raw(), u64::MAX);
    }
}
