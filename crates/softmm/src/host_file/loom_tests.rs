//! loom model of writeback on the real code: the real `File::sync`
//! (`Inode::writeback`: the dirty flag cleared under the page-cache lock,
//! `AddressSpace::page_mkclean` write-protecting the shared mapping and
//! waiting for its shootdown, then the copy) against a real [`Cpu`] storing
//! into the page through a shared mapping (its TLB walk and fill, and the
//! write-protect fault `wp_page_shared`, which marks the page dirty).
//! Only the host I/O is replaced, by a backing in memory
//! (`HostBacking::memory`).
//!
//! The property: no store is lost. After the race, either the bytes written
//! back hold the last store, or the page is dirty again (the next writeback
//! writes it).
//!
//! Run with the loom line of scripts/test.sh.

use crate::file::{broken, File, OpenFile};
use crate::mm::{AddressSpace, MmConfig};
use crate::phys::{PhysConfig, PhysMem};
use crate::tlb::ShootdownTargets;
use crate::uapi::*;
use crate::{Access, Cpu, PAGE_SIZE};

/// The spawned threads' stack: the fault and writeback paths are deeper
/// than loom's default coroutine stack.
const STACK: usize = 1 << 20;

fn builder() -> crate::sync::model::Builder {
    let mut b = crate::sync::model::Builder::new();
    b.preemption_bound = Some(2);
    b.max_branches = 100_000;
    b
}

/// One shared page of a memory-backed file, written 2 through a mapping
/// (so it is cached, dirty and mapped writable); then a `Cpu` on another
/// thread writes 3 while this thread syncs the file. Returns what was
/// written back and whether the page ended dirty.
///
/// The writer's store is a TLB miss: inside its access section it walks
/// the page table, fills its TLB from the entry it finds (writable, or
/// write-protected by the writeback's `page_mkclean`, then a write fault
/// that marks the page dirty), and then, still in the section, is
/// preempted before it stores. A write-protect between its walk and its
/// store must wait for the section's end, so the store is in the copy:
/// that is the TLB-hit case of a longer-lived entry, in one access.
///
/// The preemption is explicit because the store and the copy are guest
/// memory, which loom does not see: without a scheduling point between
/// the fill and the store, loom has no reason to run the writeback there
/// once the fill's compare-exchange (which records the filling CPU,
/// `tlb/targets.rs`) is ordered before the write-protect.
fn writeback_vs_store(targets: ShootdownTargets) -> (u64, Option<bool>) {
    let phys = PhysMem::new(PhysConfig::new(32 * PAGE_SIZE)).unwrap();
    // The page cache's writeback is `Cache`'s (`Shared`, the default,
    // maps the host file itself, which the in-memory backing has not).
    let config =
        MmConfig::model_default().shootdown_targets(targets).host_file_coherence(crate::HostFileCoherence::Cache);
    let mm = AddressSpace::new(&phys, config).unwrap();
    let file = File::with_memory_backing(&phys, "f", PAGE_SIZE);
    let open = OpenFile::read_write(&file);
    let a = mm.mmap(0, PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, Some(&open), 0).unwrap();
    Cpu::attached(&mm).write_u64(a, 2).unwrap();
    let writer = {
        let mm = mm.clone();
        crate::sync::model::spawn_with(loom::thread::Builder::new().stack_size(STACK), move || {
            let mut cpu = Cpu::attached(&mm);
            let t = cpu.translate(a, Access::Write).unwrap();
            loom::thread::yield_now();
            // SAFETY: 8 bytes inside the page, while the translation
            // (and its access section) lives; atomic stores.
            unsafe { crate::access::copy_to_host(&3u64.to_le_bytes(), t.as_ptr()) };
        })
    };
    file.sync().unwrap();
    writer.join().unwrap();
    let r = file.inode().backing_u64_and_dirty(0);
    drop((mm, open));
    r
}

/// Runs the model intact, where no execution may lose a store (a panic
/// fails the test), then with `switch` set, where some execution must, under
/// each shootdown target policy (the page_mkclean flush asks every CPU, but
/// the fill the writer makes differs: a compare-exchange recording its CPU,
/// or none). (A model reports rather than panics there: a panic inside a
/// loom execution aborts the process while loom objects unwind.)
fn check(switch: &'static std::thread::LocalKey<std::cell::Cell<bool>>) {
    for &targets in ShootdownTargets::ALL {
        builder().check(move || {
            let (written, dirty) = writeback_vs_store(targets);
            assert!(
                written == 3 || dirty == Some(true),
                "{targets:?}: store lost: written back {written}, dirty {dirty:?}"
            );
        });
        // The switch is the test thread's, where loom runs every modelled thread.
        switch.with(|c| c.set(true));
        let caught = crate::sync::broken::caught(2, builder, move || {
            let (written, dirty) = writeback_vs_store(targets);
            !(written == 3 || dirty == Some(true))
        });
        switch.with(|c| c.set(false));
        assert!(caught, "{targets:?}: the model did not catch the broken variant");
    }
}

/// Broken variant: the dirty flag cleared after the copy, not before the
/// write-protect. The store of 3 faults on the write-protected entry and
/// marks the page dirty between the copy and the clear, which undoes it
/// (one preemption).
#[test]
fn writeback_loses_no_store_clear_before_mkclean() {
    check(&broken::CLEAR_AFTER_COPY);
}

/// Broken variant: no `page_mkclean`. The store of 3 goes through the
/// still-writable entry after the copy and marks nothing (no preemption
/// needed: the sync runs before the writer).
#[test]
fn writeback_loses_no_store_mkclean() {
    check(&broken::SKIP_MKCLEAN);
}

/// Broken variant: `page_mkclean` write-protects the entry but does not
/// wait for the shootdown. The writer walked the entry while it was
/// writable, and its store lands after the copy with nothing marked dirty.
#[test]
fn writeback_loses_no_store_mkclean_flush() {
    check(&broken::SKIP_MKCLEAN_FLUSH);
}
