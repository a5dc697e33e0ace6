//! `/proc/pid/maps` and the `smaps` resident counts.

use std::fmt::Write;

use crate::vma::VmFlags;
use crate::{PAGE_SHIFT, PAGE_SIZE};

use crate::mm::AddressSpace;

/// One line of `/proc/pid/maps`, with the smaps `Rss` of the mapping. More
/// smaps fields may come: read the fields, never build one.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MapEntry {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// `rwxp`-style permissions (`s` for shared).
    pub perms: String,
    /// File offset in bytes (0 for anonymous memory).
    pub offset: u64,
    /// Inode number (0 for anonymous memory).
    pub inode: u64,
    /// Path or pseudo-name (`[heap]`), empty for anonymous memory.
    pub name: String,
    /// Resident bytes (smaps `Rss`).
    pub rss: u64,
    /// smaps's `VmFlags:` line: Linux's two-letter names of the VMA's
    /// flags in bit order, space separated (`lo` locked, `lf` lock on
    /// fault, `sl` sealed, `ac` accounted, ...).
    pub vm_flags: String,
}

impl MapEntry {
    /// The line as `/proc/pid/maps` prints it (without the newline).
    pub fn to_line(&self) -> String {
        let dev = if self.inode != 0 { "00:01" } else { "00:00" };
        let mut s =
            format!("{:08x}-{:08x} {} {:08x} {} {} ", self.start, self.end, self.perms, self.offset, dev, self.inode);
        if !self.name.is_empty() {
            while s.len() < 73 {
                s.push(' ');
            }
            s.push_str(&self.name);
        }
        s
    }
}

impl AddressSpace {
    /// Declares the main thread's initial stack pointer (Linux's
    /// `mm->start_stack`, which `exec` sets): from now on the VMA that
    /// contains `sp` — `start <= sp <= end`, both bounds inclusive as in
    /// Linux's `vma_is_initial_stack` — is named `[stack]` in
    /// [`AddressSpace::maps`], whichever VMA that is after later `mmap`s,
    /// `munmap`s or stack growth. A forked child inherits it. Naming is all
    /// it changes: a stack that should grow down is mapped with
    /// `MAP_GROWSDOWN`.
    ///
    /// ```
    /// # use softmm::{AddressSpace, MmConfig, PhysConfig, PhysMem, uapi::*};
    /// # let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    /// # let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    /// let flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_GROWSDOWN;
    /// let stack = mm.mmap(0, 32 << 10, PROT_READ | PROT_WRITE, flags, None, 0).unwrap();
    /// mm.set_start_stack(stack + (32 << 10) - 64);
    /// assert!(mm.maps_text().lines().any(|l| l.ends_with(" [stack]")));
    /// ```
    pub fn set_start_stack(&self, sp: u64) {
        let _q = crate::tlb::QuiescentGuard::enter();
        self.write_lock().start_stack = Some(sp);
    }

    /// The address [`AddressSpace::set_start_stack`] declared, if any.
    pub fn start_stack(&self) -> Option<u64> {
        let _q = crate::tlb::QuiescentGuard::enter();
        self.read_lock().start_stack
    }

    /// The mappings, in address order.
    pub fn maps(&self) -> Vec<MapEntry> {
        let _q = crate::tlb::QuiescentGuard::enter();
        let st = self.read_lock();
        st.vmas
            .iter()
            .map(|v| {
                let perms: String = [
                    if v.flags.contains(VmFlags::READ) { 'r' } else { '-' },
                    if v.flags.contains(VmFlags::WRITE) { 'w' } else { '-' },
                    if v.flags.contains(VmFlags::EXEC) { 'x' } else { '-' },
                    if v.flags.contains(VmFlags::MAYSHARE) { 's' } else { 'p' },
                ]
                .iter()
                .collect();
                // get_vma_name: a file's name first (shared anonymous
                // memory has one), then `vma_is_initial_heap` (strict
                // bounds), then `vma_is_initial_stack` (inclusive bounds).
                let heap = v.start < st.brk && v.end > st.start_brk;
                let stack = st.start_stack.is_some_and(|s| v.start <= s && v.end >= s);
                let (offset, inode, name) = match &v.file {
                    // show_map_vma prints `pgoff << PAGE_SHIFT` (wrapping).
                    // A window onto a host file shows the file's own inode.
                    Some(f) => {
                        let inode = f.host_mem.as_ref().and_then(|m| m.origin()).unwrap_or(f.id());
                        (v.pgoff.wrapping_shl(PAGE_SHIFT as u32), inode, f.name().to_string())
                    }
                    None if heap => (0, 0, "[heap]".to_string()),
                    None if stack => (0, 0, "[stack]".to_string()),
                    None => (0, 0, String::new()),
                };
                MapEntry {
                    start: v.start,
                    end: v.end,
                    perms,
                    offset,
                    inode,
                    name,
                    // smaps counts hugetlb pages apart (`Shared_Hugetlb`,
                    // `Private_Hugetlb`), never in `Rss`.
                    rss: if v.flags.contains(VmFlags::HUGETLB) { 0 } else { self.vma_resident_pages(v) * PAGE_SIZE },
                    vm_flags: v.flags.smaps_mnemonics(),
                }
            })
            .collect()
    }

    /// The whole `/proc/pid/maps` text.
    pub fn maps_text(&self) -> String {
        let mut out = String::new();
        for e in self.maps() {
            let _ = writeln!(out, "{}", e.to_line());
        }
        out
    }
}
