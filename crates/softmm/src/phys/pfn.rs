//! The physical frame number: a type of its own, so that a frame number is
//! never taken for a count, an index of a file or an address (the three other
//! `u64`s that travel beside it), and a frame number leaves the type only
//! where the arena turns it into an index or a byte offset.
//!
//! It is crate-private, as every frame number is (docs/architecture.md,
//! "Public API"; `surface.rs` pins that `PhysMem`'s frame numbers are not
//! reachable).

use crate::{PAGE_SHIFT, PAGE_SIZE};

/// A physical frame number: the index of a 4 KiB frame in the arena
/// (Linux's `unsigned long pfn`). `Debug` and `Display` show it in hex, as
/// Linux prints frame numbers.
///
/// It offers what frame numbers are used for and nothing more: the index
/// of its descriptor ([`Pfn::index`]), its byte offset in the arena and back
/// ([`Pfn::phys`], [`Pfn::from_phys`], Linux's `PFN_PHYS` and `PHYS_PFN`),
/// a tail frame of a compound page (`head + n`), the distance from a head
/// (`pfn - head`), and the alignment of a huge page.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Pfn(u64);

impl Pfn {
    /// Frame number `n`.
    #[inline]
    pub(crate) const fn new(n: u64) -> Pfn {
        Pfn(n)
    }

    /// The number itself, for arithmetic the type does not offer (node
    /// division, counts of a range).
    #[inline]
    pub(crate) const fn get(self) -> u64 {
        self.0
    }

    /// The index of the frame's descriptor in the arena's array (Linux's
    /// `pfn_to_page` is `mem_map + pfn`).
    #[inline]
    pub(crate) const fn index(self) -> usize {
        self.0 as usize
    }

    /// The byte offset of the frame's first byte in the arena (Linux's
    /// `PFN_PHYS`): what a page-table entry holds in its address bits.
    #[inline]
    pub(crate) const fn phys(self) -> u64 {
        self.0 << PAGE_SHIFT
    }

    /// The frame holding arena byte offset `addr` (Linux's `PHYS_PFN`).
    #[inline]
    pub(crate) const fn from_phys(addr: u64) -> Pfn {
        Pfn(addr >> PAGE_SHIFT)
    }

    /// The first frame of the `frames`-aligned run holding this one (a
    /// power of two: the head of a huge page of `frames` frames).
    #[inline]
    pub(crate) const fn align_down(self, frames: u64) -> Pfn {
        debug_assert!(frames.is_power_of_two());
        Pfn(self.0 & !(frames - 1))
    }

    /// Whether the frame starts a `frames`-aligned run (a power of two).
    #[inline]
    pub(crate) const fn is_aligned(self, frames: u64) -> bool {
        debug_assert!(frames.is_power_of_two());
        self.0 & (frames - 1) == 0
    }

    /// The frames `self..end`, in ascending order.
    #[inline]
    pub(crate) fn range(self, end: Pfn) -> impl DoubleEndedIterator<Item = Pfn> {
        (self.0..end.0).map(Pfn)
    }
}

/// Tail frame `n` of the compound page headed by `self` (Linux's
/// `folio_page(folio, n)`, `nth_page`).
impl std::ops::Add<u64> for Pfn {
    type Output = Pfn;

    #[inline]
    fn add(self, n: u64) -> Pfn {
        Pfn(self.0 + n)
    }
}

/// The frames from `head` to `self`: a tail's index in its compound page
/// (Linux's `folio_page_idx`). Overflows (a panic in checked builds) if
/// `head` lies above `self`.
impl std::ops::Sub for Pfn {
    type Output = u64;

    #[inline]
    fn sub(self, head: Pfn) -> u64 {
        self.0 - head.0
    }
}

impl std::fmt::Debug for Pfn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

impl std::fmt::Display for Pfn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

// `PAGE_SIZE` is `1 << PAGE_SHIFT`; `phys` and `from_phys` rely on it.
const _: () = assert!(PAGE_SIZE == 1 << PAGE_SHIFT);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_number_converts_to_its_offset_and_back_and_prints_in_hex() {
        let p = Pfn::new(0x1234);
        assert_eq!(p.phys(), 0x1234 * PAGE_SIZE);
        assert_eq!(Pfn::from_phys(p.phys() + 17), p, "an offset inside the frame");
        assert_eq!(p.index(), 0x1234);
        assert_eq!(format!("{p} {p:?}"), "0x1234 0x1234");
    }

    #[test]
    fn tails_and_heads_of_a_compound_page() {
        let head = Pfn::new(512 * 3);
        let tail = head + 511;
        assert_eq!(tail - head, 511);
        assert_eq!(tail.align_down(512), head);
        assert!(head.is_aligned(512) && !tail.is_aligned(512));
        assert_eq!(head.range(head + 3).map(Pfn::get).collect::<Vec<_>>(), [1536, 1537, 1538]);
    }
}
