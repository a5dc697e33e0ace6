//! The software TLB of one CPU: its entries live beside the CPU's shootdown
//! state ([`super::CpuTlbState`]) rather than in the `Cpu`, so that the
//! thread can empty them on its way out of softmm ([`super::QuiescentGuard`])
//! while a multi-access section of that CPU is open (`crate::Section`):
//! the section's accesses then need no check of the flush requests.
//!
//! Only the CPU's own thread reads or writes the entries (the `Cpu`, and
//! the thread's own quiescent guards): the atomics are relaxed, compile to
//! plain loads and stores, and exist only because the state is shared with
//! initiators for its other fields.
//!
//! The layout is QEMU softmmu's `CPUTLBEntry`: a tag per kind of access, so
//! that the permission test is the tag compare itself, and a host pointer
//! biased by the page's address, so that a hit adds the guest address to it.

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering::Relaxed};

use crate::access::Access;
use crate::PAGE_SIZE;

/// Entries in the 4 KiB TLB (direct mapped).
pub(crate) const TLB_ENTRIES: usize = 64;
/// Entries of the 2 MiB TLB (hugetlb PMD leaves), as x86's separate
/// large-page TLB: one hits for every 4 KiB of its page.
pub(crate) const HUGE_TLB_ENTRIES: usize = 8;
/// `log2` of a PMD leaf's size.
pub(crate) const HUGE_SHIFT: u32 = 21;
/// Mask of a 4 KiB page's address.
pub(crate) const PAGE_MASK: u64 = !(PAGE_SIZE - 1);
/// Mask of a 2 MiB page's address.
pub(crate) const HUGE_MASK: u64 = !((1 << HUGE_SHIFT) - 1);

/// The tag of an empty entry or of a refused access: bits 3..11 set, which
/// no key has (a key is a page address plus at most the low 3 bits of a
/// misaligned scalar's address), so it never matches.
const NO_TAG: u64 = u64::MAX;

/// The tag slot of `access`: its discriminant is 1, 2 or 4.
#[inline(always)]
const fn tag_index(access: Access) -> usize {
    access as usize >> 1
}

/// One entry.
struct TlbEntry {
    /// Indexed by [`tag_index`] (read, write, execute): the page's address
    /// if the entry allows that access, else [`NO_TAG`].
    tags: [AtomicU64; 3],
    /// The frame's host address minus the page's guest address (wrapping,
    /// with the arena's provenance): a hit's host address is this plus the
    /// guest address.
    bias: AtomicPtr<u8>,
}

