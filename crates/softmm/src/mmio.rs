//! MMIO regions: a device's registers mapped into an address space
//! (`AddressSpace::mmap_io`), as a driver's `mmap` maps them with
//! `remap_pfn_range` (`VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP`).
//!
//! The mapping is a `MAP_SHARED` mapping of a device inode (Linux's device
//! file) whose [`MmioDevice`] answers its accesses: it has no page, so
//! nothing of it is ever in a page table or a TLB, and the fault handler
//! answers its faults with [`Fault::Mmio`] (where Linux's `do_fault`
//! without `vm_ops->fault` raises `SIGBUS`, which `get_user_pages` turns
//! into `EFAULT`, as here). A CPU's load, store or copy that meets it calls
//! the device instead (`cpu/mmio.rs`); the calls that hand out host memory
//! return it. Everything else is Linux's
//! `VM_IO`/`VM_PFNMAP` behaviour, from the flags: `mremap` may move the
//! region, not grow it (`EFAULT`), nor `MREMAP_DONTUNMAP` it (`EINVAL`);
//! `mlock` and `MAP_POPULATE` skip it; `MADV_DONTNEED`, `MADV_DOFORK` and
//! `MADV_DODUMP` are `EINVAL`, `MADV_POPULATE_*` `EFAULT`, `MADV_REMOVE`
//! `ENODEV`; `get_user_pages` (pins) is `EFAULT` and `access_remote_*`
//! copies nothing (`EIO`, no `vm_ops->access`); `fork` copies the mapping,
//! so the child's accesses reach the same device.
//!
//! # Dispatch
//!
//! An access of one page's bytes that finds a device VMA leaves its access
//! section (the thread's CPUs are quiescent, as for a page fault), takes
//! the VMA's read reference (Linux's per-VMA lock, `vma_start_read`),
//! checks the VMA's protection (a store needs `PROT_WRITE`, a fetch
//! `PROT_EXEC`, else `SEGV_ACCERR`), calls the device, drops the reference
//! and enters the section again. An access of 1, 2, 4 or 8 bytes is one
//! call of its size at its offset, whatever its alignment; any other
//! length (a copy) the naturally aligned pieces of at most 8 bytes that
//! make it up, in address order. A watchpoint stops a device access as any
//! other; write watches and dirty logs see none (there is no page).
//!
//! # Protocol
//!
//! The promise "no callback runs after the call that removes the region
//! returns" rests on the VMA's read reference (`sync::VmaLock`): a writer
//! detaches a VMA it replaces or removes (`VmaTree::remove`), which waits
//! until every read reference is dropped, before it returns; a dispatch
//! takes the reference (which fails once the VMA is detached) before it
//! calls the device and drops it after. So either the dispatch's
//! `try_read` comes first, and the writer's detach waits for the callback,
//! or the detach comes first, and the dispatch calls nothing (it walks
//! again and faults). Loom: `mmio::loom_tests`, the real `Cpu` against the
//! real `munmap`; `broken::DISPATCH_WITHOUT_REFERENCE` fails it.
//!
//! # What a callback may do
//!
//! A callback runs outside any access section, so it may block (host I/O,
//! a lock, a channel) without holding up another thread's shootdown, and
//! it may access other memory. It runs under the region's read reference:
//! a `munmap`, `mprotect`, `mremap` or `mmap(MAP_FIXED)` that removes or
//! changes the region waits for it, so **every callback of a region
//! returns before the call that removes the region returns** (and none
//! starts after). Hence, as a Linux fault handler, a callback must not
//! change the mappings of the address space it serves (it would wait for
//! itself, or for a writer that waits for it), nor touch its guest memory
//! through a CPU (a fault there may wait for such a writer); it may read
//! them (`maps`) and use any other address space.

#[cfg(all(test, loom))]
mod loom_tests;

use std::sync::Arc;

use crate::sync::RwLock;

/// A device whose registers an MMIO region maps (`AddressSpace::mmap_io`;
/// `uc_mmio_map`'s callbacks, QEMU's `MemoryRegionOps`). Offsets are from
/// the region's first byte (its page offset follows the region through
/// splits and moves, as a file offset does); values are little endian, in
/// the low `size` bytes.
///
/// Callbacks may run on any guest thread, concurrently; see "What a
/// callback may do" in the module docs (`docs/architecture.md`, "MMIO
/// regions") for what they may call. A panic in a callback unwinds through
/// the access that made it. softmm drops its reference to the device in
/// the call that removes the region's last mapping (`munmap`, the
/// address space's end; a fork's copies count), after its last callback
/// returned.
pub trait MmioDevice: Send + Sync + 'static {
    /// A load of `size` bytes (1, 2, 4 or 8, any alignment; inside one
    /// page) at `offset`: the value, in its low `size` bytes.
    fn read(&self, offset: u64, size: usize) -> u64;

    /// A store of the low `size` bytes of `value` at `offset`.
    fn write(&self, offset: u64, size: usize, value: u64);

    /// The name the region's `/proc/pid/maps` line shows (a device file's
    /// path).
    fn name(&self) -> &str {
        "/dev/mmio"
    }
}

/// A device inode's device (`Inode::mmio`), dropped when the inode is
/// evicted (its last mapping gone, in the call that removed it), so that
/// an embedder's resources go then, not when lock-free readers of the
/// removed VMAs are done.
pub(crate) struct DeviceSlot(RwLock<Option<Arc<dyn MmioDevice>>>);

impl DeviceSlot {
    /// A slot holding `device`.
    pub(crate) fn new(device: Arc<dyn MmioDevice>) -> DeviceSlot {
        DeviceSlot(RwLock::new(Some(device)))
    }

    /// The device, unless the inode was evicted.
    pub(crate) fn get(&self) -> Option<Arc<dyn MmioDevice>> {
        self.0.read().clone()
    }

    /// Drops the slot's reference (`Inode::evict`). No callback runs then:
    /// every mapping's VMA was detached, which waited for its callbacks,
    /// and each drops its reference before its VMA's.
    pub(crate) fn release(&self) {
        let device = self.0.write().take();
        drop(device);
    }
}

/// The bytes of a device access: where a load puts them, or what a store
/// writes.
pub(crate) enum IoBytes<'a> {
    /// A load (or fetch) into these bytes.
    Load(&'a mut [u8]),
    /// A store of these bytes.
    Store(&'a [u8]),
}

impl IoBytes<'_> {
    pub(crate) fn len(&self) -> usize {
        match self {
            IoBytes::Load(b) => b.len(),
            IoBytes::Store(b) => b.len(),
        }
    }
}

/// Switches for the loom model only (`loom_tests.rs`), each breaking one
/// step of the dispatch so that the model shows it catches the race the
/// step closes. Per OS thread, as `tlb::broken`'s.
pub(crate) mod broken {
    use std::cell::Cell;

    std::thread_local! {
        /// `dispatch` calls the device without the VMA's read reference.
        pub(crate) static DISPATCH_WITHOUT_REFERENCE: Cell<bool> = const { Cell::new(false) };
    }
}
