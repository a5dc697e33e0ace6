//! In-memory files (tmpfs-like) with a page cache, truncate and hole punch, and
//! the reverse map from a file to the address spaces that map it (`i_mmap`).
//!
//! # Locks
//!
//! `invalidate_lock` (Linux's `mapping->invalidate_lock`) is taken for read by
//! a fault that looks a page up and maps it, and for write by truncate and
//! hole punch around shrinking the file, zapping mappings and dropping pages,
//! so no fault can map a page that the shrink is about to drop. Order:
//! `mmap_lock` → `invalidate_lock` → page-cache lock → PTE lock. Truncate
//! takes `mmap_lock` under `invalidate_lock`, but only as a recursive reader
//! that enters beside any reader inside, even while a writer waits
//! (`AddressSpace::read_lock_recursive`, which retries a parked wait), and
//! no `mmap_lock` writer ever takes `invalidate_lock`, so the two orders
//! cannot deadlock.
//!
//! # Reverse map
//!
//! The file knows its mappers only through the [`Mapper`] trait, so that files
//! sit below address spaces: an address space links itself into the reverse
//! map of every file it maps and removes itself when it dies, and truncate and
//! hole punch ask each mapper to zap the file's pages.
//!
//! # Lifetime
//!
//! A [`File`] is the embedder's handle; the [`Inode`] it names is what
//! mappings hold, and the object behind a shared anonymous mapping has no
//! handle at all. The inode counts its uses, the handle and each VMA, and
//! the last one put evicts it (pages, commit charge, hugetlb reservations),
//! in the call that put it: a VMA's `Arc` only keeps the inode's memory, for
//! lock-free readers that still look at a removed VMA.

mod hugetlbfs;
pub(crate) mod interval_tree;

pub(crate) use hugetlbfs::HugetlbInode;

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use crate::sync::{AtomicU64, Mutex, Ordering, RwLock};

use crate::error::{Errno, Result};
use crate::host_file::{page_bytes, HostBacking};
use crate::phys::{FrameRef, Pfn, PhysMem, Placement, PG_DIRTY, PG_FILE, PG_HOST_FILE};
use crate::PAGE_SIZE;

/// Largest file size (Linux's `MAX_LFS_FILESIZE` on 64-bit).
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;

/// Something that maps files' pages and can zap them: an address space.
/// Linux's `i_mmap` tree holds VMAs; here it holds whole address spaces,
/// each of which finds its own VMAs of the file.
pub(crate) trait Mapper: Send + Sync {
    /// Zaps the mappings of file pages `[first, last)` of `file`, private
    /// COW copies too when `even_cows` (truncate), and finishes the TLB
    /// shootdown before returning. Called with `file`'s `invalidate_lock`
    /// held for write, so it may take `mmap_lock` only for read, recursively.
    fn unmap_file_range(&self, file: &Inode, first: u64, last: u64, even_cows: bool);

    /// Linux's `folio_mkclean` for this address space, for each page-cache
    /// page `(index, pfn)` of `pages`: write-protects (and marks clean)
    /// every writable entry of a shared mapping of `file` that maps it, and
    /// finishes the TLB shootdown before returning, so that no CPU stores
    /// into those pages again without a write fault, which marks the page
    /// dirty. Called with `file`'s `invalidate_lock` held for read, so it
    /// may take `mmap_lock` only for read, recursively.
    fn mkclean_file_pages(&self, file: &Inode, pages: &[(u64, Pfn)]);

    /// `file`, whose reverse map lists this mapper, is being dropped: the
    /// mapper forgets it (its own list of linked files, which its teardown
    /// walks), so that a file that lived and died while the mapper lives
    /// leaves nothing behind, as Linux frees a shmem inode at its last
    /// `munmap`. Called from the inode's drop, with no lock held.
    fn forget_file(&self, file: *const Inode);

    /// The mapper itself, for `AddressSpace::from_mapper`, the one place
    /// that turns a reverse-map entry back into the address space it is.
    fn as_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync>;
}

/// The identity of a mapper in the reverse map: its address, without the
/// vtable (two pointers to one object may carry different vtables).
fn mapper_id(m: *const dyn Mapper) -> *const () {
    m.cast()
}

/// A tmpfs-like in-memory file: the handle an embedder holds. The file
/// exists while a handle does (as a file with a name does on Linux, open or
/// not): its pages stay, mapped or not, and it can be opened again
/// ([`OpenFile::new`]). When the last handle is dropped and no mapping is
/// left, its pages, commit charge and hugetlb reservations go at once (an
/// unlinked file's last close or `munmap`).
pub struct File {
    inode: Arc<Inode>,
}

/// What a [`File`] names and its mappings hold: the page cache, the size,
/// the reverse map (Linux's `struct inode` with its `address_space`).
///
/// Its memory lives as long as anything points to it, a VMA that lock-free
/// readers may still see after its removal included; its contents live as
/// long as it is in use: `users` counts the handle (while one exists) and
/// every VMA that maps it (taken when the VMA is made, put when the VMA is
/// removed: Linux's `vm_file` reference, which `remove_vma` drops), and the
/// last put evicts it ([`Inode::iput`]). Nothing can take a use again then:
/// only a handle or a live mapping, both counted, lead to new ones.
pub(crate) struct Inode {
    id: u64,
    name: String,
    pub(crate) phys: Arc<PhysMem>,
    inner: Mutex<FileInner>,
    pub(crate) invalidate_lock: RwLock<()>,
    i_mmap: Mutex<Vec<Weak<dyn Mapper>>>,
    /// Pages charged to the commit limit for this object (a shared
    /// anonymous mapping's, Linux's `shmem_acct_size`), returned when it
    /// is evicted.
    pub(crate) shmem_acct: AtomicU64,
    /// The host file the pages come from and go back to, if any
    /// ([`File::from_host`], `crate::host_file`).
    host: Option<HostBacking>,
    /// For the file behind [`crate::AddressSpace::mmap_host`]: the
    /// embedder's memory its pages are (`crate::host_mem`); its page cache
    /// stays empty.
    pub(crate) host_mem: Option<crate::host_mem::HostMem>,
    /// For a host file with coherent shared mappings
    /// (`HostFileCoherence::Shared`, which set `has_windows`): the size
    /// their TLB fills see besides the host's, lowered by a shrinking
    /// [`Inode::set_len`] before the host file shrinks (`u64::MAX` when
    /// the host's size alone counts).
    pub(crate) window_size: AtomicU64,
    /// A coherent shared mapping of this host file was made.
    pub(crate) has_windows: crate::sync::AtomicBool,
    /// The `FOLL_PIN` pins of a host file's pages taken through its
    /// coherent windows, one count for all of them
    /// (`crate::host_mem::PinCounts`).
    pub(crate) host_pins: Arc<crate::host_mem::PinCounts>,
    /// For a file of huge pages (hugetlbfs, or the file behind an anonymous
    /// `MAP_HUGETLB` mapping): its reserve map. Its page cache is then
    /// indexed in 2 MiB pages and holds each page's head frame.
    pub(crate) hugetlb: Option<HugetlbInode>,
    /// For a device inode (`AddressSpace::mmap_io`): the device whose
    /// registers its mappings are (`crate::mmio`); it has no page cache.
    pub(crate) mmio: Option<crate::mmio::DeviceSlot>,
    /// Pages written back to the host so far ([`File::pages_written_back`]).
    written_back: AtomicU64,
    /// The handle, while one exists, and the VMAs that map the inode
    /// (Linux's `i_count` and the `vm_file` references, as one count).
    users: AtomicU64,
}

