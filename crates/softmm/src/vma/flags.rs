//! `VM_*` flags: what a VMA allows and how it behaves, with Linux's bit values
//! (`include/linux/mm.h`), so a dump of them reads as the kernel's would.

bitflags::bitflags! {
    /// A VMA's `vm_flags`. Each constant is Linux's `VM_<NAME>` with the
    /// same bit, so `mprotect`'s "each access bit needs its `MAY` twin four
    /// bits up" rule holds on the raw bits as it does in the kernel.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub(crate) struct VmFlags: u64 {
        /// Readable.
        const READ = 0x1;
        /// Writable.
        const WRITE = 0x2;
        /// Executable.
        const EXEC = 0x4;
        /// Shared and writable through the file: writes reach the page cache.
        const SHARED = 0x8;
        /// `mprotect` may add `PROT_READ`.
        const MAYREAD = 0x10;
        /// `mprotect` may add `PROT_WRITE`.
        const MAYWRITE = 0x20;
        /// `mprotect` may add `PROT_EXEC`.
        const MAYEXEC = 0x40;
        /// Mapped `MAP_SHARED` (shown as `s` in maps).
        const MAYSHARE = 0x80;
        /// A stack that grows down on faults below it.
        const GROWSDOWN = 0x100;
        /// Linux's `VM_PFNMAP`: raw PFNs, no `struct page`. Never set here;
        /// named for `VM_SPECIAL`.
        const PFNMAP = 0x400;
        /// `mlock`ed.
        const LOCKED = 0x2000;
        /// Linux's `VM_IO`: device memory. Never set here; named for `VM_SPECIAL`.
        const IO = 0x4000;
        /// `MADV_SEQUENTIAL`.
        const SEQ_READ = 0x8000;
        /// `MADV_RANDOM`.
        const RAND_READ = 0x10000;
        /// `MADV_DONTFORK`: not copied to a child.
        const DONTCOPY = 0x20000;
        /// Cannot be expanded by mremap.
        const DONTEXPAND = 0x40000;
        /// `MLOCK_ONFAULT`/`MCL_ONFAULT`: locked pages are the ones faulted
        /// in, nothing is populated (always with `LOCKED`).
        const LOCKONFAULT = 0x80000;
        /// Charged to the commit limit (private writable).
        const ACCOUNT = 0x100000;
        /// `MAP_NORESERVE`.
        const NORESERVE = 0x200000;
        /// A hugetlb mapping: 2 MiB pages from the pool (Linux's `VM_HUGETLB`).
        const HUGETLB = 0x400000;
        /// `MADV_WIPEONFORK`: the child sees zeroes.
        const WIPEONFORK = 0x2000000;
        /// `MADV_DONTDUMP`.
        const DONTDUMP = 0x0400_0000;
        /// Linux's `VM_MIXEDMAP`. Never set here; named for `VM_SPECIAL`.
        const MIXEDMAP = 0x1000_0000;
        /// `MADV_HUGEPAGE`.
        const HUGEPAGE = 0x2000_0000;
        /// `MADV_NOHUGEPAGE`, and `MAP_STACK` (Linux 6.7+).
        const NOHUGEPAGE = 0x4000_0000;
        /// `MADV_MERGEABLE`: KSM may merge the VMA's pages.
        const MERGEABLE = 0x8000_0000;
        /// `MAP_DROPPABLE` (bit 40 on 64-bit).
        const DROPPABLE = 1 << 40;
        /// `mseal`ed (Linux 6.10+, bit 63): the VMA can no longer be
        /// unmapped, moved, resized, reprotected or discarded.
        const SEALED = 1 << 63;

        /// Linux's `VM_LOCKED_MASK`: the flags `mlock` and `munlock` set
        /// and clear together.
        const LOCKED_MASK = Self::LOCKED.bits() | Self::LOCKONFAULT.bits();
        /// The access bits.
        const ACCESS_FLAGS = Self::READ.bits() | Self::WRITE.bits() | Self::EXEC.bits();
        /// Linux's `VM_SPECIAL`: never merged, never split by THP or KSM
        /// advice. Of these softmm sets only `DONTEXPAND`.
        const SPECIAL = Self::IO.bits() | Self::DONTEXPAND.bits() | Self::PFNMAP.bits() | Self::MIXEDMAP.bits();
    }
}

