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
//! takes `mmap_lock` under `invalidate_lock`, but only with `read_recursive`,
//! and no `mmap_lock` writer ever takes `invalidate_lock`, so the two orders
//! cannot deadlock.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, RwLock};

use crate::error::{Errno, Result};
use crate::mm::AddressSpace;
use crate::phys::{Pfn, PhysMem, PG_FILE};
use crate::PAGE_SIZE;

/// Largest file size (Linux's `MAX_LFS_FILESIZE` on 64-bit).
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;

/// A tmpfs-like in-memory file.
pub struct File {
    id: u64,
    name: String,
    phys: Arc<PhysMem>,
    inner: Mutex<FileInner>,
    pub(crate) invalidate_lock: RwLock<()>,
    i_mmap: Mutex<Vec<Weak<AddressSpace>>>,
}

struct FileInner {
    size: u64,
    pages: BTreeMap<u64, Pfn>,
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "File({} {:?})", self.id, self.name)
    }
}

impl File {
    /// A file of `size` bytes, all zero (no page allocated until written).
    pub fn create(phys: &Arc<PhysMem>, name: &str, size: u64) -> Result<Arc<File>> {
        if size > MAX_FILE_SIZE {
            return Err(Errno::FBig);
        }
        Ok(Arc::new(File {
            id: phys.next_id(),
            name: name.to_string(),
            phys: phys.clone(),
            inner: Mutex::new(FileInner { size, pages: BTreeMap::new() }),
            invalidate_lock: RwLock::new(()),
            i_mmap: Mutex::new(Vec::new()),
        }))
    }

