//! The inline TLB ABI: the table of an open section's CPU, laid out as
//! QEMU softmmu's `CPUTLBEntry`, for C and generated code that test a hit
//! themselves and call out only on a miss ([`softmm_section_tlb_fill`],
//! QEMU's `tlb_fill`/`probe_access`). The header's inline helpers
//! (`softmm_tlb_lookup`, `softmm_tlb_read_u64`, ...) are this test.
//!
//! Nothing of the section protocol changes: the inline hit is what the
//! section's own accessors run (`softmm::Section`), so a caller that keeps
//! `softmm::TlbAbi`'s rules (repeated on [`softmm_section_tlb_abi`]) is
//! as sound as they are.

use std::ffi::c_void;

use softmm::{Access, TlbEntryAbi};

use crate::section::{access, open, softmm_section};
use crate::{guard, put, softmm_fault, SOFTMM_ACCESS_FETCH, SOFTMM_ACCESS_READ, SOFTMM_ACCESS_WRITE};

/// Entries in a CPU's 4 KiB TLB table (a power of two): a page's entry is
/// `table[(addr >> SOFTMM_TLB_PAGE_SHIFT) & (SOFTMM_TLB_ENTRIES - 1)]`.
/// Part of the ABI: it changes only with the library's SONAME.
pub const SOFTMM_TLB_ENTRIES: usize = 64;

/// `log2` of the page size a TLB entry maps.
pub const SOFTMM_TLB_PAGE_SHIFT: u32 = 12;

/// One entry of a CPU's 4 KiB TLB (32 bytes on 64-bit hosts).
///
/// For an `n`-byte access (`n` 1, 2, 4 or 8) of kind `a`
/// (`SOFTMM_ACCESS_READ`, `_WRITE` or `_FETCH`) at `addr`, the entry hits
/// when `tag[a >> 1] == (addr & ~(uint64_t)0xfff) | (addr & (n - 1))`: the
/// tag is the page's address if the entry allows that access, else a value
/// no address has, and a misaligned address never matches (the alignment
/// test is the compare). A hit's host address is `bias + addr`
/// (wrapping), and its `n` bytes lie in one page. A write tag is present
/// only on a page the guest may write now (written once already, not
/// COW-shared, not write-watched), a fetch tag only on an executable one,
/// and no tag for a kind a watchpoint in the page traps.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct softmm_tlb_entry {
    /// Indexed by the access kind shifted right by one: read 0, write 1,
    /// fetch 2.
    pub tag: [u64; 3],
    /// The host address of the page's first byte minus its guest address.
    pub bias: usize,
}

// The entry is the library's own (`softmm::TlbEntryAbi`, itself asserted
// against the TLB's entry); the header asserts the same with
// `_Static_assert`.
const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<softmm_tlb_entry>() == size_of::<TlbEntryAbi>());
    assert!(align_of::<softmm_tlb_entry>() == align_of::<TlbEntryAbi>());
    assert!(offset_of!(softmm_tlb_entry, tag) == offset_of!(TlbEntryAbi, tags));
    assert!(offset_of!(softmm_tlb_entry, bias) == offset_of!(TlbEntryAbi, bias));
    assert!(size_of::<softmm_tlb_entry>() == 32 || size_of::<usize>() != 8);
    assert!(SOFTMM_TLB_ENTRIES.is_power_of_two());
    assert!(1 << SOFTMM_TLB_PAGE_SHIFT == softmm::PAGE_SIZE);
};

/// The TLB table of an open section's CPU, as [`softmm_section_tlb_abi`]
/// gives it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct softmm_tlb_abi {
    /// The first of `entries` entries; fixed for the CPU's life.
    pub table: *const softmm_tlb_entry,
    /// `SOFTMM_TLB_ENTRIES` (the library's; the header's inline helpers
    /// use the constant).
    pub entries: u32,
    /// `SOFTMM_TLB_PAGE_SHIFT`.
    pub page_shift: u32,
}

