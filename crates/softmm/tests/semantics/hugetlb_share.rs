//! hugetlb PMD sharing, on by default, against the calls that meet it:
//! page migration (`move_pages`, `mbind`), which moves a page reached
//! through a shared table once for every sharer, unsharing the table in all
//! but the last, and a full
//! 1 GiB window faulted by a forked child (one fault, as on the host, which
//! the same test probes where it can reserve 512 huge pages).

use softmm_testkit::common;

use std::sync::Arc;

use common::assert_no_leaks;
use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, File, MmConfig, OpenFile, PhysConfig, PhysMem, MPOL_BIND, MPOL_MF_MOVE};
use softmm::{MPOL_MF_MOVE_ALL, MPOL_MF_STRICT};

/// The full-size tests take 1 GiB of arena and 1 GiB of the host's pool
/// each: one at a time, so a run stays within 2 GiB.
pub(crate) static FULL_SIZE: std::sync::Mutex<()> = std::sync::Mutex::new(());

const HP: u64 = 2 << 20;
const PUD: u64 = 1 << 30;
const RW: i32 = PROT_READ | PROT_WRITE;

/// Maps `len` bytes of `f` shared at `at`, without reservations.
fn map_shared(mm: &AddressSpace, f: &Arc<File>, at: u64, len: u64) -> u64 {
    let open = OpenFile::read_write(f);
    mm.mmap(at, len, RW, MAP_SHARED | MAP_FIXED | MAP_NORESERVE, Some(&open), 0).unwrap()
}

/// The node of the page at `addr` (`move_pages` with no nodes).
fn node_of(mm: &AddressSpace, addr: u64) -> i32 {
    let mut status = [0];
    mm.move_pages(&[addr], None, &mut status, 0).unwrap();
    status[0]
}

/// The node of the page at `addr` once `mm` faulted it (a migration may
/// have unshared `mm`'s table, leaving nothing mapped until a fault).
fn node_after_fault(mm: &Arc<AddressSpace>, addr: u64) -> i32 {
    Cpu::attached(mm).read_u64(addr).unwrap();
    node_of(mm, addr)
}

