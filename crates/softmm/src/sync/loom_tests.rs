//! loom models of the lock-free fault protocols (`crate::fault`), built on
//! the real primitives [`SeqCount`] and [`VmaLock`].
//!
//! Run with `RUSTFLAGS="--cfg loom --cfg crossbeam_loom" cargo test --release -p softmm --lib`.
//! Each model has a fault thread and a writer; the PTE lock is a loom mutex
//! and the VMA tree a flag, as in the code: the writer changes the tree, then
//! zaps or changes the entry under the PTE lock.

use std::sync::Arc;

use loom::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use loom::sync::Mutex;

use super::{SeqCount, VmaLock};

const NONE: u64 = 0;
const READ_ONLY: u64 = 1;
const WRITABLE: u64 = 2;

fn builder() -> crate::sync::model::Builder {
    let mut b = crate::sync::model::Builder::new();
    b.preemption_bound = Some(3);
    b
}

/// Seed 001: a fault validated by the address space's sequence count never
/// leaves an entry in a range that a concurrent munmap removed.
#[test]
fn speculative_fault_against_munmap() {
    builder().check(|| {
        let seq = Arc::new(SeqCount::new());
        let vma_mapped = Arc::new(AtomicBool::new(true));
        let pte = Arc::new(Mutex::new(NONE));
        let fault = {
            let (seq, vma_mapped, pte) = (seq.clone(), vma_mapped.clone(), pte.clone());
            crate::sync::model::spawn(move || {
                let Some(s) = seq.read_begin() else { return false };
                if !vma_mapped.load(Ordering::Acquire) {
                    return false;
                }
                let mut p = pte.lock().unwrap();
                if !seq.validate(s) {
                    return false;
                }
                *p = WRITABLE;
                true
            })
        };
        // munmap under mmap_lock for write.
        seq.write_begin();
        vma_mapped.store(false, Ordering::Release);
        *pte.lock().unwrap() = NONE;
        seq.write_end();
        fault.join().unwrap();
        assert_eq!(*pte.lock().unwrap(), NONE, "entry survived the munmap");
    });
}

/// Linux 6.4's per-VMA lock: while a fault holds the VMA's read reference the
/// writer cannot pass `detach`, and after it, no fault gets the reference.
#[test]
fn per_vma_lock_against_vma_write() {
    builder().check(|| {
        let vma = Arc::new(VmaLock::new());
        let writer_passed = Arc::new(AtomicBool::new(false));
        let pte = Arc::new(Mutex::new(NONE));
        let fault = {
            let (vma, writer_passed, pte) = (vma.clone(), writer_passed.clone(), pte.clone());
            crate::sync::model::spawn(move || {
                if !vma.try_read() {
                    return;
                }
                assert!(!writer_passed.load(Ordering::Acquire), "fault inside a VMA being written");
                *pte.lock().unwrap() = WRITABLE;
                vma.read_unlock();
            })
        };
        vma.detach();
        writer_passed.store(true, Ordering::Release);
        *pte.lock().unwrap() = NONE;
        fault.join().unwrap();
        assert_eq!(*pte.lock().unwrap(), NONE);
    });
}

/// The per-VMA sequence scheme against mprotect(RW -> RO) of the same VMA:
/// no writable entry survives the mprotect.
#[test]
fn per_vma_seq_against_mprotect() {
    builder().check(|| {
        let vma = Arc::new(VmaLock::new());
        let pte = Arc::new(Mutex::new(NONE));
        let fault = {
            let (vma, pte) = (vma.clone(), pte.clone());
            crate::sync::model::spawn(move || {
                if vma.is_detached() {
                    return;
                }
                let mut p = pte.lock().unwrap();
                if !vma.is_detached() {
                    *p = WRITABLE;
                }
            })
        };
        // mprotect: replace the VMA (detach the old one), then downgrade entries.
        vma.detach();
        {
            let mut p = pte.lock().unwrap();
            if *p == WRITABLE {
                *p = READ_ONLY;
            }
        }
        fault.join().unwrap();
        assert_ne!(*pte.lock().unwrap(), WRITABLE, "write access survived mprotect to read-only");
    });
}

/// The per-VMA sequence scheme against a split/merge of a neighbouring VMA:
/// the fault is never aborted by it, in any interleaving.
#[test]
fn per_vma_seq_unaffected_by_neighbour_split() {
    builder().check(|| {
        let mine = Arc::new(VmaLock::new());
        let neighbour = Arc::new(VmaLock::new());
        let pte_mine = Arc::new(Mutex::new(NONE));
        let pte_neighbour = Arc::new(Mutex::new(WRITABLE));
        let fault = {
            let (mine, pte_mine) = (mine.clone(), pte_mine.clone());
            crate::sync::model::spawn(move || {
                assert!(!mine.is_detached());
                let mut p = pte_mine.lock().unwrap();
                assert!(!mine.is_detached(), "aborted by an unrelated writer");
                *p = WRITABLE;
            })
        };
        // Split the neighbour: detach it, its halves replace it, its entries stay.
        neighbour.detach();
        let _halves = (VmaLock::new(), VmaLock::new());
        drop(pte_neighbour.lock().unwrap());
        fault.join().unwrap();
        assert_eq!(*pte_mine.lock().unwrap(), WRITABLE);
    });
}

