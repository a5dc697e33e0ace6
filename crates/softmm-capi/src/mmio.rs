//! MMIO regions (`AddressSpace::mmap_io`): a device's registers in the
//! guest's address space, whose accesses call the embedder's callbacks
//! (unicorn's `uc_mmio_map`).

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use softmm::MmioDevice;

use crate::mm::{mm_ref, ret64};
use crate::{guard64, softmm_mm};

/// `softmm_fault.code` when `signo` is 0: the bytes are an MMIO region's
/// ([`softmm_mmio_map`]), which have no host address. Only
/// `softmm_section_tlb_fill` and the atomics return it; the loads, stores
/// and copies (`softmm_cpu_*`, `softmm_section_*`, the inline
/// `softmm_tlb_*` helpers, which miss to them) call the device instead:
/// make the access through one of those.
pub const SOFTMM_EVENT_MMIO: i32 = 3;

/// A device's callbacks, for [`softmm_mmio_map`] (unicorn's
/// `uc_cb_mmio_read_t`/`uc_cb_mmio_write_t`). Offsets are from the
/// region's first byte; values little endian, in the low `size` bytes.
/// A load or store of 1, 2, 4 or 8 bytes in a page is one call of its
/// size at its offset (any alignment); a longer copy, its naturally
/// aligned pieces of at most 8 bytes, in address order.
///
/// The callbacks run on the guest threads, concurrently, outside any
/// access section: they may block and use other memory and other address
/// spaces, but must not change the mappings of the address space they
/// serve nor access its guest memory (either may wait for a `munmap` that
/// waits for them). Every callback of a region returns before the call
/// that removes the region (`softmm_munmap`, `softmm_mprotect`, ...)
/// returns.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct softmm_mmio_ops {
    /// A load of `size` bytes at `offset`: the value. Required.
    pub read: Option<unsafe extern "C" fn(opaque: *mut c_void, offset: u64, size: u32) -> u64>,
    /// A store of the low `size` bytes of `value` at `offset`. Required.
    pub write: Option<unsafe extern "C" fn(opaque: *mut c_void, offset: u64, size: u32, value: u64)>,
    /// Called once, when no mapping of the region is left in any address
    /// space (forks included) and no callback runs: `opaque` may be freed.
    /// May be `NULL`.
    pub release: Option<unsafe extern "C" fn(opaque: *mut c_void)>,
}

/// The C callbacks as an [`MmioDevice`].
struct CDevice {
    read: unsafe extern "C" fn(*mut c_void, u64, u32) -> u64,
    write: unsafe extern "C" fn(*mut c_void, u64, u32, u64),
    release: Option<unsafe extern "C" fn(*mut c_void)>,
    opaque: *mut c_void,
    /// Cleared when the mapping failed: the caller still owns `opaque`.
    armed: AtomicBool,
}

// SAFETY: `softmm_mmio_map`'s contract: the callbacks may be called with
// `opaque` from any thread, concurrently, and `release` from any thread.
unsafe impl Send for CDevice {}
// SAFETY: as for `Send`.
unsafe impl Sync for CDevice {}

impl MmioDevice for CDevice {
    fn read(&self, offset: u64, size: usize) -> u64 {
        // SAFETY: the caller's callback, called as its contract says.
        unsafe { (self.read)(self.opaque, offset, size as u32) }
    }

    fn write(&self, offset: u64, size: usize, value: u64) {
        // SAFETY: as in `read`.
        unsafe { (self.write)(self.opaque, offset, size as u32, value) }
    }
}

impl Drop for CDevice {
    fn drop(&mut self) {
        if let Some(release) = self.release.filter(|_| *self.armed.get_mut()) {
            // SAFETY: called once, when nothing else holds the device.
            unsafe { release(self.opaque) }
        }
    }
}

/// Maps a device's registers at `[addr, addr + len)`: `mmap(addr, len,
/// prot, flags, fd, 0)` of a new device file whose loads and stores call
/// `ops` with `opaque` ([`softmm_mmio_ops`]). Returns the address or
/// `-errno`, as `softmm_mmap` with a file: `flags` is `MAP_SHARED` (or
/// `MAP_SHARED_VALIDATE`) with `MAP_FIXED`/`MAP_FIXED_NOREPLACE` for an
/// exact address; `-EINVAL` for a `NULL` handle or `ops`, a `NULL`
/// `read` or `write`, `MAP_PRIVATE` or `MAP_ANONYMOUS`, and `mmap`'s
/// errno otherwise. The region behaves as Linux's `VM_IO | VM_PFNMAP`
/// mappings (no pins, no remote access, no growth by `mremap`, skipped by
/// `mlock`). On failure `release` is not called and nothing changed; on
/// success it is called once the region is gone from every address space,
/// on the thread whose call ended the last mapping (as
/// `softmm_mmap_host`'s `release`).
///
/// # Safety
///
/// `mm` and `ops` are null or valid; the callbacks may be called with
/// `opaque` from any thread, concurrently, until `release` is.
#[no_mangle]
pub unsafe extern "C" fn softmm_mmio_map(
    mm: *const softmm_mm,
    addr: u64,
    len: u64,
    prot: i32,
    flags: i32,
    ops: *const softmm_mmio_ops,
    opaque: *mut c_void,
) -> i64 {
    guard64(|| {
        let einval = -i64::from(libc::EINVAL);
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return einval };
        // SAFETY: null or valid (the caller's contract).
        let Some(ops) = (unsafe { ops.as_ref() }).copied() else { return einval };
        let (Some(read), Some(write)) = (ops.read, ops.write) else { return einval };
        let device = Arc::new(CDevice { read, write, release: ops.release, opaque, armed: AtomicBool::new(true) });
        let r = mm.mmap_io(addr, len, prot, flags, device.clone());
        if r.is_err() {
            // Whoever drops the device last, the caller keeps `opaque`.
            device.armed.store(false, Ordering::Relaxed);
        }
        ret64(r)
    })
}