struct FileInner {
    size: u64,
    pages: BTreeMap<u64, Pfn>,
    /// Set by [`Inode::evict`]: no page enters the page cache again (a
    /// lock-free fault on a VMA removed before the eviction may still try).
    evicted: bool,
}

impl std::fmt::Debug for Inode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "File({} {:?})", self.id, self.name)
    }
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inode.fmt(f)
    }
}

impl File {
    /// The most bytes one read or write moves (Linux's `MAX_RW_COUNT`).
    pub const MAX_RW_COUNT: usize = (i32::MAX as usize) & !(PAGE_SIZE as usize - 1);

    /// A file of `size` bytes, all zero (no page allocated until written):
    /// Linux's `memfd_create` followed by `ftruncate(size)`, so `EINVAL` for
    /// a size that is negative as an `off_t` (above `i64::MAX`).
    pub fn create(phys: &Arc<PhysMem>, name: &str, size: u64) -> Result<Arc<File>> {
        if size > MAX_FILE_SIZE {
            return Err(Errno::Inval);
        }
        Ok(File::named(Inode::new(phys, name, size, None)))
    }

    /// A file whose pages come from the host file `host` (a regular file,
    /// else `ENODEV`), named `name` in the maps: its size is the host
    /// file's, a page-cache miss reads the page from the host, and dirty
    /// pages (shared writable mappings, [`File::write_at`]) are written back
    /// on [`File::sync`], `msync(MS_SYNC)` and when the file goes (its last
    /// handle dropped and its last mapping unmapped); truncate
    /// and hole punch apply to the host file at once. What the file may do
    /// is the host descriptor's access mode: an `O_RDONLY` one refuses
    /// writes (`EBADF`), truncation (`EINVAL`) and, through
    /// [`OpenFile::from_host`], shared writable mappings (`EACCES`).
    /// A `MAP_SHARED` mapping of it is the host's own shared mapping under
    /// the default [`HostFileCoherence::Shared`](crate::HostFileCoherence),
    /// which sees others' changes at once; under `Cache`, and for private
    /// mappings, changes made to the host file by others meanwhile are not
    /// seen for pages already cached. See `crate::host_file`.
    ///
    /// ```
    /// # use softmm::{AddressSpace, Cpu, File, MmConfig, OpenFile, PhysConfig, PhysMem, uapi::*};
    /// # use std::io::Write;
    /// let path = std::env::temp_dir().join(format!("softmm-doc-{}", std::process::id()));
    /// std::fs::write(&path, b"\x7fELF").unwrap();
    /// let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    /// let elf = OpenFile::from_host(&phys, std::fs::File::open(&path).unwrap(), "a.out").unwrap();
    /// let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    /// let text = mm.mmap(0, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE, Some(&elf), 0).unwrap();
    /// let mut cpu = Cpu::attached(&mm);
    /// assert_eq!(cpu.fetch_u32(text).unwrap(), u32::from_le_bytes(*b"\x7fELF"));
    /// // Read-only on the host: no shared writable mapping.
    /// assert!(mm.mmap(0, 4096, PROT_WRITE, MAP_SHARED, Some(&elf), 0).is_err());
    /// # std::fs::remove_file(&path).unwrap();
    /// ```
    pub fn from_host(phys: &Arc<PhysMem>, host: std::fs::File, name: &str) -> Result<Arc<File>> {
        let (backing, size) = HostBacking::new(host)?;
        let mut inode = Inode::new(phys, name, size.min(MAX_FILE_SIZE), None);
        inode.host = Some(backing);
        Ok(File::named(inode))
    }

    /// A file backed like [`File::from_host`] but by `size` bytes in
    /// memory (the loom model of writeback has no host I/O).
    #[cfg(all(test, loom))]
    pub(crate) fn with_memory_backing(phys: &Arc<PhysMem>, name: &str, size: u64) -> Arc<File> {
        let mut inode = Inode::new(phys, name, size, None);
        inode.host = Some(HostBacking::memory(size));
        File::named(inode)
    }

    /// The handle of `inode`, a new one: the file's first use.
    pub(crate) fn named(inode: Inode) -> Arc<File> {
        inode.users.store(1, Ordering::Relaxed);
        Arc::new(File { inode: Arc::new(inode) })
    }

    /// What the file names, for what maps it.
    pub(crate) fn inode(&self) -> &Arc<Inode> {
        &self.inode
    }

    /// Linux's `fsync`: writes every dirty page of a host-backed file back
    /// to the host, then `fdatasync`s it. `Ok` at once for an in-memory file
    /// or a host file opened read-only (it cannot have dirty pages). `EIO`
    /// if the host refuses a write (the pages that were not written stay
    /// dirty, to be tried again).
    ///
    /// A page is written only if it was written since it was last written
    /// back: writeback marks it clean and write-protects its shared
    /// mappings, so the next store through one faults and marks it dirty
    /// again ([`File::pages_written_back`] counts the pages written).
    pub fn sync(&self) -> Result<()> {
        self.inode.sync()
    }

    /// Pages of this file written back to the host so far (by
    /// [`File::sync`], `msync(MS_SYNC)`): each page once per writeback
    /// that found it dirty. 0 for an in-memory file.
    pub fn pages_written_back(&self) -> u64 {
        self.inode.pages_written_back()
    }

    /// Unique id (used as the inode number in maps).
    pub fn id(&self) -> u64 {
        self.inode.id()
    }

    /// The name shown in maps.
    pub fn name(&self) -> &str {
        self.inode.name()
    }

    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.inode.len()
    }

    /// True if the file is empty.
    pub fn is_empty(&self) -> bool {
        self.inode.is_empty()
    }

    /// Pages in the page cache.
    pub fn cached_pages(&self) -> usize {
        self.inode.cached_pages()
    }

    /// True if page `index` is in the page cache (what mincore reports).
    pub fn is_cached(&self, index: u64) -> bool {
        self.inode.is_cached(index)
    }

    /// Reads from `offset` into `buf`, as Linux's `pread` on a tmpfs file:
    /// returns the bytes read, short at the end of the file and at most
    /// [`File::MAX_RW_COUNT`]; `Ok(0)` at or past the end. `EINVAL` (nothing
    /// read) for an offset that is negative as an `off_t` (above `i64::MAX`)
    /// or an `offset + buf.len()` beyond `i64::MAX`.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        self.inode.read_at(offset, buf)
    }

    /// Writes at `offset` (`EINVAL` on a hugetlbfs file, which has no
    /// `write`), growing the file like Linux's `pwrite` on a tmpfs file does: at most [`File::MAX_RW_COUNT`] bytes; the size grows with
    /// each page written, so running out of memory part way gives a short
    /// write (the bytes written so far) and leaves the size covering only
    /// those; `ENOMEM` if nothing could be written. `EINVAL` (nothing
    /// written) for an offset that is negative as an `off_t` (above
    /// `i64::MAX`) or an `offset + data.len()` beyond `i64::MAX`, checked
    /// first even for an empty write; then an empty write returns `Ok(0)`.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<usize> {
        self.inode.write_at(offset, data)
    }

    /// Sets the size (`ftruncate`); on a hugetlbfs file see
    /// [`File::create_hugetlbfs`] (`EINVAL` unless 2 MiB aligned). Shrinking zaps every mapping of the pages
    /// past the new end — private COW copies too, as Linux does — and drops
    /// them from the page cache; an access there then raises SIGBUS.
    /// `EINVAL` for a size that is negative as an `off_t` (above `i64::MAX`).
    pub fn set_len(&self, size: u64) -> Result<()> {
        self.inode.set_len(size)
    }

    /// Frees the pages of `[offset, offset+len)` (`fallocate(PUNCH_HOLE|KEEP_SIZE)`;
    /// on a hugetlbfs file see [`File::fallocate`]):
    /// partial pages at the edges are zeroed, whole pages unmapped from shared
    /// mappings and dropped; private COW copies are kept, as in Linux. The
    /// size never changes. As Linux's `vfs_fallocate`: `EINVAL` for an
    /// offset that is negative as an `off_t` or a length that is zero or
    /// negative, then `EFBIG` when `offset + len` passes `i64::MAX`; nothing
    /// changes on an error.
    pub fn punch_hole(&self, offset: u64, len: u64) -> Result<()> {
        self.inode.punch_hole(offset, len)
    }
}

