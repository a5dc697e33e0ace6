//! Physical memory: a host-`mmap`ed arena of 4 KiB frames grouped in NUMA nodes,
//! with a descriptor per frame (Linux's `struct page`) and per-thread frame
//! caches (Linux's per-cpu pagesets).
//!
//! The arena is prefaulted when it is made, so a host page fault never lands in
//! a measured softmm path (unless [`PhysConfig::on_demand`] asks for memory on
//! demand instead), and it is never unmapped while a [`PhysMem`] lives:
//! a stale translation can only ever read or write arena memory, never freed
//! host memory. Frames are reference counted; the last `put` returns a frame to
//! the calling thread's cache.

use std::ptr::NonNull;
use std::sync::atomic::AtomicUsize;

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicI64, AtomicU32, AtomicU64, Mutex, Ordering};

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
/// Frame flag: an anonymous page mapped by exactly one address space, which
/// may write it without a copy and may pin it (Linux's `PG_anon_exclusive`,
/// 5.19). Set on every new anonymous page; `fork` clears it when it shares
/// the page copy-on-write, and never shares a pinned one.
pub(crate) const PG_ANON_EXCLUSIVE: u32 = 1 << 4;
/// Frame flag: the page lock (`PG_locked`), held by a migrator while it
/// moves the page.
pub(crate) const PG_LOCKED: u32 = 1 << 5;
/// Frame flag: taken by one migrator's isolation (Linux's LRU isolation):
/// a second `move_pages` of the page meanwhile reports `-EBUSY`.
pub(crate) const PG_ISOLATED: u32 = 1 << 6;

/// Frame flag: a page-cache page of a host-backed file, whose mapping
/// writes back (Linux's `mapping_can_writeback`, which gup-fast reads
/// through `folio->mapping`; here the descriptor's mapping is only the
/// file's id, so the page carries the answer). gup-fast leaves long-term
/// write pins of it to the slow path, which refuses them.
pub(crate) const PG_HOST_FILE: u32 = 1 << 7;

/// Most NUMA nodes an arena may have (Linux's `MAX_NUMNODES` on x86-64).
pub const MAX_NODES: usize = 1 << 10;

/// `MemAvailable` of the host's /proc/meminfo in bytes, if it can be read.
fn host_mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// The descriptor of one frame, Linux's `struct page`.
#[derive(Default)]
pub(crate) struct FrameDesc {
    /// References: one per mapping PTE, one for the page cache, one per pin,
    /// one per [`FrameRef`].
    pub(crate) refcount: AtomicU32,
    /// `pin_user_pages` pins (`FOLL_PIN`), each of which also holds one
    /// reference in `refcount`: Linux's `_pincount` of a large folio, exact,
    /// so `page_maybe_dma_pinned` is `pincount > 0`. A pinned frame is never
    /// COW-shared by `fork` (and will not be migrated).
    pub(crate) pincount: AtomicU32,
    /// `PG_*` bits.
    pub(crate) flags: AtomicU32,
    /// The 2 MiB leaf entries mapping a huge page, on its head frame
    /// (Linux's `_entire_mapcount` of a hugetlb folio): an entry of a PMD
    /// table that several address spaces share counts once, as in Linux.
    /// Small frames count none (`rmap` says why). Only `rmap` and the
    /// table teardown change it, each under the entry's table lock (or with
    /// the table unreachable), so an exclusive holder of the one entry
    /// that maps a page sees 1 and no new mapping appears behind it.
    pub(crate) mapcount: AtomicU32,
    /// The owning file's id for page-cache pages (0 for anonymous memory).
    pub(crate) mapping: AtomicU64,
    /// The page's index in its file, or its linear page index for anonymous memory.
    pub(crate) index: AtomicU64,
}

impl FrameDesc {
    /// One more 2 MiB leaf entry maps this huge page (its head frame's
    /// descriptor); the caller holds that entry's table lock.
    #[inline]
    pub(crate) fn inc_mapcount(&self) {
        self.mapcount.fetch_add(1, Ordering::Relaxed);
    }

    /// One 2 MiB leaf entry less maps this huge page. Release: a reader of
    /// the count that sees it drop (Acquire) also sees what the entry's
    /// holder did before.
    #[inline]
    pub(crate) fn dec_mapcount(&self) {
        let old = self.mapcount.fetch_sub(1, Ordering::Release);
        debug_assert!(old > 0, "huge page mapcount underflow");
    }

    /// The 2 MiB leaf entries mapping this huge page (see `mapcount`).
    #[inline]
    pub(crate) fn mapcount(&self) -> u32 {
        self.mapcount.load(Ordering::Acquire)
    }

    /// `n` descriptors, all zero (free, unreferenced), as a boxed slice.
    /// Allocated zeroed, so that the host backs them only when written
    /// (memory on demand), unless `touch` asks to write them all now.
    /// `ENOMEM` if the allocation fails.
    #[cfg(not(loom))]
    fn new_array(n: usize, touch: bool) -> Result<Box<[FrameDesc]>> {
        let layout = std::alloc::Layout::array::<FrameDesc>(n).map_err(|_| Errno::NoMem)?;
        if layout.size() == 0 {
            return Ok(Box::new([]));
        }
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<FrameDesc>();
        if ptr.is_null() {
            return Err(Errno::NoMem);
        }
        if touch {
            // SAFETY: `ptr` holds `layout.size()` bytes just allocated.
            unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, layout.size()) };
        }
        // SAFETY: (1) `ptr` was allocated by the global allocator with the
        // layout of `[FrameDesc; n]`, which is what the box frees with;
        // (2) all-zero bytes are a valid `FrameDesc` (every field is an
        // atomic integer, zero is `FrameDesc::default()`).
        Ok(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, n)) })
    }

    /// Under loom the atomics are the model's objects, which must be built.
    #[cfg(loom)]
    fn new_array(n: usize, _touch: bool) -> Result<Box<[FrameDesc]>> {
        let mut desc = Vec::new();
        desc.try_reserve_exact(n).map_err(|_| Errno::NoMem)?;
        desc.extend((0..n).map(|_| FrameDesc::default()));
        Ok(desc.into_boxed_slice())
    }
}

/// How to build a [`PhysMem`]. The type may gain fields: build it with
/// [`PhysConfig::new`] (or [`Default`], 256 MiB) and the setters.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PhysConfig {
    /// Arena size in bytes, rounded up to whole frames per node; at least two
    /// frames per node (see [`PhysMem::new`]).
    pub bytes: u64,
    /// Number of NUMA nodes the frames are split into (1 to [`MAX_NODES`]).
    pub nodes: usize,
    /// Memory on demand (default off): the arena is only reserved
    /// (`MAP_NORESERVE`, no prefault, no `MemAvailable` check) and the host
    /// backs a frame, and its descriptor, when it is first used; frames that
    /// return to the node free lists are given back to the host
    /// (`MADV_DONTNEED`, in batches). See [`PhysMem::new`].
    pub on_demand: bool,
    /// Huge (2 MiB) pages per node in the hugetlb pool, carved out of the
    /// node's frames (Linux's `nr_hugepages`, per node); default 0.
    pub hugepages: u64,
}

impl Default for PhysConfig {
    fn default() -> Self {
        PhysConfig { bytes: 256 << 20, nodes: 1, on_demand: false, hugepages: 0 }
    }
}

impl PhysConfig {
    /// An arena of `bytes` on one node. Checked only by [`PhysMem::new`].
    pub fn new(bytes: u64) -> PhysConfig {
        PhysConfig { bytes, ..PhysConfig::default() }
    }

    /// Sets `on_demand`: reserve the arena and let the host back frames only
    /// when they are used, and take them back when they are freed.
    #[must_use]
    pub fn on_demand(mut self, on_demand: bool) -> PhysConfig {
        self.on_demand = on_demand;
        self
    }

    /// Sets `bytes`: the arena size, rounded up to whole frames per node.
    #[must_use]
    pub fn bytes(mut self, bytes: u64) -> PhysConfig {
        self.bytes = bytes;
        self
    }

