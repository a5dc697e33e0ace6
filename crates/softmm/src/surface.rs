//! The public surface, pinned by tests: what an embedder must not reach or
//! rely on. Each example below must fail to compile (with the error code it
//! names); they run as doctests (`cargo test --doc`).
//!
//! The rules (docs/architecture.md, "Public API"): internal modules are
//! private, so no page-table entry, frame number, epoch guard or lock guard
//! is reachable; configurations, statistics, errors and enums that will grow
//! are `#[non_exhaustive]`, so embedders build configurations with
//! constructors and setters, read statistics without building them, and
//! match enums with a wildcard arm.
//!
//! `softmm::pgtable` is private.
//!
//! ```compile_fail,E0603
//! use softmm::pgtable;
//! ```
//!
//! `softmm::phys` is private.
//!
//! ```compile_fail,E0603
//! use softmm::phys;
//! ```
//!
//! `softmm::vma` is private.
//!
//! ```compile_fail,E0603
//! use softmm::vma;
//! ```
//!
//! `softmm::sync` is private.
//!
//! ```compile_fail,E0603
//! use softmm::sync;
//! ```
//!
//! `softmm::tlb` is private.
//!
//! ```compile_fail,E0603
//! use softmm::tlb;
//! ```
//!
//! `softmm::mm` is private.
//!
//! ```compile_fail,E0603
//! use softmm::mm;
//! ```
//!
//! `softmm::fault` is private.
//!
//! ```compile_fail,E0603
//! use softmm::fault;
//! ```
//!
//! The published VMA tree, read under an epoch guard, is internal.
//!
//! ```compile_fail,E0624
//! # use softmm::{AddressSpace, MmConfig, PhysConfig, PhysMem};
//! # let phys = PhysMem::new(PhysConfig::default()).unwrap();
//! # let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
//! let guard = crossbeam_epoch::pin();
//! let _vmas = mm.vmas_rcu(&guard);
//! ```
//!
//! Frame numbers are internal.
//!
//! ```compile_fail,E0624
//! # use softmm::{PhysConfig, PhysMem};
//! # let phys = PhysMem::new(PhysConfig::default()).unwrap();
//! let _pfn = phys.zero_pfn();
//! ```
//!
//! Frame numbers are internal.
//!
//! ```compile_fail,E0624
//! # use softmm::{PhysConfig, PhysMem};
//! # let phys = PhysMem::new(PhysConfig::default()).unwrap();
//! let _node = phys.node_of(1);
//! ```
//!
//! `PhysConfig` is built with `PhysConfig::new` and setters.
//!
//! ```compile_fail,E0639
//! let _ = softmm::PhysConfig { bytes: 1 << 20, nodes: 1 };
//! ```
//!
//! `MmConfig` is built with setters.
//!
//! ```compile_fail,E0639
//! use softmm::{FaultPolicy, MmConfig};
//! let _ = MmConfig { policy: FaultPolicy::MmapLock, ..MmConfig::default() };
//! ```
//!
//! `Overcommit` is changed with setters.
//!
//! ```compile_fail,E0639
//! # use softmm::{PhysConfig, PhysMem};
//! # let phys = PhysMem::new(PhysConfig::default()).unwrap();
//! let _ = softmm::Overcommit { ratio: 80, ..phys.overcommit() };
//! ```
//!
//! `PhysStats` may gain counters.
//!
//! ```compile_fail,E0639
//! let _ = softmm::PhysStats { ..Default::default() };
//! ```
//!
//! `MmStats` may gain counters.
//!
//! ```compile_fail,E0639
//! let _ = softmm::MmStats { ..Default::default() };
//! ```
//!
//! `CpuStats` may gain counters.
//!
//! ```compile_fail,E0639
//! let _ = softmm::CpuStats { ..Default::default() };
//! ```
//!
//! `FaultStats` may gain counters.
//!
//! ```compile_fail,E0639
//! let _ = softmm::FaultStats { ..Default::default() };
//! ```
//!
//! `TlbStats` may gain counters.
//!
//! ```compile_fail,E0639
//! let _ = softmm::TlbStats { ..Default::default() };
//! ```
//!
//! `MapEntry` may gain smaps fields.
//!
//! ```compile_fail,E0639
//! let _ = softmm::MapEntry {
//!     start: 0, end: 4096, perms: "rw-p".into(), offset: 0, inode: 0, name: String::new(), rss: 0,
//! };
//! ```
//!
//! `FaultPolicy` may gain policies.
//!
//! ```compile_fail,E0004
//! fn name(p: softmm::FaultPolicy) -> &'static str {
//!     match p {
//!         softmm::FaultPolicy::MmapLock => "a",
//!         softmm::FaultPolicy::Speculative => "b",
//!         softmm::FaultPolicy::PerVma => "c",
//!         softmm::FaultPolicy::PerVmaSeq => "d",
//!     }
//! }
//! ```
//!
//! `UnmapPolicy` and `PinPolicy` may gain policies.
//!
//! ```compile_fail,E0004
//! fn name(p: softmm::UnmapPolicy) -> &'static str {
//!     match p {
//!         softmm::UnmapPolicy::Locked => "a",
//!         softmm::UnmapPolicy::Sectioned => "b",
//!         softmm::UnmapPolicy::Downgrade => "c",
//!         softmm::UnmapPolicy::LockFree => "d",
//!     }
//! }
//! ```
//!
//! ```compile_fail,E0004
//! fn name(p: softmm::PinPolicy) -> &'static str {
//!     match p {
//!         softmm::PinPolicy::PerPage => "a",
//!         softmm::PinPolicy::Batched => "b",
//!         softmm::PinPolicy::PerVma => "c",
//!     }
//! }
//! ```
//!
//! `Access` may gain kinds (a forced access for debuggers).
//!
//! ```compile_fail,E0004
//! fn write(a: softmm::Access) -> bool {
//!     match a {
//!         softmm::Access::Read => false,
//!         softmm::Access::Write => true,
//!         softmm::Access::Execute => false,
//!     }
//! }
//! ```
//!
//! `SegvCode` may gain codes.
//!
//! ```compile_fail,E0004
//! fn code(c: softmm::SegvCode) -> i32 {
//!     match c {
//!         softmm::SegvCode::MapErr => 1,
//!         softmm::SegvCode::AccErr => 2,
//!         softmm::SegvCode::Kernel => 0x80,
//!     }
//! }
//! ```
//!
//! `Fault` may gain signals.
//!
//! ```compile_fail,E0004
//! fn signal(f: softmm::Fault) -> i32 {
//!     match f {
//!         softmm::Fault::Segv { .. } => 11,
//!         softmm::Fault::Bus { .. } | softmm::Fault::Unaligned { .. } => 7,
//!         softmm::Fault::Oom { .. } => 9,
//!     }
//! }
//! ```
//!
//! `Errno` may gain errnos.
//!
//! ```compile_fail,E0004
//! fn fatal(e: softmm::Errno) -> bool {
//!     use softmm::Errno::*;
//!     match e {
//!         Perm | BadF | Again | NoMem | Acces | Fault | Busy | Exist | NoDev | Inval | FBig | Overflow => false,
//!         OpNotSupp => true,
//!     }
//! }
//! ```
//!
//! `Scalar` is sealed: the typed accessors rely on its widths (1, 2, 4, 8
//! bytes), so no other crate can implement it.
//!
//! ```compile_fail,E0277
//! #[derive(Clone, Copy, PartialEq, Eq, Debug)]
//! struct U24(u32);
//! impl softmm::Scalar for U24 {}
//! ```
