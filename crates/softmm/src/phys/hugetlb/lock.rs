//! The locks of seed 000's hugetlb schemes and their counters: the file's
//! `i_mmap` lock, the hugetlb fault mutex table, the per-address-space
//! hugetlb VMA lock, and [`HugetlbLockStats`].
//!
//! # Order
//!
//! `mmap_lock` or the VMA's read reference → fault mutex → hugetlb VMA lock
//! → `i_mmap` → the PMD table's lock. Every fault takes them in that order
//! (each policy a prefix of it, `huge_pmd_share` adding `i_mmap` for read),
//! and every unshare takes the VMA lock and `i_mmap` for write, then the PMD
//! lock, without any fault mutex; so does a zap of a shareable window under
//! `mmap_lock` for read (`MADV_DONTNEED`, truncate, hole punch: Linux's
//! `__hugetlb_zap_begin`, `AddressSpace::zap_vma_range`), around its
//! unshare and its walk. No step reaches another address space's locks
//! except `huge_pmd_share`'s try-lock of its `mmap_lock`. Truncate and hole punch hold a fault mutex
//! only around removing one page from the page cache, taking nothing else
//! meanwhile, so Linux's back-off (`hugetlb_unmap_file_folio` trylocking the
//! VMA lock under `i_mmap`) has nothing to back off from: softmm's truncate
//! finds VMAs through each address space (`Mapper::unmap_file_range`, under
//! its `mmap_lock`), not through `i_mmap`, and takes `i_mmap` only after the
//! VMA lock, inside the unshare.

use std::sync::atomic::{AtomicU64 as StatU64, Ordering as StatOrdering};

use crate::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Fault mutexes per pool: Linux's `num_fault_mutexes`,
/// `roundup_pow_of_two(8 * nr_possible_cpus)`, fixed when the pool is made.
/// Two under loom, so that a model can make two indices collide or not.
pub(crate) fn num_fault_mutexes() -> usize {
    if cfg!(loom) {
        return 2;
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (8 * cpus).next_power_of_two()
}

/// Linux's `hugetlb_fault_mutex_table`: faults on one page of one file (or
/// of one private mapping of it) serialize on the mutex that the file and the
/// huge page index hash to, so two faults never both allocate the page, and
/// a fault never maps a page that truncate or hole punch is removing (they
/// take the same mutex per index around the removal). Faults on different
/// pages almost never meet here.
pub(crate) struct FaultMutexTable {
    mutexes: Box<[Mutex<()>]>,
}

impl Default for FaultMutexTable {
    fn default() -> Self {
        FaultMutexTable { mutexes: (0..num_fault_mutexes()).map(|_| Mutex::new(())).collect() }
    }
}

impl FaultMutexTable {
    /// `hugetlb_fault_mutex_hash(mapping, idx)`: the slot of huge page `idx`
    /// of the file with id `file`.
    pub(crate) fn hash(&self, file: u64, idx: u64) -> usize {
        // A multiplicative mix of both words (Linux uses jhash2): indices of
        // one file, consecutive, spread over consecutive slots.
        let h = file.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ idx;
        (h as usize) & (self.mutexes.len() - 1)
    }

    /// Locks the mutex of huge page `idx` of file `file`, counted (and its
    /// wait timed, if it had to wait).
    pub(crate) fn lock(&self, stats: &LockCounters, file: u64, idx: u64) -> MutexGuard<'_, ()> {
        stats.lock(Kind::FaultMutex, &self.mutexes[self.hash(file, idx)])
    }
}

/// A hugetlb file's `i_mmap` lock (Linux's `mapping->i_mmap_rwsem` of a
/// hugetlbfs inode): held for write by every change to the file's reverse
/// map (a VMA linked by `mmap`, `fork`, a split; unlinked by `munmap` or
/// exit) and by every `huge_pmd_unshare` until its TLB flush is done; held
/// for read by `huge_pmd_share`'s lookup and, under
/// [`crate::HugetlbPolicy::IMmapRwsem`], across every fault. Shared by
/// reference with the address spaces whose PMD tables a share linked, so an
/// unshare finds it without the VMA.
pub(crate) type IMmapLock = std::sync::Arc<RwLock<()>>;