impl Inode {
    /// A new inode, in use by nothing yet: [`File::named`] gives it its
    /// handle, a mapping of an anonymous object its first VMA.
    pub(crate) fn new(phys: &Arc<PhysMem>, name: &str, size: u64, hugetlb: Option<HugetlbInode>) -> Inode {
        // The arena's reference count, which every file of the arena
        // writes when it is made and when it goes (as Linux's `new_inode`
        // and `evict` take the superblock's inode-list lock).
        crate::sync::shared_write(1);
        Inode {
            id: phys.next_id(),
            name: name.to_string(),
            phys: phys.clone(),
            inner: Mutex::new(FileInner { size, pages: BTreeMap::new(), evicted: false }),
            invalidate_lock: RwLock::new(()),
            i_mmap: Mutex::new(Vec::new()),
            shmem_acct: AtomicU64::new(0),
            host: None,
            host_mem: None,
            window_size: AtomicU64::new(u64::MAX),
            has_windows: crate::sync::AtomicBool::new(false),
            host_pins: Arc::default(),
            hugetlb,
            mmio: None,
            written_back: AtomicU64::new(0),
            users: AtomicU64::new(0),
        }
    }

    /// Takes a use for a new VMA that maps the inode (Linux's `get_file`
    /// of its `vm_file`). The caller holds a use already (the handle, or
    /// the VMA the new one is made from), or the inode is new: a use is
    /// never taken on an inode whose last use went.
    pub(crate) fn ihold(&self) {
        self.users.fetch_add(1, Ordering::Relaxed);
    }

