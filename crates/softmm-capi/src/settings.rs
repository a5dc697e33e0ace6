//! Run-time settings of an arena: the `vm.overcommit_*` sysctls, which
//! every address space on it is charged under (Rust:
//! `PhysMem::overcommit`, `PhysMem::set_overcommit`).

use softmm::OvercommitMode;

use crate::sized::{read_sized, write_sized, SizedStruct};
use crate::{guard, softmm_phys};

/// The overcommit sysctls and the machine sizes they are computed from.
/// Read it with `softmm_phys_get_overcommit` (setting `size` first),
/// change the fields wanted, and give it to `softmm_phys_set_overcommit`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct softmm_overcommit {
    /// `sizeof(softmm_overcommit)`, set by the caller before
    /// `softmm_phys_get_overcommit`.
    pub size: u32,
    /// `vm.overcommit_memory`: 0 heuristic (`OVERCOMMIT_GUESS`, the
    /// default), 1 always (`OVERCOMMIT_ALWAYS`), 2 never
    /// (`OVERCOMMIT_NEVER`: the committed total may not pass the limit).
    pub mode: i32,
    /// `vm.overcommit_ratio`: percent of RAM in the commit limit (50).
    pub ratio: u64,
    /// `vm.overcommit_kbytes`: the limit's RAM part in KiB; 0 = `ratio`.
    pub kbytes: u64,
    /// `vm.admin_reserve_kbytes`.
    pub admin_reserve_kbytes: u64,
    /// `vm.user_reserve_kbytes`.
    pub user_reserve_kbytes: u64,
    /// RAM pages as the kernel counts them (`totalram_pages`; the arena's
    /// frames by default).
    pub totalram_pages: u64,
    /// Swap pages (`total_swap_pages`; 0 by default).
    pub swap_pages: u64,
    /// Nonzero: the process has `CAP_SYS_ADMIN` (exempt from the admin
    /// reserve).
    pub cap_sys_admin: i32,
    /// Always 0.
    pub reserved: u32,
}

// SAFETY: `repr(C)`, starts with its `u32` size, integers only.
unsafe impl SizedStruct for softmm_overcommit {
    /// The whole struct of 0.1.1.
    const MIN_SIZE: usize = std::mem::size_of::<softmm_overcommit>();
}

/// The mode's `vm.overcommit_memory` value.
fn mode_value(m: OvercommitMode) -> i32 {
    match m {
        OvercommitMode::Guess => 0,
        OvercommitMode::Always => 1,
        OvercommitMode::Never => 2,
    }
}

/// Fills `out` with the arena's overcommit settings. `-EINVAL` for a
/// `NULL` handle or `out`, or an `out->size` below the first version's.
///
/// # Safety
///
/// `phys` is null or a live handle; `out` is null or valid for reads and
/// writes of its `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn softmm_phys_get_overcommit(phys: *const softmm_phys, out: *mut softmm_overcommit) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(phys) = (unsafe { phys.as_ref() }) else { return -libc::EINVAL };
        let o = phys.inner.overcommit();
        let v = softmm_overcommit {
            size: 0,
            mode: mode_value(o.mode),
            ratio: o.ratio,
            kbytes: o.kbytes,
            admin_reserve_kbytes: o.admin_reserve_kbytes,
            user_reserve_kbytes: o.user_reserve_kbytes,
            totalram_pages: o.totalram_pages,
            swap_pages: o.swap_pages,
            cap_sys_admin: i32::from(o.cap_sys_admin),
            reserved: 0,
        };
        // SAFETY: null or valid for its size (the caller's contract).
        unsafe { write_sized(out, v) }
    })
}

