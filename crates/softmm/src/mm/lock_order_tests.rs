//! The lock order of `mmap_lock` against a file's `invalidate_lock`, run
//! through the real truncate, fault-side lock and writer.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use crate::file::File;
use crate::mm::{AddressSpace, MmConfig};
use crate::phys::{PhysConfig, PhysMem};
use crate::PAGE_SIZE;

/// A truncate that parked for `mmap_lock` behind a writer's section, while
/// holding `invalidate_lock` (of a file the address space maps), must not stay parked once a reader holds
/// `mmap_lock` and a second writer waits for that reader: the reader (a
/// fault) waits for `invalidate_lock`. The order of the parked waiters is
/// set by sleeps: a writer, then the truncate; the downgrade of the first
/// section lets the reader in and wakes the writer only (parking_lot wakes
/// no waiter queued after a writer it wakes). With a plain
/// `read_recursive` the truncate stayed parked and the four waited on one
/// another for ever.
#[test]
#[cfg_attr(miri, ignore = "threads contending on parking_lot locks: Miri rejects parking_lot_core's futex call")]
fn a_truncate_parked_behind_a_writer_enters_beside_the_reader_it_waits_for() {
    let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    let mm = Arc::new(AddressSpace::new(&phys, MmConfig::default()).unwrap());
    let file = File::create(&phys, "f", 4 * PAGE_SIZE).unwrap();
    // A mapper of the file, so that the truncate takes its `mmap_lock`.
    mm.link_file(file.inode());
    let (done, finished) = mpsc::channel();
    let scenario = {
        let (mm, file) = (mm.clone(), file.clone());
        std::thread::spawn(move || {
            let first = mm.write_lock();
            let writer = {
                let mm = mm.clone();
                std::thread::spawn(move || drop(mm.write_lock()))
            };
            std::thread::sleep(Duration::from_millis(100)); // the writer parks
            let truncate = {
                let file = file.clone();
                std::thread::spawn(move || file.set_len(PAGE_SIZE).unwrap())
            };
            std::thread::sleep(Duration::from_millis(100)); // the truncate parks
            let reader = first.downgrade();
            // The fault's next lock, under `mmap_lock` for read.
            drop(file.inode().invalidate_lock.read());
            drop(reader);
            writer.join().unwrap();
            truncate.join().unwrap();
            done.send(()).unwrap();
        })
    };
    // A deadlock detector, not a time bound on the work.
    finished.recv_timeout(Duration::from_secs(60)).expect("deadlock: the truncate stayed parked");
    scenario.join().unwrap();
    assert_eq!(file.len(), PAGE_SIZE);
}