    /// Puts a use (the handle's close, a removed VMA's `fput`); the last
    /// evicts the inode, as Linux's `iput_final` does an unlinked one.
    pub(crate) fn iput(&self) {
        // AcqRel: what every use did happens before the eviction.
        if self.users.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.evict();
        }
    }

    /// Linux's `evict` of an unlinked shmem or hugetlbfs inode
    /// (`shmem_evict_inode`, `hugetlbfs_evict_inode`): the last writeback
    /// of a host-backed file, then every page out of the page cache, the
    /// commit charge back and, for huge pages, `remove_inode_hugepages` with
    /// `hugetlb_unreserve_pages`. Once only.
    ///
    /// No mapping is left, so no fault that holds `mmap_lock` or a VMA's
    /// reference (every hugetlb fault) can run on the inode. A lock-free
    /// fault may still be on a VMA removed before this (found in a tree
    /// version it loaded earlier): a page it added before the eviction goes
    /// with the others, and after it `grab_page` adds none (it answers as
    /// past the end of file, and the fault, whose VMA is detached, falls
    /// back to `mmap_lock` and finds no mapping). Either way its commit
    /// fails, because the VMA is detached, and its own reference goes.
    fn evict(&self) {
        // Into the host's page cache without waiting for its disk; nobody
        // is left to report an error to, as for Linux's writeback after the
        // last close.
        let _ = self.writeback(false);
        let pages = {
            let mut inner = self.inner.lock();
            if std::mem::replace(&mut inner.evicted, true) {
                return;
            }
            std::mem::take(&mut inner.pages)
        };
        let freed = pages.len() as u64;
        for (_, p) in pages {
            // The page cache's reference; a page still mapped (an exiting
            // address space frees its page tables after this) goes with
            // its last entry.
            drop(FrameRef::from_raw(&self.phys, p));
        }
        self.phys.vm_unacct_memory(self.shmem_acct.swap(0, Ordering::Relaxed));
        if let Some(resv) = &self.hugetlb {
            resv.unreserve(&self.phys, 0, u64::MAX, freed);
        }
        if let Some(mem) = &self.host_mem {
            mem.retire();
        }
        if let Some(device) = &self.mmio {
            device.release();
        }
    }

    /// The little-endian `u64` at `offset` of the memory backing (what
    /// writeback wrote), and whether page-cache page `offset / PAGE_SIZE`
    /// is dirty (`None` if not cached).
    #[cfg(all(test, loom))]
    pub(crate) fn backing_u64_and_dirty(&self, offset: u64) -> (u64, Option<bool>) {
        let mut b = [0; 8];
        self.host.as_ref().expect("memory backing").memory_bytes(offset, &mut b);
        let inner = self.inner.lock();
        let dirty = inner
            .pages
            .get(&(offset / PAGE_SIZE))
            .map(|&p| self.phys.desc(p).flags.load(Ordering::Relaxed) & PG_DIRTY != 0);
        (u64::from_le_bytes(b), dirty)
    }

    /// [`File::sync`].
    pub(crate) fn sync(&self) -> Result<()> {
        if let Some(mem) = &self.host_mem {
            // A window onto a host file: its pages are the host's.
            return mem.sync();
        }
        self.writeback(true)
    }

    /// The host file behind a host-backed file, `None` for any other.
    pub(crate) fn host_backing(&self) -> Option<&HostBacking> {
        self.host.as_ref()
    }

    /// [`File::pages_written_back`].
    pub(crate) fn pages_written_back(&self) -> u64 {
        self.written_back.load(Ordering::Relaxed)
    }

    /// `writepages`, then `fdatasync` when `wait`, for a host-backed,
    /// writable file, as Linux's `write_cache_pages` does it per page:
    /// `folio_clear_dirty_for_io` (clear the dirty flag, then
    /// `folio_mkclean` every mapping), then copy and write.
    ///
    /// Why no store is lost without Linux's page lock: the flag is cleared
    /// under the page-cache lock, before the write-protect and its
    /// shootdown, and the copy is taken after them. A store that lands
    /// before the shootdown completes is in the copy. A store after it goes
    /// through an entry made writable by a write fault after the
    /// write-protect, and every path that makes an entry writable or writes
    /// the page marks the page dirty after doing so (the shared fault after
    /// installing the entry, the write-protect fault under the entry's
    /// lock, `write_at` after its copy and under the page-cache lock with
    /// its size update, a forced write after its copy): so the page is
    /// dirty again and the next writeback writes it. A device writes
    /// through a pin without any entry; the unpin of a write pin marks the
    /// page dirty after those writes, so they are written by the writeback
    /// that follows the unpin (one during the pin may miss them).
    fn writeback(&self, wait: bool) -> Result<()> {
        let Some(host) = self.host.as_ref().filter(|h| h.writable) else { return Ok(()) };
        // No CPU of this thread holds a translation this depends on: the
        // write-protect's shootdown must not wait for them.
        let _q = crate::tlb::QuiescentGuard::enter();
        // Truncate and hole punch excluded: no page leaves the cache, and the
        // host file does not shrink under the writes below.
        let _inval = self.invalidate_lock.read();
        // folio_clear_dirty_for_io, first half: the pages to write, taken
        // clean, each with a reference and its bytes below the end of file.
        let dirty: Vec<(u64, FrameRef<'_>, usize)> = {
            let inner = self.inner.lock();
            let mut v = Vec::new();
            for (&index, &p) in &inner.pages {
                let n = page_bytes(index, inner.size);
                let flags = &self.phys.desc(p).flags;
                if n == 0 || flags.load(Ordering::Relaxed) & PG_DIRTY == 0 {
                    continue;
                }
                if !broken::clear_after_copy() {
                    // Acquire: a device's writes through a pin are ordered
                    // before the unpin's release of the flag, not by this
                    // lock (`pin::set_page_dirty`).
                    flags.fetch_and(!PG_DIRTY, Ordering::Acquire);
                }
                v.push((index, self.phys.get(p), n));
            }
            v
        };
        if dirty.is_empty() {
            return if wait { host.sync_data() } else { Ok(()) };
        }
        // Second half: folio_mkclean through the reverse map.
        let pages: Vec<(u64, Pfn)> = dirty.iter().map(|(i, p, _)| (*i, p.pfn())).collect();
        for mm in self.mappers().into_iter().filter(|_| !broken::skip_mkclean()) {
            mm.mkclean_file_pages(self, &pages);
        }
        // On the heap: writeback may run on a small stack (a loom thread,
        // the eviction at the last close or munmap).
        let mut buf = vec![0u8; PAGE_SIZE as usize];
        let mut result = Ok(());
        for (index, page, n) in &dirty {
            if result.is_err() {
                // Not written: dirty again, for the next writeback.
                page.desc().flags.fetch_or(PG_DIRTY, Ordering::Relaxed);
                continue;
            }
            // `n` bytes of a page-cache page, kept by the reference `page`.
            page.read(0, &mut buf[..*n]);
            if broken::clear_after_copy() {
                page.desc().flags.fetch_and(!PG_DIRTY, Ordering::Relaxed);
            }
            result = host.write(index * PAGE_SIZE, &buf[..*n]);
            match result {
                Ok(()) => {
                    self.written_back.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {
                    page.desc().flags.fetch_or(PG_DIRTY, Ordering::Relaxed);
                }
            }
        }
        result?;
        if wait {
            host.sync_data()?;
        }
        Ok(())
    }

    /// Linux's `mapping_can_writeback`: the file's dirty pages are written
    /// back somewhere (a host-backed file), so its shared writable mappings
    /// need dirty tracking; an in-memory file is shmem, which has nowhere
    /// to write them.
    pub(crate) fn can_writeback(&self) -> bool {
        self.host.is_some()
    }

    /// The host file's access mode (readable, writable), for a host-backed
    /// file; `None` for an in-memory one.
    pub(crate) fn host_mode(&self) -> Option<(bool, bool)> {
        self.host.as_ref().map(|h| (h.readable, h.writable))
    }

    /// [`File::id`].
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// [`File::name`].
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// [`File::len`].
    pub(crate) fn len(&self) -> u64 {
        self.inner.lock().size
    }

    /// [`File::is_empty`].
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// [`File::cached_pages`].
    pub(crate) fn cached_pages(&self) -> usize {
        self.inner.lock().pages.len()
    }

    /// [`File::is_cached`].
    pub(crate) fn is_cached(&self, index: u64) -> bool {
        self.inner.lock().pages.contains_key(&index)
    }

    /// The cached page at `index`, if any, with a reference for the caller.
    pub(crate) fn find_get_page(&self, index: u64) -> Option<FrameRef<'_>> {
        let inner = self.inner.lock();
        Some(self.phys.get(*inner.pages.get(&index)?))
    }

    /// The page at `index`, allocating a zeroed one for a hole (tmpfs), with a
    /// reference for the caller. `Ok(None)` past the end of the file (SIGBUS).
    /// Callers hold `invalidate_lock` for read.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn get_page(&self, index: u64) -> std::result::Result<Option<FrameRef<'_>>, Errno> {
        self.grab_page(index, false, &Placement::LOCAL)
    }

    /// [`Inode::get_page`], a new page going where `at` says (the faulting
    /// VMA's or address space's memory policy).
    pub(crate) fn get_page_at(&self, index: u64, at: &Placement) -> std::result::Result<Option<FrameRef<'_>>, Errno> {
        self.grab_page(index, false, at)
    }

    /// [`Inode::get_page`], past the end of the file too when `beyond_eof`
    /// (a write about to extend it).
    fn grab_page(
        &self,
        index: u64,
        beyond_eof: bool,
        at: &Placement,
    ) -> std::result::Result<Option<FrameRef<'_>>, Errno> {
        let mut inner = self.inner.lock();
        if inner.evicted || (!beyond_eof && index >= inner.size.div_ceil(PAGE_SIZE)) {
            return Ok(None);
        }
        let pfn = match inner.pages.get(&index) {
            Some(&p) => p,
            None => {
                let page = self.phys.alloc_zeroed_at(at).ok_or(Errno::NoMem)?;
                if let Some(host) = &self.host {
                    // read_folio: the host's bytes below the file's end.
                    let mut buf = [0u8; PAGE_SIZE as usize];
                    let n = page_bytes(index, inner.size);
                    host.read(index * PAGE_SIZE, &mut buf[..n])?;
                    page.write(0, &buf[..n]);
                }
                let d = page.desc();
                let host = if self.can_writeback() { PG_HOST_FILE } else { 0 };
                d.flags.store(PG_FILE | host, Ordering::Relaxed);
                d.mapping.store(self.id, Ordering::Relaxed);
                d.index.store(index, Ordering::Relaxed);
                // The page cache keeps the allocation's reference.
                let p = page.into_raw();
                inner.pages.insert(index, p);
                p
            }
        };
        Ok(Some(self.phys.get(pfn)))
    }

    /// Adds the huge page `page` at huge index `index` of a hugetlb file's
    /// page cache, which takes a reference of its own (Linux's
    /// `hugetlb_add_to_page_cache`). `false`, nothing added, if a page is
    /// already there. Callers hold the file's hugetlb fault mutex.
    pub(crate) fn add_huge_page(&self, index: u64, page: &FrameRef<'_>) -> bool {
        debug_assert!(self.hugetlb.is_some(), "a huge page in a file of small pages");
        let mut inner = self.inner.lock();
        // Every hugetlb fault holds `mmap_lock` or its VMA's reference, and
        // `fallocate` the handle: each keeps the inode in use.
        debug_assert!(!inner.evicted, "a huge page added to an evicted inode");
        if inner.pages.contains_key(&index) {
            return false;
        }
        let d = page.desc();
        d.flags.store(PG_FILE, Ordering::Relaxed);
        d.mapping.store(self.id, Ordering::Relaxed);
        d.index.store(index, Ordering::Relaxed);
        inner.pages.insert(index, self.phys.get(page.pfn()).into_raw());
        true
    }

    /// [`File::read_at`].
    pub(crate) fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let count = rw_verify_area(offset, buf.len())?;
        if self.hugetlb.is_some() {
            return Ok(self.hugetlbfs_read_at(offset, count, buf));
        }
        let inner = self.inner.lock();
        // No overflow: rw_verify_area bounds offset + count by i64::MAX.
        let end = inner.size.min(offset + count as u64);
        let mut pos = offset;
        while pos < end {
            let in_page = (pos % PAGE_SIZE) as usize;
            let n = ((PAGE_SIZE - pos % PAGE_SIZE).min(end - pos)) as usize;
            let dst = &mut buf[(pos - offset) as usize..][..n];
            match inner.pages.get(&(pos / PAGE_SIZE)) {
                // `n` stops at the page end.
                Some(&p) => self.phys.read(p, in_page, dst),
                // Not cached: the host file has the bytes (all changes to
                // it go through the cache's writeback, truncate or punch).
                None => match &self.host {
                    Some(host) => host.read(pos, dst)?,
                    None => dst.fill(0),
                },
            }
            pos += n as u64;
        }
        Ok(end.saturating_sub(offset) as usize)
    }

    /// [`File::write_at`].
    pub(crate) fn write_at(&self, offset: u64, data: &[u8]) -> Result<usize> {
        // vfs_write: a file not opened for writing, first.
        if self.host.as_ref().is_some_and(|h| !h.writable) {
            return Err(Errno::BadF);
        }
        if self.hugetlb.is_some() {
            // hugetlbfs has no write_iter: vfs_write says EINVAL next.
            return Err(Errno::Inval);
        }
        let mut count = rw_verify_area(offset, data.len())?;
        if count == 0 {
            return Ok(0);
        }
        // generic_write_check_limits: cannot fail or shorten the write once
        // rw_verify_area has bounded offset + count by MAX_FILE_SIZE, but kept
        // in Linux's order so a lower size limit would behave as Linux's.
        if offset >= MAX_FILE_SIZE {
            return Err(Errno::FBig);
        }
        count = count.min((MAX_FILE_SIZE - offset) as usize);
        let end = offset + count as u64;
        let _q = crate::tlb::QuiescentGuard::enter();
        // Held for read: no truncate runs between a page's allocation beyond
        // the old end and the size update that covers it.
        let _inval = self.invalidate_lock.read();
        let mut pos = offset;
        while pos < end {
            let in_page = (pos % PAGE_SIZE) as usize;
            let n = ((PAGE_SIZE - pos % PAGE_SIZE).min(end - pos)) as usize;
            let page = match self.grab_page(pos / PAGE_SIZE, true, &Placement::LOCAL) {
                Ok(p) => p.expect("allowed beyond the end"),
                Err(e) if pos == offset => return Err(e),
                Err(_) => break,
            };
            // The reference `page` keeps the page this file's until it is
            // dropped below.
            page.write(in_page, &data[(pos - offset) as usize..][..n]);
            pos += n as u64;
            let mut inner = self.inner.lock();
            inner.size = inner.size.max(pos);
            // To be written back (a host-backed file's writeback reads it),
            // marked after the copy and under the page-cache lock with the
            // size that covers it: a writeback that clears the flag (under
            // the same lock) either sees it set and the new size, or sees it
            // clear and leaves the page dirty for the next one.
            page.desc().flags.fetch_or(PG_DIRTY, Ordering::Relaxed);
            drop(inner);
            drop(page);
        }
        Ok((pos - offset) as usize)
    }

    /// [`File::set_len`].
    pub(crate) fn set_len(&self, size: u64) -> Result<()> {
        if size > MAX_FILE_SIZE {
            return Err(Errno::Inval);
        }
        if self.hugetlb.is_some() {
            return self.hugetlbfs_set_len(size);
        }
        if let Some(host) = &self.host {
            // do_ftruncate's checks, and the host file's new size before
            // anything here changes; for coherent mappings of it, no
            // translation may reach past the new end once the host's pages
            // go (the host's SIGBUS): first `window_size`, which their fills
            // check, then a shootdown of every address space that maps one
            // (`unmap_file_range`), then the host's truncation.
            let shrink = self.has_windows.load(Ordering::Acquire) && size < self.len();
            if shrink {
                let _q = crate::tlb::QuiescentGuard::enter();
                let _inval = self.invalidate_lock.write();
                self.window_size.store(size, Ordering::SeqCst);
                self.unmap_mapping_range(size.div_ceil(PAGE_SIZE), u64::MAX, true);
            }
            let res = host.set_len(size);
            if shrink {
                // The host's size alone counts again.
                self.window_size.store(u64::MAX, Ordering::SeqCst);
            }
            res?;
        }
        let _q = crate::tlb::QuiescentGuard::enter();
        let _inval = self.invalidate_lock.write();
        let old = {
            let mut inner = self.inner.lock();
            std::mem::replace(&mut inner.size, size)
        };
        if size < old {
            let first = size.div_ceil(PAGE_SIZE);
            self.unmap_mapping_range(first, u64::MAX, true);
            self.drop_pages(first, u64::MAX);
            // Zero the tail of the last partial page, like truncate_inode_pages.
            if size % PAGE_SIZE != 0 {
                if let Some(&p) = self.inner.lock().pages.get(&(size / PAGE_SIZE)) {
                    let tail = PAGE_SIZE - size % PAGE_SIZE;
                    // From the size's offset to the end of the page.
                    self.phys.fill(p, (size % PAGE_SIZE) as usize, 0, tail as usize);
                }
            }
        }
        Ok(())
    }

    /// [`File::punch_hole`].
    pub(crate) fn punch_hole(&self, offset: u64, len: u64) -> Result<()> {
        if (offset as i64) < 0 || (len as i64) <= 0 {
            return Err(Errno::Inval);
        }
        if self.hugetlb.is_some() {
            return self.fallocate(crate::uapi::FALLOC_FL_PUNCH_HOLE | crate::uapi::FALLOC_FL_KEEP_SIZE, offset, len);
        }
        let end = (offset as i64).checked_add(len as i64).ok_or(Errno::FBig)? as u64;
        if let Some(host) = &self.host {
            // vfs_fallocate's `EBADF`, then the host's hole, so that a page
            // read again later is read as a hole.
            host.punch_hole(offset, len)?;
        }
        let _q = crate::tlb::QuiescentGuard::enter();
        let _inval = self.invalidate_lock.write();
        let first = offset.div_ceil(PAGE_SIZE);
        let last = end / PAGE_SIZE;
        // Zero partial edge pages in place.
        let inner = self.inner.lock();
        for (lo, hi) in [(offset, (first * PAGE_SIZE).min(end)), ((last * PAGE_SIZE).max(offset), end)] {
            if lo < hi {
                if let Some(&p) = inner.pages.get(&(lo / PAGE_SIZE)) {
                    // `[lo, hi)` lies in one page (each edge stops at a page
                    // boundary).
                    self.phys.fill(p, (lo % PAGE_SIZE) as usize, 0, (hi - lo) as usize);
                }
            }
        }
        drop(inner);
        if first < last {
            self.unmap_mapping_range(first, last, false);
            self.drop_pages(first, last);
        }
        Ok(())
    }

    fn drop_pages(&self, first: u64, last: u64) {
        let dropped: Vec<Pfn> = {
            let mut inner = self.inner.lock();
            let keys: Vec<u64> = inner.pages.range(first..last).map(|(&k, _)| k).collect();
            keys.into_iter().filter_map(|k| inner.pages.remove(&k)).collect()
        };
        for p in dropped {
            // The page cache's reference, kept since `grab_page`.
            drop(FrameRef::from_raw(&self.phys, p));
        }
    }

    /// Zaps file pages `[first, last)` from every address space mapping them;
    /// `even_cows` also zaps private COW copies.
    ///
    /// A `fork` copies the entries of a private file mapping into a child it
    /// first records here, both under the parent's `mmap_lock`, which the
    /// parent's zap also takes. So a child missing from one snapshot of the
    /// list was forked either after its parent's zap (and copied nothing to
    /// zap) or before it, and is then in the list the next time it is read:
    /// the walk repeats until a pass finds no address space it has not
    /// visited. (Linux walks the file's VMA tree under `i_mmap_rwsem`, which
    /// `dup_mmap` takes to link the child's VMAs.)
    fn unmap_mapping_range(&self, first: u64, last: u64, even_cows: bool) {
        let mut visited: Vec<Arc<dyn Mapper>> = Vec::new();
        loop {
            let fresh: Vec<Arc<dyn Mapper>> = {
                let list = self.i_mmap.lock();
                list.iter()
                    .filter_map(Weak::upgrade)
                    .filter(|m| !visited.iter().any(|v| mapper_id(Arc::as_ptr(v)) == mapper_id(Arc::as_ptr(m))))
                    .collect()
            };
            if fresh.is_empty() {
                return;
            }
            for mm in &fresh {
                mm.unmap_file_range(self, first, last, even_cows);
            }
            visited.extend(fresh);
        }
    }

    /// The address spaces mapping this file now (a snapshot of `i_mmap`).
    pub(crate) fn mappers(&self) -> Vec<Arc<dyn Mapper>> {
        self.i_mmap.lock().iter().filter_map(Weak::upgrade).collect()
    }

    /// Replaces page-cache page `page` (the migrator's reference) at
    /// `index` by `new` for migration (Linux's `folio_migrate_mapping`
    /// under the mapping's lock), after copying it into `new`, all under
    /// the page cache's lock: `false`, with nothing copied or changed, if
    /// `index` no longer holds the page (truncated meanwhile) or the page
    /// does not freeze once `flushed` (a pin, or references besides the
    /// page cache's and the migrator's: a `write` or a fault holding it,
    /// Linux's refcount freeze fails). `read_at` reads under the same lock,
    /// and a writer or a fault takes its reference under it, so none sees
    /// the old page after the switch.
    pub(crate) fn migrate_page(
        &self,
        index: u64,
        page: &FrameRef<'_>,
        new: &FrameRef<'_>,
        flushed: &crate::phys::TlbFlushed,
    ) -> bool {
        let mut inner = self.inner.lock();
        let old = page.pfn();
        if inner.pages.get(&index) != Some(&old) {
            return false;
        }
        let Some(frozen) = crate::phys::FrozenPage::freeze_cached(page, flushed, &inner) else { return false };
        frozen.copy_to(new);
        // The page cache's reference moves from `old` to `new`.
        inner.pages.insert(index, self.phys.get(new.pfn()).into_raw());
        drop(FrameRef::from_raw(&self.phys, old));
        true
    }

    /// Whether this file's pages live only in its page cache: not a host
    /// file, host memory, a device or hugetlb (whose mappings keep to
    /// `mmap_lock` under the range writers, `mm/range.rs`).
    pub(crate) fn is_plain_memory(&self) -> bool {
        self.host.is_none() && self.host_mem.is_none() && self.hugetlb.is_none() && self.mmio.is_none()
    }

    /// Records that the mapper at `id` maps this file (the `i_mmap`
    /// reverse map), with the reference `mm` makes: `true` if it was not
    /// recorded yet (`mm` is called only then).
    pub(crate) fn add_mapping(&self, id: *const (), mm: impl FnOnce() -> Weak<dyn Mapper>) -> bool {
        let mut list = self.i_mmap.lock();
        if list.iter().any(|w| mapper_id(w.as_ptr()) == id) {
            return false;
        }
        list.push(mm());
        self.phys.account_rmap(1);
        true
    }

    /// Forgets the mapper at `mm` (an address space being torn down) in the
    /// reverse map.
    pub(crate) fn remove_mapping(&self, mm: *const dyn Mapper) {
        let mut list = self.i_mmap.lock();
        let before = list.len();
        list.retain(|w| mapper_id(w.as_ptr()) != mapper_id(mm));
        self.phys.account_rmap(list.len() as i64 - before as i64);
    }
}