#[test]
fn move_pages_and_mbind_move_hugetlb_pages_through_shared_tables() {
    let phys = PhysMem::new(PhysConfig::new(64 << 20).nodes(2).hugepages(6)).unwrap();
    let f = File::create_hugetlbfs(&phys, "/db", PUD).unwrap();
    let config = MmConfig::default();
    let parent = AddressSpace::new(&phys, config.clone()).unwrap();
    let a = map_shared(&parent, &f, 4 * PUD, PUD);
    let mut cpu = Cpu::attached(&parent);
    for i in 0..3 {
        cpu.write_u64(a + i * HP, 0xface + i).unwrap();
    }
    drop(cpu);
    let child = parent.fork().unwrap();
    assert_eq!(Cpu::attached(&child).read_u64(a).unwrap(), 0xface);
    assert_eq!(phys.huge_page_stats().pmd_shares, 1, "the child links the parent's table");
    let here = node_of(&child, a);
    let there = 1 - here;
    let pages = [a, a + HP + 4096, a + 5 * HP];
    let mut status = [0; 3];
    // Mapped once (one entry in one shared table: folio_mapcount 1), so
    // move_pages isolates and moves it, for every sharer at once. Nothing
    // mapped: -ENOENT. Already there: the node.
    assert_eq!(child.move_pages(&pages, Some(&[there; 3]), &mut status, MPOL_MF_MOVE), Ok(0));
    assert_eq!(status, [there, there, -libc::ENOENT]);
    // The first page's migration unshared the table in the sharer reached
    // while it was shared (Linux's try_to_migrate_one): the parent, the
    // file's first mapper, maps nothing until its fault links the child's
    // table again; the second page moved through the child's entry alone.
    assert_eq!(phys.huge_page_stats().pmd_unshares, 1);
    assert_eq!((node_of(&parent, a), node_of(&child, a)), (-libc::ENOENT, there));
    assert_eq!(Cpu::attached(&parent).read_u64(a + HP).unwrap(), 0xface + 1);
    assert_eq!(phys.huge_page_stats().pmd_shares, 2, "linked again");
    assert_eq!((node_of(&parent, a), node_of(&parent, a + HP)), (there, there));
    for (mm, node) in [(&parent, here), (&child, here)] {
        assert_eq!(mm.move_pages(&pages[..2], Some(&[node; 2]), &mut status[..2], MPOL_MF_MOVE), Ok(0));
        assert_eq!(status[..2], [node, node]);
    }
    // A third process maps the window 2 MiB off the PUD: a table of its own,
    // so the page is mapped twice: -EACCES without MPOL_MF_MOVE_ALL; with
    // it, the page moves for all three.
    let other = AddressSpace::new(&phys, config.clone().cap_sys_nice(true)).unwrap();
    let b = map_shared(&other, &f, 8 * PUD + HP, PUD);
    assert_eq!(Cpu::attached(&other).read_u64(b).unwrap(), 0xface);
    assert_eq!(other.move_pages(&[b], Some(&[there]), &mut status[..1], MPOL_MF_MOVE), Ok(0));
    assert_eq!(status[0], -libc::EACCES);
    assert_eq!(other.move_pages(&[b], Some(&[there]), &mut status[..1], MPOL_MF_MOVE_ALL), Ok(0));
    assert_eq!(status[0], there);
    assert_eq!((node_after_fault(&parent, a), node_after_fault(&child, a)), (there, there));
    // mbind with MOVE|STRICT: a page reached through a shared table, or
    // mapped twice, is left alone and is no failure (queue_folios_hugetlb);
    // with MOVE_ALL it moves.
    let mask = [1u64 << there];
    let strict = MPOL_MF_MOVE | MPOL_MF_STRICT;
    assert_eq!(child.mbind(a, PUD, MPOL_BIND, Some(&mask), 3, strict), Ok(()));
    assert_eq!(node_of(&child, a + HP), here);
    assert_eq!(Cpu::attached(&other).read_u64(b + HP).unwrap(), 0xface + 1);
    assert_eq!(other.mbind(b, PUD, MPOL_BIND, Some(&mask), 3, strict), Ok(()));
    assert_eq!(other.mbind(b, PUD, MPOL_BIND, Some(&mask), 3, MPOL_MF_MOVE_ALL | MPOL_MF_STRICT), Ok(()));
    assert_eq!(node_of(&child, a + HP), there);
    // A private page mapped once moves with mbind; migrate_pages moves it
    // back and counts nothing failed (one 2 MiB page, not 512).
    let p = parent.mmap(0, 2 * HP, RW, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, None, 0).unwrap();
    Cpu::attached(&parent).write_u64(p, 7).unwrap();
    assert_eq!(node_of(&parent, p), here);
    assert_eq!(parent.mbind(p, 2 * HP, MPOL_BIND, Some(&mask), 3, strict), Ok(()));
    assert_eq!(node_of(&parent, p), there);
    let from = [1u64 << here];
    assert_eq!(parent.migrate_pages(3, Some(&mask), Some(&from)), Ok(0));
    assert_eq!(node_of(&parent, p), here);
    // One unshare per migration that found the table shared: the first
    // move, the parent's move back (the parent unshares itself, so the
    // child's and other's moves find no sharer), other's mbind after the
    // parent's fault linked the table again. Every value still there.
    assert_eq!(phys.huge_page_stats().pmd_unshares, 3);
    for (mm, at) in [(&parent, a), (&child, a), (&other, b)] {
        let mut cpu = Cpu::attached(mm);
        for i in 0..3 {
            assert_eq!(cpu.read_u64(at + i * HP).unwrap(), 0xface + i);
        }
    }
    assert_eq!(Cpu::attached(&parent).read_u64(p).unwrap(), 7);
    drop((parent, child, other, f));
    assert_no_leaks(&phys);
}

