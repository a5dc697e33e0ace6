//! The value of a page-table entry ([`Pte`]) and its decoder ([`PteKind`]).
//!
//! The layout is x86-64's (NX in bit 63 included), plus software bits in the ignored range: bit 9
//! marks a `PROT_NONE` entry that keeps its frame, bit 10 a guard marker and
//! bit 11 a migration entry, whose bit 61 says that the page it replaced was
//! an exclusive anonymous page. The three software kinds are not present, so
//! a walker never translates through them.
//!
//! # Fill owners
//!
//! Bits 52-59 and 60 of a present entry say which CPUs may have cached it
//! (`crate::tlb::CpuSet`): `FILL_OWNER` is the slot + 1 of the one CPU that
//! filled its TLB from the entry (0: none since it was installed), and
//! `FILL_MULTI` says that more than one did, or one without a slot. The TLB
//! fill records itself with the compare-exchange that sets the accessed and
//! dirty bits ([`Pte::filled`]); a locked change swaps the entry and
//! returns its owners to the caller (`PteGuard::take_fill_owners`), and a
//! change to another present entry keeps them ([`Pte::with_fill_owners_of`]).
//! They are not flags: [`Pte::with_pfn`] (a copy into a new entry: fork's
//! child, mremap's destination, a migration's remap) drops them, and a
//! migration entry has none.

use crate::phys::Pfn;

/// One page-table entry's value. Only a PTE lock guard
/// ([`PteGuard`](super::PteGuard)) stores one into a table.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
#[repr(transparent)]
pub(crate) struct Pte(u64);

/// What a [`Pte`] holds, decoded.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum PteKind {
    /// Nothing: an access faults and the fault decides.
    None,
    /// A present 4 KiB page (at the PTE level) or 2 MiB page (a PMD leaf).
    Page(Pfn),
    /// A page kept under `PROT_NONE`: it holds its frame but does not translate.
    ProtNone(Pfn),
    /// A migration entry: the frame is being moved; a fault waits for it.
    Migration(Pfn),
    /// A guard marker (`MADV_GUARD_INSTALL`): an access raises `SIGSEGV`.
    Guard,
}

impl Pte {
    /// Present: the entry translates.
    pub(crate) const PRESENT: u64 = 1 << 0;
    /// Writable.
    pub(crate) const WRITE: u64 = 1 << 1;
    /// User accessible (set on every user mapping).
    pub(crate) const USER: u64 = 1 << 2;
    /// Accessed: set by the walker on every TLB fill.
    pub(crate) const ACCESSED: u64 = 1 << 5;
    /// Dirty: set by the walker on a TLB fill for write.
    pub(crate) const DIRTY: u64 = 1 << 6;
    /// A 2 MiB leaf at the PMD level (x86's PSE bit).
    pub(crate) const HUGE: u64 = 1 << 7;
    /// No-execute (x86-64's NX, bit 63): an instruction fetch through the
    /// entry faults. Set on every entry of a VMA without `VM_EXEC`.
    pub(crate) const NX: u64 = 1 << 63;
    /// Software: a `PROT_NONE` entry that keeps its frame.
    const PROTNONE: u64 = 1 << 9;
    /// Software: a guard marker, alone in its entry.
    const GUARD: u64 = 1 << 10;
    /// Software: a migration entry (not present, holds the frame number).
    const MIGRATION: u64 = 1 << 11;
    /// Software, in a migration entry only: the page was an exclusive
    /// anonymous page (`PG_ANON_EXCLUSIVE`) of this entry, which the remap
    /// gives back to whichever page it maps (Linux's writable and
    /// readable-exclusive migration entries against readable ones).
    const ANON_EXCLUSIVE: u64 = 1 << 61;
    /// Software, in a present entry: the slot + 1 of the one CPU that has
    /// filled its TLB from the entry, 0 if none has since it was installed.
    const FILL_OWNER: u64 = 0xff << Self::FILL_OWNER_SHIFT;
    const FILL_OWNER_SHIFT: u32 = 52;
    /// Software, in a present entry: more than one CPU filled from it (or
    /// one without a slot): a change shoots down every attached CPU.
    const FILL_MULTI: u64 = 1 << 60;
    /// Both fill-owner fields.
    const FILL_MASK: u64 = Self::FILL_OWNER | Self::FILL_MULTI;
    /// The frame-number field.
    const PFN_MASK: u64 = 0x000f_ffff_ffff_f000;
    /// The permission and state bits a protection change or fork rewrites:
    /// neither the frame nor who filled from the entry.
    const FLAGS_MASK: u64 = !(Self::PFN_MASK | Self::FILL_MASK);