/// Linux's `rw_verify_area` for a file without unsigned offsets, then the
/// `MAX_RW_COUNT` cap of `vfs_read`/`vfs_write`: the byte count to move.
/// `EINVAL` if `pos` is negative as an `off_t` or `pos + count` overflows it.
fn rw_verify_area(pos: u64, count: usize) -> Result<usize> {
    // A slice is at most isize::MAX bytes, so `count` is a valid ssize_t.
    let pos = i64::try_from(pos).map_err(|_| Errno::Inval)?;
    pos.checked_add(count as i64).ok_or(Errno::Inval)?;
    Ok(count.min(File::MAX_RW_COUNT))
}

impl Drop for File {
    fn drop(&mut self) {
        // The last handle: the name goes, and with it the inode's use.
        self.inode.iput();
    }
}

impl Drop for Inode {
    fn drop(&mut self) {
        // Address spaces that still list this inode died before it or no
        // longer map it (nothing else can hold an entry: a mapping holds
        // the inode); the live ones forget it.
        // The arena's reference count, dropped after this (`Inode::new`).
        crate::sync::shared_write(1);
        let me: *const Inode = self;
        let mappers = self.i_mmap.get_mut();
        self.phys.account_rmap(-(mappers.len() as i64));
        for m in mappers.drain(..).filter_map(|w| w.upgrade()) {
            m.forget_file(me);
        }
        // An inode nothing ever used (a shared anonymous mapping whose
        // `mmap` failed after making its object) is evicted here.
        if !self.inner.get_mut().evicted {
            self.evict();
        }
        if let Some(resv) = &self.hugetlb {
            // Entries of address spaces that died first (each removes its
            // own; none can be left by a live one, which holds the inode).
            self.phys.account_rmap(-(resv.vmas.len() as i64));
        }
    }
}