/// The faults a `fork`ed child of softmm takes reading every 2 MiB page of
/// a 1 GiB hugetlbfs file its parent mapped as `placement` says and faulted
/// in (written if shared, read if private), as the host probe does: the
/// child CPU's faults and the child's hugetlb faults (pages it mapped
/// itself; a fault that links a shared table maps none).
fn softmm_child_faults(placement: softmm_hostsys::Placement) -> (u64, u64) {
    use softmm_hostsys::{Placement, PAGES_PER_PUD};
    let phys = PhysMem::new(PhysConfig::new((16 << 20) + (PAGES_PER_PUD + 1) * HP).hugepages(PAGES_PER_PUD)).unwrap();
    let f = File::create_hugetlbfs(&phys, "/probe", PUD).unwrap();
    // Every page in the page cache first, as the host probe does, so that no
    // fault allocates (a private read fault maps the cached page and gives
    // the VMA no anon_vma, so fork copies no entry of it).
    f.fallocate(0, 0, PUD).unwrap();
    let parent = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let open = OpenFile::read_write(&f);
    let (at, flags) = match placement {
        Placement::SharedPudAligned => (4 * PUD, MAP_SHARED),
        Placement::SharedMisaligned => (4 * PUD + HP, MAP_SHARED),
        Placement::Private => (4 * PUD, MAP_PRIVATE | MAP_NORESERVE),
    };
    let a = parent.mmap(at, PUD, RW, flags | MAP_FIXED, Some(&open), 0).unwrap();
    let mut cpu = Cpu::attached(&parent);
    for i in 0..PAGES_PER_PUD {
        if placement == Placement::Private {
            cpu.read_u64(a + i * HP).unwrap();
        } else {
            cpu.write_u64(a + i * HP, i).unwrap();
        }
    }
    assert_eq!(cpu.stats().fault.faults, PAGES_PER_PUD, "{placement:?}: the parent faults every page in");
    drop(cpu);
    let child = parent.fork().unwrap();
    let mut cpu = Cpu::attached(&child);
    for i in 0..PAGES_PER_PUD {
        let want = if placement == Placement::Private { 0 } else { i };
        assert_eq!(cpu.read_u64(a + i * HP).unwrap(), want);
    }
    let faults = (cpu.stats().fault.faults, child.stats().hugetlb_faults);
    drop((cpu, child, parent, open, f));
    assert_no_leaks(&phys);
    faults
}

/// The host's figure at full size, in softmm: a child touching all 512
/// pages of a shared, PUD-aligned 1 GiB window takes one fault (it links
/// its parent's PMD table), 512 when the window is 2 MiB off the PUD or the
/// mapping private; and the host, probed in the same test where it can
/// reserve 512 huge pages (else skipped with its reason), says the same.
#[test]
#[cfg_attr(miri, ignore = "a 1 GiB arena and the host's huge page pool")]
fn a_forked_child_takes_one_fault_for_a_whole_shared_aligned_gib_as_on_the_host() {
    let _one_at_a_time = FULL_SIZE.lock().unwrap_or_else(|e| e.into_inner());
    use softmm_hostsys::{probe_pmd_share, HugePages, Placement, PAGES_PER_PUD};
    let all = [Placement::SharedPudAligned, Placement::SharedMisaligned, Placement::Private];
    let want = |p: Placement| if p == Placement::SharedPudAligned { 1 } else { PAGES_PER_PUD };
    let mut softmm = Vec::new();
    for p in all {
        let (cpu_faults, hugetlb_faults) = softmm_child_faults(p);
        eprintln!("softmm {p:?}: child faults {cpu_faults} (hugetlb faults {hugetlb_faults})");
        assert_eq!(cpu_faults, want(p), "softmm {p:?}");
        softmm.push(cpu_faults);
    }
    // The host half, after softmm's arena is gone (one GiB at a time).
    let guard = match HugePages::reserve_with_mount(PAGES_PER_PUD as usize) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("host half skipped: {e}");
            return;
        }
    };
    let dir = guard.mount_dir().expect("mounted");
    for (p, ours) in all.into_iter().zip(softmm) {
        let host = probe_pmd_share(dir, p).unwrap_or_else(|e| panic!("{p:?}: {e}"));
        eprintln!("host {p:?}: {host:?}");
        assert_eq!(host.child_minflt, ours, "{p:?}: softmm and the host differ");
    }
}

