//! Physical memory: a host-`mmap`ed arena of 4 KiB frames grouped in NUMA nodes,
//! with a descriptor per frame (Linux's `struct page`) and per-thread frame
//! caches (Linux's per-cpu pagesets).
//!
//! The arena is prefaulted when it is made, so a host page fault never lands in
//! a measured softmm path, and it is never unmapped while a [`PhysMem`] lives:
//! a stale translation can only ever read or write arena memory, never freed
//! host memory. Frames are reference counted; the last `put` returns a frame to
//! the calling thread's cache.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;

use crate::error::{Errno, Result};
use crate::PAGE_SIZE;

/// A physical frame number: the index of a 4 KiB frame in the arena.
pub type Pfn = u64;

/// Frames moved between a thread cache and its node's free list at once.
const CACHE_BATCH: usize = 32;

/// Frame flag: the frame holds anonymous memory.
pub(crate) const PG_ANON: u32 = 1 << 0;
/// Frame flag: the frame is a page-cache page of a file.
pub(crate) const PG_FILE: u32 = 1 << 1;
/// Frame flag: written through a mapping since it was last cleaned.
pub(crate) const PG_DIRTY: u32 = 1 << 2;
/// Frame flag: `MADV_FREE` made it lazily freeable.
pub(crate) const PG_LAZYFREE: u32 = 1 << 3;

/// The descriptor of one frame, Linux's `struct page`.
#[derive(Default)]
pub(crate) struct FrameDesc {
    /// References: one per mapping PTE, one for the page cache, one per pin.
    pub(crate) refcount: AtomicU32,
    /// Number of PTEs mapping the frame.
    pub(crate) mapcount: AtomicU32,
    /// `pin_user_pages` pins; a pinned frame is never migrated or COW-shared.
    pub(crate) pincount: AtomicU32,
    /// `PG_*` bits.
    pub(crate) flags: AtomicU32,
    /// The owning file's id for page-cache pages (0 for anonymous memory).
    pub(crate) mapping: AtomicU64,
    /// The page's index in its file, or its linear page index for anonymous memory.
    pub(crate) index: AtomicU64,
}

/// How to build a [`PhysMem`].
#[derive(Debug, Clone)]
pub struct PhysConfig {
    /// Arena size in bytes, rounded up to whole frames per node.
    pub bytes: u64,
    /// Number of NUMA nodes the frames are split into (at least 1).
    pub nodes: usize,
}

impl Default for PhysConfig {
    fn default() -> Self {
        PhysConfig { bytes: 256 << 20, nodes: 1 }
    }
}

/// Counts of what is allocated, for leak checks: all return to zero when every
/// address space and file built on a [`PhysMem`] is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PhysStats {
    /// Frames in the arena, including the shared zero page.
    pub frames_total: u64,
    /// Frames allocated (not counting the zero page).
    pub frames_used: u64,
    /// Page-table pages allocated.
    pub page_tables: u64,
    /// VMAs alive (including ones waiting for their grace period).
    pub vmas: u64,
}

/// A per-thread frame cache with its own allocation count, so that the common
/// alloc/free path writes only memory of the calling thread's shard.
#[derive(Default)]
struct Shard {
    frames: Vec<Pfn>,
    /// Frames allocated minus frames freed through this shard.
    used: i64,
}

/// The free frames of one NUMA node.
struct Node {
    free: Mutex<Vec<Pfn>>,
    first: Pfn,
    end: Pfn,
}

/// Physical memory shared by address spaces and files.
pub struct PhysMem {
    base: NonNull<u8>,
    bytes: usize,
    desc: Box<[FrameDesc]>,
    nodes: Box<[Node]>,
    shards: Box<[CachePadded<Mutex<Shard>>]>,
    zero_pfn: Pfn,
    page_tables: AtomicI64,
    vmas: AtomicI64,
    next_id: AtomicU64,
}

// SAFETY: the arena pointer is only dereferenced through raw, atomic or
// volatile accesses whose races are those of the guest program itself; all
// bookkeeping is atomics and locks.
unsafe impl Send for PhysMem {}
// SAFETY: as for `Send`: shared access goes through atomics and locks.
unsafe impl Sync for PhysMem {}

thread_local! {
    /// This thread's shard slot, like the current CPU's per-cpu pageset.
    static SLOT: usize = {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed)
    };
}