impl VmFlags {
    /// The access bits of `PROT_*` (Linux's `calc_vm_prot_bits`).
    pub(crate) fn from_prot(prot: i32) -> VmFlags {
        let mut f = VmFlags::empty();
        f.set(VmFlags::READ, prot & libc::PROT_READ != 0);
        f.set(VmFlags::WRITE, prot & libc::PROT_WRITE != 0);
        f.set(VmFlags::EXEC, prot & libc::PROT_EXEC != 0);
        f
    }

    /// The flags as smaps's `VmFlags:` line prints them (Linux's
    /// `show_smap_vma_flags` mnemonics, in bit order, space separated).
    pub(crate) fn smaps_mnemonics(self) -> String {
        const NAMES: [(VmFlags, &str); 27] = [
            (VmFlags::READ, "rd"),
            (VmFlags::WRITE, "wr"),
            (VmFlags::EXEC, "ex"),
            (VmFlags::SHARED, "sh"),
            (VmFlags::MAYREAD, "mr"),
            (VmFlags::MAYWRITE, "mw"),
            (VmFlags::MAYEXEC, "me"),
            (VmFlags::MAYSHARE, "ms"),
            (VmFlags::GROWSDOWN, "gd"),
            (VmFlags::PFNMAP, "pf"),
            (VmFlags::LOCKED, "lo"),
            (VmFlags::IO, "io"),
            (VmFlags::SEQ_READ, "sr"),
            (VmFlags::RAND_READ, "rr"),
            (VmFlags::DONTCOPY, "dc"),
            (VmFlags::DONTEXPAND, "de"),
            (VmFlags::LOCKONFAULT, "lf"),
            (VmFlags::ACCOUNT, "ac"),
            (VmFlags::NORESERVE, "nr"),
            (VmFlags::HUGETLB, "ht"),
            (VmFlags::WIPEONFORK, "wf"),
            (VmFlags::DONTDUMP, "dd"),
            (VmFlags::MIXEDMAP, "mm"),
            (VmFlags::HUGEPAGE, "hg"),
            (VmFlags::NOHUGEPAGE, "nh"),
            (VmFlags::MERGEABLE, "mg"),
            (VmFlags::DROPPABLE, "dp"),
        ];
        let mut names: Vec<&str> = NAMES.iter().filter(|(f, _)| self.contains(*f)).map(|&(_, n)| n).collect();
        if self.contains(VmFlags::SEALED) {
            names.push("sl");
        }
        names.join(" ")
    }

    /// The access bits that lack their `VM_MAY*` twin (which sits four bits
    /// up): `mprotect` refuses to add any of them.
    pub(crate) fn access_without_may(self) -> VmFlags {
        let b = self.bits();
        VmFlags::from_bits_retain(b & !(b >> 4)) & VmFlags::ACCESS_FLAGS
    }
}

#[cfg(test)]
mod tests {
    use super::VmFlags;

    #[test]
    fn prot_bits_map_to_access_flags() {
        assert_eq!(VmFlags::from_prot(libc::PROT_NONE), VmFlags::empty());
        assert_eq!(VmFlags::from_prot(libc::PROT_READ | libc::PROT_EXEC), VmFlags::READ | VmFlags::EXEC);
        assert_eq!(VmFlags::from_prot(libc::PROT_WRITE), VmFlags::WRITE);
    }

    #[test]
    fn smaps_names_the_flags_in_bit_order() {
        let f = VmFlags::READ | VmFlags::MAYREAD | VmFlags::LOCKED | VmFlags::LOCKONFAULT | VmFlags::SEALED;
        assert_eq!(f.smaps_mnemonics(), "rd mr lo lf sl");
        assert_eq!(VmFlags::empty().smaps_mnemonics(), "");
    }

    #[test]
    fn an_access_bit_needs_its_may_twin() {
        let may_rw = VmFlags::MAYREAD | VmFlags::MAYWRITE;
        assert!((VmFlags::READ | VmFlags::WRITE | may_rw).access_without_may().is_empty());
        assert_eq!((VmFlags::READ | VmFlags::EXEC | may_rw).access_without_may(), VmFlags::EXEC);
        assert_eq!((VmFlags::WRITE | VmFlags::MAYREAD).access_without_may(), VmFlags::WRITE);
    }
}