/// Minor faults of this process so far.
fn minflt() -> u64 {
    // SAFETY: `getrusage` fills the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    ru.ru_minflt as u64
}

/// Minor faults taken reading one word of each of `pages` huge pages from `base`.
///
/// # Safety
///
/// `base + i * HP` for `i < pages` must be mapped readable.
#[inline(never)]
unsafe fn faults_reading(base: u64, pages: u64) -> u64 {
    let before = minflt();
    for i in 0..pages {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::read_volatile((base + i * HP) as *const u64) };
    }
    minflt() - before
}

/// A new 1 GiB file, fallocated, in `dir` (a hugetlbfs mount with 512
/// free pages), and a 3 GiB `PROT_NONE` reservation to map it inside at
/// PUD-aligned addresses; dropping it unmaps the reservation, closes and
/// unlinks the file.
struct HostProbe {
    cpath: std::ffi::CString,
    fd: i32,
    res: *mut libc::c_void,
    /// The reservation's first PUD-aligned address (two more PUDs fit).
    base: u64,
}

const PROBE_ROOM: usize = 3 * PUD as usize;

impl HostProbe {
    fn new(dir: &std::path::Path, name: &str) -> HostProbe {
        use std::os::unix::ffi::OsStrExt;
        let path = dir.join(format!("{name}.{}", std::process::id()));
        let cpath = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a new file in the test's own mount, and a new anonymous
        // reservation: nothing else is touched.
        unsafe {
            let fd = libc::open(cpath.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o600);
            assert!(fd >= 0, "open {}", path.display());
            assert_eq!(libc::fallocate(fd, 0, 0, PUD as i64), 0, "fallocate of 1 GiB");
            let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
            let res = libc::mmap(std::ptr::null_mut(), PROBE_ROOM, libc::PROT_NONE, flags, -1, 0);
            assert_ne!(res, libc::MAP_FAILED);
            HostProbe { cpath, fd, res, base: (res as u64).next_multiple_of(PUD) }
        }
    }

    /// Maps the whole file shared at `a`, a PUD-aligned address inside the
    /// reservation.
    fn map_at(&self, a: u64) {
        // SAFETY: MAP_FIXED over the probe's own reservation only.
        let p = unsafe { libc::mmap(a as *mut _, PUD as usize, RW, libc::MAP_SHARED | libc::MAP_FIXED, self.fd, 0) };
        assert_eq!(p as u64, a);
    }
}

impl Drop for HostProbe {
    fn drop(&mut self) {
        // SAFETY: the reservation and the file are the probe's own.
        unsafe {
            libc::munmap(self.res, PROBE_ROOM);
            libc::close(self.fd);
            libc::unlink(self.cpath.as_ptr());
        }
    }
}

