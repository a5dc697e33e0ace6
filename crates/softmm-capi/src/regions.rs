//! `softmm_mm_regions`: the mappings of an address space as an array of
//! structs (unicorn's `uc_mem_regions`, `/proc/pid/maps` without the text).

use std::ffi::c_char;

use softmm::MapEntry;

use crate::sized::SizedStruct;
use crate::{guard64, softmm_mm};

/// Bytes of [`softmm_region::name`], its terminating NUL included.
pub const SOFTMM_REGION_NAME_MAX: usize = 256;

/// One mapping (a line of `/proc/pid/maps`, with its smaps `Rss`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct softmm_region {
    /// The bytes of this struct the library wrote (`softmm_mm_regions`
    /// sets it; see its `region_size`).
    pub size: u32,
    /// `PROT_READ | PROT_WRITE | PROT_EXEC` bits of `<sys/mman.h>` (0 for
    /// `PROT_NONE`).
    pub prot: i32,
    /// `MAP_SHARED` or `MAP_PRIVATE` (the maps' `s`/`p`).
    pub flags: i32,
    /// Always 0.
    pub reserved: u32,
    /// First address (page aligned).
    pub start: u64,
    /// One past the last address (page aligned).
    pub end: u64,
    /// File offset in bytes of `start` (0 for anonymous memory).
    pub offset: u64,
    /// Inode number of the file (0 for anonymous memory).
    pub inode: u64,
    /// Resident bytes (smaps `Rss`).
    pub rss: u64,
    /// Length in bytes of the full name, without the NUL: more than
    /// `SOFTMM_REGION_NAME_MAX - 1` when `name` was truncated.
    pub name_len: u64,
    /// The file's name or a pseudo-name (`[heap]`, `[stack]`), UTF-8,
    /// NUL-terminated, truncated at a character boundary to fit; empty for
    /// anonymous memory.
    pub name: [c_char; SOFTMM_REGION_NAME_MAX],
}

// SAFETY: `repr(C)`, starts with its `u32` size, integers only.
unsafe impl SizedStruct for softmm_region {
    /// The whole struct of 0.1.1.
    const MIN_SIZE: usize = std::mem::size_of::<softmm_region>();
}

impl From<&MapEntry> for softmm_region {
    fn from(e: &MapEntry) -> Self {
        let p = e.perms.as_bytes();
        let has = |i: usize, c: u8| p.get(i) == Some(&c);
        let prot = if has(0, b'r') { libc::PROT_READ } else { 0 }
            | if has(1, b'w') { libc::PROT_WRITE } else { 0 }
            | if has(2, b'x') { libc::PROT_EXEC } else { 0 };
        let flags = if has(3, b's') { libc::MAP_SHARED } else { libc::MAP_PRIVATE };
        let mut name = [0 as c_char; SOFTMM_REGION_NAME_MAX];
        let mut n = e.name.len().min(SOFTMM_REGION_NAME_MAX - 1);
        while !e.name.is_char_boundary(n) {
            n -= 1;
        }
        for (d, &s) in name.iter_mut().zip(&e.name.as_bytes()[..n]) {
            *d = s as c_char;
        }
        softmm_region {
            size: std::mem::size_of::<softmm_region>() as u32,
            prot,
            flags,
            reserved: 0,
            start: e.start,
            end: e.end,
            offset: e.offset,
            inode: e.inode,
            rss: e.rss,
            name_len: e.name.len() as u64,
            name,
        }
    }
}

