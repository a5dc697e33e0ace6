//! What the replay knows of an address space beyond softmm's own state:
//! which recorded ranges traced calls touched ([`RangeSet`]), where softmm
//! placed what the log placed elsewhere ([`Translation`]), and which memory a
//! call's recorded success proves existed before tracing began ([`proof`]).

use std::collections::BTreeMap;

use softmm::uapi::{MREMAP_DONTUNMAP, MREMAP_FIXED};
use softmm::{page_align, PAGE_SIZE};

use super::parse::Call;

/// Ranges of addresses, merged.
#[derive(Default, Clone)]
pub(super) struct RangeSet {
    /// start → end
    map: BTreeMap<u64, u64>,
}

impl RangeSet {
    pub(super) fn insert(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        let overlapping: Vec<(u64, u64)> =
            self.map.range(..=end).rev().take_while(|&(_, &e)| e >= start).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in overlapping {
            self.map.remove(&s);
            start = start.min(s);
            end = end.max(e);
        }
        self.map.insert(start, end);
    }

    /// Removes `[start, end)` from the set.
    pub(super) fn remove(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let overlapping: Vec<(u64, u64)> =
            self.map.range(..end).rev().take_while(|&(_, &e)| e > start).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in overlapping {
            self.map.remove(&s);
            if s < start {
                self.map.insert(s, start);
            }
            if e > end {
                self.map.insert(end, e);
            }
        }
    }

    /// The parts of `[start, end)` not in the set.
    pub(super) fn gaps(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut cur = start;
        if let Some((_, &e)) = self.map.range(..=start).next_back() {
            cur = cur.max(e);
        }
        for (&s, &e) in self.map.range(start..end) {
            if s > cur {
                out.push((cur, s));
            }
            cur = cur.max(e);
        }
        if cur < end {
            out.push((cur, end));
        }
        out
    }
}

/// Recorded-address ranges softmm placed elsewhere (`--addresses own`).
#[derive(Default, Clone)]
pub(super) struct Translation {
    /// (recorded start, recorded end, softmm start − recorded start)
    ranges: Vec<(u64, u64, u64)>,
}

impl Translation {
    pub(super) fn add(&mut self, rec: u64, len: u64, own: u64) {
        self.ranges.push((rec, rec.saturating_add(page_align(len).max(PAGE_SIZE)), own.wrapping_sub(rec)));
    }

    pub(super) fn tr(&self, a: u64) -> u64 {
        match self.ranges.iter().rev().find(|&&(s, e, _)| s <= a && a < e) {
            Some(&(_, _, d)) => a.wrapping_add(d),
            None => a,
        }
    }
}

/// An anonymous mapping standing for memory mapped before tracing began.
#[derive(Clone)]
pub(super) struct Placeholder {
    /// softmm addresses.
    pub start: u64,
    pub end: u64,
    /// The log line whose recorded success proved the memory.
    pub line: usize,
    pub call: &'static str,
}

