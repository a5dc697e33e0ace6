//! loom model of the dispatch's promise (`super`'s `# Protocol`) on the
//! real code: a real `Cpu` loading from an MMIO region against the real
//! `munmap` of the region.
//!
//! Run with `RUSTFLAGS="--cfg loom --cfg crossbeam_loom" cargo test --release -p softmm --lib mmio::`.

use std::sync::Arc;

use loom::sync::atomic::{AtomicBool, Ordering};

use crate::mm::{AddressSpace, MmConfig};
use crate::phys::{PhysConfig, PhysMem};
use crate::uapi::*;
use crate::{Cpu, Fault, SegvCode, PAGE_SIZE};

/// A device that notes a callback made once `unmapped` is set.
struct Late {
    unmapped: Arc<AtomicBool>,
    late: Arc<AtomicBool>,
}

impl super::MmioDevice for Late {
    fn read(&self, _offset: u64, _size: usize) -> u64 {
        if self.unmapped.load(Ordering::Acquire) {
            self.late.store(true, Ordering::Relaxed);
        }
        7
    }

    fn write(&self, _offset: u64, _size: usize, _value: u64) {}
}

/// A `Cpu` on another thread loads a byte of an MMIO region (a fault that
/// answers `SIGBUS`, then the dispatch); meanwhile the main thread unmaps
/// the region with the real `munmap`, then sets `unmapped`. A callback
/// that sees `unmapped` set ran after `munmap` returned: the bug.
fn no_callback_runs_after_munmap_returns() -> Result<(), String> {
    let phys = PhysMem::new(PhysConfig::new(16 * PAGE_SIZE)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::model_default()).unwrap();
    let unmapped = Arc::new(AtomicBool::new(false));
    let late = Arc::new(AtomicBool::new(false));
    let device = Arc::new(Late { unmapped: unmapped.clone(), late: late.clone() });
    let io = mm.mmap_io(0, PAGE_SIZE, PROT_READ, MAP_SHARED, device).unwrap();
    let t = {
        let mm = mm.clone();
        crate::sync::model::spawn(move || Cpu::attached(&mm).read_u8(io))
    };
    mm.munmap(io, PAGE_SIZE).unwrap();
    unmapped.store(true, Ordering::Release);
    let r = t.join().unwrap();
    drop(mm);
    assert_eq!(phys.stats().frames_used, 0);
    if !(r == Ok(7) || r == Err(Fault::Segv { addr: io, code: SegvCode::MapErr })) {
        return Err(format!("load: {r:?}"));
    }
    if late.load(Ordering::Relaxed) {
        return Err("a callback ran after munmap returned".into());
    }
    Ok(())
}

/// The model, and its variant where the dispatch calls the device without
/// the VMA's read reference (`broken::DISPATCH_WITHOUT_REFERENCE`): a
/// dispatch that found the region before the `munmap` calls the device
/// after it returned.
#[test]
fn every_callback_of_a_region_returns_before_its_munmap() {
    crate::sync::broken::check_model(no_callback_runs_after_munmap_returns, &super::broken::DISPATCH_WITHOUT_REFERENCE);
}
