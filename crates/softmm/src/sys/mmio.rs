//! `mmap_io` (`crate::mmio`): a device's registers mapped as a
//! `MAP_SHARED` mapping of a device inode, and that inode's `VmaOps`.

use std::sync::Arc;

use crate::error::{Errno, Result};
use crate::file::{File, Inode, OpenFile};
use crate::mm::AddressSpace;
use crate::mmio::{DeviceSlot, MmioDevice};
use crate::phys::PhysMem;
use crate::uapi::MAP_ANONYMOUS;
use crate::vma::{VmFlags, VmaDesc, VmaOps};

/// The hooks of a device mapping: every default but the preparation.
pub(crate) struct MmioVmOps;

impl VmaOps for MmioVmOps {
    fn name(&self) -> &'static str {
        "mmio"
    }

    /// A driver's `mmap` with `remap_pfn_range`: registers are shared with
    /// the device, so a private mapping is `EINVAL` (as VFIO's `mmap`).
    fn mmap_prepare(&self, _phys: &Arc<PhysMem>, desc: &mut VmaDesc) -> Result<()> {
        if !desc.flags.contains(VmFlags::MAYSHARE) {
            return Err(Errno::Inval);
        }
        desc.flags |= VmFlags::IO | VmFlags::PFNMAP | VmFlags::DONTEXPAND | VmFlags::DONTDUMP;
        Ok(())
    }
}

/// The hooks every device VMA holds.
pub(crate) static MMIO_VM_OPS: MmioVmOps = MmioVmOps;

impl AddressSpace {
    /// Maps `device`'s registers at `[addr, addr + len)` (an MMIO region):
    /// `mmap(addr, len, prot, flags, fd, 0)` of a new device file whose
    /// accesses call `device` ([`MmioDevice`]; see `crate::mmio` in
    /// `docs/architecture.md` for the dispatch and what a callback may do).
    ///
    /// `flags` are `mmap`'s with a file: `MAP_SHARED` or
    /// `MAP_SHARED_VALIDATE`, with `MAP_FIXED` or `MAP_FIXED_NOREPLACE`
    /// for an exact address (without them `addr` is a hint, and a mapping
    /// there is not replaced). Every `mmap` errno applies (`EINVAL` for a
    /// zero length or an unaligned fixed address, `EEXIST`, `ENOMEM`...);
    /// `MAP_PRIVATE` and `MAP_ANONYMOUS` are `EINVAL`. A failed call
    /// changes nothing.
    ///
    /// ```
    /// use softmm::{uapi::*, AddressSpace, Cpu, MmConfig, MmioDevice, PhysConfig, PhysMem};
    /// use std::sync::{atomic::{AtomicU64, Ordering}, Arc};
    /// struct Reg(AtomicU64);
    /// impl MmioDevice for Reg {
    ///     fn read(&self, offset: u64, _size: usize) -> u64 { self.0.load(Ordering::Relaxed) + offset }
    ///     fn write(&self, _offset: u64, _size: usize, value: u64) { self.0.store(value, Ordering::Relaxed) }
    /// }
    /// let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    /// let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    /// let io = mm.mmap_io(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, Arc::new(Reg(AtomicU64::new(0)))).unwrap();
    /// let mut cpu = Cpu::attached(&mm);
    /// cpu.write_u32(io, 40).unwrap();
    /// assert_eq!(cpu.read_u16(io + 2).unwrap(), 42);
    /// ```
    pub fn mmap_io(&self, addr: u64, len: u64, prot: i32, flags: i32, device: Arc<dyn MmioDevice>) -> Result<u64> {
        if flags & MAP_ANONYMOUS != 0 {
            return Err(Errno::Inval);
        }
        let mut inode = Inode::new(&self.phys, device.name(), len, None);
        inode.mmio = Some(DeviceSlot::new(device));
        let file = File::named(inode);
        self.mmap(addr, len, prot, flags, Some(&OpenFile::read_write(&file)), 0)
    }
}