/// On the host, in `dir` (a hugetlbfs mount with 512 free pages): a parent
/// maps a 1 GiB file shared at a PUD-aligned address and writes every page;
/// its forked child reads every page (sharing the table), splits the VMA
/// with `madvise(MADV_DONTFORK)` of page 3, and reads every page again.
/// The child's minor faults for each of the two reads.
fn host_faults_around_a_split(dir: &std::path::Path) -> (u64, u64) {
    let probe = HostProbe::new(dir, "split-probe");
    let a = probe.base;
    probe.map_at(a);
    // SAFETY: every access below is inside the probe's mapping or a shared
    // result page made here, and the child only reads, calls madvise and
    // getrusage, writes the result page and `_exit`s.
    unsafe {
        for i in 0..PUD / HP {
            std::ptr::write_volatile((a + i * HP) as *mut u64, i);
        }
        let slot = libc::mmap(std::ptr::null_mut(), 4096, RW, libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1, 0);
        assert_ne!(slot, libc::MAP_FAILED);
        let slot = slot.cast::<u64>();
        let pid = libc::fork();
        assert!(pid >= 0);
        if pid == 0 {
            // A dry run faults in the result page and the code first.
            faults_reading(slot as u64, 1);
            let first = faults_reading(a, PUD / HP);
            libc::madvise((a + 3 * HP) as *mut _, HP as usize, libc::MADV_DONTFORK);
            let second = faults_reading(a, PUD / HP);
            std::ptr::write_volatile(slot, first);
            std::ptr::write_volatile(slot.add(1), second);
            libc::_exit(0);
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
        let r = (std::ptr::read_volatile(slot), std::ptr::read_volatile(slot.add(1)));
        libc::munmap(slot.cast(), 4096);
        r
    }
}

/// The same in softmm, with its fault counters.
fn softmm_faults_around_a_split() -> (u64, u64) {
    let pages = PUD / HP;
    let phys = PhysMem::new(PhysConfig::new((16 << 20) + (pages + 1) * HP).hugepages(pages)).unwrap();
    let f = File::create_hugetlbfs(&phys, "/split", PUD).unwrap();
    f.fallocate(0, 0, PUD).unwrap();
    let parent = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let a = map_shared(&parent, &f, 4 * PUD, PUD);
    let mut cpu = Cpu::attached(&parent);
    for i in 0..pages {
        cpu.write_u64(a + i * HP, i).unwrap();
    }
    drop(cpu);
    let child = parent.fork().unwrap();
    let read_all = |mm: &Arc<AddressSpace>| {
        let mut cpu = Cpu::attached(mm);
        for i in 0..pages {
            assert_eq!(cpu.read_u64(a + i * HP).unwrap(), i);
        }
        cpu.stats().fault.faults
    };
    let first = read_all(&child);
    child.madvise(a + 3 * HP, HP, MADV_DONTFORK).unwrap();
    let second = read_all(&child);
    drop((child, parent, f));
    assert_no_leaks(&phys);
    (first, second)
}

/// `hugetlb_split` at full size, against the host: a child that shares its
/// parent's table (one fault for 512 pages) and then splits the VMA inside
/// the window without changing an entry has lost the table: 512 faults to
/// read the window again, on the host (6.16+ and the stable backports) as in
/// softmm. Without the unshare at split it would be 0.
#[test]
#[cfg_attr(miri, ignore = "a 1 GiB arena and the host's huge page pool")]
fn a_split_inside_a_shared_gib_costs_the_child_its_table_as_on_the_host() {
    let _one_at_a_time = FULL_SIZE.lock().unwrap_or_else(|e| e.into_inner());
    use softmm_hostsys::{HugePages, PAGES_PER_PUD};
    let ours = softmm_faults_around_a_split();
    eprintln!("softmm: child faults {ours:?}");
    assert_eq!(ours, (1, PAGES_PER_PUD));
    let guard = match HugePages::reserve_with_mount(PAGES_PER_PUD as usize) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("host half skipped: {e}");
            return;
        }
    };
    let host = host_faults_around_a_split(guard.mount_dir().expect("mounted"));
    eprintln!("host: child faults {host:?}");
    assert_eq!(host, ours, "softmm and the host differ");
}

