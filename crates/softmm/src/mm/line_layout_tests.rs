//! Which cache lines of an [`AddressSpace`] its writers write, and which
//! its faults read: none in common (docs/interference.md section 2).

use super::*;
use crate::phys::PhysConfig;

/// The 64-byte lines `[addr, addr + size)` covers.
fn lines(addr: usize, size: usize) -> std::ops::RangeInclusive<usize> {
    addr / 64..=(addr + size.max(1) - 1) / 64
}

fn span<T>(field: &T) -> (&'static str, std::ops::RangeInclusive<usize>) {
    (std::any::type_name::<T>(), lines(field as *const T as usize, std::mem::size_of::<T>()))
}

/// A write section writes the `mmap_lock` word and `MmState`, swaps the
/// pointers of the windows it changed (off this struct, each on a line of
/// its own: `vma/windows.rs`) and bumps `seq` twice; a lock-free unmap locks
/// `unreachable.write`. A fault reads the arena and configuration
/// pointers, the page-table root, the memory policy, the unreachable list
/// and the watches: were one of those on a written line, each write section
/// would cost every faulting CPU a miss (the writer's words were beside
/// `mempolicy` and the root: docs/interference.md).
#[test]
fn no_line_a_writer_writes_holds_a_field_a_fault_reads() {
    let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let written = [
        span::<RwLock<MmState>>(&mm.mmap_lock),
        span::<SeqCount>(&mm.seq),
        span::<crate::sync::Mutex<()>>(&mm.unreachable.write),
    ];
    let read = [
        span(&mm.phys),
        span(&mm.config),
        span(&mm.pgtables),
        span(&mm.mempolicy),
        span(&mm.unreachable.list),
        span(&mm.watches),
        span(&mm.pins),
        span(&mm.windows),
    ];
    for (w, wl) in &written {
        for (r, rl) in &read {
            let shared = wl.clone().filter(|l| rl.contains(l)).count();
            assert_eq!(shared, 0, "{w} (written) and {r} (read by faults) share a line");
        }
    }
}
