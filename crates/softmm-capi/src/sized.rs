//! Size-versioned structs: the first field of every struct that may grow is
//! its `size` in bytes, so that a library and a program built against
//! different headers agree on how much of it each knows.
//!
//! The rules are Linux's for `sched_setattr`/`sched_getattr`, `clone3` and
//! `openat2` (`copy_struct_from_user`):
//!
//! * **In** (a configuration the library reads): a `size` below the first
//!   version's is `-EINVAL`; a smaller one from an older header leaves the
//!   fields it lacks at their defaults; a larger one from a newer header is
//!   accepted if the bytes the library does not know are all zero (the new
//!   fields at their "unset" value), and is `-E2BIG` otherwise.
//! * **Out** (statistics the library writes): the caller sets `size`; the
//!   library writes `min(size, its own)` bytes, zeroes the rest of the
//!   caller's `size` bytes, and stores the byte count it wrote in `size`.

use std::mem::size_of;

/// A `#[repr(C)]` struct whose first field is its `size: u32`, every bit
/// pattern of which is a valid value (integers, raw pointers, byte arrays).
///
/// # Safety
///
/// The implementer is `#[repr(C)]`, starts with a `u32` size, and has no
/// field with invalid bit patterns (no `bool`, reference or enum).
pub(crate) unsafe trait SizedStruct: Copy {
    /// The `size` of the first version of the struct: the smallest a caller
    /// may pass.
    const MIN_SIZE: usize;
    /// The `size` of every older version ([`SizedStruct::MIN_SIZE`]
    /// first): a caller's size below the library's own must be one of
    /// them, so that no field is read in part (a pointer cut to its low
    /// bytes would be followed). None by default: the first version is the
    /// only one.
    const OLDER: &'static [usize] = &[];
}

/// The caller's `size` of the struct at `p`.
///
/// # Safety
///
/// `p` is not null and valid for a read of the `u32` at its start.
unsafe fn size_of_callers<T: SizedStruct>(p: *const T) -> usize {
    // SAFETY: valid for the first field (the caller's contract); every
    // implementer starts with a `u32` (the trait's contract).
    unsafe { p.cast::<u32>().read() as usize }
}

/// Reads the caller's struct at `p` over `base` (the defaults of the
/// fields an older caller does not know), as `copy_struct_from_user`:
/// `-EINVAL` for a null `p`, a `size` below [`SizedStruct::MIN_SIZE`] or
/// one below the library's that no version had ([`SizedStruct::OLDER`]:
/// Linux's structs hold integers, whose part is harmless, where these hold
/// pointers), `-E2BIG` for a larger struct whose extra bytes are not all
/// zero.
///
/// # Safety
///
/// `p` is null or valid for reads of its own `size` bytes.
pub(crate) unsafe fn read_sized<T: SizedStruct>(p: *const T, base: T) -> Result<T, i32> {
    if p.is_null() {
        return Err(-libc::EINVAL);
    }
    // SAFETY: not null and valid (the caller's contract).
    let size = unsafe { size_of_callers(p) };
    let ours = size_of::<T>();
    if size < T::MIN_SIZE || (size < ours && !T::OLDER.contains(&size)) {
        return Err(-libc::EINVAL);
    }
    if size > ours {
        // SAFETY: valid for `size` bytes of reads (the caller's contract).
        let tail = unsafe { std::slice::from_raw_parts(p.cast::<u8>().add(ours), size - ours) };
        if tail.iter().any(|&b| b != 0) {
            return Err(-libc::E2BIG);
        }
    }
    let mut v = base;
    // SAFETY: `p` is valid for `min(size, ours)` bytes of reads, `v` for
    // `ours` bytes of writes; any bytes make a valid `T` (the trait's
    // contract).
    unsafe { std::ptr::copy_nonoverlapping(p.cast::<u8>(), (&raw mut v).cast::<u8>(), size.min(ours)) };
    Ok(v)
}