/// On the host, in `dir` (a hugetlbfs mount with 512 free pages): this
/// process maps a 1 GiB file shared at two PUD-aligned addresses and writes
/// every page through the first. Its minor faults reading every page
/// through the second, then, once the second is unmapped, through the
/// first again.
fn host_faults_of_a_second_mapping(dir: &std::path::Path) -> (u64, u64) {
    let probe = HostProbe::new(dir, "twice-probe");
    let (first, second) = (probe.base, probe.base + PUD);
    probe.map_at(first);
    probe.map_at(second);
    // SAFETY: each read and write below stays inside the probe's two
    // mappings.
    unsafe {
        for i in 0..PUD / HP {
            std::ptr::write_volatile((first + i * HP) as *mut u64, i);
        }
        // A dry run through the first mapping faults in the probe's code.
        assert_eq!(faults_reading(first, PUD / HP), 0);
        let through_second = faults_reading(second, PUD / HP);
        for i in 0..PUD / HP {
            assert_eq!(std::ptr::read_volatile((second + i * HP) as *const u64), i);
        }
        assert_eq!(libc::munmap(second as *mut _, PUD as usize), 0);
        let first_again = faults_reading(first, PUD / HP);
        (through_second, first_again)
    }
}

/// The same in softmm, with its fault and sharing counters.
fn softmm_faults_of_a_second_mapping() -> (u64, u64) {
    let pages = PUD / HP;
    let phys = PhysMem::new(PhysConfig::new((16 << 20) + (pages + 1) * HP).hugepages(pages)).unwrap();
    let f = File::create_hugetlbfs(&phys, "/twice", PUD).unwrap();
    f.fallocate(0, 0, PUD).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let first = map_shared(&mm, &f, 4 * PUD, PUD);
    let second = map_shared(&mm, &f, 5 * PUD, PUD);
    let mut cpu = Cpu::attached(&mm);
    for i in 0..pages {
        cpu.write_u64(first + i * HP, i).unwrap();
    }
    let read_all = |cpu: &mut Cpu, a: u64| {
        let before = cpu.stats().fault.faults;
        for i in 0..pages {
            assert_eq!(cpu.read_u64(a + i * HP).unwrap(), i);
        }
        cpu.stats().fault.faults - before
    };
    let tables = phys.stats().page_tables;
    let through_second = read_all(&mut cpu, second);
    assert_eq!(phys.huge_page_stats().pmd_shares, 1, "the second mapping linked the first one's table");
    assert_eq!(phys.stats().page_tables, tables, "one PMD table for both");
    mm.munmap(second, PUD).unwrap();
    assert_eq!(phys.huge_page_stats().pmd_unshares, 1);
    let first_again = read_all(&mut cpu, first);
    drop((cpu, mm, f));
    assert_no_leaks(&phys);
    (through_second, first_again)
}

/// `huge_pmd_share` within one address space, at full size, against the
/// host: a second shared mapping of the same 1 GiB at another PUD-aligned
/// address links the first one's PMD table (Linux skips only the faulting
/// VMA itself), so reading its 512 pages takes one fault; its munmap
/// unshares, and the first mapping still maps every page. On the host
/// (probed where it can reserve 512 huge pages, else skipped with its
/// reason) as in softmm; before softmm looked at its own VMAs it took 512.
#[test]
#[cfg_attr(miri, ignore = "a 1 GiB arena and the host's huge page pool")]
fn a_second_mapping_of_a_gib_in_one_process_takes_one_fault_as_on_the_host() {
    let _one_at_a_time = FULL_SIZE.lock().unwrap_or_else(|e| e.into_inner());
    use softmm_hostsys::{HugePages, PAGES_PER_PUD};
    let ours = softmm_faults_of_a_second_mapping();
    eprintln!("softmm: faults through the second mapping, then the first: {ours:?}");
    assert_eq!(ours, (1, 0));
    let guard = match HugePages::reserve_with_mount(PAGES_PER_PUD as usize) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("host half skipped: {e}");
            return;
        }
    };
    let host = host_faults_of_a_second_mapping(guard.mount_dir().expect("mounted"));
    eprintln!("host: faults through the second mapping, then the first: {host:?}");
    assert_eq!(host, ours, "softmm and the host differ");
}