    /// The empty entry.
    pub(crate) const NONE: Pte = Pte(0);
    /// A guard marker.
    pub(crate) const GUARD_MARKER: Pte = Pte(Self::GUARD);

    /// A present user entry mapping `pfn` with the extra bits `flags`
    /// (`WRITE`, `ACCESSED`, `DIRTY`, `NX`).
    #[inline]
    pub(crate) fn page(pfn: Pfn, flags: u64) -> Pte {
        debug_assert_eq!(flags & Self::PFN_MASK, 0);
        Pte(pfn.phys() | flags | Self::PRESENT | Self::USER)
    }

    /// A migration entry for `pfn`, remembering whether the page was writable.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn migration(pfn: Pfn, writable: bool) -> Pte {
        Pte(pfn.phys() | Self::MIGRATION | if writable { Self::WRITE } else { 0 })
    }

    /// The migration entry replacing the entry `self`, present or
    /// `PROT_NONE` (Linux's `make_writable_migration_entry` /
    /// `make_readable_migration_entry`; x86-64's `PROT_NONE` entries are
    /// present to `try_to_migrate_one`): not present, same frame number,
    /// and the entry's write, dirty, accessed and NX bits kept for
    /// [`Pte::restored`] (the remap applies the VMA's protection again).
    #[inline]
    #[must_use]
    pub(crate) fn to_migration(self, anon_exclusive: bool) -> Pte {
        debug_assert!(self.has_frame());
        let exclusive = if anon_exclusive { Self::ANON_EXCLUSIVE } else { 0 };
        // No fill owners: the entry no longer translates, and the change
        // that made it so shot its owners down.
        Pte((self.0 & !(Self::PRESENT | Self::PROTNONE | Self::FILL_MASK)) | Self::MIGRATION | exclusive)
    }

    /// True for a migration entry that replaced an exclusive anonymous page
    /// (see [`Pte::to_migration`]).
    #[inline]
    pub(crate) fn is_exclusive_migration(self) -> bool {
        self.is_migration() && self.0 & Self::ANON_EXCLUSIVE != 0
    }

    /// A migration entry copied by `fork` into a COW mapping: neither
    /// writable nor exclusive any more, in the parent or the child (Linux's
    /// `make_readable_migration_entry` in `copy_nonpresent_pte`).
    #[inline]
    #[must_use]
    pub(crate) fn shared_migration(self) -> Pte {
        debug_assert!(self.is_migration());
        Pte(self.0 & !(Self::WRITE | Self::ANON_EXCLUSIVE))
    }

    /// True for a migration entry.
    #[inline]
    pub(crate) fn is_migration(self) -> bool {
        self.0 & (Self::PRESENT | Self::PROTNONE | Self::MIGRATION) == Self::MIGRATION
    }

    /// The present entry a migration entry becomes once its page has moved
    /// to `pfn` (Linux's `remove_migration_pte`).
    #[inline]
    #[must_use]
    pub(crate) fn restored(self, pfn: Pfn) -> Pte {
        debug_assert!(self.is_migration());
        Pte((self.0 & !(Self::MIGRATION | Self::ANON_EXCLUSIVE)) | Self::PRESENT).with_pfn(pfn)
    }

    /// The raw bits, as a table stores them.
    #[inline]
    pub(super) const fn bits(self) -> u64 {
        self.0
    }

    /// The entry whose raw bits are `bits`.
    #[inline]
    pub(super) const fn from_bits(bits: u64) -> Pte {
        Pte(bits)
    }

    /// Decodes the entry.
    #[inline]
    pub(crate) fn kind(self) -> PteKind {
        let pfn = self.pfn();
        if self.0 & Self::PRESENT != 0 {
            PteKind::Page(pfn)
        } else if self.0 & Self::PROTNONE != 0 {
            PteKind::ProtNone(pfn)
        } else if self.0 & Self::MIGRATION != 0 {
            PteKind::Migration(pfn)
        } else if self.0 == Self::GUARD {
            PteKind::Guard
        } else {
            debug_assert_eq!(self.0, 0, "unknown page-table entry {:#x}", self.0);
            PteKind::None
        }
    }

    /// True for the empty entry.
    #[inline]
    pub(crate) fn is_none(self) -> bool {
        self.0 == 0
    }

    /// True if the entry translates.
    #[inline]
    pub(crate) fn is_present(self) -> bool {
        self.0 & Self::PRESENT != 0
    }

    /// True if the entry holds a reference on a frame: present, or kept under
    /// `PROT_NONE`.
    #[inline]
    pub(crate) fn has_frame(self) -> bool {
        self.0 & (Self::PRESENT | Self::PROTNONE) != 0
    }

    /// True for a guard marker.
    #[inline]
    pub(crate) fn is_guard(self) -> bool {
        self.0 == Self::GUARD
    }

    /// True if every bit of `flags` is set.
    #[inline]
    pub(crate) fn has(self, flags: u64) -> bool {
        self.0 & flags == flags
    }

    /// The frame number (meaningful when [`Pte::has_frame`] or for a
    /// migration entry).
    #[inline]
    pub(crate) fn pfn(self) -> Pfn {
        Pfn::from_phys(self.0 & Self::PFN_MASK)
    }

    /// The entry with `flags` added.
    #[inline]
    #[must_use]
    pub(crate) fn set(self, flags: u64) -> Pte {
        Pte(self.0 | flags)
    }

    /// The entry with `flags` removed.
    #[inline]
    #[must_use]
    pub(crate) fn clear(self, flags: u64) -> Pte {
        Pte(self.0 & !flags)
    }

    /// The value a TLB fill by the CPU of `slot` (`None`: a CPU without a
    /// slot) leaves in the entry: with `bits` (accessed, dirty) set and the
    /// CPU among its fill owners: the owner if there was none, else
    /// [`Pte::FILL_MULTI`] unless the owner is this CPU. `self` itself when
    /// nothing changes, the common case of a CPU refilling its own entry,
    /// which then needs no compare-exchange.
    #[inline]
    #[must_use]
    pub(crate) fn filled(self, bits: u64, slot: Option<u8>) -> Pte {
        debug_assert!(bits & !(Self::ACCESSED | Self::DIRTY) == 0);
        let me = slot.map_or(0, |s| (u64::from(s) + 1) << Self::FILL_OWNER_SHIFT);
        let owner = self.0 & Self::FILL_OWNER;
        let fill = if self.0 & Self::FILL_MULTI != 0 || (me != 0 && owner == me) {
            0
        } else if owner == 0 && me != 0 {
            me
        } else {
            Self::FILL_MULTI
        };
        Pte(self.0 | bits | fill)
    }

    /// The fill owners of the entry: added to `set` (every CPU for
    /// [`Pte::FILL_MULTI`]).
    #[inline]
    pub(crate) fn add_fill_owners(self, set: &mut crate::tlb::CpuSet) {
        if self.0 & Self::FILL_MULTI != 0 {
            set.insert_all();
        } else if let Some(slot) = self.fill_owner() {
            set.insert(slot);
        }
    }

    /// The slot of the entry's one fill owner, if it has exactly one.
    #[inline]
    pub(crate) fn fill_owner(self) -> Option<u8> {
        match (self.0 & Self::FILL_OWNER) >> Self::FILL_OWNER_SHIFT {
            _ if self.0 & Self::FILL_MULTI != 0 => None,
            0 => None,
            o => Some((o - 1) as u8),
        }
    }

    /// The entry with the fill owners of `old` added to its own: what a
    /// locked change that keeps the entry translating stores, so that a CPU
    /// that cached `old` is still found by the change that later clears it.
    #[inline]
    #[must_use]
    pub(crate) fn with_fill_owners_of(self, old: Pte) -> Pte {
        let (mine, theirs) = (self.0 & Self::FILL_OWNER, old.0 & Self::FILL_OWNER);
        let multi = (self.0 | old.0) & Self::FILL_MULTI != 0 || (mine != 0 && theirs != 0 && mine != theirs);
        if multi {
            Pte((self.0 & !Self::FILL_OWNER) | Self::FILL_MULTI)
        } else {
            Pte(self.0 | theirs)
        }
    }

    /// The same permissions and state on another frame (a COW copy), with
    /// no fill owner (nothing has filled from the new entry).
    #[inline]
    #[must_use]
    pub(crate) fn with_pfn(self, pfn: Pfn) -> Pte {
        Pte((self.0 & Self::FLAGS_MASK) | pfn.phys())
    }

    /// The entry hidden by `PROT_NONE`: it keeps its frame and dirty state
    /// but neither translates nor allows writes.
    #[inline]
    #[must_use]
    pub(crate) fn protnone(self) -> Pte {
        Pte((self.0 & !(Self::PRESENT | Self::WRITE)) | Self::PROTNONE)
    }

    /// A `PROT_NONE` entry made present again.
    #[inline]
    #[must_use]
    pub(crate) fn unprotnone(self) -> Pte {
        Pte((self.0 & !Self::PROTNONE) | Self::PRESENT)
    }
}

