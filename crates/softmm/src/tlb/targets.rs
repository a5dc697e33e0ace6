//! Shootdown targets: which CPUs may cache a translation, so that a
//! shootdown asks only those (ABIS, RadixVM's per-page CPU sets, in
//! software).
//!
//! Every CPU ([`super::CpuTlbState`]) holds a process-wide *slot*, a small
//! number (`0..MAX_SLOTS`) taken when it is made and given back when it is
//! dropped. The TLB fill records its slot in the page-table entry it fills
//! from (the entry's fill-owner bits, `pgtable/pte.rs`); a clear of the
//! entry collects the owners it swapped out into a [`CpuSet`]; and the
//! flush asks only the attached CPUs whose slot is in the set
//! ([`super::TlbDomain::flush_begin_targets`]). A set that is
//! [`CpuSet::all`] (an entry filled by more than one CPU, a table shared
//! across address spaces, a CPU made when every slot was taken) asks every
//! attached CPU, as a plain [`super::TlbDomain::flush_begin`] does.
//!
//! A slot given back and taken again by another CPU may still be named by
//! entries its old holder filled: the old holder emptied its TLB when it
//! left its domain (or was dropped with it), so the new holder only gets a
//! request it did not need.
//!
//! # Protocol
//!
//! * **Fill** (lock-free, `Cpu::translate_slow`): load the entry; if it
//!   already names this CPU (or several) and has the accessed and dirty
//!   bits the access needs, fill from it with no atomic; else
//!   compare-exchange it to the same entry with the bits and this CPU added
//!   (`Pte::filled`, `Leaf::set_filled`), fill from the value the exchange
//!   validated, or walk again if it failed.
//! * **Change** (under the PTE lock, `PteGuard::replace`): compare-exchange
//!   the entry from the value last seen to the new one, retrying with what
//!   the failure returned (fills only add bits: at most four retries); the
//!   owners of the old value, if it was present, go to the guard and, if the
//!   new value is present too, into it.
//! * **Flush** ([`super::TlbDomain::flush_begin_targets`]): after the
//!   changes, ask the attached CPUs the collected set names.
//!
//! Fill and change are read-modify-writes of one word, so one is first in
//! its modification order. Fill first: the change's exchange reads the
//! filler's bits and the flush asks it (then the handshake of [`super`]
//! applies). Change first: the fill's exchange fails, and it walks the new
//! entry. A fill with no atomic read a value naming it, which every value
//! after it in the modification order names too (only a change drops
//! owners, and then returns them), so the change returns it. The loom model
//! `a_fill_racing_a_clear_is_seen_by_the_clear_or_sees_the_cleared_entry`
//! (`loom_tests.rs`) runs this on the real `Cpu` and `MADV_DONTNEED`.

use std::sync::Mutex;

/// Which CPUs a shootdown asks to drop their TLB entries. More policies
/// may come, so a `match` on it needs a wildcard arm. Every policy asks at
/// least every CPU that may cache a translation the change removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ShootdownTargets {
    /// Every attached CPU (of another thread: a thread's own CPUs flush at
    /// their next access), as softmm did first and Linux does for an
    /// `mm_cpumask` that every thread's CPU has joined.
    Broadcast,
    /// The CPUs that filled their TLB from the entries the change cleared
    /// or narrowed, recorded in the entries (ABIS, RadixVM): none but the
    /// initiator's own in the common case of thread-private data, and then
    /// no request, no barrier and no wait. Zaps and the COW break use them;
    /// other changes (mprotect, mremap, fork, migration, hugetlb entries,
    /// which may sit in tables shared across address spaces) and an entry
    /// filled by several CPUs ask every attached CPU.
    #[default]
    FillOwners,
    /// [`ShootdownTargets::FillOwners`], and each request names the pages
    /// the change covered (at most `FlushRange::MAX_PAGES`, else every
    /// entry), so that a target keeps the rest of its TLB (Linux's and
    /// Asterinas's ranged flushes). Broadcasts still empty whole TLBs.
    FillOwnersRanges,
}

impl ShootdownTargets {
    /// Every policy, for sweeps.
    pub const ALL: &'static [ShootdownTargets] =
        &[ShootdownTargets::Broadcast, ShootdownTargets::FillOwners, ShootdownTargets::FillOwnersRanges];

    /// The kebab-case name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            ShootdownTargets::Broadcast => "broadcast",
            ShootdownTargets::FillOwners => "fill-owners",
            ShootdownTargets::FillOwnersRanges => "fill-owners-ranges",
        }
    }

    /// The policy named `name` (see [`ShootdownTargets::name`]).
    pub fn from_name(name: &str) -> Option<ShootdownTargets> {
        ShootdownTargets::ALL.iter().copied().find(|p| p.name() == name)
    }
}