/// Stripes of an address space's hugetlb VMA lock.
const VMA_LOCK_STRIPES: usize = if cfg!(loom) { 1 } else { 16 };

/// The hugetlb VMA lock of one address space (Linux's `hugetlb_vma_lock`,
/// seed 000): read across a fault under [`crate::HugetlbPolicy::VmaLock`],
/// write around every `huge_pmd_unshare` in this address space. Linux keeps
/// one per shared VMA; here it is striped by PUD window, the unit an unshare
/// works on, so the unshare, which knows its window but not its VMA, takes
/// exactly the stripe the faults of that window take. A VMA that may share
/// covers whole windows, so the fault and the unshare that Linux's VMA lock
/// orders are ordered here too (and faults in different windows rarely meet
/// on one stripe).
pub(crate) struct HugetlbVmaLock {
    stripes: [RwLock<()>; VMA_LOCK_STRIPES],
    /// Per PUD window of this address space whose PMD table was ever shared
    /// (linked from another address space or by one), the file's `i_mmap`
    /// lock: an unshare, or a change to a table left exclusive, must wait
    /// for an unsharer's flush under it.
    shared_windows: Mutex<std::collections::BTreeMap<u64, IMmapLock>>,
}

impl Default for HugetlbVmaLock {
    fn default() -> Self {
        HugetlbVmaLock {
            stripes: std::array::from_fn(|_| RwLock::new(())),
            shared_windows: Mutex::new(std::collections::BTreeMap::new()),
        }
    }
}

impl HugetlbVmaLock {
    /// The stripe of the PUD window holding `addr`.
    // One stripe under loom, where the modulo is then always 0.
    #[cfg_attr(loom, allow(clippy::modulo_one))]
    pub(crate) fn stripe(&self, addr: u64) -> &RwLock<()> {
        let w = (addr >> 30) as usize;
        &self.stripes[w % VMA_LOCK_STRIPES]
    }

    /// Records that the table of the window at `w` is shared through the
    /// file whose `i_mmap` lock is `i_mmap`. Replaces what an earlier share
    /// recorded: a window is covered by one VMA at a time, and the unmap of
    /// an earlier one unshared the window before another could share it.
    pub(crate) fn note_shared(&self, w: u64, i_mmap: &IMmapLock) {
        self.shared_windows.lock().insert(w, i_mmap.clone());
    }

    /// The `i_mmap` lock of the window at `w` if its table was ever shared.
    pub(crate) fn shared_i_mmap(&self, w: u64) -> Option<IMmapLock> {
        self.shared_windows.lock().get(&w).cloned()
    }
}

/// What a lock acquisition was, for [`HugetlbLockStats`].
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    IMmapRead,
    IMmapWrite,
    VmaLockRead,
    VmaLockWrite,
    FaultMutex,
    ValidationRetry,
}

/// Counter shards: a thread counts in its own, so counting adds no shared
/// write to the faults it measures (statistics, not protocol: `std`'s
/// atomics, as `crate::sync` allows).
const SHARDS: usize = 16;

/// This thread's counter shard.
fn shard() -> usize {
    crate::sync::percpu::this_thread_number().unwrap_or(0) % SHARDS
}

/// Counted kinds: [`Kind`]'s six, then the three wait times
/// ([`Wait`]).
const COUNTERS: usize = 9;

/// The lock whose contended acquisitions a wait time sums.
#[derive(Clone, Copy)]
enum Wait {
    IMmap = 6,
    VmaLock = 7,
    FaultMutex = 8,
}