/// A file opened with an access mode, Linux's open file description (a
/// `struct file`): what `mmap` checks against the requested protection
/// (`EACCES`), and the identity a VMA keeps as its `vm_file`. Each
/// constructor call is a new open; a clone is the same open (as `dup` or a
/// forked child's descriptor is), so mappings of one open merge where Linux
/// merges them and mappings of two opens of one file never do.
#[derive(Clone, Debug)]
pub struct OpenFile {
    /// The file.
    pub file: Arc<File>,
    /// Opened for reading.
    pub readable: bool,
    /// Opened for writing.
    pub writable: bool,
    /// This open's identity (never 0, unique in the process).
    open: u64,
}

/// The next open's identity. A plain counter: only uniqueness matters.
static NEXT_OPEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl OpenFile {
    /// A new open of `file` with the given access mode; for a host-backed
    /// file ([`File::from_host`]) the mode is limited to the host
    /// descriptor's (an `O_RDONLY` host file is never opened writable).
    pub fn new(file: &Arc<File>, readable: bool, writable: bool) -> OpenFile {
        let open = NEXT_OPEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (readable, writable) = match file.inode.host_mode() {
            Some((r, w)) => (readable && r, writable && w),
            None => (readable, writable),
        };
        OpenFile { file: file.clone(), readable, writable, open }
    }

    /// [`File::from_host`] opened with the host descriptor's access mode:
    /// what `open(path, O_RDONLY or O_RDWR)` then `mmap` gives a process.
    /// `ENODEV` if `host` is not a regular file.
    pub fn from_host(phys: &Arc<PhysMem>, host: std::fs::File, name: &str) -> Result<OpenFile> {
        let file = File::from_host(phys, host, name)?;
        Ok(OpenFile::new(&file, true, true))
    }

    /// A new open of `file`, read-write.
    pub fn read_write(file: &Arc<File>) -> OpenFile {
        OpenFile::new(file, true, true)
    }

    /// A new open of `file`, read-only.
    pub fn read_only(file: &Arc<File>) -> OpenFile {
        OpenFile::new(file, true, false)
    }

    /// An open of `file` (a coherent window onto this open's host file)
    /// with this open's mode and identity, so that the VMAs mapping
    /// windows through it are one `vm_file`'s, as Linux merges them.
    pub(crate) fn view_of(&self, file: &Arc<File>) -> OpenFile {
        OpenFile { file: file.clone(), readable: self.readable, writable: self.writable, open: self.open }
    }

    /// This open's identity, for the VMAs that map through it.
    pub(crate) fn open_id(&self) -> u64 {
        self.open
    }
}

