//! hugetlb: 2 MiB pages from a pool set aside when the arena is made (seed 000,
//! Mike Kravetz's "hugetlb: Change huge pmd sharing synchronization again").
//!
//! - `pool.rs`: the pool itself (Linux's `struct hstate` for the one 2 MiB
//!   size: per-node free lists, `nr_huge_pages`, `free_huge_pages`,
//!   `resv_huge_pages`, `surplus_huge_pages` under one `hugetlb_lock`) and
//!   the counts `/proc/meminfo` shows, [`HugePageStats`].
//!
//! What comes next (PMD sharing, the three locking policies of the seed) is
//! described in `docs/architecture.md`, "hugetlb".

pub(crate) mod pool;

pub use pool::HugePageStats;

/// The one huge page size softmm supports: 2 MiB, a PMD leaf on x86-64
/// (Linux's default hstate).
pub(crate) const HPAGE_SIZE: u64 = crate::pgtable::PMD_SIZE;
/// 4 KiB frames per huge page (`pages_per_huge_page`).
pub(crate) const HPAGE_FRAMES: u64 = HPAGE_SIZE / crate::PAGE_SIZE;
