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

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicI64, AtomicU32, AtomicU64, Mutex, Ordering};

use crate::error::{Errno, Result};
use crate::PAGE_SIZE;

mod commit;
mod frozen;
pub(crate) mod hugetlb;
mod pfn;
pub use commit::{Overcommit, OvercommitMode};

pub(crate) use frozen::{FrozenPage, TlbFlushed};
pub(crate) use pfn::Pfn;

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
}

/// The arena's frame descriptors, one per frame, indexed by frame number.
#[cfg(not(loom))]
struct FrameDescs(Box<[FrameDesc]>);

#[cfg(not(loom))]
impl FrameDescs {
    /// `n` descriptors, all zero (free, unreferenced). Allocated zeroed, so
    /// that the host backs them only when written (memory on demand),
    /// unless `touch` asks to write them all now. `ENOMEM` if the
    /// allocation fails.
    fn new(n: usize, touch: bool) -> Result<Self> {
        let layout = std::alloc::Layout::array::<FrameDesc>(n).map_err(|_| Errno::NoMem)?;
        if layout.size() == 0 {
            return Ok(Self(Box::new([])));
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
        Ok(Self(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, n)) }))
    }

    #[inline]
    fn get(&self, i: usize) -> &FrameDesc {
        &self.0[i]
    }

    #[inline]
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// Under loom a descriptor's atomics are the model's objects, and every
/// acquire fence visits every object of the execution: a two-node arena
/// with a pool page per node is over 2,000 descriptors, six atomics each,
/// most of them never used (a huge page's tail frames, free frames). So a
/// descriptor is built at its first use, all zero as the real array's
/// are from the start: no store can precede it, so a load reads the same
/// zero either way. (A `OnceLock` of std: loom runs one model thread at a
/// time, and the lock is bookkeeping, not part of any protocol modelled.)
#[cfg(loom)]
struct FrameDescs(Box<[std::sync::OnceLock<FrameDesc>]>);

#[cfg(loom)]
impl FrameDescs {
    fn new(n: usize, _touch: bool) -> Result<Self> {
        let mut desc = Vec::new();
        desc.try_reserve_exact(n).map_err(|_| Errno::NoMem)?;
        desc.extend((0..n).map(|_| std::sync::OnceLock::new()));
        Ok(Self(desc.into_boxed_slice()))
    }

    #[inline]
    fn get(&self, i: usize) -> &FrameDesc {
        self.0[i].get_or_init(FrameDesc::default)
    }

    #[inline]
    fn len(&self) -> usize {
        self.0.len()
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
    /// How each node's free frames are kept for the thread caches' refills
    /// and spills (see [`FreeLists`]).
    pub free_lists: FreeLists,
}

/// How a node's free frames are kept, which the per-thread frame caches
/// refill from (a batch at a time) and spill to. More policies may come, so
/// a `match` on it needs a wildcard arm. Every policy hands out the same
/// frames in the end: an allocation fails only when every list of every
/// allowed node is empty, thread caches drained.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FreeLists {
    /// One list per node under one lock (Linux's zone free lists under
    /// `zone->lock`): every thread's refill and spill writes that lock's
    /// line, 2 shared writes per batch of 32 frames. The default: a thread
    /// that uses more than its share of a node under `Striped` pays more
    /// (`tests/shared_writes.rs`: 0.10 shared writes per fault against
    /// 0.061, a thread faulting a quarter of a 16 MiB arena).
    #[default]
    Node,
    /// One list per CPU slot per node, each on its own cache line: a thread
    /// refills from and spills to its slot's list, and takes from the
    /// others, in turn, only when its own is empty, so threads of disjoint
    /// slots that each use less than their share of the node refill from
    /// disjoint lines (0.031 shared writes per fault, against 0.061).
    Striped,
}

impl FreeLists {
    /// Every policy, for sweeps.
    pub const ALL: &'static [FreeLists] = &[FreeLists::Node, FreeLists::Striped];

    /// The kebab-case name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            FreeLists::Node => "node",
            FreeLists::Striped => "striped",
        }
    }

    /// The policy named `name` (see [`FreeLists::name`]).
    pub fn from_name(name: &str) -> Option<FreeLists> {
        FreeLists::ALL.iter().copied().find(|p| p.name() == name)
    }

    /// Lists per node. One under loom, as the thread caches: a model's
    /// threads share one OS thread, and so one slot.
    fn stripes(self) -> usize {
        match self {
            FreeLists::Node => 1,
            _ if cfg!(loom) => 1,
            FreeLists::Striped => crate::sync::percpu::SLOTS,
        }
    }
}

