//! A callback that a call on a CPU runs (a device's `read`) and that calls
//! in again on the same CPU or its section is refused with `-EBUSY`: the
//! running call holds the one reference to that state. Before, the inner
//! call got a second mutable reference to the CPU in use (and could free
//! it under the outer call). A callback may still use other address
//! spaces through CPUs of its own, made then and kept.

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicI32, AtomicPtr, Ordering};

use softmm_capi::*;

thread_local! {
    /// What the device's callback does, and what its inner call returned.
    static MODE: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}
static OUTER_CPU: AtomicPtr<softmm_cpu> = AtomicPtr::new(null_mut());
static OUTER_SECTION: AtomicPtr<softmm_section> = AtomicPtr::new(null_mut());
static OTHER_MM: AtomicPtr<softmm_mm> = AtomicPtr::new(null_mut());
static INNER: AtomicI32 = AtomicI32::new(1);

unsafe extern "C" fn dev_read(_opaque: *mut c_void, _offset: u64, _size: u32) -> u64 {
    let cpu = OUTER_CPU.load(Ordering::SeqCst);
    // SAFETY: the handles are live while the outer call runs; every output
    // is valid for its write.
    let rc = unsafe {
        match MODE.with(std::cell::Cell::get) {
            0 => {
                let mut st =
                    softmm_cpu_stats { size: std::mem::size_of::<softmm_cpu_stats>() as u32, ..Default::default() };
                softmm_cpu_get_stats(cpu, &mut st)
            }
            1 => softmm_cpu_free(cpu),
            2 => {
                let mut abi = std::mem::MaybeUninit::<softmm_tlb_abi>::uninit();
                softmm_section_tlb_abi(OUTER_SECTION.load(Ordering::SeqCst), abi.as_mut_ptr())
            }
            3 => softmm_section_end(OUTER_SECTION.load(Ordering::SeqCst)),
            _ => {
                // A CPU of another address space, made here and freed here.
                let mut other = null_mut();
                let rc = softmm_cpu_new(OTHER_MM.load(Ordering::SeqCst), &mut other);
                assert_eq!(rc, 0);
                softmm_cpu_free(other)
            }
        }
    };
    INNER.store(rc, Ordering::SeqCst);
    0x42
}

unsafe extern "C" fn dev_write(_opaque: *mut c_void, _offset: u64, _size: u32, _value: u64) {}

#[test]
fn a_callback_calling_in_on_its_own_cpu_or_section_is_busy() {
    // SAFETY: every handle is made and freed here, on this thread; every
    // output pointer is valid.
    unsafe {
        let (mut phys, mut mm, mut other, mut cpu) = (null_mut(), null_mut(), null_mut(), null_mut());
        assert_eq!(softmm_phys_new(1 << 20, &mut phys), 0);
        assert_eq!(softmm_mm_new(phys, &mut mm), 0);
        assert_eq!(softmm_mm_new(phys, &mut other), 0);
        OTHER_MM.store(other, Ordering::SeqCst);
        assert_eq!(softmm_cpu_new(mm, &mut cpu), 0);
        OUTER_CPU.store(cpu, Ordering::SeqCst);
        let ops = softmm_mmio_ops { read: Some(dev_read), write: Some(dev_write), release: None };
        let io = softmm_mmio_map(mm, 0, 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, &ops, null_mut());
        assert!(io > 0, "{io}");
        let io = io as u64;
        let mut v = 0;
        for (mode, what) in [(0, "softmm_cpu_get_stats"), (1, "softmm_cpu_free"), (4, "a CPU of its own")] {
            MODE.with(|m| m.set(mode));
            INNER.store(1, Ordering::SeqCst);
            assert_eq!(softmm_cpu_read_uint(cpu, io, 4, &mut v, null_mut()), 0, "{what}");
            assert_eq!(v, 0x42);
            let want = if mode == 4 { 0 } else { -libc::EBUSY };
            assert_eq!(INNER.load(Ordering::SeqCst), want, "{what} from the callback");
        }
        let mut s = null_mut();
        assert_eq!(softmm_cpu_section_begin(cpu, &mut s), 0);
        OUTER_SECTION.store(s, Ordering::SeqCst);
        for (mode, what) in [(2, "softmm_section_tlb_abi"), (3, "softmm_section_end"), (0, "softmm_cpu_get_stats")] {
            MODE.with(|m| m.set(mode));
            INNER.store(1, Ordering::SeqCst);
            assert_eq!(softmm_section_read_uint(s, io, 4, &mut v, null_mut()), 0, "{what}");
            assert_eq!(INNER.load(Ordering::SeqCst), -libc::EBUSY, "{what} from the callback");
        }
        // Outside the callbacks, the same calls succeed.
        let mut abi = std::mem::MaybeUninit::<softmm_tlb_abi>::uninit();
        assert_eq!(softmm_section_tlb_abi(s, abi.as_mut_ptr()), 0);
        assert_eq!(softmm_section_end(s), 0);
        let mut st = softmm_cpu_stats { size: std::mem::size_of::<softmm_cpu_stats>() as u32, ..Default::default() };
        assert_eq!(softmm_cpu_get_stats(cpu, &mut st), 0);
        assert_eq!(softmm_cpu_free(cpu), 0);
        softmm_mm_free(mm);
        softmm_mm_free(other);
        softmm_phys_free(phys);
    }
}