impl PhysMem {
    /// Maps and prefaults an arena of `config.bytes` (asks the host for
    /// transparent huge pages), and returns it with every frame free.
    ///
    /// Fails with `ENOMEM` if the host cannot provide the memory or the arena
    /// is too small to hold the zero page and one frame per node.
    pub fn new(config: PhysConfig) -> Result<std::sync::Arc<PhysMem>> {
        let nodes = config.nodes.max(1);
        let per_node = (config.bytes / PAGE_SIZE).div_ceil(nodes as u64).max(2);
        let frames = per_node * nodes as u64;
        let bytes = (frames * PAGE_SIZE) as usize;
        // SAFETY: a fresh private anonymous mapping; the kernel picks the address.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | if cfg!(miri) { 0 } else { libc::MAP_NORESERVE },
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(Errno::NoMem);
        }
        // SAFETY: `base..base+bytes` is the mapping just made; advice and
        // population do not change its contents (zero). (Miri models neither.)
        #[cfg(not(miri))]
        unsafe {
            libc::madvise(base, bytes, libc::MADV_HUGEPAGE);
            if libc::madvise(base, bytes, 23 /* MADV_POPULATE_WRITE */) != 0 {
                // Older hosts: touch every page ourselves.
                for off in (0..bytes).step_by(PAGE_SIZE as usize) {
                    std::ptr::write_volatile((base as *mut u8).add(off), 0);
                }
            }
        }
        let desc: Box<[FrameDesc]> = (0..frames).map(|_| FrameDesc::default()).collect();
        // Frame 0 is the zero page: never allocated, never refcounted.
        let zero_pfn = 0;
        let nodes: Box<[Node]> = (0..nodes as u64)
            .map(|n| {
                let first = n * per_node;
                let end = first + per_node;
                // Pop from the end gives ascending frames.
                let free = (first..end).filter(|&p| p != zero_pfn).rev().collect();
                Node { free: Mutex::new(free), first, end }
            })
            .collect();
        let nshards = std::thread::available_parallelism().map_or(4, |n| n.get()) * 2;
        let shards = (0..nshards).map(|_| CachePadded::new(Mutex::default())).collect();
        Ok(std::sync::Arc::new(PhysMem {
            base: NonNull::new(base as *mut u8).expect("mmap returned null"),
            bytes,
            desc,
            nodes,
            shards,
            zero_pfn,
            page_tables: AtomicI64::new(0),
            vmas: AtomicI64::new(0),
            next_id: AtomicU64::new(1),
        }))
    }

    /// The shared zero page: mapped read-only by anonymous read faults.
    #[inline]
    pub fn zero_pfn(&self) -> Pfn {
        self.zero_pfn
    }

    /// Number of NUMA nodes.
    pub fn nodes(&self) -> usize {
        self.nodes.len()
    }

    /// The node a frame belongs to.
    pub fn node_of(&self, pfn: Pfn) -> usize {
        self.nodes.iter().position(|n| (n.first..n.end).contains(&pfn)).expect("pfn outside the arena")
    }

    /// A process-unique id for files and anon_vmas made on this memory.
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    #[inline]
    pub(crate) fn desc(&self, pfn: Pfn) -> &FrameDesc {
        &self.desc[pfn as usize]
    }

    /// The host address of a frame's first byte.
    #[inline]
    pub(crate) fn frame_ptr(&self, pfn: Pfn) -> *mut u8 {
        debug_assert!((pfn as usize) < self.desc.len());
        // SAFETY: pfn < frames, so the offset stays inside the arena mapping.
        unsafe { self.base.as_ptr().add(pfn as usize * PAGE_SIZE as usize) }
    }

    fn shard(&self) -> &Mutex<Shard> {
        let slot = SLOT.with(|s| *s);
        &self.shards[slot % self.shards.len()]
    }

    /// Allocates a frame, preferring `node`, with a reference count of one and
    /// unspecified contents. `None` when every node is out of frames.
    pub(crate) fn alloc(&self, node: usize) -> Option<Pfn> {
        let mut shard = self.shard().lock();
        let pfn = match shard.frames.iter().rposition(|&p| self.node_of_fast(p) == node) {
            Some(i) => shard.frames.swap_remove(i),
            None => self.refill(&mut shard, node)?,
        };
        shard.used += 1;
        drop(shard);
        let d = self.desc(pfn);
        d.flags.store(0, Ordering::Relaxed);
        d.mapping.store(0, Ordering::Relaxed);
        d.mapcount.store(0, Ordering::Relaxed);
        d.refcount.store(1, Ordering::Release);
        Some(pfn)
    }

    #[inline]
    fn node_of_fast(&self, pfn: Pfn) -> usize {
        if self.nodes.len() == 1 {
            0
        } else {
            self.node_of(pfn)
        }
    }

    #[cold]
    fn refill(&self, shard: &mut Shard, node: usize) -> Option<Pfn> {
        crate::fault::shared_write(2); // the node's free-list lock
        let order = (0..self.nodes.len()).map(|i| (node + i) % self.nodes.len());
        for n in order {
            let mut free = self.nodes[n].free.lock();
            if free.is_empty() {
                continue;
            }
            let take = free.len().min(CACHE_BATCH);
            let at = free.len() - take;
            shard.frames.extend(free.drain(at..));
            drop(free);
            return shard.frames.pop();
        }
        None
    }

    /// Allocates a zero-filled frame (see [`PhysMem::alloc`]).
    pub(crate) fn alloc_zeroed(&self, node: usize) -> Option<Pfn> {
        let pfn = self.alloc(node)?;
        // SAFETY: the frame was just allocated: nothing else maps or references it.
        unsafe { std::ptr::write_bytes(self.frame_ptr(pfn), 0, PAGE_SIZE as usize) };
        Some(pfn)
    }

    /// Allocates a frame holding a copy of `src`.
    pub(crate) fn alloc_copy(&self, src: Pfn, node: usize) -> Option<Pfn> {
        let pfn = self.alloc(node)?;
        copy_frame(self.frame_ptr(src), self.frame_ptr(pfn));
        Some(pfn)
    }

    /// Takes a reference on a frame that the caller already holds a reference
    /// to (directly or through a locked PTE). The zero page is not counted.
    #[inline]
    pub(crate) fn get(&self, pfn: Pfn) {
        if pfn != self.zero_pfn {
            self.desc(pfn).refcount.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Drops a reference; the last one frees the frame.
    #[inline]
    pub(crate) fn put(&self, pfn: Pfn) {
        if pfn == self.zero_pfn {
            return;
        }
        // Release pairs with the Acquire below so that every use of the frame
        // through other references happens before it is reused.
        let old = self.desc(pfn).refcount.fetch_sub(1, Ordering::Release);
        debug_assert!(old > 0, "frame {pfn} refcount underflow");
        if old == 1 {
            std::sync::atomic::fence(Ordering::Acquire);
            self.free(pfn);
        }
    }

    fn free(&self, pfn: Pfn) {
        let mut shard = self.shard().lock();
        shard.used -= 1;
        shard.frames.push(pfn);
        if shard.frames.len() >= 4 * CACHE_BATCH {
            let drained: Vec<Pfn> = shard.frames.drain(..2 * CACHE_BATCH).collect();
            drop(shard);
            crate::fault::shared_write(2 * drained.len() as u64);
            for p in drained {
                self.nodes[self.node_of_fast(p)].free.lock().push(p);
            }
        }
    }

    pub(crate) fn account_page_table(&self, delta: i64) {
        self.page_tables.fetch_add(delta, Ordering::Relaxed);
    }

    pub(crate) fn account_vma(&self, delta: i64) {
        self.vmas.fetch_add(delta, Ordering::Relaxed);
    }

    /// Current allocation counts. Objects freed after a grace period are
    /// counted until the grace period ends; [`PhysMem::quiesce`] waits for it.
    pub fn stats(&self) -> PhysStats {
        let used: i64 = self.shards.iter().map(|s| s.lock().used).sum();
        PhysStats {
            frames_total: self.desc.len() as u64,
            frames_used: used as u64,
            page_tables: self.page_tables.load(Ordering::Relaxed) as u64,
            vmas: self.vmas.load(Ordering::Relaxed) as u64,
        }
    }

    /// Runs deferred frees until no grace period is pending that would change
    /// [`PhysMem::stats`], or ten seconds have passed (a thread of the process
    /// that stays pinned holds every grace period back), and returns the stats.
    pub fn quiesce(&self) -> PhysStats {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            crossbeam_epoch::pin().flush();
            let now = self.stats();
            if (now.page_tables == 0 && now.vmas == 0) || std::time::Instant::now() > deadline {
                return now;
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }
}

impl Drop for PhysMem {
    fn drop(&mut self) {
        // SAFETY: the arena was mapped in `new` with this length, and no frame
        // pointer outlives `self` (every user holds an `Arc<PhysMem>`).
        unsafe { libc::munmap(self.base.as_ptr() as *mut libc::c_void, self.bytes) };
    }
}

/// Copies one frame to another with word-sized relaxed atomic accesses, so a
/// guest thread writing the source concurrently is a race of the guest
/// program, not undefined behaviour of softmm.
pub(crate) fn copy_frame(src: *const u8, dst: *mut u8) {
    use std::sync::atomic::AtomicU64 as A;
    let words = PAGE_SIZE as usize / 8;
    for i in 0..words {
        // SAFETY: both pointers are frame-aligned frames of the arena, so each
        // word is in bounds and 8-byte aligned; arena memory is only ever
        // accessed atomically or by the guest.
        unsafe {
            let s = &*(src as *const A).add(i);
            let d = &*(dst as *const A).add(i);
            d.store(s.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }
}
