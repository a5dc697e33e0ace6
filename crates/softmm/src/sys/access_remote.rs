//! Access to an address space from outside it, for loaders and debuggers:
//! Linux's `access_remote_vm` (`mm/memory.c`), which `/proc/<pid>/mem`
//! (`mem_rw` in `fs/proc/base.c`), `ptrace(PTRACE_PEEKDATA/POKEDATA)` and
//! `process_vm_readv`'s slow cousins use, with or without `FOLL_FORCE`.
//!
//! Per page, with `mmap_lock` held for read across the whole call (so no
//! fork can share a page between the lookup and the copy, and no munmap can
//! pull the VMA away), it does what `get_user_pages_remote` does for one
//! page: `check_vma_flags`, then `follow_page_pte` under the PTE lock, and a
//! fault (`faultin_page`) where the page cannot be taken as it is, then
//! again. Then it copies through the kernel's view of the frame, not through
//! the guest's page-table permissions.
//!
//! `FOLL_FORCE`'s rules are `mm/gup.c`'s:
//!
//! * a forced read works in a VMA without `VM_READ` (`PROT_NONE`, or
//!   `PROT_EXEC` alone), since every VMA has `VM_MAYREAD`; the entry it
//!   faults in stays `PROT_NONE`;
//! * a forced write to a VMA without `VM_WRITE` works only in a COW mapping
//!   (private, `VM_MAYWRITE`): the fault breaks COW (`FAULT_FLAG_WRITE`
//!   on a read-only private page) and the process gets its own exclusive
//!   anonymous copy, still mapped read-only, which `can_follow_write_pte`
//!   accepts; later reads by the guest see the written bytes and the file
//!   or the other process of a fork does not;
//! * a forced write to a shared read-only mapping (anonymous or file, and a
//!   private mapping of a file opened read-only which has no
//!   `VM_MAYWRITE`) fails: `EFAULT` inside gup, 0 bytes done here;
//! * `VM_IO`/`VM_PFNMAP` VMAs are refused (Linux then tries the VMA's
//!   `vm_ops->access`, which softmm's VMAs do not have);
//! * a coherent shared mapping of a host file (`HostFileCoherence::Shared`)
//!   is a shared file mapping: copied straight from or to the host's page
//!   of the window, stopping where the file ends (Linux's `SIGBUS`).
//!
//! The result is the number of bytes done, as `access_remote_vm` returns:
//! the copy stops at the first page that cannot be had (no VMA, a refused
//! VMA, a fault that raises a signal — a guard marker, `SIGBUS` past the
//! end of a file — or out of memory). An address below a `MAP_GROWSDOWN`
//! stack grows the stack first, as Linux's `expand_stack` call there does.
//! `/proc/<pid>/mem` turns 0 bytes into `EIO`; `PTRACE_POKEDATA` turns
//! anything short of the whole word into `EIO`.
//!
//! hugetlb pages are followed as gup's `follow_huge_pmd` follows them: the
//! 2 MiB leaf's head frame holds the reference and the copy goes to the
//! 4 KiB subpage of the address. A forced read of a hugetlb VMA without
//! `PROT_READ` works as for any VMA. A forced write to a private hugetlb
//! VMA without `PROT_WRITE` breaks COW as for a small page: the huge page
//! is replaced by an exclusive anonymous copy (or marked exclusive if it
//! is already this process's alone), still mapped read-only (`PROT_NONE`
//! if it was: a page never touched or shared with a fork child is copied
//! and stays out of the guest's reach), and written
//! (`hugetlb_wp` with `FAULT_FLAG_UNSHARE`'s copy, then
//! `can_follow_write_pmd`); a shared one is refused. That is what the host
//! kernel (6.18) does through `/proc/self/mem`, which
//! `tests/semantics/access_remote.rs` checks; Linux 6.12's `check_vma_flags` still
//! refused every forced write to a read-only hugetlb VMA ("hugetlb does not
//! support FOLL_FORCE|FOLL_WRITE").

use crate::error::Errno;
use crate::fault::Access;
use crate::pgtable::Pte;
use crate::phys::{FrameRef, Pfn, PG_ANON, PG_ANON_EXCLUSIVE, PG_DIRTY, PG_FILE};
use crate::sync::Ordering;
use crate::vma::{VmFlags, Vma};
use crate::PAGE_SIZE;

use crate::mm::AddressSpace;