impl Kind {
    fn wait(self) -> Wait {
        match self {
            Kind::IMmapRead | Kind::IMmapWrite => Wait::IMmap,
            Kind::VmaLockRead | Kind::VmaLockWrite => Wait::VmaLock,
            Kind::FaultMutex | Kind::ValidationRetry => Wait::FaultMutex,
        }
    }
}

thread_local! {
    /// Nanoseconds this thread waited for hugetlb locks, for
    /// [`HugetlbLockStats::thread_wait_ns`].
    static THREAD_WAIT_NS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// One cache line of counters.
#[derive(Default)]
#[repr(align(128))]
struct Shard([StatU64; COUNTERS]);

/// The pool's lock counters, sharded by thread.
#[derive(Default)]
pub(crate) struct LockCounters {
    shards: [Shard; SHARDS],
}

impl LockCounters {
    fn sum(&self, i: usize) -> u64 {
        self.shards.iter().map(|s| s.0[i].load(StatOrdering::Relaxed)).sum()
    }

    /// Counts one acquisition of `kind`.
    #[inline]
    pub(crate) fn count(&self, kind: Kind) {
        self.shards[shard()].0[kind as usize].fetch_add(1, StatOrdering::Relaxed);
    }

    /// Adds the wait of a contended acquisition of `kind` that began at
    /// `since` to this thread's shard and to the thread's own total.
    #[cold]
    fn waited(&self, kind: Kind, since: std::time::Instant) {
        let ns = since.elapsed().as_nanos() as u64;
        self.shards[shard()].0[kind.wait() as usize].fetch_add(ns, StatOrdering::Relaxed);
        THREAD_WAIT_NS.with(|t| t.set(t.get().saturating_add(ns)));
    }

    /// `lock.read()`, counted as `kind`; timed only when a first try finds
    /// the lock taken, so an uncontended acquisition costs one try more and
    /// no clock read.
    #[inline]
    pub(crate) fn read<'l>(&self, kind: Kind, lock: &'l RwLock<()>) -> RwLockReadGuard<'l, ()> {
        self.acquire(kind, || lock.try_read(), || lock.read())
    }

    /// `lock.write()`, counted as `kind` and timed as [`Self::read`].
    #[inline]
    pub(crate) fn write<'l>(&self, kind: Kind, lock: &'l RwLock<()>) -> RwLockWriteGuard<'l, ()> {
        self.acquire(kind, || lock.try_write(), || lock.write())
    }

    /// `lock.lock()`, counted as `kind` and timed as [`Self::read`].
    #[inline]
    pub(crate) fn lock<'l>(&self, kind: Kind, lock: &'l Mutex<()>) -> MutexGuard<'l, ()> {
        self.acquire(kind, || lock.try_lock(), || lock.lock())
    }

    /// One acquisition of `kind`: `try_take`, and when it fails `take`,
    /// timed.
    #[inline]
    fn acquire<G>(&self, kind: Kind, try_take: impl FnOnce() -> Option<G>, take: impl FnOnce() -> G) -> G {
        self.count(kind);
        // Under loom, no try: a model explores each lock step it takes.
        if cfg!(loom) {
            drop(try_take);
            return take();
        }
        if let Some(g) = try_take() {
            return g;
        }
        let since = std::time::Instant::now();
        let g = take();
        self.waited(kind, since);
        g
    }

    /// The sums over every shard.
    pub(crate) fn snapshot(&self) -> HugetlbLockStats {
        let sum = |k: Kind| self.sum(k as usize);
        HugetlbLockStats {
            i_mmap_read: sum(Kind::IMmapRead),
            i_mmap_write: sum(Kind::IMmapWrite),
            vma_lock_read: sum(Kind::VmaLockRead),
            vma_lock_write: sum(Kind::VmaLockWrite),
            fault_mutex: sum(Kind::FaultMutex),
            validation_retries: sum(Kind::ValidationRetry),
            i_mmap_wait_ns: self.sum(Wait::IMmap as usize),
            vma_lock_wait_ns: self.sum(Wait::VmaLock as usize),
            fault_mutex_wait_ns: self.sum(Wait::FaultMutex as usize),
        }
    }
}

