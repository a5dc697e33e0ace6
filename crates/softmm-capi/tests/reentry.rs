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

thread_local! {
    /// The CPU the release below calls in on, whether it frees it (else it
    /// asks for its statistics), and what that call returned.
    static RELEASE_ON: std::cell::Cell<(*mut softmm_cpu, bool, i32)> =
        const { std::cell::Cell::new((null_mut(), false, 1)) };
}

unsafe extern "C" fn release_calling_in(_opaque: *mut c_void) {
    let (cpu, free, _) = RELEASE_ON.with(std::cell::Cell::get);
    let mut st = softmm_cpu_stats { size: std::mem::size_of::<softmm_cpu_stats>() as u32, ..Default::default() };
    // SAFETY: the test's live handle, on its thread; `st` is valid.
    let rc = unsafe {
        if free {
            softmm_cpu_free(cpu)
        } else {
            softmm_cpu_get_stats(cpu, &mut st)
        }
    };
    RELEASE_ON.with(|r| r.set((cpu, free, rc)));
}

/// A device's release that `softmm_cpu_free` runs (the CPU held the last
/// reference to the address space) and that calls in on that CPU is
/// refused with `-EBUSY`, as from any callback its call runs; the CPU is
/// freed once. Before, the free let go of its in-call mark before the
/// address space's teardown: the release's `softmm_cpu_get_stats` got a
/// reference to the state being dropped (0), and its `softmm_cpu_free`
/// freed the handle twice (glibc: "double free detected").
#[test]
fn a_release_run_by_softmm_cpu_free_that_calls_in_on_that_cpu_is_busy() {
    // SAFETY: every handle is made and freed here, on this thread; every
    // output pointer is valid.
    unsafe {
        let mut phys = null_mut();
        assert_eq!(softmm_phys_new(1 << 20, &mut phys), 0);
        for free in [false, true] {
            let (mut mm, mut cpu) = (null_mut(), null_mut());
            assert_eq!(softmm_mm_new(phys, &mut mm), 0);
            assert_eq!(softmm_cpu_new(mm, &mut cpu), 0);
            RELEASE_ON.with(|r| r.set((cpu, free, 1)));
            let ops =
                softmm_mmio_ops { read: Some(dev_read), write: Some(dev_write), release: Some(release_calling_in) };
            let rw = libc::PROT_READ | libc::PROT_WRITE;
            assert!(softmm_mmio_map(mm, 0, 4096, rw, libc::MAP_SHARED, &ops, null_mut()) > 0);
            // The CPU now holds the address space alone.
            softmm_mm_free(mm);
            assert_eq!(RELEASE_ON.with(std::cell::Cell::get).2, 1, "no release before the CPU's free");
            assert_eq!(softmm_cpu_free(cpu), 0);
            assert_eq!(RELEASE_ON.with(std::cell::Cell::get).2, -libc::EBUSY, "free {free}: the release's call");
        }
        softmm_phys_free(phys);
    }
}
