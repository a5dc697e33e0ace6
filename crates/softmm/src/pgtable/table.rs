//! One page-table page: 512 entries and the split lock that guards them.
//!
//! Every entry is one pointer-sized word. A directory entry (PGD, PUD, PMD
//! level) that leads to the next table holds that table's pointer, with its
//! provenance, and the present bit set through [`pointer::map_addr`]; a leaf
//! entry holds a [`Pte`] value as a pointer without provenance. So a walk
//! turns an entry back into a table without an integer-to-pointer cast, and
//! Miri checks it under strict provenance.

use std::ptr::NonNull;

use super::{Pte, PTRS_PER_TABLE};
use crate::sync::{AtomicPtr, AtomicUsize, Mutex, MutexGuard, Ordering};

/// A page-table page with its lock (Linux's split PTE lock at the PTE level,
/// the split PMD lock at the PMD level). Aligned so that a table's address
/// has every bit a directory entry decodes (present, huge) clear.
#[repr(C, align(256))]
pub(super) struct Table {
    entries: [AtomicPtr<Table>; PTRS_PER_TABLE],
    lock: Mutex<()>,
    /// PUD entries beyond the first (of other address spaces, or of the
    /// same tree) that link this PMD table (hugetlb PMD sharing, Linux 6.13+'s `pt_share_count`): 0 while
    /// the table is exclusive. Separate from everything else, so nothing
    /// that counts frames or tables can confuse a sharer with a user.
    share_count: AtomicUsize,
    /// loom models only: set instead of freeing when a model breaks the
    /// exit's grace period (`phys::hugetlb::lock::broken::FREE_AT_ONCE`), so that
    /// a later lock of the table is seen rather than undefined.
    #[cfg(loom)]
    pub(super) freed: std::sync::atomic::AtomicBool,
}

const _: () = assert!(std::mem::align_of::<Table>() > Pte::HUGE as usize);

/// What a directory entry leads to.
pub(super) enum Child {
    /// Nothing mapped below.
    None,
    /// The next-level table.
    Table(NonNull<Table>),
    /// A leaf at this level (a 2 MiB page at the PMD level).
    Leaf,
}

impl Table {
    pub(super) fn new_boxed() -> Box<Table> {
        Box::new(Table {
            entries: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
            lock: Mutex::new(()),
            share_count: AtomicUsize::new(0),
            #[cfg(loom)]
            freed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Entry `i` read as a leaf value.
    #[inline]
    pub(super) fn load(&self, i: usize, order: Ordering) -> Pte {
        Pte::from_bits(self.entries[i].load(order).addr() as u64)
    }

    /// Stores a leaf value into entry `i`.
    #[inline]
    pub(super) fn store(&self, i: usize, pte: Pte, order: Ordering) {
        self.entries[i].store(std::ptr::without_provenance_mut(pte.bits() as usize), order);
    }

    /// Stores `new` into entry `i` if it still holds `seen`; else returns
    /// what it holds. AcqRel: a success is ordered like any store of the
    /// entry (Release) and after every earlier change of it (Acquire), as
    /// a swap is; a failure reads the value it returns like a load.
    #[inline]
    pub(super) fn compare_exchange(&self, i: usize, seen: Pte, new: Pte) -> Result<(), Pte> {
        let new = std::ptr::without_provenance_mut(new.bits() as usize);
        let old = std::ptr::without_provenance_mut(seen.bits() as usize);
        match self.entries[i].compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => Ok(()),
            Err(cur) => Err(Pte::from_bits(cur.addr() as u64)),
        }
    }

    /// Directory entry `i` decoded. Acquire pairs with the Release of
    /// [`Table::install_child`], so a table reached here is seen zeroed.
    #[inline]
    pub(super) fn child(&self, i: usize) -> Child {
        let p = self.entries[i].load(Ordering::Acquire);
        let bits = p.addr() as u64;
        // HUGE first: a 2 MiB leaf stays a leaf when it is not present
        // (`PROT_NONE`), so walks and frees still find its frame. A table's
        // address never has the bit (tables are 256-byte aligned).
        if bits & Pte::HUGE != 0 {
            Child::Leaf
        } else if bits & Pte::PRESENT == 0 {
            Child::None
        } else {
            let table = p.map_addr(|a| a & !(Pte::PRESENT as usize));
            Child::Table(NonNull::new(table).expect("a present directory entry points to a table"))
        }
    }

    /// Installs `new` into the empty directory entry `i`, or returns what
    /// another thread installed first (the caller then frees `new`).
    pub(super) fn install_child(&self, i: usize, new: NonNull<Table>) -> Result<(), Child> {
        let tagged = new.as_ptr().map_addr(|a| a | Pte::PRESENT as usize);
        // Release publishes the zeroed table to walkers; Acquire on failure
        // reads the winner's table like `child` does.
        match self.entries[i].compare_exchange(std::ptr::null_mut(), tagged, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => Ok(()),
            Err(_) => Err(self.child(i)),
        }
    }

    /// Clears directory entry `i`, returning the table it led to.
    pub(super) fn take_child(&self, i: usize) -> Option<NonNull<Table>> {
        match self.child(i) {
            Child::Table(t) => {
                // Release: walkers that load the empty entry find nothing below.
                self.entries[i].store(std::ptr::null_mut(), Ordering::Release);
                Some(t)
            }
            Child::None | Child::Leaf => None,
        }
    }

    /// Takes the table's lock.
    #[inline]
    pub(super) fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock()
    }

    /// True while another PUD entry (of another address space, or of the
    /// same tree) links this PMD table (`ptdesc_pmd_is_shared`).
    #[inline]
    pub(super) fn is_shared(&self) -> bool {
        // Acquire pairs with the Release of `share_dec`, so an owner that
        // sees the table exclusive sees every sharer's work on it done.
        self.share_count.load(Ordering::Acquire) != 0
    }

    /// `ptdesc_pmd_pts_inc`: one more PUD entry links the table. The
    /// caller holds a link of its own (the table cannot be freed meanwhile).
    #[inline]
    pub(super) fn share_inc(&self) {
        self.share_count.fetch_add(1, Ordering::Relaxed);
    }

    /// Drops one link: false if other links remain (the caller must not
    /// free the table), true if the caller held the last one and owns the
    /// table alone (`ptdesc_pmd_pts_dec` and the `free_pgtables` of the
    /// last user).
    #[inline]
    pub(super) fn share_dec(&self) -> bool {
        // AcqRel: Release orders this user's work on the table before the
        // last user's Acquire that frees or reuses it; Acquire for the same
        // reason in the other direction.
        let prev = self.share_count.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(1));
        prev.is_err()
    }
}