/// Sets the arena's overcommit settings, as writing the sysctls does: later
/// charges (mmap, brk, mremap, mprotect, fork) of every address space on
/// the arena follow them; what is committed stays. `-EINVAL` for a `mode`
/// other than 0, 1, 2 (as the sysctl's range check), a `NULL` handle or
/// `config`, or a `size` below the first version's; `-E2BIG` for a struct
/// from a newer header whose new fields are not zero. Nothing changes on
/// error.
///
/// # Safety
///
/// `phys` is null or a live handle; `config` is null or valid for reads of
/// its `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn softmm_phys_set_overcommit(phys: *const softmm_phys, config: *const softmm_overcommit) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(phys) = (unsafe { phys.as_ref() }) else { return -libc::EINVAL };
        // SAFETY: null or valid for its size (the caller's contract); every
        // field is in the first version, so no default is read.
        let c = match unsafe { read_sized(config, softmm_overcommit::default()) } {
            Ok(c) => c,
            Err(e) => return e,
        };
        let mode = match c.mode {
            0 => OvercommitMode::Guess,
            1 => OvercommitMode::Always,
            2 => OvercommitMode::Never,
            _ => return -libc::EINVAL,
        };
        let o = phys
            .inner
            .overcommit()
            .mode(mode)
            .ratio(c.ratio)
            .kbytes(c.kbytes)
            .admin_reserve_kbytes(c.admin_reserve_kbytes)
            .user_reserve_kbytes(c.user_reserve_kbytes)
            .totalram_pages(c.totalram_pages)
            .swap_pages(c.swap_pages)
            .cap_sys_admin(c.cap_sys_admin != 0);
        phys.inner.set_overcommit(o);
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{softmm_mm_free, softmm_mm_new, softmm_mmap, softmm_phys_free, softmm_phys_new};

    #[test]
    fn never_overcommit_refuses_a_charge_past_the_limit() {
        let mut phys = std::ptr::null_mut();
        let mut mm = std::ptr::null_mut();
        // SAFETY: valid outputs; handles live until freed below.
        unsafe {
            assert_eq!(softmm_phys_new(1 << 20, &mut phys), 0);
            assert_eq!(softmm_mm_new(phys, &mut mm), 0);
            let mut o =
                softmm_overcommit { size: std::mem::size_of::<softmm_overcommit>() as u32, ..Default::default() };
            assert_eq!(softmm_phys_get_overcommit(phys, &mut o), 0);
            assert_eq!((o.mode, o.ratio, o.totalram_pages), (0, 50, 256));
            let rw = libc::PROT_READ | libc::PROT_WRITE;
            let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
            // Guess: only a single charge past RAM + swap (256 pages) fails.
            assert_eq!(softmm_mmap(mm, 0, 2 << 20, rw, anon, std::ptr::null(), 0), -i64::from(libc::ENOMEM));
            assert!(softmm_mmap(mm, 0, 512 << 10, rw, anon, std::ptr::null(), 0) > 0);
            o.mode = 3;
            assert_eq!(softmm_phys_set_overcommit(phys, &o), -libc::EINVAL);
            o.mode = 2;
            o.ratio = 100;
            assert_eq!(softmm_phys_set_overcommit(phys, &o), 0);
            let mut back = softmm_overcommit { size: o.size, ..Default::default() };
            assert_eq!(softmm_phys_get_overcommit(phys, &mut back), 0);
            assert_eq!((back.mode, back.ratio), (2, 100));
            // Never: 128 pages committed, 192 more pass the limit of 256.
            assert_eq!(softmm_mmap(mm, 0, 768 << 10, rw, anon, std::ptr::null(), 0), -i64::from(libc::ENOMEM));
            assert!(softmm_mmap(mm, 0, 64 << 10, rw, anon, std::ptr::null(), 0) > 0);
            assert_eq!(softmm_phys_set_overcommit(std::ptr::null(), &o), -libc::EINVAL);
            assert_eq!(softmm_phys_set_overcommit(phys, std::ptr::null()), -libc::EINVAL);
            softmm_mm_free(mm);
            softmm_phys_free(phys);
        }
    }
}
