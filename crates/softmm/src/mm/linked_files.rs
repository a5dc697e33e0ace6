//! The files whose reverse map lists an address space (`i_mmap`), kept
//! so that the address space's teardown can take itself out of each.
//!
//! One list per CPU slot ([`PerCpu`]): a new link goes into the linking
//! thread's own list, so threads that map new objects at once (shared
//! anonymous `mmap`s as range writers, `mm/range.rs`) write no line they
//! share. A file that dies first takes itself out
//! ([`LinkedFiles::forget`], from `Mapper::forget_file`), looking in the
//! caller's list first: a mapping is most often unmapped, and its object
//! freed, by the thread that made it. The lists hold weak references: a
//! listed file keeps no memory of its own alive.

use std::sync::Weak;

use crate::file::Inode;
use crate::sync::percpu::PerCpu;
use crate::sync::{LastWriter, Mutex};

/// The files an address space is linked to, in per-slot lists.
#[derive(Default)]
pub(crate) struct LinkedFiles {
    slots: PerCpu<Slot>,
}

/// One slot's list, and (`shared-write-stats`) which thread wrote it last.
#[derive(Default)]
struct Slot {
    files: Mutex<Vec<Weak<Inode>>>,
    written: LastWriter,
}

impl LinkedFiles {
    /// Lists `file` in the calling thread's list. The caller has just
    /// made the file's link to the address space, which happens once per
    /// file while both live (`Inode::add_mapping`), so no file is listed
    /// twice.
    pub(crate) fn link(&self, file: Weak<Inode>) {
        let slot = self.slots.mine();
        // The lock word, at the lock and at the unlock: the slot's line.
        slot.written.write();
        slot.files.lock().push(file);
    }

    /// Takes the dying `file` out of whichever list holds it: the calling
    /// thread's is searched first, the others only when it is not there.
    pub(crate) fn forget(&self, file: *const Inode) {
        let take = |slot: &Slot| {
            slot.written.write();
            let mut files = slot.files.lock();
            let found = files.iter().position(|w| std::ptr::eq(w.as_ptr(), file));
            found.map(|i| files.swap_remove(i)).is_some()
        };
        let mine = self.slots.mine();
        if !take(mine) {
            let _ = self.slots.iter().filter(|s| !std::ptr::eq(*s, mine)).any(take);
        }
    }

    /// Every listed file that is still alive, the lists emptied (the
    /// address space's teardown, which no thread shares).
    pub(crate) fn drain_live(&mut self) -> Vec<std::sync::Arc<Inode>> {
        self.slots.iter_mut().flat_map(|s| s.files.get_mut().drain(..)).filter_map(|w| w.upgrade()).collect()
    }

    /// How many files are listed (tests).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn len(&self) -> usize {
        self.slots.iter().map(|s| s.files.lock().len()).sum()
    }
}
