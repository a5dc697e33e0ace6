//! What softmm's tests and lab need from the host kernel, and give back.
//!
//! softmm reproduces Linux's memory management, so its differential tests
//! and its lab run the same programs on the host. Some of them need host
//! state that a test must set up and undo: hugetlb needs a pool of huge pages
//! (`/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages`, the pool that
//! `/proc/sys/vm/nr_hugepages` shows for x86-64's default 2 MiB size) and a
//! hugetlbfs mount. [`HugePages`] reserves them and restores the host when
//! it is dropped; where the host refuses it returns a [`HostError`] whose
//! message says why, so that callers print it and skip.

mod error;
mod hugepages;
mod lock;

pub use error::HostError;
pub use hugepages::{pool_counters, HugePages, PoolCounters, HUGE_PAGE_SIZE, MAX_PAGES};