/// The mappings of `mm` in address order, into the caller's array, with
/// `listxattr(2)`'s sizing convention carried by an in/out count:
///
/// * on entry `*count` is the capacity of `regions`, in elements of
///   `region_size` bytes (pass `sizeof(softmm_region)`; a later library
///   writes only the part an older caller's struct has);
/// * `*count == 0` asks only for the number: it is returned and stored in
///   `*count`, and `regions` (which may be `NULL`) is not touched;
/// * a capacity smaller than the number of mappings is `-ERANGE`, the
///   number stored in `*count` and nothing written, as `listxattr` (and
///   `getxattr`) fail with `ERANGE` for a too small buffer;
/// * otherwise each mapping is written, and their number is returned and
///   stored in `*count`.
///
/// The mappings are one snapshot, taken under the address space's lock:
/// another thread's `mmap` between a sizing call and the next may make
/// that one `-ERANGE` too (call again with the new count). unicorn's
/// `uc_mem_regions` allocates the array instead; here nothing is allocated
/// for the caller to free. `-EINVAL` for a `NULL` handle or `count`, or a
/// `region_size` below the first version's `sizeof(softmm_region)`;
/// `-EFAULT` for a `NULL` `regions` with a nonzero count.
///
/// # Safety
///
/// `mm` is null or a live handle; `count` is null or valid for a read and
/// a write; `regions` is valid for writes of `*count * region_size` bytes
/// when `*count` is not 0.
#[no_mangle]
pub unsafe extern "C" fn softmm_mm_regions(
    mm: *const softmm_mm,
    regions: *mut softmm_region,
    region_size: usize,
    count: *mut usize,
) -> i64 {
    guard64(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm.as_ref() }) else { return -i64::from(libc::EINVAL) };
        if count.is_null() || region_size < softmm_region::MIN_SIZE {
            return -i64::from(libc::EINVAL);
        }
        // SAFETY: not null and valid (the caller's contract).
        let capacity = unsafe { count.read() };
        if capacity != 0 && regions.is_null() {
            return -i64::from(libc::EFAULT);
        }
        let maps = mm.inner.maps();
        let needed = maps.len();
        // SAFETY: not null and valid (the caller's contract).
        unsafe { count.write(needed) };
        if capacity == 0 {
            return needed as i64;
        }
        if capacity < needed {
            return -i64::from(libc::ERANGE);
        }
        let n = region_size.min(std::mem::size_of::<softmm_region>());
        for (i, e) in maps.iter().enumerate() {
            let mut r = softmm_region::from(e);
            r.size = n as u32;
            // SAFETY: element `i < capacity` of `region_size` bytes lies in
            // the caller's array (the caller's contract); `r` is a local
            // of at least `n` bytes; the tail of the element past `n` is
            // zeroed as `crate::sized::write_sized` does.
            unsafe {
                let dst = regions.cast::<u8>().add(i * region_size);
                std::ptr::copy_nonoverlapping((&raw const r).cast::<u8>(), dst, n);
                std::ptr::write_bytes(dst.add(n), 0, region_size - n);
            }
        }
        needed as i64
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{softmm_mm_free, softmm_mm_new, softmm_mmap, softmm_phys_free, softmm_phys_new};
    use std::ffi::CStr;

    fn region_name(r: &softmm_region) -> &str {
        // SAFETY: NUL-terminated within the array.
        unsafe { CStr::from_ptr(r.name.as_ptr()) }.to_str().unwrap()
    }

    #[test]
    fn regions_follow_listxattrs_sizing_convention() {
        let mut phys = std::ptr::null_mut();
        let mut mm = std::ptr::null_mut();
        // SAFETY: valid outputs; handles live until freed below.
        unsafe {
            assert_eq!(softmm_phys_new(1 << 20, &mut phys), 0);
            assert_eq!(softmm_mm_new(phys, &mut mm), 0);
            let rw = libc::PROT_READ | libc::PROT_WRITE;
            let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
            let a = softmm_mmap(mm, 0, 8192, rw, anon, std::ptr::null(), 0) as u64;
            let b =
                softmm_mmap(mm, 0, 4096, libc::PROT_READ, libc::MAP_SHARED | libc::MAP_ANONYMOUS, std::ptr::null(), 0)
                    as u64;
            let sz = std::mem::size_of::<softmm_region>();

            let mut count = 0usize;
            assert_eq!(softmm_mm_regions(mm, std::ptr::null_mut(), sz, &mut count), 2, "a query");
            assert_eq!(count, 2);
            let mut out = [softmm_region::from(&mm_entry()); 3];
            count = 1;
            assert_eq!(softmm_mm_regions(mm, out.as_mut_ptr(), sz, &mut count), -i64::from(libc::ERANGE));
            assert_eq!((count, out[0].start), (2, 0), "the count needed, nothing written");
            count = 3;
            assert_eq!(softmm_mm_regions(mm, out.as_mut_ptr(), sz, &mut count), 2);
            assert_eq!(count, 2);
            let (shared, private) = if a < b { (&out[1], &out[0]) } else { (&out[0], &out[1]) };
            assert_eq!((private.start, private.end, private.prot, private.flags), (a, a + 8192, rw, libc::MAP_PRIVATE));
            assert_eq!((shared.start, shared.prot, shared.flags), (b, libc::PROT_READ, libc::MAP_SHARED));
            assert_eq!(private.size as usize, sz);

            assert_eq!(softmm_mm_regions(mm, out.as_mut_ptr(), sz - 1, &mut count), -i64::from(libc::EINVAL));
            assert_eq!(softmm_mm_regions(mm, out.as_mut_ptr(), sz, std::ptr::null_mut()), -i64::from(libc::EINVAL));
            assert_eq!(softmm_mm_regions(std::ptr::null(), out.as_mut_ptr(), sz, &mut count), -i64::from(libc::EINVAL));
            count = 5;
            assert_eq!(softmm_mm_regions(mm, std::ptr::null_mut(), sz, &mut count), -i64::from(libc::EFAULT));
            assert_eq!(count, 5);
            softmm_mm_free(mm);
            softmm_phys_free(phys);
        }
    }

    fn mm_entry() -> MapEntry {
        let phys = softmm::PhysMem::new(softmm::PhysConfig::new(1 << 20)).unwrap();
        let mm = softmm::AddressSpace::new(&phys, softmm::MmConfig::default()).unwrap();
        mm.mmap(0x10000, 4096, 0, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED, None, 0).unwrap();
        let mut e = mm.maps().remove(0);
        e.start = 0;
        e
    }

    #[test]
    fn a_long_name_is_cut_at_a_character_boundary_and_its_length_kept() {
        let mut e = mm_entry();
        e.name = "é".repeat(200); // 400 bytes
        let r = softmm_region::from(&e);
        assert_eq!(r.name_len, 400);
        assert_eq!(region_name(&r), "é".repeat(127), "254 bytes: the 255th would split a character");
        assert_eq!((r.prot, r.flags), (0, libc::MAP_PRIVATE));
    }
}
