//! loom model of host memory's release protocol (`super`'s "Protocol"),
//! on the real `Cpu` (its fill from the VMA, `cpu/host_mem.rs`) against
//! the real `mmap_host` and `munmap` (`AddressSpace::end_write_section`'s
//! shootdown). Run with
//! `RUSTFLAGS="--cfg loom --cfg crossbeam_loom" cargo test --release -p softmm --lib host_mem`.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::sync::Arc;

use loom::sync::atomic::{AtomicBool, Ordering};

use crate::sync::broken::host_mem::NO_SHOOTDOWN;
use crate::uapi::*;
use crate::{Access, PAGE_SIZE};

/// A CPU on another thread reads a host-memory page twice (two sections:
/// a fill, then a TLB hit unless a shootdown emptied the TLB) while the
/// main thread unmaps it; the release callback marks the memory released
/// (and the test frees it after the model). No read may hold a
/// translation of the page once the release ran. With
/// `broken::host_mem::NO_SHOOTDOWN` the unmap publishes the tree and puts
/// the VMA without the shootdown: the release runs while the reader is
/// inside its section, or its second read hits the entry it cached.
fn a_real_cpu_against_a_real_munmap() -> Result<(), String> {
    let layout = Layout::from_size_align(PAGE_SIZE as usize, PAGE_SIZE as usize).unwrap();
    // SAFETY: a non-zero size and a valid alignment.
    let buf = unsafe { alloc_zeroed(layout) };
    let phys = crate::phys::PhysMem::new(crate::phys::PhysConfig::new(16 * PAGE_SIZE)).unwrap();
    let mm = crate::mm::AddressSpace::new(&phys, crate::mm::MmConfig::model_default()).unwrap();
    let released = Arc::new(AtomicBool::new(false));
    let release = {
        let released = released.clone();
        Box::new(move || released.store(true, Ordering::Release))
    };
    // SAFETY: the buffer is freed only after the model, after the release.
    let a = unsafe { mm.mmap_host(0, PAGE_SIZE, PROT_READ | PROT_WRITE, 0, buf, Some(release)) }.unwrap();
    let t = {
        let (mm, released) = (mm.clone(), released.clone());
        crate::sync::model::spawn(move || {
            let mut cpu = crate::Cpu::attached(&mm);
            let mut stale = false;
            for _ in 0..2 {
                if let Ok(t) = cpu.translate(a, Access::Read) {
                    // Inside the section the translation holds: the memory
                    // must not have been released.
                    stale |= released.load(Ordering::Acquire);
                    drop(t);
                }
            }
            stale
        })
    };
    mm.munmap(a, PAGE_SIZE).unwrap();
    let stale = t.join().unwrap();
    let done = released.load(Ordering::Acquire);
    drop(mm);
    // SAFETY: allocated above with `layout`; no mapping is left.
    unsafe { dealloc(buf, layout) };
    if !done {
        return Err("the release did not run at the munmap".into());
    }
    if stale {
        return Err("a CPU held a translation of host memory after its release".into());
    }
    Ok(())
}

/// The model, and its variant without the shootdown.
#[test]
fn the_release_comes_after_the_last_translation() {
    crate::sync::broken::check_model(a_real_cpu_against_a_real_munmap, &NO_SHOOTDOWN);
}