impl Default for PhysConfig {
    fn default() -> Self {
        PhysConfig { bytes: 256 << 20, nodes: 1, on_demand: false, hugepages: 0, free_lists: FreeLists::default() }
    }
}

impl PhysConfig {
    /// An arena of `bytes` on one node. Checked only by [`PhysMem::new`].
    pub fn new(bytes: u64) -> PhysConfig {
        PhysConfig { bytes, ..PhysConfig::default() }
    }

    /// Sets `free_lists`: how each node's free frames are kept.
    #[must_use]
    pub fn free_lists(mut self, free_lists: FreeLists) -> PhysConfig {
        self.free_lists = free_lists;
        self
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

/// The free frames of one NUMA node, in one list or one per CPU slot
/// ([`FreeLists`]), each list on cache lines of its own.
struct Node {
    free: Box<[CachePadded<Mutex<Vec<Pfn>>>]>,
    first: Pfn,
    end: Pfn,
}

impl Node {
    /// The list the calling thread refills from and spills to first: its
    /// slot's.
    fn mine(&self) -> usize {
        crate::sync::percpu::this_thread_number().unwrap_or(0) % self.free.len()
    }

    /// The lists in the order the calling thread takes from them: its own,
    /// then the others, each once.
    fn lists(&self) -> impl Iterator<Item = &Mutex<Vec<Pfn>>> {
        let (mine, n) = (self.mine(), self.free.len());
        (0..n).map(move |i| &*self.free[(mine + i) % n])
    }

    /// Locks list `list`, counting it as a shared write when other threads'
    /// refills and spills write it too: always with one list, and for
    /// another slot's list.
    fn lock<'a>(&self, list: &'a Mutex<Vec<Pfn>>) -> crate::sync::MutexGuard<'a, Vec<Pfn>> {
        if self.free.len() == 1 || !std::ptr::eq(list, &*self.free[self.mine()]) {
            crate::sync::shared_write(2);
        }
        list.lock()
    }

    /// Frames free in the node's lists.
    fn free_count(&self) -> usize {
        self.free.iter().map(|l| l.lock().len()).sum()
    }

    /// Puts `frames` on the calling thread's list.
    fn spill(&self, frames: impl IntoIterator<Item = Pfn>) {
        let list = &*self.free[self.mine()];
        self.lock(list).extend(frames);
    }
}

/// Physical memory shared by address spaces and files.
pub struct PhysMem {
    base: NonNull<u8>,
    bytes: usize,
    desc: FrameDescs,
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
    /// VMAs alive, per CPU slot: the references each slot's token
    /// ([`VmaAcct`]) holds beyond this one.
    vmas: crate::sync::percpu::PerCpu<VmaAcct>,
    /// Reverse-map entries (statistics), per CPU slot: a shared
    /// anonymous `mmap` links its new object, and range writers do that
    /// beside each other.
    rmap_entries: crate::sync::percpu::PercpuCounter,
    /// File ids, per CPU slot in batches (Linux's `get_next_ino`): every
    /// shared anonymous `mmap` makes a file.
    next_id: crate::sync::percpu::PercpuIds,
    /// The committed total and overcommit policy (see [`crate::mm::commit`]).
    pub(crate) commit: CachePadded<commit::CommitState>,
    /// [`PhysConfig::on_demand`]: give frames back to the host when they
    /// return to the node free lists.
    on_demand: bool,
    /// The hugetlb pool (see [`hugetlb`]).
    pub(crate) hugetlb: hugetlb::pool::HugePool,
}