impl std::fmt::Debug for Pte {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pte({:#x}: {:?})", self.0, self.kind())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::PAGE_SHIFT;

    /// Two frame numbers.
    const P: Pfn = Pfn::new(0x1234);
    const Q: Pfn = Pfn::new(9);

    #[test]
    fn every_kind_decodes_to_itself() {
        assert_eq!(Pte::NONE.kind(), PteKind::None);
        assert_eq!(Pte::GUARD_MARKER.kind(), PteKind::Guard);
        let p = Pte::page(P, Pte::WRITE | Pte::DIRTY);
        assert_eq!(p.kind(), PteKind::Page(P));
        assert!(p.is_present() && p.has_frame() && p.has(Pte::WRITE | Pte::DIRTY | Pte::USER));
        let hidden = p.protnone();
        assert_eq!(hidden.kind(), PteKind::ProtNone(P));
        assert!(!hidden.is_present() && hidden.has_frame() && !hidden.has(Pte::WRITE) && hidden.has(Pte::DIRTY));
        assert_eq!(hidden.unprotnone(), p.clear(Pte::WRITE));
        assert_eq!(Pte::migration(Pfn::new(7), true).kind(), PteKind::Migration(Pfn::new(7)));
        assert!(!Pte::migration(Pfn::new(7), true).has_frame() && !Pte::migration(Pfn::new(7), true).is_present());
        let m = p.to_migration(false);
        assert!(m.is_migration() && !m.is_present() && !m.has_frame() && m.has(Pte::WRITE | Pte::DIRTY));
        assert!(!m.is_exclusive_migration());
        let x = p.to_migration(true);
        assert!(x.is_exclusive_migration() && x.kind() == PteKind::Migration(P));
        assert_eq!(x.restored(Q), p.with_pfn(Q), "the remap keeps no software bit");
        assert_eq!(x.shared_migration(), m.clear(Pte::WRITE));
        assert_eq!(m.kind(), PteKind::Migration(P));
        assert_eq!(m.restored(Q), p.with_pfn(Q));
        assert!(!p.is_migration() && !hidden.is_migration() && !Pte::NONE.is_migration());
        // A PROT_NONE entry migrates too; the remap hides it again.
        let hm = hidden.to_migration(false);
        assert_eq!(hm.kind(), PteKind::Migration(P));
        assert_eq!(hm.restored(Q).protnone(), hidden.with_pfn(Q));
        assert_eq!(p.with_pfn(Q).kind(), PteKind::Page(Q));
        assert_eq!(p.with_pfn(Q).clear(Pte::PFN_MASK), p.clear(Pte::PFN_MASK));
    }

    #[test]
    fn a_fill_records_one_owner_then_several() {
        use crate::tlb::CpuSet;
        let p = Pte::page(P, Pte::WRITE | Pte::ACCESSED);
        let owners = |p: Pte| {
            let mut s = CpuSet::EMPTY;
            p.add_fill_owners(&mut s);
            s
        };
        assert!(owners(p).is_empty());
        assert_eq!(p.filled(0, Some(3)).fill_owner(), Some(3));
        assert_eq!(p.filled(Pte::DIRTY, Some(254)).fill_owner(), Some(254));
        let mine = p.filled(0, Some(3));
        assert_eq!(mine.filled(0, Some(3)), mine, "a refill by the owner changes nothing");
        assert_eq!(mine.filled(Pte::DIRTY, Some(3)), mine.set(Pte::DIRTY));
        let both = mine.filled(0, Some(4));
        assert!(both.fill_owner().is_none() && owners(both).is_all());
        assert_eq!(both.filled(0, Some(9)), both);
        assert!(owners(p.filled(0, None)).is_all(), "a CPU without a slot");
        assert!(owners(mine).contains(Some(3)) && !owners(mine).contains(Some(4)));
        // Frame, kind and permissions are untouched by the owners.
        assert_eq!(both.kind(), p.kind());
        assert_eq!(both.pfn(), P);
        assert_eq!(mine.with_pfn(Q), p.with_pfn(Q), "a copy has no owner");
        assert!(mine.to_migration(false).restored(P) == p, "nor a migration entry");
        // A locked change that keeps the entry keeps its owners.
        assert_eq!(p.clear(Pte::WRITE).with_fill_owners_of(mine).fill_owner(), Some(3));
        assert_eq!(mine.clear(Pte::WRITE).with_fill_owners_of(mine).fill_owner(), Some(3));
        assert!(owners(p.filled(0, Some(4)).with_fill_owners_of(mine)).is_all());
        assert!(owners(mine.with_fill_owners_of(both)).is_all());
        assert_eq!(p.with_fill_owners_of(Pte::NONE), p);
        assert_eq!(mine.protnone().unprotnone().fill_owner(), Some(3));
    }

    #[test]
    fn the_frame_field_holds_every_frame_of_a_52_bit_space() {
        let max = Pfn::new((1 << 40) - 1);
        assert_eq!(Pte::page(max, 0).pfn(), max);
        assert_eq!(Pte::page(max, 0).clear(Pte::PRESENT | Pte::USER).bits(), max.get() << PAGE_SHIFT);
    }
}