/// The lock-free page-table walk against page-table freeing: a table is
/// detached from its parent only after its entries were zapped under its
/// lock, and freed only after every walker that could have loaded it is done
/// (the epoch grace period, modelled as a reader count).
#[test]
fn lockless_walk_against_page_table_free() {
    builder().check(|| {
        let seq = Arc::new(SeqCount::new());
        let parent_entry = Arc::new(AtomicBool::new(true)); // points at the leaf table
        let table_freed = Arc::new(AtomicBool::new(false));
        let walkers = Arc::new(AtomicU64::new(0)); // pinned epoch readers
        let pte = Arc::new(Mutex::new(NONE));
        let fault = {
            let (seq, parent_entry, table_freed, walkers, pte) =
                (seq.clone(), parent_entry.clone(), table_freed.clone(), walkers.clone(), pte.clone());
            crate::sync::model::spawn(move || {
                let Some(s) = seq.read_begin() else { return };
                // pin: crossbeam-epoch publishes the pin, then a SeqCst fence.
                walkers.fetch_add(1, Ordering::Relaxed);
                fence(Ordering::SeqCst);
                if parent_entry.load(Ordering::Acquire) {
                    // Walked to the table: it must still be allocated.
                    assert!(!table_freed.load(Ordering::Acquire), "walker touched a freed page table");
                    let mut p = pte.lock().unwrap();
                    if seq.validate(s) {
                        *p = WRITABLE;
                    }
                }
                walkers.fetch_sub(1, Ordering::Release); // unpin
            })
        };
        // munmap of the whole table's range.
        seq.write_begin();
        *pte.lock().unwrap() = NONE; // zap
        parent_entry.store(false, Ordering::Release); // detach
        fence(Ordering::SeqCst); // the collector's fence before it reads the pins
        while walkers.load(Ordering::Acquire) != 0 {
            loom::thread::yield_now(); // grace period
        }
        assert_eq!(*pte.lock().unwrap(), NONE, "an entry was committed into a detached table");
        table_freed.store(true, Ordering::Release);
        seq.write_end();
        fault.join().unwrap();
    });
}

/// One fault of the per-VMA sequence scheme (the VMA, its leaf table's
/// parent entry, the entry): lock-free through an existing table; where the
/// table is missing, under the VMA's reference, which it needs to install one.
fn per_vma_seq_fault(vma: &VmaLock, table: &AtomicBool, pte: &Mutex<u64>) {
    if vma.is_detached() {
        return;
    }
    if table.load(Ordering::Acquire) {
        let mut p = pte.lock().unwrap();
        if !vma.is_detached() {
            *p = WRITABLE;
        }
        return;
    }
    if !vma.try_read() {
        return;
    }
    // Install the table (or find the one a racing fault installed).
    let _ = table.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire);
    // The reference keeps the VMA attached: no check needed to commit.
    *pte.lock().unwrap() = WRITABLE;
    vma.read_unlock();
}

/// The per-VMA sequence scheme's page-table allocation against munmap: two
/// faults, either of which may install the leaf table (under the VMA's
/// reference) while the other commits into it lock-free, and a writer that
/// detaches the VMA and then zaps the entries of every table it finds. No
/// entry survives, in particular none in a table the writer's walk missed.
#[test]
fn per_vma_seq_table_allocation_against_munmap() {
    builder().check(|| {
        let vma = Arc::new(VmaLock::new());
        let table = Arc::new(AtomicBool::new(false));
        let pte = Arc::new(Mutex::new(NONE));
        let faults: Vec<_> = (0..2)
            .map(|_| {
                let (vma, table, pte) = (vma.clone(), table.clone(), pte.clone());
                crate::sync::model::spawn(move || per_vma_seq_fault(&vma, &table, &pte))
            })
            .collect();
        // munmap: detach (waits for references), then zap what the walk finds.
        vma.detach();
        if table.load(Ordering::Acquire) {
            *pte.lock().unwrap() = NONE;
        }
        for f in faults {
            f.join().unwrap();
        }
        assert_eq!(*pte.lock().unwrap(), NONE, "an entry outlived its VMA");
    });
}

/// The range writers' shared mode (`sync/range_writers.rs`, the real
/// code): a range writer and a blocker (a whole-space `mmap_lock` holder)
/// are never inside at once. Each side marks a shared flag with a
/// read-modify-write while inside, so an overlap is seen whatever the
/// orderings. Seen failing with `NO_ENTER_FENCE` (store buffering: the
/// writer's announcement and the blocker's both unseen) and `NO_RECHECK`.
#[test]
fn range_writer_vs_blocker() {
    use super::broken::range_writers::{NO_ENTER_FENCE, NO_RECHECK};
    use super::range_writers::RangeWriters;

    fn model() -> Result<(), String> {
        let lock = Arc::new(RangeWriters::default());
        let busy = Arc::new(AtomicBool::new(false));
        let writer = {
            let (lock, busy) = (lock.clone(), busy.clone());
            crate::sync::model::spawn(move || {
                let Some(g) = lock.try_enter() else { return Ok(()) };
                let overlap = busy.swap(true, Ordering::AcqRel);
                busy.store(false, Ordering::Release);
                drop(g);
                if overlap {
                    Err("a range writer inside beside a blocker".to_string())
                } else {
                    Ok(())
                }
            })
        };
        let b = lock.block();
        let overlap = busy.swap(true, Ordering::AcqRel);
        busy.store(false, Ordering::Release);
        drop(b);
        writer.join().unwrap()?;
        if overlap {
            return Err("a blocker inside beside a range writer".to_string());
        }
        Ok(())
    }
    super::broken::check_model(model, &NO_ENTER_FENCE);
    super::broken::check_model(model, &NO_RECHECK);
}