/// hugetlb lock acquisitions by kind since the arena was made, for the lab:
/// what each [`crate::HugetlbPolicy`] pays per fault, fork and unshare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct HugetlbLockStats {
    /// `i_mmap` taken for read: `huge_pmd_share`'s lookups, and every fault
    /// under [`crate::HugetlbPolicy::IMmapRwsem`].
    pub i_mmap_read: u64,
    /// `i_mmap` taken for write: reverse-map changes (mmap, fork, munmap,
    /// exit) and unshares.
    pub i_mmap_write: u64,
    /// Hugetlb VMA lock taken for read (faults under
    /// [`crate::HugetlbPolicy::VmaLock`]).
    pub vma_lock_read: u64,
    /// Hugetlb VMA lock taken for write (around every unshare).
    pub vma_lock_write: u64,
    /// Fault mutexes taken (every hugetlb fault, `fallocate` per page,
    /// truncate and hole punch per removed page).
    pub fault_mutex: u64,
    /// Faults under [`crate::HugetlbPolicy::LockFree`] that found, under the
    /// PMD table's lock, that their table had been unshared, and retried.
    pub validation_retries: u64,
    /// Nanoseconds spent waiting for a file's `i_mmap` lock (read or
    /// write), summed over the acquisitions that found it taken (an
    /// acquisition that finds it free is not timed).
    pub i_mmap_wait_ns: u64,
    /// Nanoseconds spent waiting for a hugetlb VMA lock, as
    /// [`Self::i_mmap_wait_ns`].
    pub vma_lock_wait_ns: u64,
    /// Nanoseconds spent waiting for a fault mutex, as
    /// [`Self::i_mmap_wait_ns`].
    pub fault_mutex_wait_ns: u64,
}

impl HugetlbLockStats {
    /// Nanoseconds the calling thread has spent waiting for hugetlb locks
    /// (`i_mmap`, VMA lock, fault mutexes; only acquisitions that found
    /// the lock taken are timed) since it started, over every arena: a
    /// per-thread clock like `CLOCK_THREAD_CPUTIME_ID`, so that a caller
    /// can tell the waits of one thread's operations from another's. The
    /// hugetlb locks only: `mmap_lock` and the PMD table locks are not
    /// counted.
    pub fn thread_wait_ns() -> u64 {
        THREAD_WAIT_NS.with(|t| t.get())
    }

    /// The three wait times summed.
    pub fn wait_ns(&self) -> u64 {
        self.i_mmap_wait_ns + self.vma_lock_wait_ns + self.fault_mutex_wait_ns
    }
}

