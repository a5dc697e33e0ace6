//! softmm: a userspace virtual-memory subsystem with Linux semantics.
//!
//! An [`AddressSpace`] holds VMAs and 4-level page tables over frames of a
//! [`PhysMem`] arena; a [`Cpu`] per thread accesses it through a software TLB;
//! faults, COW after [`AddressSpace::fork`], files with a page cache
//! ([`File`]) and every mapping call behave as Linux's, errno included.
//!
//! ```
//! use softmm::{AddressSpace, Cpu, MmConfig, PhysConfig, PhysMem, uapi::*};
//! let phys = PhysMem::new(PhysConfig::new(4 << 20)).unwrap();
//! let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
//! let a = mm.mmap(0, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
//! let mut cpu = Cpu::attached(&mm);
//! cpu.write_u64(a, 42).unwrap();
//! assert_eq!(cpu.read_u64(a).unwrap(), 42);
//! ```
//!
//! # Where to read more
//!
//! - `docs/architecture.md` in the repository: the design (address space,
//!   page tables, TLB shootdowns, the fault, unmap, pin, hugetlb and
//!   migration policies), the public API's rules, and the C API's
//!   threading and lifetime rules.
//! - The C API, crate `softmm-capi` (`crates/softmm-capi`, header
//!   `include/softmm.h`, a toy emulator in `examples/emulator.c`): opaque
//!   handles for arenas, address spaces, files and CPUs.
//! - The lab, the `softmm` command (crate `softmm-cli`): each policy and
//!   the host kernel under the same workloads, one experiment per Linux mm
//!   patch series whose design softmm compares with the one it replaced
//!   (`softmm bench --help` cites them), and `softmm replay` of `strace`
//!   logs; the committed results are in `docs/results/`.
#![warn(missing_docs)]

// Every module is private: the public surface is what is re-exported below.
// Nothing reachable from it exposes a page-table entry, a frame number, an
// epoch guard or a lock guard, so the mechanisms can change without breaking
// an embedder. The whole crate builds under `cfg(loom)` too (see `sync`).
// The low layers hold every `unsafe` block, each with the invariant that
// makes it sound: guest memory copies (`access`, `phys`), the MMU (`cpu`,
// `pgtable`, `tlb`), the primitives (`sync`), the host file calls
// (`host_file`), and the core's RCU publication (`mm`). The modules above
// them may not use `unsafe` (`deny`; the migrators' bulk copy of a frozen
// page is `phys::FrozenPage::copy_to`).
mod access;
mod cpu;
#[deny(unsafe_code)]
mod error;
#[deny(unsafe_code)]
mod fault;
#[deny(unsafe_code)]
mod file;
mod host_file;
mod host_mem;
#[deny(unsafe_code)]
mod hugetlb;
#[deny(unsafe_code)]
mod mempolicy;
#[deny(unsafe_code)]
mod migrate;
mod mm;
#[deny(unsafe_code)]
mod mmio;
mod pgtable;
mod phys;
#[deny(unsafe_code)]
mod pin;
#[deny(unsafe_code)]
mod policy;
#[deny(unsafe_code)]
mod populate;
#[deny(unsafe_code)]
mod rmap;
mod sync;
#[deny(unsafe_code)]
mod sys;
#[cfg(all(test, not(loom)))]
mod testing;
mod tlb;
#[deny(unsafe_code)]
pub mod uapi;
// Doctests that pin the public surface (compile_fail examples).
#[cfg(doctest)]
mod surface;
#[deny(unsafe_code)]
mod vma;
#[deny(unsafe_code)]
mod watch;

/// The `bytemuck` crate whose [`Pod`](bytemuck::Pod) bound
/// [`Cpu::read_obj`]/[`Cpu::write_obj`] take (derive it with the same
/// version).
pub use bytemuck;
pub use cpu::{Cpu, CpuStats, FaultInfo, GuestBytes, Scalar, Section, TlbAbi, Translation};
pub use error::{Errno, Fault, Result, SegvCode};
pub use fault::{Access, FaultStats};
pub use file::{File, OpenFile};
pub use mm::{AddressSpace, ConfigError, MmConfig, MmStats, TASK_SIZE, TASK_SIZE_32};
pub use mm::{RangeStats, UnmapStats};
pub use mmio::MmioDevice;
pub use phys::{FreeLists, Overcommit, OvercommitMode, PhysConfig, PhysMem, PhysStats, MAX_NODES};
pub use pin::{Foll, PinStats, PinnedPages, MAX_PIN_THREADS};
pub use sync::{shared_writes_by_site_this_thread, shared_writes_this_thread, SharedWriteSite};
pub use sys::MapEntry;
pub use tlb::TlbEntryAbi;
pub use tlb::TlbStats;
pub use tlb::{fences_are_asymmetric, PostingPolicy, ShootdownPolicy, ShootdownTargets};
pub use watch::{WatchAccess, WatchMode, MAX_WATCHED_PAGES, MAX_WATCHPOINTS};
// hugetlb (seed 000).
pub use phys::hugetlb::HugePageStats;
pub use phys::hugetlb::HugetlbLockStats;
// hugetlb migration: the pool per node.
pub use phys::hugetlb::HugePageNodeStats;
// NUMA memory policies and page migration (seed 003).
pub use mempolicy::{
    MPOL_BIND, MPOL_DEFAULT, MPOL_F_ADDR, MPOL_F_MEMS_ALLOWED, MPOL_F_NODE, MPOL_F_NUMA_BALANCING,
    MPOL_F_RELATIVE_NODES, MPOL_F_STATIC_NODES, MPOL_INTERLEAVE, MPOL_LOCAL, MPOL_MAX, MPOL_MF_MOVE, MPOL_MF_MOVE_ALL,
    MPOL_MF_STRICT, MPOL_PREFERRED, MPOL_PREFERRED_MANY, MPOL_WEIGHTED_INTERLEAVE,
};
pub use migrate::NR_MAX_BATCHED_MIGRATION;
pub use phys::{NodeMask, NodeStats};
// The policies, one per mechanism the lab compares.
pub use policy::{
    AtomicAlignment, FaultPolicy, HostFileCoherence, HugetlbPolicy, MadvisePolicy, MigratePolicy, PinPolicy,
    PlacementPolicy, UnmapPolicy, WriterPolicy,
};

/// log2 of the page size.
pub const PAGE_SHIFT: u64 = 12;
/// The base page size: 4 KiB.
pub const PAGE_SIZE: u64 = 1 << PAGE_SHIFT;

/// Rounds up to a page boundary, wrapping to 0 on overflow as Linux's
/// `PAGE_ALIGN` does (callers treat 0 as overflow).
#[inline]
pub const fn page_align(x: u64) -> u64 {
    x.wrapping_add(PAGE_SIZE - 1) & !(PAGE_SIZE - 1)
}