/// Writes `v` to the caller's struct at `out` as `sched_getattr` does:
/// `min(size, ours)` bytes, the rest of the caller's `size` bytes zeroed,
/// and that byte count stored in its `size`. `-EINVAL` for a null `out` or
/// a `size` below [`SizedStruct::MIN_SIZE`], with nothing written.
///
/// # Safety
///
/// `out` is null or valid for reads and writes of its own `size` bytes.
pub(crate) unsafe fn write_sized<T: SizedStruct>(out: *mut T, v: T) -> i32 {
    if out.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: not null and valid (the caller's contract).
    let size = unsafe { size_of_callers(out) };
    if size < T::MIN_SIZE {
        return -libc::EINVAL;
    }
    let n = size.min(size_of::<T>());
    // SAFETY: `out` is valid for `size >= n` bytes of writes (the caller's
    // contract), `v` for `n` bytes of reads; the caller's struct is not
    // ours, so they do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping((&raw const v).cast::<u8>(), out.cast::<u8>(), n);
        std::ptr::write_bytes(out.cast::<u8>().add(n), 0, size - n);
        out.cast::<u32>().write(n as u32);
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct V2 {
        size: u32,
        a: u32,
        b: u64,
    }

    // SAFETY: `repr(C)`, starts with its size, integers only.
    unsafe impl SizedStruct for V2 {
        const MIN_SIZE: usize = 8;
        const OLDER: &'static [usize] = &[8];
    }

    const BASE: V2 = V2 { size: 0, a: 1, b: 2 };

    #[test]
    fn an_older_struct_keeps_the_defaults_of_the_fields_it_lacks() {
        let old = [8u32, 7]; // size 8: `a` only
                             // SAFETY: valid for 8 bytes, as its size says.
        let v = unsafe { read_sized(old.as_ptr().cast::<V2>(), BASE) }.unwrap();
        assert_eq!((v.a, v.b), (7, 2));
    }

    #[test]
    fn a_newer_struct_is_accepted_only_with_its_new_fields_zero() {
        let mut new = [24u32, 7, 9, 0, 0, 0]; // size 24: 8 bytes we do not know
                                              // SAFETY: valid for 24 bytes.
        let v = unsafe { read_sized(new.as_ptr().cast::<V2>(), BASE) }.unwrap();
        assert_eq!((v.a, v.b), (7, 9));
        new[5] = 1;
        // SAFETY: as above.
        assert_eq!(unsafe { read_sized(new.as_ptr().cast::<V2>(), BASE) }, Err(-libc::E2BIG));
        let short = [4u32, 7];
        // SAFETY: valid for 8 bytes.
        assert_eq!(unsafe { read_sized(short.as_ptr().cast::<V2>(), BASE) }, Err(-libc::EINVAL));
        // SAFETY: null is allowed.
        assert_eq!(unsafe { read_sized(std::ptr::null::<V2>(), BASE) }, Err(-libc::EINVAL));
    }

    #[test]
    fn an_output_is_cut_or_zero_padded_to_the_callers_size() {
        let v = V2 { size: 0, a: 7, b: 9 };
        let mut old = [8u32, 0, 0xdead, 0xbeef];
        // SAFETY: valid for its 8 bytes.
        assert_eq!(unsafe { write_sized(old.as_mut_ptr().cast::<V2>(), v) }, 0);
        assert_eq!(old, [8, 7, 0xdead, 0xbeef], "nothing past the caller's size");
        let mut new = [24u32, 0, 0, 0, 0xdead, 0xbeef];
        // SAFETY: valid for 24 bytes.
        assert_eq!(unsafe { write_sized(new.as_mut_ptr().cast::<V2>(), v) }, 0);
        assert_eq!(new, [16, 7, 9, 0, 0, 0], "the bytes we do not know zeroed, size says what we wrote");
        let mut short = [4u32, 0];
        // SAFETY: valid for 8 bytes.
        assert_eq!(unsafe { write_sized(short.as_mut_ptr().cast::<V2>(), v) }, -libc::EINVAL);
        assert_eq!(short, [4, 0]);
    }
}