/// Stores in `*out` the TLB table of the section's CPU, for an inline hit
/// test in C or generated code (QEMU's `tlb_hit`; the header's
/// `softmm_tlb_lookup` and `softmm_tlb_read_*`/`_write_*`). `-EINVAL` for
/// NULL or a section not open, `-EPERM` from another thread.
///
/// The rules (the section's, unchanged; `softmm::TlbAbi` in Rust):
///  1. read the table only on the section's thread while the section is
///     open (it may be kept across sections of the same CPU, and stays at
///     the same address for the CPU's life); never write it;
///  2. read the entry anew for every access: any call into softmm on the
///     thread (a miss, a munmap, another CPU's access) may empty it;
///  3. a hit's host address is valid for the access's bytes until the
///     section ends or the thread calls into softmm; access them only with
///     relaxed atomics (`__atomic_load_n(p, __ATOMIC_RELAXED)`, a plain
///     `mov` on x86-64 and arm64: other guest threads may access the same
///     bytes) and never block meanwhile;
///  4. a miss is not a fault: call [`softmm_section_tlb_fill`] (or a
///     `softmm_section_*` accessor), which walks, fills and faults.
///
/// # Safety
///
/// `s` is null or the section handle of a live CPU; `out` is null or valid
/// for a write.
#[no_mangle]
pub unsafe extern "C" fn softmm_section_tlb_abi(s: *mut softmm_section, out: *mut softmm_tlb_abi) -> i32 {
    guard(|| {
        if out.is_null() {
            return -libc::EINVAL;
        }
        // SAFETY: the caller's contract.
        let section = match unsafe { open(s) } {
            Ok(section) => section,
            Err(e) => return e,
        };
        let abi = section.tlb_abi();
        let v = softmm_tlb_abi { table: abi.table.cast(), entries: abi.entries as u32, page_shift: abi.page_shift };
        // SAFETY: not null and valid (the caller's contract).
        unsafe { put(out, v) }
    })
}

/// The miss path of the inline ABI (QEMU's `tlb_fill` and
/// `probe_access`): translates the `size` bytes at `addr` for `access`
/// (`SOFTMM_ACCESS_READ`, `_WRITE` or `_FETCH`), filling the TLB entry,
/// and stores their host address in `*host`. `0` on success;
/// `SOFTMM_FAULTED` with `fault` filled (its `access`, `size` and
/// `access_addr` are this call's) when the access faults; `-EINVAL` for
/// NULL, a bad `access`, a `size` of 0, bytes that cross a page boundary
/// (split the access, or use `softmm_section_read`), or a section not
/// open; `-EPERM` from another thread.
///
/// After a 0, an inline lookup of an aligned scalar in the page hits
/// unless the page is a 2 MiB one (those hit in a TLB of their own, which
/// only this call reads) or is never cached for that access (a write
/// watch): callers always keep this call as their miss path. The host
/// address obeys rule 3 of [`softmm_section_tlb_abi`].
///
/// # Safety
///
/// `s` is null or the section handle of a live CPU; `host` and `fault` are
/// null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn softmm_section_tlb_fill(
    s: *mut softmm_section,
    addr: u64,
    size: u32,
    access_kind: u32,
    host: *mut *mut c_void,
    fault: *mut softmm_fault,
) -> i32 {
    let access_kind = match access_kind {
        SOFTMM_ACCESS_READ => Access::Read,
        SOFTMM_ACCESS_WRITE => Access::Write,
        SOFTMM_ACCESS_FETCH => Access::Execute,
        _ => return -libc::EINVAL,
    };
    if host.is_null() || size == 0 || addr % softmm::PAGE_SIZE + u64::from(size) > softmm::PAGE_SIZE {
        return -libc::EINVAL;
    }
    // SAFETY: the caller's contract (`host` checked not null).
    unsafe {
        access(s, fault, |c| {
            let p = c.probe(addr, size as usize, access_kind)?;
            host.write(p.cast());
            Ok(())
        })
    }
}