// The loom models' broken switches: `sync/broken.rs`.
#[cfg(loom)]
pub(crate) use crate::sync::broken::hugetlb as broken;

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::uapi::*;
    use crate::{AddressSpace, Cpu, File, HugetlbPolicy, MmConfig, OpenFile, PhysConfig, PhysMem};

    const HP: u64 = 2 << 20;

    #[test]
    #[cfg_attr(miri, ignore = "safe lock accounting under every policy, hundreds of faults")]
    fn each_policy_takes_its_own_locks_per_fault_and_truncate_one_fault_mutex_per_page() {
        for &policy in HugetlbPolicy::ALL {
            let phys = PhysMem::new(PhysConfig::new((16 << 20) + 5 * HP).hugepages(4)).unwrap();
            let f = File::create_hugetlbfs(&phys, "/f", 4 * HP).unwrap();
            let mm = AddressSpace::new(&phys, MmConfig::default().hugetlb_policy(policy)).unwrap();
            let open = OpenFile::read_write(&f);
            let a = mm.mmap(0, 4 * HP, PROT_READ | PROT_WRITE, MAP_SHARED, Some(&open), 0).unwrap();
            let before = phys.hugetlb_lock_stats();
            let mut cpu = Cpu::attached(&mm);
            for i in 0..4 {
                cpu.write_u64(a + i * HP, i).unwrap();
            }
            let after = phys.hugetlb_lock_stats();
            assert_eq!(after.fault_mutex - before.fault_mutex, 4, "{policy:?}: one fault mutex per fault");
            // The VMA is smaller than a PUD window: no share lookup, so
            // `i_mmap` is read only by the policy itself.
            let (i_mmap, vma_lock) = match policy {
                HugetlbPolicy::IMmapRwsem => (4, 0),
                HugetlbPolicy::VmaLock => (0, 4),
                _ => (0, 0),
            };
            assert_eq!(after.i_mmap_read - before.i_mmap_read, i_mmap, "{policy:?}");
            assert_eq!(after.vma_lock_read - before.vma_lock_read, vma_lock, "{policy:?}");
            assert_eq!(after.validation_retries, 0, "{policy:?}: nothing unshared");
            drop(cpu);
            // Truncate removes each page under its fault mutex.
            f.set_len(0).unwrap();
            assert_eq!(phys.hugetlb_lock_stats().fault_mutex - after.fault_mutex, 4, "{policy:?}");
            assert_eq!(phys.huge_page_stats().free, 4);
        }
    }

    /// Only contended acquisitions are timed, into the lock's kind and the
    /// waiting thread's own total. (Seen failing with `waited` made a
    /// no-op: no wait counted.)
    #[test]
    #[cfg_attr(miri, ignore = "threads contending on parking_lot locks: Miri rejects parking_lot_core's futex call")]
    fn a_contended_acquisition_is_timed_for_its_lock_and_its_thread() {
        use super::{Kind, LockCounters};
        use crate::sync::{Mutex, RwLock};
        let counters = LockCounters::default();
        let (rw, m) = (RwLock::new(()), Mutex::new(()));
        let t0 = crate::HugetlbLockStats::thread_wait_ns();
        drop(counters.read(Kind::IMmapRead, &rw));
        drop(counters.write(Kind::VmaLockWrite, &rw));
        drop(counters.lock(Kind::FaultMutex, &m));
        assert_eq!(counters.snapshot().wait_ns(), 0, "uncontended: not timed");
        assert_eq!(crate::HugetlbLockStats::thread_wait_ns(), t0);
        use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
        // A few tries: a waiter preempted for the whole hold between its
        // flag and its try finds the lock free and waits 0.
        let (mut waited, mut tries) = (0, 0);
        while waited == 0 && tries < 5 {
            tries += 1;
            let held = rw.write();
            let started = AtomicBool::new(false);
            waited += std::thread::scope(|s| {
                let waiter = s.spawn(|| {
                    let before = crate::HugetlbLockStats::thread_wait_ns();
                    started.store(true, Relaxed);
                    drop(counters.read(Kind::IMmapRead, &rw));
                    crate::HugetlbLockStats::thread_wait_ns() - before
                });
                while !started.load(Relaxed) {
                    std::thread::yield_now();
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
                drop(held);
                waiter.join().unwrap()
            });
        }
        assert!(waited > 0, "a read behind a held write waited");
        let s = counters.snapshot();
        assert_eq!((s.i_mmap_read, s.vma_lock_write, s.fault_mutex), (1 + tries, 1, 1));
        assert_eq!(s.i_mmap_wait_ns, waited, "the waiter's wait, in its lock's kind and its thread's total");
        assert_eq!(s.vma_lock_wait_ns + s.fault_mutex_wait_ns, 0);
        assert_eq!(crate::HugetlbLockStats::thread_wait_ns(), t0, "another thread's wait is not ours");
    }

    #[test]
    fn the_fault_mutex_table_spreads_one_files_pages() {
        let t = super::FaultMutexTable::default();
        let slots: std::collections::BTreeSet<usize> = (0..8).map(|i| t.hash(7, i)).collect();
        assert_eq!(slots.len(), 8.min(super::num_fault_mutexes()), "consecutive pages, distinct mutexes");
    }
}