/// The two directions of a copy.
enum Buf<'b> {
    /// From the address space into this buffer (`FOLL_WRITE` clear).
    Read(&'b mut [u8]),
    /// From this buffer into the address space (`FOLL_WRITE`).
    Write(&'b [u8]),
}

impl Buf<'_> {
    fn len(&self) -> usize {
        match self {
            Buf::Read(b) => b.len(),
            Buf::Write(b) => b.len(),
        }
    }

    fn is_write(&self) -> bool {
        matches!(self, Buf::Write(_))
    }
}

impl AddressSpace {
    /// Linux's `access_remote_vm(mm, addr, buf, len, FOLL_FORCE?)` for a
    /// read: copies up to `buf.len()` bytes from `addr` into `buf` and
    /// returns how many it copied, as a debugger's `PTRACE_PEEKDATA` or a
    /// read of `/proc/<pid>/mem` does. Stops short at the first page that
    /// cannot be read (no VMA, a `VM_IO`/`VM_PFNMAP` VMA, a VMA without
    /// `PROT_READ` unless `force`, a guard marker, a page past the end of its
    /// file, no memory); 0 means the first one could not (`/proc/<pid>/mem`
    /// returns `EIO` then). An address just below a `MAP_GROWSDOWN` stack
    /// grows the stack first.
    ///
    /// With `force` (`FOLL_FORCE`) a page of a VMA without `PROT_READ`
    /// (`PROT_NONE`, `PROT_EXEC` alone) is read too. A page never touched
    /// reads as zeros (it is faulted in, as Linux faults it: the zero page
    /// for anonymous memory, the page cache for a file). Never changes a
    /// mapping's contents.
    ///
    /// ```
    /// # use softmm::{AddressSpace, MmConfig, PhysConfig, PhysMem, uapi::*};
    /// let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    /// let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    /// let a = mm.mmap(0, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    /// let mut buf = [1u8; 8];
    /// assert_eq!(mm.access_remote_read(a, &mut buf, false), 0); // EFAULT inside gup
    /// assert_eq!(mm.access_remote_read(a, &mut buf, true), 8); // FOLL_FORCE
    /// assert_eq!(buf, [0; 8]);
    /// ```
    pub fn access_remote_read(&self, addr: u64, buf: &mut [u8], force: bool) -> usize {
        self.access_remote_vm(addr, Buf::Read(buf), force)
    }

    /// Linux's `access_remote_vm(mm, addr, buf, len, FOLL_WRITE |
    /// FOLL_FORCE?)`: copies `buf` to `addr` and returns how many bytes it
    /// wrote, as `PTRACE_POKEDATA` or a write to `/proc/<pid>/mem` does.
    /// Stops short at the first page that cannot be written, for the reasons
    /// of [`AddressSpace::access_remote_read`] and the ones below.
    ///
    /// With `force` (`FOLL_FORCE`), a page of a private mapping without
    /// `PROT_WRITE` — a loader's or a debugger's write into read-only text —
    /// is written as Linux does it: COW is broken, the address space gets its
    /// own copy of the page, still read-only to the guest, and the file (or
    /// the other side of a fork) keeps the old bytes. A shared mapping
    /// without `PROT_WRITE` is never written (0 bytes).
    ///
    /// ```
    /// # use softmm::{AddressSpace, Cpu, MmConfig, PhysConfig, PhysMem, uapi::*};
    /// let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    /// let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    /// let text = mm.mmap(0, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    /// // A breakpoint, as a debugger plants it.
    /// assert_eq!(mm.access_remote_write(text, &[0xcc], false), 0);
    /// assert_eq!(mm.access_remote_write(text, &[0xcc], true), 1);
    /// let mut cpu = Cpu::attached(&mm);
    /// assert_eq!(cpu.fetch_le::<u8>(text).unwrap(), 0xcc);
    /// assert!(cpu.write_u8(text, 0).is_err()); // still read-only to the guest
    /// ```
    pub fn access_remote_write(&self, addr: u64, buf: &[u8], force: bool) -> usize {
        self.access_remote_vm(addr, Buf::Write(buf), force)
    }