    /// Sets `nodes`: the number of NUMA nodes the frames are split into.
    #[must_use]
    pub fn nodes(mut self, nodes: usize) -> PhysConfig {
        self.nodes = nodes;
        self
    }

    /// Sets `hugepages`: 2 MiB pages per node for the hugetlb pool, taken
    /// from the node's frames (each 512 contiguous frames, aligned), so the
    /// arena must be big enough: [`PhysMem::new`] says `EINVAL` otherwise.
    #[must_use]
    pub fn hugepages(mut self, per_node: u64) -> PhysConfig {
        self.hugepages = per_node;
        self
    }
}

/// Counts of what is allocated, for leak checks: all return to zero when every
/// address space and file built on a [`PhysMem`] is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PhysStats {
    /// Frames in the arena, including the shared zero page.
    pub frames_total: u64,
    /// Frames allocated (not counting the zero page).
    pub frames_used: u64,
    /// Page-table pages allocated.
    pub page_tables: u64,
    /// VMAs alive (including ones waiting for their grace period).
    pub vmas: u64,
    /// Reverse-map entries: (file, address space) pairs in files' `i_mmap`.
    pub rmap_entries: u64,
}

/// A per-thread frame cache with its own allocation count, so that the common
/// alloc/free path writes only memory of the calling thread's shard.
#[derive(Default)]
struct Shard {
    frames: Vec<Pfn>,
    /// Frames allocated minus frames freed through this shard.
    used: i64,
}

/// Where a new page goes: a node to try first and, for `MPOL_BIND`, the only
/// nodes allowed, for `MPOL_PREFERRED_MANY` the nodes tried before any other
/// (see [`crate::mempolicy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placement {
    /// The node tried first.
    pub(crate) node: usize,
    /// `Some`: no frame from outside these nodes, unless `then_any`.
    pub(crate) allowed: Option<NodeMask>,
    /// `allowed` is a preference, not a bind: once none of its nodes has a
    /// free frame, any node (Linux's `alloc_pages_preferred_many`).
    pub(crate) then_any: bool,
}

impl Placement {
    /// Node 0 first, then any node: the default policy's placement.
    pub(crate) const LOCAL: Placement = Placement::new(0, None);

    /// `node` first, then the other nodes of `allowed` (any node if
    /// `None`).
    pub(crate) const fn new(node: usize, allowed: Option<NodeMask>) -> Placement {
        Placement { node, allowed, then_any: false }
    }

    /// `node` first, then the other nodes of `preferred`, then any node.
    pub(crate) const fn preferring(node: usize, preferred: NodeMask) -> Placement {
        Placement { node, allowed: Some(preferred), then_any: true }
    }

    fn allows(&self, node: usize) -> bool {
        self.allowed.as_ref().is_none_or(|a| a.contains(node))
    }

    /// `node` and no other (Linux's `__GFP_THISNODE`): where `move_pages`
    /// and `migrate_pages(2)` allocate a page's new frame. A `node` at or
    /// past [`MAX_NODES`] allows no node.
    pub(crate) fn this_node(node: usize) -> Placement {
        let allowed = if node < MAX_NODES { NodeMask::single(node) } else { NodeMask::default() };
        Placement::new(node, Some(allowed))
    }

    /// The nodes an allocation for this placement tries, in order, on an
    /// arena of `nodes` nodes: `node` (clamped to the arena), then `node +
    /// 1`, `node + 2`, ... wrapping (softmm's zonelist, every node at the
    /// same distance), each kept only if allowed; with `then_any`, the
    /// nodes not allowed follow, in the same order.
    pub(crate) fn zonelist(&self, nodes: usize) -> impl Iterator<Item = usize> + '_ {
        let first = self.node.min(nodes.saturating_sub(1));
        let ring = (0..nodes).map(move |i| (first + i) % nodes);
        let rest = ring.clone().filter(move |&m| self.then_any && !self.allows(m));
        ring.filter(move |&m| self.allows(m)).chain(rest)
    }

    /// A frame where this placement says: its nodes, and with `then_any`
    /// any node after them.
    fn alloc<'p>(&self, phys: &'p PhysMem) -> Option<FrameRef<'p>> {
        phys.alloc_in(self.node, self.allowed.as_ref()).or_else(|| {
            if self.then_any {
                phys.alloc_in(self.node, None)
            } else {
                None
            }
        })
    }
}

/// One node's frame counts (see [`PhysMem::node_stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct NodeStats {
    /// Frames of the node, the zero page left out.
    pub frames_total: u64,
    /// Frames on the node's free list or in a thread cache.
    pub frames_free: u64,
    /// `frames_total - frames_free`: frames allocated from the node.
    pub frames_used: u64,
}

/// A set of NUMA nodes (Linux's `nodemask_t`, [`MAX_NODES`] bits).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodeMask([u64; MAX_NODES / 64]);

impl Default for NodeMask {
    fn default() -> NodeMask {
        NodeMask([0; MAX_NODES / 64])
    }
}

impl std::fmt::Debug for NodeMask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl NodeMask {
    /// The set holding only `node`. Panics if `node >= MAX_NODES`.
    pub fn single(node: usize) -> NodeMask {
        let mut m = NodeMask::default();
        m.set(node);
        m
    }

    /// Adds `node`. Panics if `node >= MAX_NODES`.
    pub fn set(&mut self, node: usize) {
        assert!(node < MAX_NODES, "node {node} >= MAX_NODES");
        self.0[node / 64] |= 1 << (node % 64);
    }

    /// True if `node` is in the set (false for any `node >= MAX_NODES`).
    pub fn contains(&self, node: usize) -> bool {
        node < MAX_NODES && self.0[node / 64] & (1 << (node % 64)) != 0
    }

    /// True for the empty set.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }

    /// Number of nodes in the set (`nodes_weight`).
    pub fn weight(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The nodes in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (0..MAX_NODES).filter(|&n| self.contains(n))
    }

    /// The intersection (`nodes_and`).
    #[must_use]
    pub fn and(&self, other: &NodeMask) -> NodeMask {
        let mut m = *self;
        for (a, b) in m.0.iter_mut().zip(other.0.iter()) {
            *a &= b;
        }
        m
    }