/// Slots: one less than the fill-owner field's values (0 there means
/// "nobody").
pub(crate) const MAX_SLOTS: usize = 255;

/// A set of CPU slots, or every CPU. 256 bits: one per slot.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct CpuSet {
    bits: [u64; 4],
    all: bool,
}

impl CpuSet {
    /// No CPU.
    pub const EMPTY: CpuSet = CpuSet { bits: [0; 4], all: false };

    /// Every CPU.
    pub fn all() -> CpuSet {
        CpuSet { bits: [0; 4], all: true }
    }

    /// Adds `slot`.
    #[inline]
    pub fn insert(&mut self, slot: u8) {
        self.bits[slot as usize / 64] |= 1 << (slot % 64);
    }

    /// Makes the set every CPU.
    #[inline]
    pub fn insert_all(&mut self) {
        self.all = true;
    }

    /// Adds every CPU of `other`.
    #[inline]
    pub fn union(&mut self, other: &CpuSet) {
        self.all |= other.all;
        self.bits.iter_mut().zip(other.bits).for_each(|(a, b)| *a |= b);
    }

    /// True if the set holds the CPU of `slot` (every slot, for
    /// [`CpuSet::all`]); `None`, a CPU without a slot, only in `all`.
    #[inline]
    pub fn contains(&self, slot: Option<u8>) -> bool {
        self.all || slot.is_some_and(|s| self.bits[s as usize / 64] & (1 << (s % 64)) != 0)
    }

    /// True if the set is every CPU.
    #[inline]
    pub fn is_all(&self) -> bool {
        self.all
    }

    /// True if the set holds no CPU.
    #[inline]
    pub fn is_empty(&self) -> bool {
        !self.all && self.bits == [0; 4]
    }

    /// The set without `slots` (`None`s ignored); [`CpuSet::all`] stays
    /// every CPU.
    pub(crate) fn without(mut self, slots: impl IntoIterator<Item = Option<u8>>) -> CpuSet {
        for s in slots.into_iter().flatten() {
            self.bits[s as usize / 64] &= !(1 << (s % 64));
        }
        self
    }
}

/// The slots in use, a bit each. A plain `std` lock (never loom's): taken
/// only where a CPU is made or dropped, never inside a protocol step, so
/// that a model's CPUs take their slots without scheduling points.
static SLOTS: Mutex<[u64; 4]> = Mutex::new([0; 4]);

/// Takes a free slot, or `None` if all [`MAX_SLOTS`] are in use (the CPU
/// then marks the entries it fills as filled by several CPUs).
pub(crate) fn alloc_slot() -> Option<u8> {
    let mut slots = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
    let slot = (0..MAX_SLOTS).find(|&s| slots[s / 64] & (1 << (s % 64)) == 0)?;
    slots[slot / 64] |= 1 << (slot % 64);
    Some(slot as u8)
}

/// Gives `slot` back (from the CPU's drop).
pub(crate) fn free_slot(slot: u8) {
    let mut slots = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
    slots[slot as usize / 64] &= !(1 << (slot % 64));
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_set_holds_its_slots_and_all_holds_every_one() {
        let mut s = CpuSet::EMPTY;
        assert!(s.is_empty() && !s.contains(Some(0)) && !s.contains(None));
        s.insert(0);
        s.insert(200);
        assert!(s.contains(Some(0)) && s.contains(Some(200)) && !s.contains(Some(1)) && !s.contains(None));
        assert!(s.without([Some(0), None]).contains(Some(200)));
        assert!(!s.without([Some(0), Some(200)]).contains(Some(0)));
        assert!(s.without([Some(0), Some(200)]).is_empty());
        let mut t = CpuSet::EMPTY;
        t.insert(7);
        t.union(&s);
        assert!(t.contains(Some(7)) && t.contains(Some(200)) && !t.is_all());
        t.union(&CpuSet::all());
        assert!(t.is_all() && t.contains(None) && t.contains(Some(254)) && !t.is_empty());
        assert!(t.without([Some(7)]).contains(Some(7)), "every CPU stays every CPU");
    }

    #[test]
    fn each_policy_is_found_by_its_name() {
        for p in ShootdownTargets::ALL {
            assert_eq!(ShootdownTargets::from_name(p.name()), Some(*p));
        }
        assert_eq!(ShootdownTargets::from_name("nobody"), None);
    }

    #[test]
    fn slots_are_unique_and_come_back() {
        let a = alloc_slot().expect("a free slot");
        let b = alloc_slot().expect("a free slot");
        assert_ne!(a, b);
        free_slot(a);
        free_slot(b);
    }
}
