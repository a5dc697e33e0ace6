//! The page-fault handler.
//!
//! # Protocol
//!
//! A fault is resolved against one VMA and committed under the PTE lock of
//! the leaf table that maps the address: the handler re-reads the entry under
//! the lock and installs its result only if the entry is still what it based
//! the work on, so two CPUs faulting the same page install one frame.
//!
//! How the fault is kept safe from concurrent mapping changes is the
//! [`FaultPolicy`], chosen per address space:
//!
//! * [`FaultPolicy::MmapLock`] — the classic path: `mmap_lock` is held for read
//!   across the whole fault, so no VMA or page table it uses can change or be
//!   freed under it.
//!
//! Fault kinds (all in [`handler`]): anonymous read (zero page), anonymous
//! write (zeroed frame), file read (page-cache page, read-only, with
//! fault-around), private file write (COW copy), shared file write (page-cache
//! page made writable and dirty), write-protect faults (COW after fork, reuse
//! of an exclusively owned page), and growsdown stack expansion, done with
//! `mmap_lock` held for write (the StackRot fix).

pub(crate) mod handler;
mod mmap_lock;

use crate::error::Fault;
use crate::mm::AddressSpace;

/// How page faults synchronize with changes to the address space.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum FaultPolicy {
    /// Every fault takes `mmap_lock` for read.
    #[default]
    MmapLock,
}

impl FaultPolicy {
    /// Every policy, for sweeps.
    pub const ALL: &'static [FaultPolicy] = &[FaultPolicy::MmapLock];

    /// The kebab-case name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            FaultPolicy::MmapLock => "mmap-lock",
        }
    }
}

/// The kind of access that faulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// A load.
    Read,
    /// A store.
    Write,
}

impl AddressSpace {
    /// Resolves a fault at `addr` for `access`, as the MMU would raise it.
    /// On success the page is mapped with at least the needed permission; on
    /// failure the signal Linux would deliver.
    pub fn handle_fault(&self, addr: u64, access: Access) -> Result<(), Fault> {
        match self.policy() {
            FaultPolicy::MmapLock => mmap_lock::handle(self, addr, access),
        }
    }
}