/// The range (recorded addresses) that a call's recorded success proves was
/// mapped before it, by the checks Linux makes before it succeeds; `None`
/// where success proves nothing (`munmap`, `mmap`, `brk`, an empty range).
///
/// * `mprotect`, `madvise`, `mseal`: the whole range (a hole is `ENOMEM`;
///   glibc's startup and `seal_elf` seal the executable's and ld.so's
///   segments, mapped before tracing began).
/// * `mremap` that resizes in place or moves without `MREMAP_FIXED`: a shrink
///   or a same-size call only looks up the VMA at `old` (its tail may cross
///   holes and other VMAs): one page; a growth needs `[old, old + old_len)`
///   in one VMA (`EFAULT` otherwise).
/// * `mremap` with `MREMAP_FIXED` or `MREMAP_DONTUNMAP`: `[old, old +
///   min(old_len, new_len))` in one VMA; a same-size `MREMAP_FIXED` move
///   moves every VMA in the range, holes and all, and needs only the VMA at
///   `old`: one page. (Checked on Linux 6.18.)
pub(super) fn proof(call: &Call) -> Option<(u64, u64)> {
    let (start, len) = match *call {
        Call::Mprotect { addr, len, .. } | Call::Madvise { addr, len, .. } | Call::Mseal { addr, len, .. } => {
            (addr, page_align(len))
        }
        Call::Mremap { old, old_len, new_len, flags, .. } => {
            let (o, n) = (page_align(old_len), page_align(new_len));
            let len = if flags & MREMAP_FIXED != 0 && o == n {
                PAGE_SIZE
            } else if flags & (MREMAP_FIXED | MREMAP_DONTUNMAP) != 0 {
                o.min(n)
            } else if n <= o {
                PAGE_SIZE
            } else {
                o
            };
            (old, len.max(PAGE_SIZE))
        }
        _ => return None,
    };
    let end = start.checked_add(len)?;
    (start < end).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use softmm::uapi::MREMAP_MAYMOVE;

    const P: u64 = PAGE_SIZE;

    #[test]
    fn what_success_proves() {
        let mremap = |old_len, new_len, flags| Call::Mremap { old: 0x10000, old_len, new_len, flags, new_addr: 0 };
        let page = Some((0x10000, 0x10000 + P));
        // Shrink and same size in place: only the VMA at `old`.
        assert_eq!(proof(&mremap(8 * P, 2 * P, 0)), page);
        assert_eq!(proof(&mremap(8 * P, 8 * P, MREMAP_MAYMOVE)), page);
        // Growth: the whole old range.
        assert_eq!(proof(&mremap(3 * P, 8 * P, MREMAP_MAYMOVE)), Some((0x10000, 0x10000 + 3 * P)));
        assert_eq!(proof(&mremap(0, 8 * P, MREMAP_MAYMOVE)), page);
        // Fixed or DONTUNMAP: the part that moves; a same-size fixed move
        // takes holes along.
        assert_eq!(proof(&mremap(8 * P, 2 * P, MREMAP_MAYMOVE | MREMAP_FIXED)), Some((0x10000, 0x10000 + 2 * P)));
        assert_eq!(proof(&mremap(5 * P, 5 * P, MREMAP_MAYMOVE | MREMAP_FIXED)), page);
        assert_eq!(proof(&mremap(4 * P, 4 * P, MREMAP_MAYMOVE | MREMAP_DONTUNMAP)), Some((0x10000, 0x10000 + 4 * P)));
        assert_eq!(proof(&Call::Mprotect { addr: P, len: 3 * P - 1, prot: 0 }), Some((P, 4 * P)));
        assert_eq!(proof(&Call::Madvise { addr: P, len: 0, advice: 0 }), None);
        // mseal of a hole is ENOMEM (Linux 6.12 check_mm_seal): success
        // proves the whole range, as seal_elf's seals of the executable do.
        assert_eq!(proof(&Call::Mseal { addr: P, len: 2 * P + 1, flags: 0 }), Some((P, 4 * P)));
        assert_eq!(proof(&Call::Mseal { addr: P, len: 0, flags: 0 }), None);
        assert_eq!(proof(&Call::Munmap { addr: P, len: P }), None);
        // A range past 2^64 proves nothing (it cannot have succeeded).
        assert_eq!(proof(&Call::Mprotect { addr: u64::MAX - P + 1, len: 2 * P, prot: 0 }), None);
    }

    #[test]
    fn range_set_insert_remove_gaps() {
        let mut s = RangeSet::default();
        s.insert(0x1000, 0x5000);
        s.insert(0x8000, 0x9000);
        s.remove(0x2000, 0x3000);
        assert_eq!(s.gaps(0, 0xa000), vec![(0, 0x1000), (0x2000, 0x3000), (0x5000, 0x8000), (0x9000, 0xa000)]);
        s.remove(0x4000, 0x8800);
        assert_eq!(s.gaps(0x1000, 0x9000), vec![(0x2000, 0x3000), (0x4000, 0x8800)]);
        s.insert(0, 0x10000);
        assert!(s.gaps(0, 0x10000).is_empty());
    }
}