// The loom models' broken switches: `sync/broken.rs`.
pub(crate) use crate::sync::broken::writeback as broken;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::phys::PhysConfig;

    const PS: u64 = PAGE_SIZE;

    /// A tiny arena (15 usable frames) so leaks show up in `frames_used`.
    fn phys() -> Arc<PhysMem> {
        PhysMem::new(PhysConfig::new(64 << 10)).unwrap()
    }

    /// `len` bytes of the file from `offset`, and how many `read_at` reported.
    fn read(f: &File, offset: u64, len: usize) -> (usize, Vec<u8>) {
        let mut buf = vec![0xee; len];
        let n = f.read_at(offset, &mut buf).unwrap();
        (n, buf)
    }

    /// A file of three pages of `0xab`, every page cached.
    fn three_pages(phys: &Arc<PhysMem>) -> Arc<File> {
        let f = File::create(phys, "three", 0).unwrap();
        assert_eq!(f.write_at(0, &[0xab; 3 * PS as usize]).unwrap(), 3 * PS as usize);
        assert_eq!(f.cached_pages(), 3);
        f
    }

    #[test]
    fn create_is_sparse_and_reads_zero() {
        let p = phys();
        let f = File::create(&p, "sparse", 10_000).unwrap();
        assert_eq!((f.len(), f.is_empty(), f.name()), (10_000, false, "sparse"));
        assert_eq!(f.cached_pages(), 0, "no page until written");
        let (n, buf) = read(&f, 4000, 200);
        assert_eq!(n, 200);
        assert!(buf.iter().all(|&b| b == 0));
        assert_eq!(f.cached_pages(), 0, "reading a hole does not allocate");
        assert_eq!(p.stats().frames_used, 0);
        let g = File::create(&p, "other", 0).unwrap();
        assert!(g.is_empty());
        assert_ne!(f.id(), g.id());
    }

    #[test]
    fn create_above_max_file_size_is_einval_like_ftruncate() {
        let p = phys();
        assert_eq!(File::create(&p, "big", MAX_FILE_SIZE + 1).unwrap_err(), Errno::Inval);
        assert_eq!(File::create(&p, "max", MAX_FILE_SIZE).unwrap().len(), MAX_FILE_SIZE);
    }

    #[test]
    fn write_then_read_round_trips_across_a_page_boundary() {
        let p = phys();
        let f = File::create(&p, "f", 0).unwrap();
        let data: Vec<u8> = (0..100u8).collect();
        assert_eq!(f.write_at(PS - 40, &data).unwrap(), 100);
        assert_eq!(f.len(), PS + 60, "pwrite grows the file to the end of the write");
        assert!(!f.is_cached(2) && f.is_cached(0) && f.is_cached(1));
        assert_eq!(f.cached_pages(), 2);
        assert_eq!(p.stats().frames_used, 2);
        let (n, buf) = read(&f, PS - 40, 100);
        assert_eq!(n, 100);
        assert_eq!(buf, data);
        // The bytes before the write are zero, not whatever the frame held.
        let (n, buf) = read(&f, 0, 8);
        assert_eq!((n, buf), (8, vec![0; 8]));
        // Overwriting in place allocates nothing and does not shrink the file.
        f.write_at(0, b"xy").unwrap();
        assert_eq!((f.len(), f.cached_pages()), (PS + 60, 2));
        assert_eq!(read(&f, 0, 3).1, b"xy\0");
    }

    #[test]
    fn reads_stop_at_end_of_file() {
        let p = phys();
        let f = File::create(&p, "f", 0).unwrap();
        f.write_at(0, &[7; 100]).unwrap();
        let (n, buf) = read(&f, 90, 20);
        assert_eq!(n, 10, "a short read at EOF");
        assert_eq!(buf[..10], [7; 10]);
        assert_eq!(buf[10..], [0xee; 10], "nothing written past what was read");
        assert_eq!(read(&f, 100, 4).0, 0);
        assert_eq!(read(&f, 1 << 40, 4), (0, vec![0xee; 4]));
        assert_eq!(read(&f, MAX_FILE_SIZE - 4, 4).0, 0, "up to the largest offset is just EOF");
        // pread: a negative offset or an offset + len past i64::MAX is EINVAL.
        let mut buf = [0xee; 4];
        assert_eq!(f.read_at(u64::MAX, &mut buf), Err(Errno::Inval));
        assert_eq!(f.read_at(MAX_FILE_SIZE - 3, &mut buf), Err(Errno::Inval));
        assert_eq!(buf, [0xee; 4], "nothing read on an error");
    }

    #[test]
    fn write_past_max_file_size_is_einval() {
        let p = phys();
        let f = File::create(&p, "f", 0).unwrap();
        // pwrite: offset + len past i64::MAX, or a negative offset: EINVAL.
        assert_eq!(f.write_at(MAX_FILE_SIZE, &[1]).unwrap_err(), Errno::Inval);
        assert_eq!(f.write_at(u64::MAX, &[1, 2]).unwrap_err(), Errno::Inval);
        assert_eq!(f.write_at(u64::MAX, &[]).unwrap_err(), Errno::Inval);
        assert_eq!(f.write_at(MAX_FILE_SIZE, &[]), Ok(0), "an empty write at the limit is fine");
        assert_eq!((f.len(), f.cached_pages()), (0, 0), "a failed write changes nothing");
        // Up to the limit itself is fine.
        assert_eq!(f.write_at(MAX_FILE_SIZE - 1, &[1]).unwrap(), 1);
        assert_eq!(f.len(), MAX_FILE_SIZE);
        assert!(f.is_cached((MAX_FILE_SIZE - 1) / PS));
        assert_eq!(read(&f, MAX_FILE_SIZE - 2, 2), (2, vec![0, 1]));
    }

    #[test]
    fn set_len_shrink_drops_pages_and_zeroes_the_tail() {
        let p = phys();
        let f = three_pages(&p);
        f.set_len(PS + 904).unwrap();
        assert_eq!(f.len(), PS + 904);
        assert_eq!((f.is_cached(0), f.is_cached(1), f.is_cached(2)), (true, true, false));
        assert_eq!(p.stats().frames_used, 2, "the dropped page went back to the arena");
        // Growing again must not resurrect the old bytes past the shrink point (truncate_inode_pages).
        f.set_len(3 * PS).unwrap();
        assert_eq!(f.len(), 3 * PS);
        assert_eq!(f.cached_pages(), 2, "growing allocates nothing");
        let (n, buf) = read(&f, 0, 3 * PS as usize);
        assert_eq!(n, 3 * PS as usize);
        let keep = (PS + 904) as usize;
        assert!(buf[..keep].iter().all(|&b| b == 0xab));
        assert!(buf[keep..].iter().all(|&b| b == 0), "stale bytes after shrink and regrow");
    }

    #[test]
    fn set_len_to_a_page_boundary_and_to_zero() {
        let p = phys();
        let f = three_pages(&p);
        f.set_len(PS).unwrap();
        assert_eq!((f.len(), f.cached_pages()), (PS, 1));
        assert_eq!(read(&f, PS - 1, 2), (1, vec![0xab, 0xee]));
        f.set_len(0).unwrap();
        assert_eq!((f.len(), f.is_empty(), f.cached_pages()), (0, true, 0));
        assert_eq!(p.stats().frames_used, 0);
    }

    #[test]
    fn set_len_above_i64_max_is_einval() {
        let p = phys();
        let f = three_pages(&p);
        assert_eq!(f.set_len(MAX_FILE_SIZE + 1).unwrap_err(), Errno::Inval);
        assert_eq!(f.set_len(u64::MAX).unwrap_err(), Errno::Inval);
        assert_eq!((f.len(), f.cached_pages()), (3 * PS, 3), "a failed truncate changes nothing");
        f.set_len(MAX_FILE_SIZE).unwrap();
        assert_eq!((f.len(), f.cached_pages()), (MAX_FILE_SIZE, 3));
    }

    #[test]
    fn punch_hole_zeroes_edges_drops_whole_pages_and_keeps_size() {
        let p = phys();
        let f = three_pages(&p);
        // [100, 2*PS + 100): the tail of page 0, all of page 1, the head of page 2.
        f.punch_hole(100, 2 * PS).unwrap();
        assert_eq!(f.len(), 3 * PS, "FALLOC_FL_KEEP_SIZE");
        assert_eq!((f.is_cached(0), f.is_cached(1), f.is_cached(2)), (true, false, true));
        assert_eq!(p.stats().frames_used, 2);
        let (n, buf) = read(&f, 0, 3 * PS as usize);
        assert_eq!(n, 3 * PS as usize);
        assert!(buf[..100].iter().all(|&b| b == 0xab));
        assert!(buf[100..(2 * PS + 100) as usize].iter().all(|&b| b == 0));
        assert!(buf[(2 * PS + 100) as usize..].iter().all(|&b| b == 0xab));
    }

    #[test]
    fn punch_hole_inside_one_page_only_zeroes() {
        let p = phys();
        let f = three_pages(&p);
        f.punch_hole(PS + 10, 20).unwrap();
        assert_eq!(f.cached_pages(), 3);
        let (_, buf) = read(&f, PS, 40);
        assert!(buf[..10].iter().all(|&b| b == 0xab));
        assert!(buf[10..30].iter().all(|&b| b == 0));
        assert!(buf[30..].iter().all(|&b| b == 0xab));
        // An exactly page-aligned punch drops the page without touching its neighbours.
        f.punch_hole(2 * PS, PS).unwrap();
        assert_eq!((f.is_cached(1), f.is_cached(2), f.len()), (true, false, 3 * PS));
        assert_eq!(read(&f, 2 * PS - 1, 2).1, [0xab, 0]);
        // vfs_fallocate: negative offset or length, or a zero length: EINVAL;
        // an end past i64::MAX: EFBIG. Nothing changes.
        assert_eq!(f.punch_hole(u64::MAX, 2).unwrap_err(), Errno::Inval);
        assert_eq!(f.punch_hole(0, 0).unwrap_err(), Errno::Inval);
        assert_eq!(f.punch_hole(0, 1 << 63).unwrap_err(), Errno::Inval);
        assert_eq!(f.punch_hole(PS, MAX_FILE_SIZE).unwrap_err(), Errno::FBig);
        assert_eq!((f.cached_pages(), f.len()), (2, 3 * PS));
        assert_eq!(read(&f, 0, 1).1, [0xab], "page 0 kept its data");
    }

    #[test]
    fn get_page_fills_holes_and_stops_at_eof() {
        let p = phys();
        let handle = File::create(&p, "f", PS + 1).unwrap();
        let f = handle.inode();
        assert!(f.find_get_page(1).is_none(), "a hole is not cached");
        let page = f.get_page(1).unwrap().unwrap();
        let pfn = page.pfn();
        assert!(f.is_cached(1));
        let d = p.desc(pfn);
        assert_eq!(d.flags.load(Ordering::Relaxed), PG_FILE);
        assert_eq!(d.mapping.load(Ordering::Relaxed), f.id());
        assert_eq!(d.index.load(Ordering::Relaxed), 1);
        assert_eq!(d.refcount.load(Ordering::Relaxed), 2, "the page cache's and the caller's");
        let again = f.find_get_page(1).unwrap();
        assert_eq!(again.pfn(), pfn);
        assert_eq!(d.refcount.load(Ordering::Relaxed), 3);
        drop((page, again));
        assert_eq!(d.refcount.load(Ordering::Relaxed), 1);
        assert!(matches!(f.get_page(2), Ok(None)), "past EOF: SIGBUS for a fault");
        assert!(matches!(f.get_page(u64::MAX), Ok(None)));
        assert_eq!(f.cached_pages(), 1);
    }

    #[test]
    fn get_page_out_of_frames_is_enomem() {
        let p = phys();
        let handle = File::create(&p, "f", 64 * PS).unwrap();
        let f = handle.inode();
        // 15 usable frames: the 16th page cannot be allocated.
        for i in 0..15 {
            drop(f.get_page(i).unwrap().unwrap());
        }
        assert_eq!(f.get_page(15).unwrap_err(), Errno::NoMem);
        assert_eq!(f.write_at(15 * PS, &[1]).unwrap_err(), Errno::NoMem);
        assert!(!f.is_cached(15));
        drop(handle);
        assert_eq!(p.stats().frames_used, 0);
    }

    #[test]
    fn write_failing_with_enomem_does_not_grow_the_file() {
        let p = phys();
        let hog = File::create(&p, "hog", 15 * PS).unwrap();
        hog.write_at(0, &[1; 15 * PS as usize]).unwrap();
        assert_eq!(p.stats().frames_used, 15);
        let f = File::create(&p, "f", 0).unwrap();
        assert_eq!(f.write_at(0, b"x").unwrap_err(), Errno::NoMem);
        // pwrite that writes nothing leaves i_size alone.
        assert_eq!(f.len(), 0);
        // One frame free: a two-page write is short and the size covers what it wrote.
        hog.set_len(14 * PS).unwrap();
        assert_eq!(f.write_at(0, &[2; 2 * PS as usize]), Ok(PS as usize));
        assert_eq!(f.len(), PS);
        assert_eq!(read(&f, PS - 1, 2), (1, vec![2, 0xee]));
    }

    #[test]
    fn dropping_the_file_frees_its_page_cache() {
        let p = phys();
        let f = three_pages(&p);
        f.write_at(10 * PS, b"z").unwrap();
        assert_eq!(p.stats().frames_used, 4);
        let g = File::create(&p, "g", 0).unwrap();
        g.write_at(0, b"g").unwrap();
        drop(f);
        assert_eq!(p.stats().frames_used, 1, "only the other file's page");
        assert_eq!(read(&g, 0, 1).1, b"g");
        drop(g);
        assert_eq!(p.quiesce(), crate::phys::PhysStats { frames_total: 16, ..Default::default() });
    }
}