impl TlbEntry {
    fn empty() -> TlbEntry {
        TlbEntry {
            tags: [AtomicU64::new(NO_TAG), AtomicU64::new(NO_TAG), AtomicU64::new(NO_TAG)],
            bias: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    #[inline(always)]
    fn hit(&self, va: u64, key: u64, access: Access) -> Option<*mut u8> {
        // Both loads before the compare: the bias load then addresses the
        // entry directly instead of recomputing it on the hit path.
        let (tag, bias) = (self.tags[tag_index(access)].load(Relaxed), self.bias.load(Relaxed));
        if tag == key {
            return Some(bias.wrapping_add(va as usize));
        }
        None
    }

    fn fill(&self, page: u64, host: *mut u8, perms: u8) {
        // The bias first: a tag is never seen with another page's bias (the
        // same thread reads them, so program order is enough).
        self.bias.store(host.wrapping_sub(page as usize), Relaxed);
        for a in [Access::Read, Access::Write, Access::Execute] {
            let tag = if perms & a.bit() != 0 { page } else { NO_TAG };
            self.tags[tag_index(a)].store(tag, Relaxed);
        }
    }

    fn clear(&self) {
        self.tags.iter().for_each(|t| t.store(NO_TAG, Relaxed));
    }
}

/// A CPU's 4 KiB and 2 MiB TLBs.
pub(crate) struct SoftTlb {
    small: [TlbEntry; TLB_ENTRIES],
    huge: [TlbEntry; HUGE_TLB_ENTRIES],
}

impl SoftTlb {
    /// An empty TLB.
    pub(crate) fn new() -> SoftTlb {
        SoftTlb { small: std::array::from_fn(|_| TlbEntry::empty()), huge: std::array::from_fn(|_| TlbEntry::empty()) }
    }

    /// The host address of `va` if the 4 KiB TLB holds its page for
    /// `access`: an index and one compare.
    #[inline(always)]
    pub(crate) fn hit(&self, va: u64, access: Access) -> Option<*mut u8> {
        self.small[(va / PAGE_SIZE) as usize % TLB_ENTRIES].hit(va, va & PAGE_MASK, access)
    }

    /// The host address of the naturally aligned `n`-byte scalar at `va`
    /// (`n` a power of two up to 8) if the 4 KiB TLB holds its page for
    /// `access`. The key keeps the low bits of a misaligned address, which
    /// no tag has, so the alignment test is the tag compare too (as in
    /// QEMU's softmmu); an aligned scalar never crosses a page, so there is
    /// no page-end test either.
    #[inline(always)]
    pub(crate) fn hit_aligned(&self, va: u64, n: usize, access: Access) -> Option<*mut u8> {
        self.small[(va / PAGE_SIZE) as usize % TLB_ENTRIES].hit(va, va & (PAGE_MASK | (n as u64 - 1)), access)
    }

    /// The host address of `va` if the 2 MiB TLB holds its page for `access`.
    #[inline]
    pub(crate) fn hit_huge(&self, va: u64, access: Access) -> Option<*mut u8> {
        self.huge[(va >> HUGE_SHIFT) as usize % HUGE_TLB_ENTRIES].hit(va, va & HUGE_MASK, access)
    }

    /// Caches the 4 KiB page at `va` backed at `host` (the frame's first
    /// byte), allowing what `perms` says ([`Access::bit`]s).
    pub(crate) fn fill(&self, va: u64, host: *mut u8, perms: u8) {
        self.small[(va / PAGE_SIZE) as usize % TLB_ENTRIES].fill(va & PAGE_MASK, host, perms);
    }

    /// Caches the 2 MiB page at `va` backed at `host` (its first byte).
    pub(crate) fn fill_huge(&self, va: u64, host: *mut u8, perms: u8) {
        self.huge[(va >> HUGE_SHIFT) as usize % HUGE_TLB_ENTRIES].fill(va & HUGE_MASK, host, perms);
    }

    /// Drops the entries of the `pages` 4 KiB pages from `start` (page
    /// aligned), and any 2 MiB entry overlapping them.
    pub(crate) fn flush_range(&self, start: u64, pages: u64) {
        for page in (0..pages).map(|i| start + i * PAGE_SIZE) {
            let e = &self.small[(page / PAGE_SIZE) as usize % TLB_ENTRIES];
            // A tag is the page's address or `NO_TAG`.
            if e.tags.iter().any(|t| t.load(Relaxed) == page) {
                e.clear();
            }
        }
        let end = start + pages * PAGE_SIZE;
        for e in &self.huge {
            if e.tags.iter().any(|t| {
                let huge = t.load(Relaxed);
                huge != NO_TAG && huge < end && start < huge + (1 << HUGE_SHIFT)
            }) {
                e.clear();
            }
        }
    }

    /// Drops every entry.
    pub(crate) fn clear(&self) {
        self.small.iter().chain(&self.huge).for_each(TlbEntry::clear);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_tag_per_access_and_the_alignment_in_the_key() {
        let tlb = SoftTlb::new();
        let mut frame = vec![0u64; 512];
        let host = frame.as_mut_ptr() as *mut u8;
        let va = 0x7000_1000;
        assert_eq!(tlb.hit(va, Access::Read), None);
        tlb.fill(va + 8, host, Access::Read.bit() | Access::Execute.bit());
        assert_eq!(tlb.hit(va + 8, Access::Read), Some(host.wrapping_add(8)));
        assert_eq!(tlb.hit(va + 4095, Access::Execute), Some(host.wrapping_add(4095)));
        assert_eq!(tlb.hit(va, Access::Write), None);
        assert_eq!(tlb.hit_aligned(va + 8, 8, Access::Read), Some(host.wrapping_add(8)));
        assert_eq!(tlb.hit_aligned(va + 12, 8, Access::Read), None, "misaligned");
        assert_eq!(tlb.hit_aligned(va + 12, 4, Access::Read), Some(host.wrapping_add(12)));
        assert_eq!(tlb.hit_aligned(va + 13, 1, Access::Read), Some(host.wrapping_add(13)));
        // Same index, other page; an address with high bits set.
        assert_eq!(tlb.hit(va + 64 * PAGE_SIZE, Access::Read), None);
        assert_eq!(tlb.hit(va | 1 << 60, Access::Read), None);
        // A range drops its pages only.
        tlb.fill(va + PAGE_SIZE, host, Access::Read.bit());
        tlb.flush_range(va, 1);
        assert_eq!(tlb.hit(va, Access::Read), None);
        assert_eq!(tlb.hit(va + PAGE_SIZE, Access::Read), Some(host));
        tlb.fill(va, host, Access::Read.bit());
        tlb.clear();
        assert_eq!(tlb.hit(va, Access::Read), None);
        assert_eq!(tlb.hit(va + PAGE_SIZE, Access::Read), None);
        assert_eq!(tlb.hit_huge(0x4000_0000, Access::Read), None);
        tlb.fill_huge(0x4000_0000, host, Access::Read.bit() | Access::Write.bit());
        assert_eq!(tlb.hit_huge(0x401f_fff8, Access::Write), Some(host.wrapping_add(0x1f_fff8)));
        assert_eq!(tlb.hit_huge(0x4020_0000, Access::Read), None);
        tlb.flush_range(0x4020_0000, 1);
        assert!(tlb.hit_huge(0x4000_0000, Access::Read).is_some(), "the next 2 MiB");
        tlb.flush_range(0x401f_f000, 1);
        assert_eq!(tlb.hit_huge(0x4000_0000, Access::Read), None, "its last page");
        drop(frame);
    }
}