    /// The words of the set, node 0 in bit 0 of the first (a user-space
    /// `unsigned long` bitmap).
    pub fn words(&self) -> &[u64] {
        &self.0
    }
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
    /// Frames per node: every node holds the same number, so `node_of` divides.
    per_node: u64,
    shards: Box<[CachePadded<Mutex<Shard>>]>,
    zero_pfn: Pfn,
    // The counters below are written by every mmap, munmap and page-table
    // allocation of every thread; each on its own line, so that they do not
    // share one with the fields above, which every frame freed reads (a big
    // munmap's put_batch was 30% slower while another thread mapped and
    // unmapped: docs/results/big-munmap-cause.txt section 7, in git at d35c665).
    page_tables: CachePadded<AtomicI64>,
    /// VMAs alive, per CPU slot: a statistic, so `std`'s atomics even
    /// under loom (VMAs are dropped at every thread's exit).
    vmas: crate::sync::percpu::PerCpu<std::sync::atomic::AtomicI64>,
    rmap_entries: CachePadded<AtomicI64>,
    next_id: CachePadded<AtomicU64>,
    /// The committed total and overcommit policy (see [`crate::mm::commit`]).
    pub(crate) commit: CachePadded<crate::mm::commit::CommitState>,
    /// [`PhysConfig::on_demand`]: give frames back to the host when they
    /// return to the node free lists.
    on_demand: bool,
    /// The hugetlb pool (see [`crate::hugetlb`]).
    pub(crate) hugetlb: crate::hugetlb::pool::HugePool,
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
    /// Maps and prefaults an arena of `config.bytes` rounded up to whole
    /// frames per node (asks the host for transparent huge pages), and
    /// returns it with every frame free.
    ///
    /// `EINVAL` for a configuration that makes no sense: no nodes or more
    /// than [`MAX_NODES`], fewer than two frames per node (node 0 holds the
    /// zero page, and every node must have a frame to hand out), or a size
    /// whose rounding overflows. `ENOMEM` when the host cannot back the
    /// arena: the rule is that the arena plus its frame descriptors must fit
    /// in the host's `MemAvailable` when it is made (checked before anything
    /// is mapped, so a refused arena costs nothing), and that the host's own
    /// commit accounting accepts the mapping (it is not `MAP_NORESERVE`;
    /// under `vm.overcommit_memory=2` that alone guarantees the prefault
    /// cannot meet the OOM killer). Under the default heuristic overcommit the
    /// `MemAvailable` check is a snapshot: memory other processes take while
    /// the arena is prefaulted can still exhaust the host. A prefault that
    /// fails is undone and reported as `ENOMEM`.
    ///
    /// With [`PhysConfig::on_demand`] the arena is only reserved: mapped
    /// `MAP_NORESERVE`, not prefaulted, its descriptors allocated zeroed and
    /// left untouched, and no `MemAvailable` check, so a 256 MiB arena costs
    /// the host the free lists (8 bytes a frame) until frames are used. The
    /// host backs each frame at its first use (a host page fault inside the
    /// softmm call that allocates it), and frames that go back from a
    /// thread's cache to the node free lists are returned with
    /// `MADV_DONTNEED`, so the host's resident memory follows softmm's use
    /// (up to what the thread caches hold). The price: a guest can then
    /// overcommit the host, whose OOM killer, not `ENOMEM`, answers; and host
    /// faults land in measured paths, which is why prefaulting is the default
    /// (the lab compares locking designs and must not time the host's
    /// faults).
    pub fn new(config: PhysConfig) -> Result<std::sync::Arc<PhysMem>> {
        let nodes = config.nodes;
        if nodes == 0 || nodes > MAX_NODES || config.bytes == 0 {
            return Err(Errno::Inval);
        }
        let per_node = config.bytes.div_ceil(PAGE_SIZE).div_ceil(nodes as u64);
        if per_node < 2 {
            return Err(Errno::Inval);
        }
        let frames = per_node * nodes as u64; // <= bytes / PAGE_SIZE + nodes: no overflow
        let bytes = frames.checked_mul(PAGE_SIZE).and_then(|b| usize::try_from(b).ok()).ok_or(Errno::Inval)?;
        // Checked before anything is mapped. The hugetlb pool takes the top of each node; the rest is 4 KiB frames.
        let spans: Vec<(Pfn, Pfn)> = (0..nodes as u64).map(|n| (n * per_node, (n + 1) * per_node)).collect();
        let (hugetlb, small_ends) = crate::hugetlb::pool::HugePool::carve(&spans, config.hugepages)?;
        let desc_bytes = frames.saturating_mul(std::mem::size_of::<FrameDesc>() as u64);
        // Miri cannot read /proc (isolation); its arenas are tiny anyway.
        let avail = if cfg!(miri) || config.on_demand { None } else { host_mem_available() };
        if avail.is_some_and(|avail| (bytes as u64).saturating_add(desc_bytes) > avail) {
            return Err(Errno::NoMem);
        }
        let desc = FrameDesc::new_array(frames as usize, !config.on_demand)?;
        let noreserve = if config.on_demand { libc::MAP_NORESERVE } else { 0 };
        // SAFETY: a fresh private anonymous mapping; the kernel picks the address.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | noreserve,
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
            if config.on_demand {
                // Memory on demand: reserved only; the host backs each frame
                // at its first use, 4 KiB at a time (a huge page would back
                // 2 MiB for one frame, and split when one is given back).
                libc::madvise(base, bytes, libc::MADV_NOHUGEPAGE);
            } else {
                libc::madvise(base, bytes, libc::MADV_HUGEPAGE);
                if libc::madvise(base, bytes, 23 /* MADV_POPULATE_WRITE */) != 0 {
                    if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
                        // Out of memory (or interrupted): give it back.
                        libc::munmap(base, bytes);
                        return Err(Errno::NoMem);
                    }
                    // Older hosts without MADV_POPULATE_WRITE: touch every page ourselves.
                    for off in (0..bytes).step_by(PAGE_SIZE as usize) {
                        std::ptr::write_volatile((base as *mut u8).add(off), 0);
                    }
                }
            }
        }
        // Frame 0 is the zero page: never allocated, never refcounted.
        let zero_pfn = 0;
        let nodes: Box<[Node]> = (0..nodes as u64)
            .map(|n| {
                let first = n * per_node;
                let end = first + per_node;
                // Pop from the end gives ascending frames.
                let free = (first..small_ends[n as usize]).filter(|&p| p != zero_pfn).rev().collect();
                Node { free: Mutex::new(free), first, end }
            })
            .collect();
        // Under loom one shard: a model's threads share one OS thread (and so
        // one `SLOT`), and every lock is a point the model checker explores.
        let nshards = if cfg!(loom) { 1 } else { std::thread::available_parallelism().map_or(4, |n| n.get()) * 2 };
        let shards = (0..nshards).map(|_| CachePadded::new(Mutex::default())).collect();
        Ok(std::sync::Arc::new(PhysMem {
            base: NonNull::new(base as *mut u8).expect("mmap returned null"),
            bytes,
            desc,
            nodes,
            per_node,
            shards,
            zero_pfn,
            page_tables: CachePadded::new(AtomicI64::new(0)),
            vmas: Default::default(),
            rmap_entries: CachePadded::new(AtomicI64::new(0)),
            next_id: CachePadded::new(AtomicU64::new(1)),
            on_demand: config.on_demand,
            commit: CachePadded::new(crate::mm::commit::CommitState::new(frames - hugetlb.frames())),
            hugetlb,
        }))
    }

    /// The shared zero page: mapped read-only by anonymous read faults.
    #[inline]
    pub(crate) fn zero_pfn(&self) -> Pfn {
        self.zero_pfn
    }

    /// Number of NUMA nodes.
    pub fn nodes(&self) -> usize {
        self.nodes.len()
    }

    /// The node a frame belongs to, in O(1) (Linux's `page_to_nid`).
    pub(crate) fn node_of(&self, pfn: Pfn) -> usize {
        let node = (pfn / self.per_node) as usize;
        assert!(node < self.nodes.len(), "pfn {pfn} outside the arena");
        debug_assert!(self.nodes[node].first <= pfn && pfn < self.nodes[node].end);
        node
    }

    /// The nodes of this arena, as a mask (Linux's `node_states[N_MEMORY]`).
    pub fn online_nodes(&self) -> NodeMask {
        let mut m = NodeMask::default();
        for n in 0..self.nodes.len() {
            m.set(n);
        }
        m
    }

    /// Per-node counts, node by node (Linux's `/sys/devices/system/node/nodeN/meminfo`
    /// `MemTotal`/`MemFree`). Frames in thread caches count as free on their node.
    pub fn node_stats(&self) -> Vec<NodeStats> {
        let mut free: Vec<u64> = self.nodes.iter().map(|n| n.free.lock().len() as u64).collect();
        for shard in self.shards.iter() {
            for &p in shard.lock().frames.iter() {
                free[self.node_of(p)] += 1;
            }
        }
        self.nodes
            .iter()
            .zip(free)
            .map(|(n, free)| {
                // The zero page is neither free nor used.
                let total = n.end - n.first - u64::from((n.first..n.end).contains(&self.zero_pfn));
                NodeStats { frames_total: total, frames_free: free, frames_used: total - free }
            })
            .collect()
    }

    /// A process-unique id for files made on this memory.
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
        // A frame number of another arena must never become a pointer here.
        assert!((pfn as usize) < self.desc.len(), "pfn {pfn} outside the arena");
        // SAFETY: pfn < frames (checked), so the offset stays inside the arena mapping.
        unsafe { self.base.as_ptr().add(pfn as usize * PAGE_SIZE as usize) }
    }

    /// The frame holding the arena byte at `ptr`, which must come from
    /// [`PhysMem::frame_ptr`] of this arena (plus an offset inside the frame).
    #[inline]
    pub(crate) fn pfn_of_ptr(&self, ptr: *const u8) -> Pfn {
        let off = ptr.addr().wrapping_sub(self.base.as_ptr().addr());
        debug_assert!(off < self.desc.len() * PAGE_SIZE as usize, "pointer outside the arena");
        (off / PAGE_SIZE as usize) as Pfn
    }

    fn shard(&self) -> &Mutex<Shard> {
        let slot = SLOT.with(|s| *s);
        &self.shards[slot % self.shards.len()]
    }

    /// Allocates a frame, preferring `node`, with unspecified contents: the
    /// returned reference is its only one. `None` when every node is out of
    /// frames, frames cached by other threads included.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn alloc(&self, node: usize) -> Option<FrameRef<'_>> {
        self.alloc_in(node, None)
    }

    /// [`PhysMem::alloc`] restricted to the nodes of `allowed` when it is
    /// given (Linux's `__alloc_pages(gfp, order, nid, nodemask)`): `node`
    /// first, then the allowed nodes in zonelist order. `None` when the
    /// allowed nodes are out of frames.
    pub(crate) fn alloc_in(&self, node: usize, allowed: Option<&NodeMask>) -> Option<FrameRef<'_>> {
        let pfn = match self.alloc_cached(node, allowed) {
            Some(p) => p,
            None => {
                // Out of memory everywhere this thread can see: give back what
                // other threads' caches hold and try once more (Linux's
                // drain_all_pages before declaring OOM).
                self.drain_all_caches();
                self.alloc_cached(node, allowed)?
            }
        };
        let d = self.desc(pfn);
        d.flags.store(0, Ordering::Relaxed);
        d.mapping.store(0, Ordering::Relaxed);
        d.refcount.store(1, Ordering::Release);
        Some(FrameRef { phys: self, pfn })
    }

    /// Allocates up to `n` frames of `node` and of no other node (Linux's
    /// `alloc_pages_bulk` with `__GFP_THISNODE`, what `move_pages` and
    /// `migrate_pages(2)` ask for), with unspecified contents, each returned
    /// reference its frame's only one. Returns fewer than `n` only when
    /// `node` has no more free frames, those in other threads' caches
    /// included; none for a node the arena lacks. (Migration passes
    /// [`Placement::this_node`] to [`PhysMem::alloc_bulk_at`], which this is.)
    #[cfg(all(test, not(loom)))]
    pub(crate) fn alloc_bulk_on(&self, node: usize, n: usize) -> Vec<FrameRef<'_>> {
        self.alloc_bulk_at(&Placement::this_node(node), n)
    }

    /// Allocates up to `n` frames where `at` says (Linux's
    /// `alloc_pages_mpol` for each of `n` pages, what `mbind`'s migration
    /// asks for through `alloc_migration_target_by_mpol`): `at.node` first,
    /// then the other allowed nodes in the order [`PhysMem::alloc_in`]
    /// falls back in (`node + 1`, `node + 2`, ... wrapping: softmm's
    /// zonelist), each node's frames taken before the next is tried.
    /// Returns fewer than `n` only when every allowed node is out of free
    /// frames, those in other threads' caches included.
    ///
    /// It takes this thread's cache lock and a node's free-list lock once
    /// per node tried and attempt (a second attempt after draining every
    /// cache), where `n` calls of [`PhysMem::alloc_in`] lock the cache `n`
    /// times and search it for a frame of `node` each time: a migration
    /// batch of 512 pages spent that on every page, with the cache full of
    /// the frames of the node it was emptying.
    pub(crate) fn alloc_bulk_at(&self, at: &Placement, n: usize) -> Vec<FrameRef<'_>> {
        let order: Vec<usize> = at.zonelist(self.nodes.len()).collect();
        // A node never has more than `per_node` frames to give.
        let mut pfns = Vec::with_capacity(n.min(self.per_node as usize * order.len()));
        for attempt in 0..2 {
            if attempt == 1 {
                // Out of the allowed nodes in this thread's view: give back
                // what other threads' caches hold and try once more, as
                // `alloc_in` does.
                self.drain_all_caches();
            }
            for &m in &order {
                if pfns.len() == n {
                    break;
                }
                self.take_from_node(m, n - pfns.len(), &mut pfns);
            }
            if pfns.len() == n {
                break;
            }
        }
        pfns.into_iter()
            .map(|pfn| {
                let d = self.desc(pfn);
                d.flags.store(0, Ordering::Relaxed);
                d.mapping.store(0, Ordering::Relaxed);
                d.refcount.store(1, Ordering::Release);
                FrameRef { phys: self, pfn }
            })
            .collect()
    }

    /// Appends up to `n` free frames of `node` to `out`: this thread's
    /// cached ones first (as [`PhysMem::alloc_cached`] prefers them), then
    /// from `node`'s free list under one lock (shard then node, the order
    /// `refill` takes them in).
    fn take_from_node(&self, node: usize, n: usize, out: &mut Vec<Pfn>) {
        let before = out.len();
        let mut shard = self.shard().lock();
        shard.frames.retain(|&p| {
            let take = out.len() - before < n && self.node_of_fast(p) == node;
            if take {
                out.push(p);
            }
            !take
        });
        let want = n - (out.len() - before);
        if want > 0 {
            crate::sync::shared_write(2); // the node's free-list lock
            let mut free = self.nodes[node].free.lock();
            let at = free.len().saturating_sub(want);
            out.extend(free.drain(at..));
        }
        shard.used += (out.len() - before) as i64;
    }

    /// A frame from this thread's cache or the node free lists, in the
    /// zonelist order: the cache's frames of `node`, `node`'s free list, then
    /// any cached frame, then the other nodes' free lists.
    fn alloc_cached(&self, node: usize, allowed: Option<&NodeMask>) -> Option<Pfn> {
        let nodes = self.nodes.len();
        let node = node.min(nodes - 1);
        let ok = |n: usize| allowed.is_none_or(|m| m.contains(n));
        let mut shard = self.shard().lock();
        let local = if ok(node) { shard.frames.iter().rposition(|&p| self.node_of_fast(p) == node) } else { None };
        let pfn = match local {
            Some(i) => Some(shard.frames.swap_remove(i)),
            None => ok(node).then(|| self.refill(&mut shard, node)).flatten().or_else(|| {
                match allowed {
                    None => shard.frames.pop(),
                    Some(_) => shard
                        .frames
                        .iter()
                        .rposition(|&p| ok(self.node_of_fast(p)))
                        .map(|i| shard.frames.swap_remove(i)),
                }
                .or_else(|| {
                    (1..nodes).map(|i| (node + i) % nodes).filter(|&n| ok(n)).find_map(|n| self.refill(&mut shard, n))
                })
            }),
        }?;
        shard.used += 1;
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

    /// Moves up to a batch of `node`'s free frames into `shard` and takes one.
    #[cold]
    fn refill(&self, shard: &mut Shard, node: usize) -> Option<Pfn> {
        crate::sync::shared_write(2); // the node's free-list lock
        let mut free = self.nodes[node].free.lock();
        let take = free.len().min(CACHE_BATCH);
        if take == 0 {
            // Nothing of `node`: the cache's other frames are not its to give.
            return None;
        }
        let at = free.len() - take;
        shard.frames.extend(free.drain(at..));
        drop(free);
        shard.frames.pop()
    }

    /// Returns every thread cache's frames to the node free lists.
    #[cold]
    fn drain_all_caches(&self) {
        for shard in self.shards.iter() {
            // One shard lock at a time, none held by the caller: no order to break.
            let frames = std::mem::take(&mut shard.lock().frames);
            for p in frames {
                self.nodes[self.node_of_fast(p)].free.lock().push(p);
            }
        }
    }

    /// Allocates a zero-filled frame (see [`PhysMem::alloc`]).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn alloc_zeroed(&self, node: usize) -> Option<FrameRef<'_>> {
        self.alloc_zeroed_at(&Placement::new(node, None))
    }

    /// Allocates a zero-filled frame where `at` says (see [`PhysMem::alloc_in`]).
    pub(crate) fn alloc_zeroed_at(&self, at: &Placement) -> Option<FrameRef<'_>> {
        let frame = at.alloc(self)?;
        // SAFETY: the frame was just allocated: nothing else maps or references it.
        unsafe { std::ptr::write_bytes(frame.ptr(), 0, PAGE_SIZE as usize) };
        Some(frame)
    }

    /// Allocates a frame holding a copy of `src`.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn alloc_copy(&self, src: Pfn, node: usize) -> Option<FrameRef<'_>> {
        self.alloc_copy_at(src, &Placement::new(node, None))
    }

    /// Allocates a frame holding a copy of `src` where `at` says.
    pub(crate) fn alloc_copy_at(&self, src: Pfn, at: &Placement) -> Option<FrameRef<'_>> {
        let frame = at.alloc(self)?;
        // SAFETY: both pointers come from `frame_ptr` (which checks the
        // frame number) of this arena, mapped while `self` lives.
        unsafe { copy_frame(self.frame_ptr(src), frame.ptr()) };
        Some(frame)
    }

    /// A new reference on a frame that the caller already holds a reference
    /// to (directly, or through the page cache's lock). Never on a frame
    /// number read from a page-table entry without the entry's lock, whose
    /// frame may have been freed since: from an entry, a reference comes
    /// only from its locked guard (`PteGuard::page`).
    #[inline]
    pub(crate) fn get(&self, pfn: Pfn) -> FrameRef<'_> {
        let pfn = self.compound_head(pfn);
        if pfn != self.zero_pfn {
            self.desc(pfn).refcount.fetch_add(1, Ordering::Relaxed);
        }
        FrameRef { phys: self, pfn }
    }

    /// The shared zero page, whose references are not counted.
    #[inline]
    pub(crate) fn zero_page(&self) -> FrameRef<'_> {
        FrameRef { phys: self, pfn: self.zero_pfn }
    }

    /// Drops a reference; the last one frees the frame. Only [`FrameRef`]'s
    /// drop calls it.
    #[inline]
    fn put(&self, pfn: Pfn) {
        if pfn == self.zero_pfn {
            return;
        }
        let pfn = self.compound_head(pfn);
        // Release pairs with the Acquire below so that every use of the frame
        // through other references happens before it is reused (the reasons
        // of `Arc::drop`).
        let old = self.desc(pfn).refcount.fetch_sub(1, Ordering::Release);
        debug_assert!(old > 0, "frame {pfn} refcount underflow");
        if old == 1 {
            crate::sync::fence(Ordering::Acquire);
            if self.is_huge(pfn) {
                self.free_huge(self.node_of(pfn), pfn);
                return;
            }
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
            self.free_to_nodes(drained);
        }
    }

    /// Puts frames drained from a thread cache on their nodes' free lists,
    /// one lock per node. With memory on demand their memory goes back to
    /// the host first: once on a free list, another thread may take one and
    /// fill it.
    fn free_to_nodes(&self, mut drained: Vec<Pfn>) {
        if self.on_demand {
            self.release_to_host(&mut drained); // sorts them too
        } else if self.nodes.len() > 1 {
            drained.sort_unstable();
        }
        for run in drained.chunk_by(|&a, &b| self.node_of_fast(a) == self.node_of_fast(b)) {
            crate::sync::shared_write(2);
            self.nodes[self.node_of_fast(run[0])].free.lock().extend_from_slice(run);
        }
    }

    /// Drops one reference on each frame of `pfns` (references taken over
    /// with [`FrameRef::into_raw`]) and frees those whose last reference it
    /// was, leaving `pfns` empty (its capacity kept): what [`PhysMem::put`]
    /// does frame by frame, with this thread's cache locked once for the
    /// whole batch and each node's free list once per drain, instead of
    /// both once per frame (Linux's `free_pages_and_swap_cache` →
    /// `folios_put`, for the same reason: an unmap frees thousands of frames
    /// after each flush, and two lock round trips per frame were most of its
    /// time, and contended with the allocations of other threads).
    pub(crate) fn put_batch(&self, pfns: &mut Vec<Pfn>) {
        // Release as in `put`: every use of a frame through other references
        // happens before it is reused.
        pfns.retain_mut(|pfn| {
            if *pfn == self.zero_pfn {
                return false;
            }
            // A huge page's count is on its head frame, as in `put`.
            *pfn = self.compound_head(*pfn);
            let old = self.desc(*pfn).refcount.fetch_sub(1, Ordering::Release);
            debug_assert!(old > 0, "frame {pfn} refcount underflow");
            old == 1
        });
        if pfns.is_empty() {
            return;
        }
        // One Acquire fence for every last reference dropped above (it
        // orders each of those reads-from before the frees below).
        crate::sync::fence(Ordering::Acquire);
        if !self.hugetlb.is_empty() {
            // Huge pages go back to their pool, never to the 4 KiB lists.
            pfns.retain(|&pfn| {
                let huge = self.is_huge(pfn);
                if huge {
                    self.free_huge(self.node_of(pfn), pfn);
                }
                !huge
            });
        }
        let mut shard = self.shard().lock();
        shard.used -= pfns.len() as i64;
        shard.frames.append(pfns);
        if shard.frames.len() >= 4 * CACHE_BATCH {
            // Keep the most recently freed 2 * CACHE_BATCH, as `free` does;
            // the rest goes back to the node free lists, one lock per node
            // (shard then node: the order `refill` takes them in).
            let surplus = shard.frames.len() - 2 * CACHE_BATCH;
            if self.nodes.len() == 1 && !self.on_demand {
                crate::sync::shared_write(2);
                self.nodes[0].free.lock().extend(shard.frames.drain(..surplus));
            } else {
                let drained: Vec<Pfn> = shard.frames.drain(..surplus).collect();
                drop(shard);
                self.free_to_nodes(drained);
            }
        }
    }

    /// Memory on demand ([`PhysConfig::on_demand`]): gives the host back the
    /// memory of `frames`, which the caller owns (free, on no list), in one
    /// `MADV_DONTNEED` per run of consecutive frames. Their contents become
    /// zero; nothing reads a free frame's contents (every allocation fills
    /// it), and a stale access could only reach arena memory, still mapped.
    #[cold]
    fn release_to_host(&self, frames: &mut [Pfn]) {
        frames.sort_unstable();
        let mut i = 0;
        while i < frames.len() {
            let mut j = i + 1;
            while j < frames.len() && frames[j] == frames[j - 1] + 1 {
                j += 1;
            }
            #[cfg(not(any(miri, loom)))]
            // SAFETY: `[frame_ptr(frames[i]), + (j - i) pages)` is a run of
            // whole frames inside the arena mapping, owned by the caller;
            // `MADV_DONTNEED` only replaces their contents by zeros.
            unsafe {
                libc::madvise(self.frame_ptr(frames[i]).cast(), (j - i) * PAGE_SIZE as usize, libc::MADV_DONTNEED);
            }
            i = j;
        }
    }

    /// Bytes of the arena the host holds in memory now (`mincore`): all of
    /// it for a prefaulted arena, what has been used and not given back for
    /// one on demand ([`PhysConfig::on_demand`]).
    pub fn host_resident_bytes(&self) -> u64 {
        if cfg!(miri) {
            return self.bytes as u64;
        }
        let pages = self.bytes / PAGE_SIZE as usize;
        let mut vec = vec![0u8; pages];
        // SAFETY: the arena is one mapping of `self.bytes` bytes at `base`,
        // alive while `self` is; `vec` has one byte per page of it.
        let r = unsafe { libc::mincore(self.base.as_ptr().cast(), self.bytes, vec.as_mut_ptr()) };
        if r != 0 {
            return 0;
        }
        vec.iter().filter(|&&b| b & 1 != 0).count() as u64 * PAGE_SIZE
    }

    pub(crate) fn account_page_table(&self, delta: i64) {
        self.page_tables.fetch_add(delta, Ordering::Relaxed);
    }

    /// Counts `delta` VMAs made (dropped, if negative): in the caller's CPU
    /// slot, so that address spaces making VMAs write no line in common.
    pub(crate) fn account_vma(&self, delta: i64) {
        self.vmas.mine().fetch_add(delta, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn account_rmap(&self, delta: i64) {
        self.rmap_entries.fetch_add(delta, Ordering::Relaxed);
    }

    /// Current allocation counts. Objects freed after a grace period are
    /// counted until the grace period ends; [`PhysMem::quiesce`] waits for it.
    pub fn stats(&self) -> PhysStats {
        let used: i64 = self.shards.iter().map(|s| s.lock().used).sum();
        PhysStats {
            frames_total: self.desc.len() as u64,
            frames_used: used as u64,
            page_tables: self.page_tables.load(Ordering::Relaxed) as u64,
            vmas: self.vmas.iter().map(|s| s.load(std::sync::atomic::Ordering::Relaxed)).sum::<i64>() as u64,
            rmap_entries: self.rmap_entries.load(Ordering::Relaxed) as u64,
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

/// One counted reference on a frame of a [`PhysMem`] (the zero page's is not
/// counted). Dropping it puts the reference, so no path can forget to; a
/// page-table entry or the page cache that keeps the reference takes it with
/// [`FrameRef::into_raw`] and gives it back with [`FrameRef::from_raw`].
#[must_use = "dropping a frame reference puts it"]
pub(crate) struct FrameRef<'a> {
    phys: &'a PhysMem,
    pfn: Pfn,
}

impl<'a> FrameRef<'a> {
    /// Takes back the reference that `pfn`'s holder (an entry, the page
    /// cache) kept with [`FrameRef::into_raw`].
    #[inline]
    pub(crate) fn from_raw(phys: &'a PhysMem, pfn: Pfn) -> FrameRef<'a> {
        FrameRef { phys, pfn }
    }

    /// Passes the reference on to a holder that stores only the number.
    #[inline]
    pub(crate) fn into_raw(self) -> Pfn {
        std::mem::ManuallyDrop::new(self).pfn
    }

    /// The frame number.
    #[inline]
    pub(crate) fn pfn(&self) -> Pfn {
        self.pfn
    }

    /// The arena the frame belongs to.
    #[inline]
    pub(crate) fn phys(&self) -> &'a PhysMem {
        self.phys
    }

    /// The frame's descriptor.
    #[inline]
    pub(crate) fn desc(&self) -> &'a FrameDesc {
        self.phys.desc(self.pfn)
    }

    /// The host address of the frame's first byte.
    #[inline]
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.phys.frame_ptr(self.pfn)
    }
}

impl Clone for FrameRef<'_> {
    /// Another reference on the same frame: the one cloned keeps it alive.
    #[inline]
    fn clone(&self) -> Self {
        self.phys.get(self.pfn)
    }
}

