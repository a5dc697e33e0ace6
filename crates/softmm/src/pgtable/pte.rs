//! The value of a page-table entry ([`Pte`]) and its decoder ([`PteKind`]).
//!
//! The layout is x86-64's (NX in bit 63 included), plus software bits in the ignored range: bit 9
//! marks a `PROT_NONE` entry that keeps its frame, bit 10 a guard marker and
//! bit 11 a migration entry, whose bit 58 says that the page it replaced was
//! an exclusive anonymous page. The three software kinds are not present, so
//! a walker never translates through them.

use crate::phys::Pfn;
use crate::PAGE_SHIFT;

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
    const ANON_EXCLUSIVE: u64 = 1 << 58;
    /// The frame-number field.
    const PFN_MASK: u64 = 0x000f_ffff_ffff_f000;
    /// The permission and state bits a protection change or fork rewrites.
    const FLAGS_MASK: u64 = !Self::PFN_MASK;

    /// The empty entry.
    pub(crate) const NONE: Pte = Pte(0);
    /// A guard marker.
    pub(crate) const GUARD_MARKER: Pte = Pte(Self::GUARD);

    /// A present user entry mapping `pfn` with the extra bits `flags`
    /// (`WRITE`, `ACCESSED`, `DIRTY`, `NX`).
    #[inline]
    pub(crate) fn page(pfn: Pfn, flags: u64) -> Pte {
        debug_assert_eq!(flags & Self::PFN_MASK, 0);
        Pte((pfn << PAGE_SHIFT) | flags | Self::PRESENT | Self::USER)
    }

    /// A migration entry for `pfn`, remembering whether the page was writable.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn migration(pfn: Pfn, writable: bool) -> Pte {
        Pte((pfn << PAGE_SHIFT) | Self::MIGRATION | if writable { Self::WRITE } else { 0 })
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
        Pte((self.0 & !(Self::PRESENT | Self::PROTNONE)) | Self::MIGRATION | exclusive)
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
        (self.0 & Self::PFN_MASK) >> PAGE_SHIFT
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

    /// The same permissions and state on another frame (a COW copy).
    #[inline]
    #[must_use]
    pub(crate) fn with_pfn(self, pfn: Pfn) -> Pte {
        Pte((self.0 & Self::FLAGS_MASK) | (pfn << PAGE_SHIFT))
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

    #[test]
    fn every_kind_decodes_to_itself() {
        assert_eq!(Pte::NONE.kind(), PteKind::None);
        assert_eq!(Pte::GUARD_MARKER.kind(), PteKind::Guard);
        let p = Pte::page(0x1234, Pte::WRITE | Pte::DIRTY);
        assert_eq!(p.kind(), PteKind::Page(0x1234));
        assert!(p.is_present() && p.has_frame() && p.has(Pte::WRITE | Pte::DIRTY | Pte::USER));
        let hidden = p.protnone();
        assert_eq!(hidden.kind(), PteKind::ProtNone(0x1234));
        assert!(!hidden.is_present() && hidden.has_frame() && !hidden.has(Pte::WRITE) && hidden.has(Pte::DIRTY));
        assert_eq!(hidden.unprotnone(), p.clear(Pte::WRITE));
        assert_eq!(Pte::migration(7, true).kind(), PteKind::Migration(7));
        assert!(!Pte::migration(7, true).has_frame() && !Pte::migration(7, true).is_present());
        let m = p.to_migration(false);
        assert!(m.is_migration() && !m.is_present() && !m.has_frame() && m.has(Pte::WRITE | Pte::DIRTY));
        assert!(!m.is_exclusive_migration());
        let x = p.to_migration(true);
        assert!(x.is_exclusive_migration() && x.kind() == PteKind::Migration(0x1234));
        assert_eq!(x.restored(9), p.with_pfn(9), "the remap keeps no software bit");
        assert_eq!(x.shared_migration(), m.clear(Pte::WRITE));
        assert_eq!(m.kind(), PteKind::Migration(0x1234));
        assert_eq!(m.restored(9), p.with_pfn(9));
        assert!(!p.is_migration() && !hidden.is_migration() && !Pte::NONE.is_migration());
        // A PROT_NONE entry migrates too; the remap hides it again.
        let hm = hidden.to_migration(false);
        assert_eq!(hm.kind(), PteKind::Migration(0x1234));
        assert_eq!(hm.restored(9).protnone(), hidden.with_pfn(9));
        assert_eq!(p.with_pfn(9).kind(), PteKind::Page(9));
        assert_eq!(p.with_pfn(9).clear(Pte::PFN_MASK), p.clear(Pte::PFN_MASK));
    }

    #[test]
    fn the_frame_field_holds_every_frame_of_a_52_bit_space() {
        let max: Pfn = (1 << 40) - 1;
        assert_eq!(Pte::page(max, 0).pfn(), max);
        assert_eq!(Pte::page(max, 0).clear(Pte::PRESENT | Pte::USER).bits(), max << PAGE_SHIFT);
    }
}
