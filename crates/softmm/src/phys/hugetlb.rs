//! The hugetlb state below every layer that holds it (seed 000): the pool
//! of 2 MiB pages that the arena owns (`pool.rs`, Linux's `struct hstate`),
//! the locks of the seed's schemes and their counters (`lock.rs`: the
//! file's `i_mmap` lock, the fault mutex table, the per-address-space
//! hugetlb VMA lock), the reserve maps (`resv.rs`, Linux's `resv_map`:
//! the ranges a file's mappings reserved, a private mapping's unused
//! reservations) and the one huge page size. VMAs, files and the address
//! space core hold these; the mechanisms over them (faults, PMD sharing,
//! migration, the hooks of hugetlb VMAs) are `crate::hugetlb`'s, above
//! the core. A hugetlb file's reverse map by VMA is the file's
//! (`file/interval_tree.rs`), and its inode state `file/hugetlbfs.rs`'s.

pub(crate) mod lock;
pub(crate) mod pool;
pub(crate) mod resv;

pub use lock::HugetlbLockStats;
pub use pool::{HugePageNodeStats, HugePageStats};

/// The one huge page size softmm supports: 2 MiB, a PMD leaf on x86-64
/// (Linux's default hstate).
pub(crate) const HPAGE_SIZE: u64 = 1 << HPAGE_SHIFT;
/// `log2(HPAGE_SIZE)`.
pub(crate) const HPAGE_SHIFT: u64 = 21;
/// 4 KiB frames per huge page (`pages_per_huge_page`).
pub(crate) const HPAGE_FRAMES: u64 = HPAGE_SIZE / crate::PAGE_SIZE;