    /// Unique id (used as the inode number in maps).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The name shown in maps.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.inner.lock().size
    }

    /// True if the file is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Pages in the page cache.
    pub fn cached_pages(&self) -> usize {
        self.inner.lock().pages.len()
    }

    /// True if page `index` is in the page cache (what mincore reports).
    pub fn is_cached(&self, index: u64) -> bool {
        self.inner.lock().pages.contains_key(&index)
    }

    /// The cached page at `index`, if any, with a reference for the caller.
    pub(crate) fn find_get_page(&self, index: u64) -> Option<Pfn> {
        let inner = self.inner.lock();
        let pfn = *inner.pages.get(&index)?;
        self.phys.get(pfn);
        Some(pfn)
    }

    /// The page at `index`, allocating a zeroed one for a hole (tmpfs), with a
    /// reference for the caller. `Ok(None)` past the end of the file (SIGBUS).
    /// Callers hold `invalidate_lock` for read.
    pub(crate) fn get_page(&self, index: u64) -> std::result::Result<Option<Pfn>, Errno> {
        let mut inner = self.inner.lock();
        if index >= inner.size.div_ceil(PAGE_SIZE) {
            return Ok(None);
        }
        let pfn = match inner.pages.get(&index) {
            Some(&p) => p,
            None => {
                let p = self.phys.alloc_zeroed(0).ok_or(Errno::NoMem)?;
                let d = self.phys.desc(p);
                d.flags.store(PG_FILE, Ordering::Relaxed);
                d.mapping.store(self.id, Ordering::Relaxed);
                d.index.store(index, Ordering::Relaxed);
                inner.pages.insert(index, p);
                p
            }
        };
        self.phys.get(pfn);
        Ok(Some(pfn))
    }

    /// Reads from `offset`; returns the bytes read (short at end of file).
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> usize {
        let inner = self.inner.lock();
        let end = inner.size.min(offset.saturating_add(buf.len() as u64));
        let mut pos = offset;
        while pos < end {
            let in_page = (pos % PAGE_SIZE) as usize;
            let n = ((PAGE_SIZE - pos % PAGE_SIZE).min(end - pos)) as usize;
            let dst = &mut buf[(pos - offset) as usize..][..n];
            match inner.pages.get(&(pos / PAGE_SIZE)) {
                Some(&p) => crate::access::copy_from_host(self.phys.frame_ptr(p).wrapping_add(in_page), dst),
                None => dst.fill(0),
            }
            pos += n as u64;
        }
        end.saturating_sub(offset) as usize
    }

    /// Writes at `offset`, growing the file like `pwrite` does.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<usize> {
        let end = offset.checked_add(data.len() as u64).filter(|&e| e <= MAX_FILE_SIZE).ok_or(Errno::FBig)?;
        let _q = crate::cpu::QuiescentGuard::enter();
        let _inval = self.invalidate_lock.read();
        {
            let mut inner = self.inner.lock();
            inner.size = inner.size.max(end);
        }
        let mut pos = offset;
        while pos < end {
            let in_page = (pos % PAGE_SIZE) as usize;
            let n = ((PAGE_SIZE - pos % PAGE_SIZE).min(end - pos)) as usize;
            let p = self.get_page(pos / PAGE_SIZE)?.expect("within size");
            crate::access::copy_to_host(
                &data[(pos - offset) as usize..][..n],
                self.phys.frame_ptr(p).wrapping_add(in_page),
            );
            self.phys.put(p);
            pos += n as u64;
        }
        Ok(data.len())
    }

    /// Sets the size (`ftruncate`). Shrinking zaps every mapping of the pages
    /// past the new end — private COW copies too, as Linux does — and drops
    /// them from the page cache; an access there then raises SIGBUS.
    /// `EINVAL` for a size that is negative as an `off_t` (above `i64::MAX`).
    pub fn set_len(&self, size: u64) -> Result<()> {
        if size > MAX_FILE_SIZE {
            return Err(Errno::Inval);
        }
        let _q = crate::cpu::QuiescentGuard::enter();
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
                    crate::access::fill_host(
                        self.phys.frame_ptr(p).wrapping_add((size % PAGE_SIZE) as usize),
                        0,
                        tail as usize,
                    );
                }
            }
        }
        Ok(())
    }

    /// Frees the pages of `[offset, offset+len)` (`fallocate(PUNCH_HOLE|KEEP_SIZE)`):
    /// partial pages at the edges are zeroed, whole pages unmapped from shared
    /// mappings and dropped; private COW copies are kept, as in Linux.
    pub fn punch_hole(&self, offset: u64, len: u64) -> Result<()> {
        let end = offset.checked_add(len).ok_or(Errno::FBig)?;
        let _q = crate::cpu::QuiescentGuard::enter();
        let _inval = self.invalidate_lock.write();
        let first = offset.div_ceil(PAGE_SIZE);
        let last = end / PAGE_SIZE;
        // Zero partial edge pages in place.
        let inner = self.inner.lock();
        for (lo, hi) in [(offset, (first * PAGE_SIZE).min(end)), ((last * PAGE_SIZE).max(offset), end)] {
            if lo < hi {
                if let Some(&p) = inner.pages.get(&(lo / PAGE_SIZE)) {
                    crate::access::fill_host(
                        self.phys.frame_ptr(p).wrapping_add((lo % PAGE_SIZE) as usize),
                        0,
                        (hi - lo) as usize,
                    );
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
            self.phys.put(p);
        }
    }

    /// Zaps file pages `[first, last)` from every address space mapping them;
    /// `even_cows` also zaps private COW copies.
    fn unmap_mapping_range(&self, first: u64, last: u64, even_cows: bool) {
        let mms: Vec<Arc<AddressSpace>> = {
            let mut list = self.i_mmap.lock();
            list.retain(|w| w.strong_count() > 0);
            list.iter().filter_map(Weak::upgrade).collect()
        };
        for mm in mms {
            mm.unmap_file_range(self, first, last, even_cows);
        }
    }

    /// Records that `mm` maps this file (the `i_mmap` reverse map).
    pub(crate) fn add_mapping(&self, mm: &Arc<AddressSpace>) {
        let mut list = self.i_mmap.lock();
        if !list.iter().any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(mm))) {
            list.push(Arc::downgrade(mm));
        }
    }
}

impl Drop for File {
    fn drop(&mut self) {
        let inner = self.inner.get_mut();
        for (_, p) in std::mem::take(&mut inner.pages) {
            self.phys.put(p);
        }
    }
}

/// A file opened with an access mode: what `mmap` checks against the requested
/// protection (`EACCES`), like an open file description.
#[derive(Clone, Debug)]
pub struct OpenFile {
    /// The file.
    pub file: Arc<File>,
    /// Opened for reading.
    pub readable: bool,
    /// Opened for writing.
    pub writable: bool,
}

impl OpenFile {
    /// The file opened read-write.
    pub fn read_write(file: &Arc<File>) -> OpenFile {
        OpenFile { file: file.clone(), readable: true, writable: true }
    }

    /// The file opened read-only.
    pub fn read_only(file: &Arc<File>) -> OpenFile {
        OpenFile { file: file.clone(), readable: true, writable: false }
    }
}