    /// `__access_remote_vm`.
    fn access_remote_vm(&self, mut addr: u64, mut buf: Buf<'_>, force: bool) -> usize {
        // This thread's CPUs hold no translation this call depends on: a
        // COW break's shootdown must not wait for them.
        let _q = crate::tlb::QuiescentGuard::enter();
        let len = buf.len();
        let write = buf.is_write();
        let mut done = 0;
        let mut st = self.read_lock();
        while done < len {
            let Some(vma) = st.vmas.find(addr) else {
                // "We might need to expand the stack to access it."
                drop(st);
                if self.expand_stack(addr).is_err() {
                    return done;
                }
                st = self.read_lock();
                continue;
            };
            // A VMA gup refuses: Linux would try `vm_ops->access`, which
            // no softmm VMA has.
            if check_vma_flags(vma, write, force).is_err() {
                break;
            }
            let offset = addr % PAGE_SIZE;
            let n = ((PAGE_SIZE - offset) as usize).min(len - done);
            if crate::fault::host_window::is_host_file_window(vma) {
                // A window onto a host file: the host's page, or a stop
                // where the file ends (the fault's `SIGBUS`).
                let copied = match &mut buf {
                    Buf::Read(b) => crate::fault::host_window::read_window(vma, addr, &mut b[done..done + n]),
                    Buf::Write(b) => crate::fault::host_window::write_window(vma, addr, &b[done..done + n]),
                };
                if !copied {
                    break;
                }
                // Mapped now, as gup's fault maps it on Linux (`Rss`).
                crate::fault::host_window::mapped(self, vma, addr, write);
            } else {
                let Some((frame, page)) = self.get_user_page(vma, addr, write, force) else { break };
                self.copy_frame(&mut buf, &frame, page, offset as usize, done, n);
            }
            done += n;
            match addr.checked_add(n as u64) {
                Some(next) => addr = next,
                None => break,
            }
        }
        done
    }

    /// The copy of `n` bytes at `at` of the 4 KiB frame `page`, which the
    /// reference `frame` (on it, or on the head of the huge page holding
    /// it) keeps from being freed and reused meanwhile, from or to
    /// `buf[done..]` (`at + n <= PAGE_SIZE`).
    fn copy_frame(&self, buf: &mut Buf<'_>, frame: &FrameRef<'_>, page: Pfn, at: usize, done: usize, n: usize) {
        match buf {
            Buf::Read(b) => self.phys.read(page, at, &mut b[done..done + n]),
            Buf::Write(b) => {
                self.phys.write(page, at, &b[done..done + n]);
                // `set_page_dirty_lock`: a page-cache page now differs
                // from what its file was last written with (a huge
                // page's state is its head's).
                frame.desc().flags.fetch_or(PG_DIRTY, Ordering::Relaxed);
            }
        }
    }

    /// `get_user_pages_remote` for the one page at `addr` of `vma`
    /// (checked): follow, fault, follow again. The reference and the host
    /// address of the 4 KiB page holding `addr`; `None` when the fault
    /// raises a signal or the page is mapped by a leaf gup cannot follow
    /// here.
    fn get_user_page(&self, vma: &Vma, addr: u64, write: bool, force: bool) -> Option<(FrameRef<'_>, Pfn)> {
        let access = if write { Access::Write } else { Access::Read };
        let va = addr & !(PAGE_SIZE - 1);
        // Linux loops until the page can be followed. One fault makes it
        // followable unless another thread undoes it in between (a zap, a
        // migration); the bound only keeps a bug from hanging the caller.
        for _ in 0..FOLLOW_TRIES {
            match self.follow_page(vma, va, write, force) {
                Follow::Got(frame, page) => return Some((frame, page)),
                // The COW break of a forced write to a read-only private
                // huge page: an exclusive anonymous copy, mapped read-only.
                Follow::Unshare => crate::pin::hugetlb::hugetlb_unshare(self, vma, va).ok()?,
                Follow::Stop => return None,
                // The fault gup makes (`faultin_page`): no MMU permission
                // check, `check_vma_flags` allowed the access.
                Follow::Fault => self.handle_mm_fault_forced(vma, va, access).ok()?,
            }
        }
        debug_assert!(false, "page at {va:#x} never became followable");
        None
    }