impl Drop for FrameRef<'_> {
    #[inline]
    fn drop(&mut self) {
        self.phys.put(self.pfn);
    }
}

impl std::fmt::Debug for FrameRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FrameRef({})", self.pfn)
    }
}

/// Copies one frame to another with word-sized relaxed atomic accesses, so a
/// guest thread writing the source concurrently is a race of the guest
/// program, not undefined behaviour of softmm.
///
/// # Safety
///
/// `src` and `dst` must each point at the first byte of a frame of a live
/// arena (from [`PhysMem::frame_ptr`], with the `PhysMem` alive for the
/// call), so that each is page aligned and valid for a page; arena memory is
/// only ever accessed atomically.
pub(crate) unsafe fn copy_frame(src: *const u8, dst: *mut u8) {
    use std::sync::atomic::AtomicU64 as A;
    let words = PAGE_SIZE as usize / 8;
    for i in 0..words {
        // SAFETY: both pointers are frames of a live arena (`# Safety`), so
        // each word is in bounds and 8-byte aligned; arena memory is only
        // ever accessed atomically.
        unsafe {
            let s = &*(src as *const A).add(i);
            let d = &*(dst as *const A).add(i);
            d.store(s.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A one-node arena of `frames` frames, frame 0 being the zero page.
    fn arena(frames: u64) -> Arc<PhysMem> {
        PhysMem::new(PhysConfig::new(frames * PAGE_SIZE)).unwrap()
    }

    /// A frame's reference as a number, as a page-table entry holds it.
    fn alloc_raw(phys: &PhysMem, node: usize) -> Option<Pfn> {
        phys.alloc(node).map(FrameRef::into_raw)
    }

    /// Puts a reference held as a number.
    fn put(phys: &PhysMem, pfn: Pfn) {
        drop(FrameRef::from_raw(phys, pfn));
    }

    /// Allocates from `node` until the arena runs out, in allocation order.
    fn alloc_all(phys: &PhysMem, node: usize) -> Vec<Pfn> {
        std::iter::from_fn(|| alloc_raw(phys, node)).collect()
    }

    #[test]
    fn config_constructor_and_setters() {
        let c = PhysConfig::new(5 << 20);
        assert_eq!((c.bytes, c.nodes), (5 << 20, 1));
        let c = c.nodes(3).bytes(7 << 20);
        assert_eq!((c.bytes, c.nodes), (7 << 20, 3));
        let d = PhysConfig::default();
        assert_eq!((d.bytes, d.nodes), (256 << 20, 1));
    }

    #[test]
    fn fresh_arena_counts_every_frame_and_uses_none() {
        let phys = arena(16);
        assert_eq!(
            phys.stats(),
            PhysStats { frames_total: 16, frames_used: 0, page_tables: 0, vmas: 0, rmap_entries: 0 }
        );
        assert_eq!(phys.nodes(), 1);
        assert_eq!(phys.zero_pfn(), 0);
        assert_eq!(phys.quiesce(), phys.stats());
    }

    #[test]
    fn arena_size_rounds_up_to_whole_frames_per_node() {
        // 5 frames over 2 nodes: 3 per node.
        let phys = PhysMem::new(PhysConfig::new(5 * PAGE_SIZE).nodes(2)).unwrap();
        assert_eq!(phys.stats().frames_total, 6);
        // The smallest arena: the zero page and one frame to allocate.
        let phys = PhysMem::new(PhysConfig::new(PAGE_SIZE + 1)).unwrap();
        assert_eq!(phys.stats().frames_total, 2);
        assert_eq!(alloc_all(&phys, 0), vec![1]);
    }

    #[track_caller]
    fn refused(bytes: u64, nodes: usize) -> Errno {
        match PhysMem::new(PhysConfig::new(bytes).nodes(nodes)) {
            Ok(_) => panic!("PhysConfig {{ bytes: {bytes:#x}, nodes: {nodes} }} was accepted"),
            Err(e) => e,
        }
    }

    #[test]
    fn nonsensical_configs_are_einval() {
        // No nodes, or more than Linux's MAX_NUMNODES (1 << 10 on x86-64).
        assert_eq!(refused(1 << 20, 0), Errno::Inval);
        assert_eq!(refused(1 << 20, usize::MAX), Errno::Inval);
        assert_eq!(refused(1 << 40, MAX_NODES + 1), Errno::Inval);
        // No bytes, or too few for the zero page plus one frame on every node.
        assert_eq!(refused(0, 1), Errno::Inval);
        assert_eq!(refused(1, 1), Errno::Inval);
        assert_eq!(refused(PAGE_SIZE, 1), Errno::Inval);
        assert_eq!(refused(2 * PAGE_SIZE, 2), Errno::Inval);
        assert_eq!(refused(1 << 20, 512), Errno::Inval, "one frame per node");
        assert_eq!(PhysMem::new(PhysConfig::new(3 * PAGE_SIZE).nodes(2)).unwrap().stats().frames_total, 4);
        // Sizes whose rounding to whole frames per node overflows.
        assert_eq!(refused(u64::MAX, 1), Errno::Inval);
        // 2^52 - 1 frames: 2^51 per node on two nodes, 2^64 bytes in all.
        assert_eq!(refused(u64::MAX - PAGE_SIZE, 2), Errno::Inval);
    }

    /// The host's free memory, from /proc/meminfo.
    fn mem_available() -> u64 {
        host_mem_available().expect("MemAvailable in /proc/meminfo")
    }

    #[test]
    #[cfg_attr(miri, ignore = "reads the host's /proc/meminfo")]
    fn an_arena_the_host_cannot_back_is_enomem_not_the_oom_killer() {
        // Refused before anything is mapped or allocated: the test itself
        // touches no memory (an accepted arena this size would be prefaulted
        // and meet the host's OOM killer).
        let avail = mem_available();
        assert_eq!(refused(2 * avail, 1), Errno::NoMem);
        assert_eq!(refused(avail + (avail >> 6), 4), Errno::NoMem, "descriptors count too");
        assert_eq!(refused(1 << 50, 16), Errno::NoMem);
        // Representable but far beyond any host.
        assert_eq!(refused(u64::MAX - 2 * PAGE_SIZE, 1), Errno::NoMem);
    }

    #[test]
    fn arena_size_rounds_a_partial_frame_up() {
        // The doc promises rounding up: a partial fifth frame is a whole one.
        let phys = PhysMem::new(PhysConfig::new(4 * PAGE_SIZE + 1)).unwrap();
        assert_eq!(phys.stats().frames_total, 5);
    }

    #[test]
    fn alloc_hands_out_distinct_frames_never_the_zero_page() {
        let phys = arena(16);
        let mut got = alloc_all(&phys, 0);
        assert_eq!(got.len(), 15, "every frame but the zero page");
        assert_eq!(phys.stats().frames_used, 15);
        for &p in &got {
            assert_eq!(phys.desc(p).refcount.load(Ordering::Relaxed), 1);
        }
        got.sort_unstable();
        assert_eq!(got, (1..16).collect::<Vec<_>>());
        for p in got {
            put(&phys, p);
        }
        assert_eq!(phys.stats().frames_used, 0);
    }

    #[test]
    fn out_of_frames_is_none_and_recovers_after_a_free() {
        let phys = arena(8);
        let got = alloc_all(&phys, 0);
        assert_eq!(got.len(), 7);
        assert_eq!(alloc_raw(&phys, 0), None);
        assert!(phys.alloc_zeroed(0).is_none());
        assert!(phys.alloc_copy(got[0], 0).is_none());
        assert_eq!(phys.stats().frames_used, 7, "failed allocations are not counted");
        put(&phys, got[3]);
        assert_eq!(phys.stats().frames_used, 6);
        assert_eq!(alloc_raw(&phys, 0), Some(got[3]), "the only free frame");
        assert_eq!(alloc_raw(&phys, 0), None);
        for p in got {
            put(&phys, p);
        }
        assert_eq!(phys.stats().frames_used, 0);
        assert_eq!(alloc_all(&phys, 0).len(), 7, "every frame is free again");
    }

    #[test]
    fn get_and_put_count_references_and_the_last_put_frees() {
        let phys = arena(4);
        let p = alloc_raw(&phys, 0).unwrap();
        phys.get(p).into_raw();
        phys.get(p).into_raw();
        assert_eq!(phys.desc(p).refcount.load(Ordering::Relaxed), 3);
        put(&phys, p);
        put(&phys, p);
        assert_eq!(phys.desc(p).refcount.load(Ordering::Relaxed), 1);
        assert_eq!(phys.stats().frames_used, 1, "still referenced");
        put(&phys, p);
        assert_eq!(phys.desc(p).refcount.load(Ordering::Relaxed), 0);
        assert_eq!(phys.stats().frames_used, 0);
    }

    #[test]
    fn zero_page_is_not_reference_counted() {
        let phys = arena(4);
        let z = phys.zero_pfn();
        phys.get(z).into_raw();
        put(&phys, z);
        // A counted put would underflow (debug) or free the zero page.
        put(&phys, z);
        assert_eq!(phys.desc(z).refcount.load(Ordering::Relaxed), 0);
        assert_eq!(phys.stats().frames_used, 0);
        let got = alloc_all(&phys, 0);
        assert!(!got.contains(&z), "the zero page was handed out: {got:?}");
        assert_eq!(got.len(), 3);
    }

    #[test]
    fn alloc_resets_the_descriptor_of_a_reused_frame() {
        let phys = arena(4);
        let got = alloc_all(&phys, 0);
        for &p in &got {
            let d = phys.desc(p);
            d.flags.store(PG_FILE | PG_DIRTY | PG_LAZYFREE, Ordering::Relaxed);
            d.mapping.store(77, Ordering::Relaxed);
            put(&phys, p);
        }
        let p = alloc_raw(&phys, 0).unwrap();
        let d = phys.desc(p);
        assert_eq!(d.flags.load(Ordering::Relaxed), 0);
        assert_eq!(d.mapping.load(Ordering::Relaxed), 0);
        assert_eq!(d.refcount.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn alloc_zeroed_and_alloc_copy_fill_the_frame() {
        let phys = arena(4);
        // Dirty every frame so the one handed back cannot be zero by chance.
        for p in alloc_all(&phys, 0) {
            // SAFETY: the frame is allocated to this test and referenced by nothing else.
            unsafe { std::ptr::write_bytes(phys.frame_ptr(p), 0xa5, PAGE_SIZE as usize) };
            put(&phys, p);
        }
        let src = phys.alloc_zeroed(0).unwrap().into_raw();
        let frame = |p: Pfn| {
            let mut buf = vec![0u8; PAGE_SIZE as usize];
            // SAFETY: one frame of this test's live arena.
            unsafe { crate::access::copy_from_host(phys.frame_ptr(p), &mut buf) };
            buf
        };
        assert!(frame(src).iter().all(|&b| b == 0), "alloc_zeroed left old contents");
        let pattern: Vec<u8> = (0..PAGE_SIZE).map(|i| (i * 7 % 251) as u8).collect();
        // SAFETY: one frame of this test's live arena.
        unsafe { crate::access::copy_to_host(&pattern, phys.frame_ptr(src)) };
        let dst = phys.alloc_copy(src, 0).unwrap().into_raw();
        assert_ne!(dst, src);
        assert_eq!(frame(dst), pattern);
        assert_eq!(phys.stats().frames_used, 2);
    }

    #[test]
    fn numa_nodes_split_the_arena_and_alloc_prefers_the_asked_node() {
        // 16 frames on 2 nodes: node 0 holds frames 0..8 (0 is the zero page), node 1 frames 8..16.
        let phys = PhysMem::new(PhysConfig::new(16 * PAGE_SIZE).nodes(2)).unwrap();
        assert_eq!(phys.nodes(), 2);
        assert_eq!((phys.node_of(0), phys.node_of(7), phys.node_of(8), phys.node_of(15)), (0, 0, 1, 1));
        let on1: Vec<Pfn> = (0..8).map(|_| alloc_raw(&phys, 1).unwrap()).collect();
        assert!(on1.iter().all(|&p| phys.node_of(p) == 1 && (8..16).contains(&p)), "{on1:?}");
        // Node 1 is empty: the allocation falls back to node 0 rather than failing.
        let fallback = alloc_raw(&phys, 1).unwrap();
        assert_eq!(phys.node_of(fallback), 0);
        let on0 = alloc_raw(&phys, 0).unwrap();
        assert_eq!(phys.node_of(on0), 0);
        assert_eq!(phys.stats().frames_used, 10);
        // The 5 frames left on node 0.
        assert_eq!(alloc_all(&phys, 0).len(), 5);
        assert_eq!(alloc_raw(&phys, 0), None);
    }

    #[test]
    fn fallback_allocations_can_use_every_frame_of_the_other_node() {
        // Every softmm caller asks for node 0. Once node 0 is empty, refill moves a batch of node 1
        // frames into the thread cache and hands out one; the next alloc(0) finds no node-0 frame
        // in the cache, finds both free lists empty, and fails with 7 free frames in the cache.
        let phys = PhysMem::new(PhysConfig::new(16 * PAGE_SIZE).nodes(2)).unwrap();
        let got = alloc_all(&phys, 0);
        assert_eq!(got.len(), 15, "frames_used = {}", phys.stats().frames_used);
    }

    #[test]
    fn freeing_past_the_cache_limit_spills_to_the_node() {
        // More frames than a thread cache keeps (4 * CACHE_BATCH), so frees drain to the free list.
        let phys = arena(256);
        let got = alloc_all(&phys, 0);
        assert_eq!(got.len(), 255);
        for &p in &got {
            put(&phys, p);
        }
        assert_eq!(phys.stats().frames_used, 0);
        assert!(phys.shard().lock().frames.len() < 4 * CACHE_BATCH, "the thread cache never drained");
        assert_eq!(alloc_all(&phys, 0).len(), 255, "a frame was lost between the cache and the node");
    }

    #[test]
    fn frames_cached_by_another_thread_are_still_allocatable() {
        // Linux drains the per-cpu pagesets (drain_all_pages) before it reports an allocation failure.
        let phys = arena(8);
        let got = alloc_all(&phys, 0);
        assert_eq!(got.len(), 7);
        // Free from a thread whose cache is not this thread's (threads share caches modulo their count).
        let here = SLOT.with(|s| *s) % phys.shards.len();
        let mut frames = got;
        while !frames.is_empty() {
            let freer = phys.clone();
            frames = std::thread::spawn(move || {
                if SLOT.with(|s| *s) % freer.shards.len() == here {
                    return frames;
                }
                frames.into_iter().for_each(|p| put(&freer, p));
                Vec::new()
            })
            .join()
            .unwrap();
        }
        assert_eq!(phys.stats().frames_used, 0);
        assert_eq!(alloc_all(&phys, 0).len(), 7);
    }

    #[test]
    fn allocation_counts_add_up_across_threads() {
        let phys = arena(64);
        let got = alloc_all(&phys, 0);
        assert_eq!(got.len(), 63);
        // Frees on other threads land in other thread caches but the totals still balance.
        let halves: Vec<Vec<Pfn>> = got.chunks(32).map(<[Pfn]>::to_vec).collect();
        std::thread::scope(|s| {
            for half in halves {
                let phys = &phys;
                s.spawn(move || half.into_iter().for_each(|p| put(phys, p)));
            }
        });
        assert_eq!(phys.stats().frames_used, 0);
    }

    #[test]
    fn stats_count_vmas_and_page_tables_and_quiesce_waits_for_deferred_frees() {
        let phys = arena(4);
        phys.account_vma(2);
        phys.account_page_table(3);
        assert_eq!((phys.stats().vmas, phys.stats().page_tables), (2, 3));
        phys.account_vma(-2);
        phys.account_page_table(-1);
        // Free the last two page tables after a grace period, as detached page tables are.
        let guard = crossbeam_epoch::pin();
        let deferred = phys.clone();
        guard.defer(move || deferred.account_page_table(-2));
        drop(guard);
        assert_eq!(
            phys.quiesce(),
            PhysStats { frames_total: 4, frames_used: 0, page_tables: 0, vmas: 0, rmap_entries: 0 }
        );
    }

    /// `put_batch` frees the frames whose last reference it drops, on every
    /// node (more than a thread cache keeps, so frees reach the node free
    /// lists), keeps the others and skips the zero page: afterwards every
    /// freed frame can be allocated again, and only the shared one is used.
    #[test]
    fn put_batch_frees_last_references_on_every_node() {
        for nodes in [1, 2] {
            put_batch_frees_last_references_on(nodes);
        }
    }

    fn put_batch_frees_last_references_on(nodes: usize) {
        let phys = PhysMem::new(PhysConfig::new(512 * PAGE_SIZE).nodes(nodes)).unwrap();
        let all: Vec<Pfn> = (0..nodes).flat_map(|n| alloc_all(&phys, n)).collect();
        assert_eq!(all.len(), 511, "every frame but the zero page");
        let shared = all[7];
        let _second = phys.get(shared).into_raw();
        let mut batch = all.clone();
        batch.push(phys.zero_page().into_raw());
        phys.put_batch(&mut batch);
        assert!(batch.is_empty());
        assert_eq!(phys.stats().frames_used, 1, "only the frame with another reference stays used");
        assert_eq!(phys.desc(shared).refcount.load(Ordering::Relaxed), 1);
        let again: Vec<Pfn> = (0..nodes).flat_map(|n| alloc_all(&phys, n)).collect();
        assert_eq!(again.len(), 510, "a freed frame was lost");
        assert!(!again.contains(&shared));
        let mut batch = again;
        batch.push(shared);
        phys.put_batch(&mut batch);
        assert_eq!(phys.quiesce().frames_used, 0);
    }

    /// `alloc_bulk_at` takes the placement's node first, then the other
    /// allowed nodes in `alloc_in`'s fallback order (node + 1, node + 2,
    /// ... wrapping), each emptied before the next; never a node outside
    /// the mask; fewer frames only when every allowed node is empty.
    #[test]
    fn alloc_bulk_at_falls_back_over_the_allowed_nodes_in_order() {
        let phys = PhysMem::new(PhysConfig::new(3 * 64 * PAGE_SIZE).nodes(3)).unwrap();
        let total: Vec<u64> = phys.node_stats().iter().map(|s| s.frames_total).collect();
        let mut mask = NodeMask::single(2);
        mask.set(0);
        // Node 2 first, then node 0 (2 + 1 wraps to 0), never node 1.
        let at = Placement::new(2, Some(mask));
        let got = phys.alloc_bulk_at(&at, total[2] as usize + 10);
        let nodes: Vec<usize> = got.iter().map(|f| phys.node_of(f.pfn())).collect();
        assert_eq!(nodes.len() as u64, total[2] + 10);
        assert!(nodes[..total[2] as usize].iter().all(|&n| n == 2), "node 2 emptied first: {nodes:?}");
        assert!(nodes[total[2] as usize..].iter().all(|&n| n == 0), "then node 0: {nodes:?}");
        let rest = phys.alloc_bulk_at(&at, usize::MAX >> 1);
        assert_eq!(rest.len() as u64, total[0] - 10, "all of node 0, none of node 1");
        assert_eq!(phys.node_stats()[1].frames_used, 0);
        // Without a mask the fallback reaches node 1; a one-node placement
        // does not.
        assert!(phys.alloc_bulk_at(&Placement::this_node(2), 1).is_empty());
        assert!(phys.alloc_bulk_at(&Placement::this_node(7), 1).is_empty(), "no node 7");
        assert!(phys.alloc_bulk_at(&Placement::this_node(MAX_NODES), 1).is_empty());
        let any = phys.alloc_bulk_at(&Placement::new(2, None), 5);
        assert!(any.len() == 5 && any.iter().all(|f| phys.node_of(f.pfn()) == 1));
        drop((got, rest, any));
        assert_eq!(phys.quiesce().frames_used, 0);
    }

    /// `alloc_bulk_on` hands out frames of the asked node only, from this
    /// thread's cache and the node's free list and, once those run out,
    /// from other threads' caches; it returns fewer only when the node is
    /// empty, and each frame comes with one reference, counted as used.
    #[test]
    fn alloc_bulk_on_takes_only_the_node_and_all_of_it() {
        let phys = PhysMem::new(PhysConfig::new(512 * PAGE_SIZE).nodes(2)).unwrap();
        let per_node: Vec<u64> = phys.node_stats().iter().map(|s| s.frames_total).collect();
        // Fill this thread's cache with frames of both nodes, and another
        // thread's with frames of node 1.
        let mut mixed: Vec<Pfn> = (0..40).flat_map(|_| [alloc_raw(&phys, 0), alloc_raw(&phys, 1)]).flatten().collect();
        phys.put_batch(&mut mixed);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut other: Vec<Pfn> = (0..20).filter_map(|_| alloc_raw(&phys, 1)).collect();
                phys.put_batch(&mut other);
            });
        });
        let some = phys.alloc_bulk_on(1, 50);
        assert_eq!(some.len(), 50);
        assert!(some.iter().all(|f| phys.node_of(f.pfn()) == 1 && f.desc().refcount.load(Ordering::Relaxed) == 1));
        let rest = phys.alloc_bulk_on(1, usize::MAX >> 1);
        assert_eq!(rest.len() as u64, per_node[1] - 50, "frames of node 1 left behind");
        assert!(rest.iter().all(|f| phys.node_of(f.pfn()) == 1));
        assert!(phys.alloc_bulk_on(1, 1).is_empty(), "node 1 is empty");
        assert!(phys.alloc_bulk_on(2, 1).is_empty(), "no node 2");
        assert_eq!(phys.stats().frames_used, per_node[1]);
        assert_eq!(phys.node_stats()[0].frames_used, 0);
        drop((some, rest));
        assert_eq!(phys.quiesce().frames_used, 0);
    }
}