// SAFETY: the arena pointer is only dereferenced through raw, atomic or
// volatile accesses whose races are those of the guest program itself; all
// bookkeeping is atomics and locks.
unsafe impl Send for PhysMem {}
// SAFETY: as for `Send`: shared access goes through atomics and locks.
unsafe impl Sync for PhysMem {}

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
        let spans: Vec<(Pfn, Pfn)> =
            (0..nodes as u64).map(|n| (Pfn::new(n * per_node), Pfn::new((n + 1) * per_node))).collect();
        let (hugetlb, small_ends) = hugetlb::pool::HugePool::carve(&spans, config.hugepages)?;
        let desc_bytes = frames.saturating_mul(std::mem::size_of::<FrameDesc>() as u64);
        // Miri cannot read /proc (isolation); its arenas are tiny anyway.
        let avail = if cfg!(miri) || config.on_demand { None } else { host_mem_available() };
        if avail.is_some_and(|avail| (bytes as u64).saturating_add(desc_bytes) > avail) {
            return Err(Errno::NoMem);
        }
        let desc = FrameDescs::new(frames as usize, !config.on_demand)?;
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
        let zero_pfn = Pfn::new(0);
        let nodes: Box<[Node]> = (0..nodes as u64)
            .map(|n| {
                let first = Pfn::new(n * per_node);
                let end = first + per_node;
                // Pop from the end gives ascending frames.
                let free: Vec<Pfn> = first.range(small_ends[n as usize]).filter(|&p| p != zero_pfn).rev().collect();
                // Split in equal runs, each list popping ascending frames.
                let stripes = config.free_lists.stripes();
                let run = free.len().div_ceil(stripes).max(1);
                let mut runs: Vec<_> =
                    free.chunks(run).rev().map(|c| CachePadded::new(Mutex::new(c.to_vec()))).collect();
                runs.resize_with(stripes, || CachePadded::new(Mutex::new(Vec::new())));
                Node { free: runs.into_boxed_slice(), first, end }
            })
            .collect();
        // Under loom one shard: a model's threads share one OS thread (and so
        // one thread number), and every lock is a point the model checker explores.
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
            vmas: VmaAcct::per_slot(),
            rmap_entries: Default::default(),
            next_id: Default::default(),
            on_demand: config.on_demand,
            commit: CachePadded::new(commit::CommitState::new(frames - hugetlb.frames())),
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
        let node = (pfn.get() / self.per_node) as usize;
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
        let mut free: Vec<u64> = self.nodes.iter().map(|n| n.free_count() as u64).collect();
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

    /// A process-unique id for files made on this memory, never zero.
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.next()
    }

    #[inline]
    pub(crate) fn desc(&self, pfn: Pfn) -> &FrameDesc {
        self.desc.get(pfn.index())
    }

    /// The host address of a frame's first byte.
    #[inline]
    pub(crate) fn frame_ptr(&self, pfn: Pfn) -> *mut u8 {
        // A frame number of another arena must never become a pointer here.
        assert!(pfn.index() < self.desc.len(), "pfn {pfn} outside the arena");
        // SAFETY: pfn < frames (checked), so the offset stays inside the arena mapping.
        unsafe { self.base.as_ptr().add(pfn.index() * PAGE_SIZE as usize) }
    }

    /// The host address of byte `off` of the run of frames that starts at
    /// `pfn`, checked to leave `len` bytes inside the arena (a run longer
    /// than a frame is a huge page: contiguous frames of the arena).
    fn range_ptr(&self, pfn: Pfn, off: usize, len: usize) -> *mut u8 {
        let start = pfn.index().checked_mul(PAGE_SIZE as usize).and_then(|b| b.checked_add(off));
        let end = start.and_then(|s| s.checked_add(len));
        // Never a pointer outside the arena, whatever the caller computed.
        assert!(
            matches!(end, Some(e) if e <= self.desc.len() * PAGE_SIZE as usize),
            "frame {pfn} + {off}, {len} bytes: outside the arena"
        );
        self.base.as_ptr().wrapping_add(start.expect("checked above"))
    }

    /// Copies guest memory, from byte `off` of the frames starting at `pfn`,
    /// into `dst`, with relaxed atomic accesses (`access.rs`): a guest
    /// thread writing the range meanwhile is the guest program's race.
    /// Panics if the range leaves the arena. That the frame is still the one
    /// the caller means (referenced, or under the lock that keeps it) is the
    /// caller's correctness, not a matter of safety.
    pub(crate) fn read(&self, pfn: Pfn, off: usize, dst: &mut [u8]) {
        let src = self.range_ptr(pfn, off, dst.len());
        // SAFETY: `range_ptr` checked that the range lies in the arena, which
        // stays mapped while `self` lives and is only accessed atomically.
        unsafe { crate::access::copy_from_host(src, dst) }
    }

    /// Copies `src` into guest memory at byte `off` of the frames starting
    /// at `pfn`, as [`PhysMem::read`] does the other way.
    pub(crate) fn write(&self, pfn: Pfn, off: usize, src: &[u8]) {
        let dst = self.range_ptr(pfn, off, src.len());
        // SAFETY: as in `read`.
        unsafe { crate::access::copy_to_host(src, dst) }
    }

    /// Fills `len` bytes of guest memory at byte `off` of the frames
    /// starting at `pfn` with `byte`, as [`PhysMem::write`] does.
    pub(crate) fn fill(&self, pfn: Pfn, off: usize, byte: u8, len: usize) {
        let dst = self.range_ptr(pfn, off, len);
        // SAFETY: as in `read`.
        unsafe { crate::access::fill_host(dst, byte, len) }
    }

    /// Copies `frames` whole frames from `src` to `dst` word by word with
    /// relaxed atomic accesses (a guest writing the source meanwhile is the
    /// guest's race). Panics if either run leaves the arena.
    pub(crate) fn copy_frames(&self, src: Pfn, dst: Pfn, frames: usize) {
        let len = frames * PAGE_SIZE as usize;
        let (s, d) = (self.range_ptr(src, 0, len), self.range_ptr(dst, 0, len));
        for i in 0..frames {
            let off = i * PAGE_SIZE as usize;
            // SAFETY: both runs were checked to lie in the arena, so each
            // frame of them is page aligned and valid for a page while
            // `self` lives; arena memory is only accessed atomically.
            unsafe { copy_frame(s.wrapping_add(off), d.wrapping_add(off)) };
        }
    }

    /// True if `ptr` points into the arena (not into embedder memory that
    /// `AddressSpace::mmap_host` maps).
    #[inline]
    pub(crate) fn is_arena_ptr(&self, ptr: *const u8) -> bool {
        let off = ptr.addr().wrapping_sub(self.base.as_ptr().addr());
        off < self.desc.len() * PAGE_SIZE as usize
    }

    /// The frame holding the arena byte at `ptr`, which must come from
    /// [`PhysMem::frame_ptr`] of this arena (plus an offset inside the frame).
    #[inline]
    pub(crate) fn pfn_of_ptr(&self, ptr: *const u8) -> Pfn {
        let off = ptr.addr().wrapping_sub(self.base.as_ptr().addr());
        debug_assert!(off < self.desc.len() * PAGE_SIZE as usize, "pointer outside the arena");
        Pfn::new((off / PAGE_SIZE as usize) as u64)
    }

    fn shard(&self) -> &Mutex<Shard> {
        // The calling thread's shard, like the current CPU's per-cpu pageset.
        &self.shards[crate::sync::percpu::this_thread_number().unwrap_or(0) % self.shards.len()]
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
        for list in self.nodes[node].lists() {
            let want = n - (out.len() - before);
            if want == 0 {
                break;
            }
            let mut free = self.nodes[node].lock(list);
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

    /// Moves up to a batch of `node`'s free frames into `shard` and takes
    /// one: from the calling thread's list, else from the first of the
    /// node's other lists that has any.
    #[cold]
    fn refill(&self, shard: &mut Shard, node: usize) -> Option<Pfn> {
        let node = &self.nodes[node];
        for list in node.lists() {
            let mut free = node.lock(list);
            let take = free.len().min(CACHE_BATCH);
            if take > 0 {
                let at = free.len() - take;
                shard.frames.extend(free.drain(at..));
                drop(free);
                return shard.frames.pop();
            }
        }
        // Nothing of `node`: the cache's other frames are not its to give.
        None
    }

    /// Returns every thread cache's frames to the node free lists.
    #[cold]
    fn drain_all_caches(&self) {
        for shard in self.shards.iter() {
            // One shard lock at a time, none held by the caller: no order to break.
            let frames = std::mem::take(&mut shard.lock().frames);
            for p in frames {
                self.nodes[self.node_of_fast(p)].spill([p]);
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
            self.nodes[self.node_of_fast(run[0])].spill(run.iter().copied());
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
                self.nodes[0].spill(shard.frames.drain(..surplus));
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

    /// Counts a VMA made, in the caller's CPU slot, until the returned
    /// token is dropped: so that address spaces making VMAs write no line
    /// in common, and a VMA that outlives its address space and this arena
    /// (an old tree version freed after a grace period) still has its
    /// count to drop.
    pub(crate) fn account_vma(&self) -> VmaAcct {
        self.vmas.mine().clone()
    }

    /// Counts `delta` more reverse-map entries ([`PhysStats::rmap_entries`])
    /// in the calling thread's slot.
    pub(crate) fn account_rmap(&self, delta: i64) {
        self.rmap_entries.add(delta);
    }

    /// Current allocation counts. Objects freed after a grace period are
    /// counted until the grace period ends; [`PhysMem::quiesce`] waits for it.
    pub fn stats(&self) -> PhysStats {
        let used: i64 = self.shards.iter().map(|s| s.lock().used).sum();
        PhysStats {
            frames_total: self.desc.len() as u64,
            frames_used: used as u64,
            page_tables: self.page_tables.load(Ordering::Relaxed) as u64,
            vmas: self.vmas.iter().map(VmaAcct::others).sum::<usize>() as u64,
            rmap_entries: self.rmap_entries.sum() as u64,
        }
    }

    /// Runs deferred frees until no grace period is pending that would change
    /// [`PhysMem::stats`], or ten seconds have passed (a thread of the process
    /// that stays pinned holds every grace period back), and returns the stats.
    /// The calling thread's own callbacks (a writer's under
    /// [`crate::WriterPolicy::ShortOwnRcu`]) run too, its open batch closed
    /// whatever it holds; another live thread's wait for a later write
    /// section of it once its batch holds 32 frees, or its exit.
    pub fn quiesce(&self) -> PhysStats {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            crate::sync::rcu::reclaim_now();
            let now = self.stats();
            if (now.page_tables == 0 && now.vmas == 0) || std::time::Instant::now() > deadline {
                return now;
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }
}

/// One CPU slot's count of VMAs alive (Linux counts `vm_area_struct`s in
/// the slab's per-CPU caches): the reference count of a block of its own,
/// which every [`crate::vma::Vma`] made in the slot holds one reference of.
///
/// A VMA thus writes, when it is made and when it is dropped, the line of
/// the slot it was made in, which only the threads of that slot write; an
/// `Arc<PhysMem>` per VMA wrote the arena's reference count instead, one
/// line for every address space of the arena (2 shared writes per mmap +
/// munmap). The block outlives the arena if a VMA does: no VMA reaches the
/// arena through it. A copy of a VMA (a split piece, a merge) is counted
/// in the slot of the thread that makes it, as Linux's `vm_area_dup`
/// allocates from the calling CPU's slab: each block reaches its arena's
/// other blocks by weak references ([`VmaAcct::this_slot`]), so that a
/// thread that merges with or splits another thread's VMA writes no line of
/// that thread's slot.
#[derive(Clone)]
pub(crate) struct VmaAcct(std::sync::Arc<CachePadded<SlotVmas>>);

/// A [`VmaAcct`] block: its slot and its arena's blocks, by slot.
struct SlotVmas {
    slot: usize,
    /// Set once, when the arena made every block.
    siblings: std::sync::OnceLock<std::sync::Arc<[std::sync::Weak<CachePadded<SlotVmas>>]>>,
}

impl VmaAcct {
    /// One token per slot, each reaching the others, held by the arena.
    fn per_slot() -> crate::sync::percpu::PerCpu<VmaAcct> {
        let slots = crate::sync::percpu::PerCpu::from_fn(|slot| {
            VmaAcct(std::sync::Arc::new(CachePadded::new(SlotVmas { slot, siblings: Default::default() })))
        });
        let weak: std::sync::Arc<[_]> = slots.iter().map(|a| std::sync::Arc::downgrade(&a.0)).collect();
        for a in slots.iter() {
            let _ = a.0.siblings.set(weak.clone());
        }
        slots
    }

    /// The token of the calling thread's slot in this token's arena, for a
    /// copy made by this thread: a reference taken on this thread's own
    /// line. This token if it is that slot's, or if that slot's is gone
    /// (no arena and no VMA of the slot left).
    pub(crate) fn this_slot(&self) -> VmaAcct {
        let me = crate::sync::percpu::this_slot();
        if self.0.slot != me {
            let sibling = self.0.siblings.get().and_then(|s| s.get(me)).and_then(std::sync::Weak::upgrade);
            if let Some(s) = sibling {
                return VmaAcct(s);
            }
        }
        self.clone()
    }

    /// The references beyond the arena's: VMAs alive that were made in
    /// this slot.
    fn others(&self) -> usize {
        std::sync::Arc::strong_count(&self.0) - 1
    }

    /// Counts a write of this token's count in [`crate::sync::shared_write`]
    /// when the calling thread is not of its slot (a VMA dropped by
    /// another thread: the last version holding it freed there).
    pub(crate) fn note_write(&self) {
        if self.0.slot != crate::sync::percpu::this_slot() {
            crate::sync::shared_write(1);
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

    /// [`PhysMem::read`] from byte `off` of this frame (and the frames after
    /// it, for a huge page's head).
    #[inline]
    pub(crate) fn read(&self, off: usize, dst: &mut [u8]) {
        self.phys.read(self.pfn, off, dst)
    }

    /// [`PhysMem::write`] at byte `off` of this frame.
    #[inline]
    pub(crate) fn write(&self, off: usize, src: &[u8]) {
        self.phys.write(self.pfn, off, src)
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
mod tests;