    /// Linux's `follow_page_pte` for `FOLL_GET` (and `follow_huge_pmd` for
    /// a hugetlb page's 2 MiB leaf): a reference on the page at `va`, taken
    /// under its PTE lock, if it can be used as it is.
    fn follow_page(&self, vma: &Vma, va: u64, write: bool, force: bool) -> Follow<'_> {
        let guard = crossbeam_epoch::pin();
        let Some(leaf) = self.pgtables.leaf(va, &guard) else { return Follow::Fault };
        let huge = leaf.entry_size() != PAGE_SIZE;
        if huge && !vma.flags.contains(VmFlags::HUGETLB) {
            return Follow::Stop;
        }
        let ptl = leaf.lock();
        let pte = ptl.get(va);
        // A `PROT_NONE` entry holds its page too: without
        // `FOLL_HONOR_NUMA_FAULT` gup follows it.
        if !pte.has_frame() {
            return Follow::Fault;
        }
        // `can_follow_write_pmd` is `can_follow_write_pte`'s rule for the
        // head page. Where it says no, a writable VMA takes the write fault
        // (`hugetlb_wp` breaks COW); a forced write to a read-only one
        // unshares the page instead: the hugetlb fault never maps a page
        // writable in a VMA without `VM_WRITE`.
        if write && !self.can_follow_write_pte(vma, pte, force) {
            if !huge || vma.flags.contains(VmFlags::WRITE) {
                return Follow::Fault;
            }
            // Present or `PROT_NONE` alike: the copy keeps the entry's
            // protection, so a `PROT_NONE` page stays inaccessible.
            return Follow::Unshare;
        }
        // The reference is on the head frame for a huge page, which copies
        // go through the subpage of `va` of.
        let head = pte.pfn();
        let page = if huge { crate::pin::hugetlb::subpage(head, va) } else { head };
        Follow::Got(ptl.page(va, &self.phys).expect("the entry holds a frame"), page)
    }

    /// Linux's `can_follow_write_pte`: the entry is writable, or `FOLL_FORCE`
    /// broke COW in a read-only private VMA and the page is this process's
    /// own (an exclusive anonymous page), so writing it changes no one
    /// else's memory.
    fn can_follow_write_pte(&self, vma: &Vma, pte: Pte, force: bool) -> bool {
        if pte.is_present() && pte.has(Pte::WRITE) {
            return true;
        }
        if !force
            || vma.flags.intersects(VmFlags::MAYSHARE | VmFlags::SHARED)
            || !vma.flags.contains(VmFlags::MAYWRITE)
            || vma.flags.contains(VmFlags::WRITE)
        {
            return false;
        }
        let pfn = pte.pfn();
        if pfn == self.phys.zero_pfn() {
            return false;
        }
        // Read under the PTE lock, under which fork clears the exclusive bit.
        let flags = self.phys.desc(pfn).flags.load(Ordering::Relaxed);
        flags & (PG_ANON | PG_FILE | PG_ANON_EXCLUSIVE) == PG_ANON | PG_ANON_EXCLUSIVE
    }
}

/// Faults [`AddressSpace::get_user_page`] makes for one page before it gives
/// up on it (see there).
const FOLLOW_TRIES: u32 = 1000;

/// What [`AddressSpace::follow_page`] found.
enum Follow<'p> {
    /// A reference on the page (the head frame of a huge page) and the
    /// 4 KiB frame to copy from or to.
    Got(FrameRef<'p>, Pfn),
    /// Not mapped as the access needs: fault it in and look again.
    Fault,
    /// A read-only private huge page a forced write needs as this
    /// process's own: unshare it and look again.
    Unshare,
    /// Mapped in a way this path does not follow: stop the copy.
    Stop,
}

/// Linux's `is_cow_mapping`: private and may become writable.
fn is_cow_mapping(vma: &Vma) -> bool {
    vma.flags & (VmFlags::SHARED | VmFlags::MAYWRITE) == VmFlags::MAYWRITE
}

/// Linux's `check_vma_flags` for a remote access (no `FOLL_LONGTERM`,
/// `FOLL_ANON` or `FOLL_PIN`), in its order: `VM_IO`/`VM_PFNMAP` are refused;
/// a write without `VM_WRITE` needs `FOLL_FORCE` and a COW mapping (hugetlb
/// included, as the host kernel has it; see the module docs); a read
/// without `VM_READ` needs `FOLL_FORCE` and `VM_MAYREAD`. `EFAULT` otherwise.
fn check_vma_flags(vma: &Vma, write: bool, force: bool) -> Result<(), Errno> {
    let flags = vma.flags;
    if flags.intersects(VmFlags::IO | VmFlags::PFNMAP) {
        return Err(Errno::Fault);
    }
    if write {
        if !flags.contains(VmFlags::WRITE) && (!force || !is_cow_mapping(vma)) {
            return Err(Errno::Fault);
        }
    } else if !flags.contains(VmFlags::READ) && (!force || !flags.contains(VmFlags::MAYREAD)) {
        return Err(Errno::Fault);
    }
    Ok(())
}
