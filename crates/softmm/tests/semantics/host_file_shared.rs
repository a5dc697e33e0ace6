//! Coherent shared host files (`HostFileCoherence::Shared`): a
//! `MAP_SHARED` mapping of a host file whose pages are the host's own
//! shared mapping, tested against the host: a host write seen by the guest
//! and the reverse, at once; a page past the host's end of file is
//! `SIGBUS` after the host truncates; `msync` works; a fork shares; the
//! last unmap closes the host mapping and the descriptor. And the old
//! policy (`Cache`) beside it.

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, Errno, Fault, Foll, HostFileCoherence, MmConfig, OpenFile, PhysMem};
use softmm_testkit::common::{assert_no_leaks, phys, TempFile, ANON, PAGE, RW};

fn mm(phys: &Arc<PhysMem>, coherence: HostFileCoherence) -> Arc<AddressSpace> {
    AddressSpace::new(phys, MmConfig::default().host_file_coherence(coherence)).unwrap()
}

/// The start of most tests here: a 4-frame arena, an address space whose
/// host-file mappings are coherent, the host file `tag` holding `content`
/// (`path_of(tag)`), and an open of it in softmm.
fn coherent_file(tag: &str, content: &[u8]) -> (Arc<PhysMem>, Arc<AddressSpace>, TempFile, OpenFile) {
    let phys = phys(4);
    let mm = mm(&phys, HostFileCoherence::Shared);
    let tf = TempFile::new(tag, content);
    let open = OpenFile::from_host(&phys, tf.open(true), tag).unwrap();
    (phys, mm, tf, open)
}

/// `pages` pages of file content, page `i` filled with the byte `i + 1`.
fn numbered_pages(pages: usize) -> Vec<u8> {
    (0..pages * PAGE as usize).map(|i| (i / PAGE as usize) as u8 + 1).collect()
}

/// `TempFile::new(tag, ..)`'s path.
fn path_of(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("softmm-host-file-{}-{tag}", std::process::id()))
}

/// This process's host mappings of `path` (`/proc/self/maps` lines) and
/// its descriptors open on it (`/proc/self/fd`).
fn host_uses(path: &PathBuf) -> (usize, usize) {
    let p = path.to_str().unwrap();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap().lines().filter(|l| l.ends_with(p)).count();
    let fds = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l == path)
        .count();
    (maps, fds)
}

#[test]
fn guest_and_host_see_each_others_writes_at_once() {
    let (phys, mm, tf, open) = coherent_file("coherent-rw", &[0u8; 2 * PAGE as usize]);
    let host = tf.open(true);
    let a = mm.mmap(0, 2 * PAGE, RW, MAP_SHARED, Some(&open), 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a + 8, 0x1234_5678).unwrap();
    let mut b = [0u8; 8];
    host.read_exact_at(&mut b, 8).unwrap();
    assert_eq!(u64::from_le_bytes(b), 0x1234_5678, "the host reads the guest's store without an msync");
    // A host write to a page the guest has cached: seen by its next load.
    assert_eq!(cpu.read_u64(a + PAGE + 16).unwrap(), 0);
    host.write_all_at(&42u64.to_le_bytes(), PAGE + 16).unwrap();
    assert_eq!(cpu.read_u64(a + PAGE + 16).unwrap(), 42);
    mm.msync(a, 2 * PAGE, MS_SYNC).unwrap();
    assert!(mm.maps_text().contains("coherent-rw"));
    assert_eq!(phys.stats().frames_used, 0, "no page cache: the pages are the host's");
    drop(cpu);
    mm.munmap(a, 2 * PAGE).unwrap();
    drop((mm, open));
    assert_no_leaks(&phys);
}

/// The old policy, for contrast: a private cache written back at `msync`.
#[test]
fn the_cache_policy_writes_back_at_msync_and_keeps_its_copy() {
    let phys = phys(4);
    let mm = mm(&phys, HostFileCoherence::Cache);
    let tf = TempFile::new("cached-rw", &[0u8; PAGE as usize]);
    let host = tf.open(true);
    let open = OpenFile::from_host(&phys, tf.open(true), "cached-rw").unwrap();
    let a = mm.mmap(0, PAGE, RW, MAP_SHARED, Some(&open), 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a, 7).unwrap();
    host.write_all_at(&9u64.to_le_bytes(), 8).unwrap();
    assert_eq!(cpu.read_u64(a + 8).unwrap(), 0, "the cached page does not see the host's write");
    assert_eq!(tf.read()[0], 0, "nor the host the guest's, before the msync");
    mm.msync(a, PAGE, MS_SYNC).unwrap();
    assert_eq!(tf.read()[0], 7);
    drop(cpu);
    drop((mm, open));
    assert_no_leaks(&phys);
}

#[test]
fn a_page_past_the_hosts_end_of_file_is_sigbus() {
    let (phys, mm, tf, open) = coherent_file("coherent-eof", &[1u8; 3 * PAGE as usize]);
    let host = tf.open(true);
    // Four pages of a three-page file: the fourth is past the end.
    let a = mm.mmap(0, 4 * PAGE, RW, MAP_SHARED, Some(&open), 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    assert_eq!(cpu.read_u8(a).unwrap(), 1);
    assert_eq!(cpu.read_u8(a + 3 * PAGE + 5), Err(Fault::Bus { addr: a + 3 * PAGE + 5 }));
    // The host truncates into the second page: the rest of that page reads
    // zero, the third page is SIGBUS. (Not cached by this CPU before the
    // truncation: a translation cached before it would reach the host's
    // SIGBUS, the window docs/architecture.md describes.)
    host.set_len(PAGE + 100).unwrap();
    assert_eq!(cpu.read_u8(a + PAGE + 99).unwrap(), 1);
    assert_eq!(cpu.read_u8(a + PAGE + 200).unwrap(), 0);
    assert_eq!(cpu.write_u8(a + 2 * PAGE, 3), Err(Fault::Bus { addr: a + 2 * PAGE }));
    // gup of a page past the end is the fault's SIGBUS: EFAULT.
    assert_eq!(mm.pin_user_pages(a + 2 * PAGE, 1, Foll::empty()).err(), Some(Errno::Fault));
    assert_eq!(mm.madvise(a + 2 * PAGE, PAGE, MADV_POPULATE_READ), Err(Errno::Fault));
    // The file grows again: the page is back, as zeros.
    host.set_len(3 * PAGE).unwrap();
    assert_eq!(cpu.read_u8(a + 2 * PAGE).unwrap(), 0);
    drop(cpu);
    drop((mm, open));
    assert_no_leaks(&phys);
}

#[test]
fn a_fork_shares_and_the_last_unmap_closes_the_host_mapping_and_descriptor() {
    let (phys, mm, tf, open) = coherent_file("coherent-fork", &[0u8; PAGE as usize]);
    let path = path_of("coherent-fork");
    assert_eq!(host_uses(&path), (0, 1));
    let a = mm.mmap(0, PAGE, RW, MAP_SHARED, Some(&open), 0).unwrap();
    drop(open);
    assert_eq!(host_uses(&path), (1, 1), "the mapping keeps the descriptor");
    let child = mm.fork().unwrap();
    let mut ccpu = Cpu::attached(&child);
    ccpu.write_u64(a, 5).unwrap();
    assert_eq!(tf.read()[0], 5, "the child's store is the host's at once");
    let mut cpu = Cpu::attached(&mm);
    assert_eq!(cpu.read_u64(a).unwrap(), 5);
    drop(cpu);
    mm.munmap(a, PAGE).unwrap();
    assert_eq!(host_uses(&path), (1, 1), "the child still maps it");
    drop(ccpu);
    drop(child);
    assert_eq!(host_uses(&path), (0, 0), "the last unmap closes both");
    drop(mm);
    assert_no_leaks(&phys);
}

#[test]
fn a_read_only_host_file_maps_read_only() {
    let phys = phys(4);
    let mm = mm(&phys, HostFileCoherence::Shared);
    let tf = TempFile::new("coherent-ro", &[4u8; PAGE as usize]);
    let open = OpenFile::from_host(&phys, tf.open(false), "coherent-ro").unwrap();
    assert_eq!(mm.mmap(0, PAGE, RW, MAP_SHARED, Some(&open), 0), Err(Errno::Acces));
    assert_eq!(mm.mmap(0, 0, PROT_READ, MAP_SHARED, Some(&open), 0), Err(Errno::Inval));
    let a = mm.mmap(0, PAGE, PROT_READ, MAP_SHARED, Some(&open), 0).unwrap();
    assert_eq!(mm.mprotect(a, PAGE, RW), Err(Errno::Acces));
    let mut cpu = Cpu::attached(&mm);
    assert_eq!(cpu.read_u8(a).unwrap(), 4);
    assert_eq!(cpu.write_u8(a, 1), Err(Fault::Segv { addr: a, code: softmm::SegvCode::AccErr }));
    drop(cpu);
    drop((mm, open));
    assert_no_leaks(&phys);
}

/// A truncate through softmm (`File::set_len`) closes the window a host
/// truncation leaves: the pages past the new end go from every TLB before
/// the host's do, so a CPU that had cached one gets the guest's `SIGBUS`,
/// not the host's.
#[test]
fn a_truncate_through_softmm_shoots_cached_pages_down_first() {
    let (phys, mm, tf, open) = coherent_file("coherent-set-len", &[2u8; 3 * PAGE as usize]);
    let a = mm.mmap(0, 3 * PAGE, RW, MAP_SHARED, Some(&open), 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    // Every page cached, the last one for writing.
    assert_eq!(cpu.read_u8(a).unwrap(), 2);
    assert_eq!(cpu.read_u8(a + PAGE).unwrap(), 2);
    cpu.write_u8(a + 2 * PAGE, 3).unwrap();
    open.file.set_len(PAGE + 10).unwrap();
    assert_eq!(tf.read().len() as u64, PAGE + 10);
    assert_eq!(cpu.read_u8(a + 2 * PAGE), Err(Fault::Bus { addr: a + 2 * PAGE }));
    assert_eq!(cpu.write_u8(a + 2 * PAGE + 1, 1), Err(Fault::Bus { addr: a + 2 * PAGE + 1 }));
    assert_eq!(cpu.read_u8(a + PAGE + 9).unwrap(), 2);
    assert_eq!(cpu.read_u8(a + PAGE + 10).unwrap(), 0, "past the end, in the last page");
    // It grows back: the page is there again, as zeros.
    open.file.set_len(3 * PAGE).unwrap();
    assert_eq!(cpu.read_u8(a + 2 * PAGE).unwrap(), 0);
    drop(cpu);
    drop((mm, open));
    assert_no_leaks(&phys);
}

/// The host's own `MAP_SHARED` mapping of `len` bytes of `file` at
/// `offset`, read and write, unmapped when dropped.
struct HostMap(*mut u8, usize);

impl HostMap {
    fn new(file: &std::fs::File, len: u64, prot: i32, offset: u64) -> HostMap {
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh mapping the kernel places, of a descriptor we own.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len as usize, prot, libc::MAP_SHARED, file.as_raw_fd(), offset as i64)
        };
        assert_ne!(p, libc::MAP_FAILED);
        HostMap(p.cast(), len as usize)
    }

    fn addr(&self) -> u64 {
        self.0 as u64
    }

    /// `madvise` on the host: 0 or the errno.
    fn madvise(&self, off: u64, len: u64, advice: i32) -> i32 {
        // SAFETY: advice on our own mapping; none of those used frees
        // memory anything else refers to.
        let r = unsafe { libc::madvise(self.0.add(off as usize).cast(), len as usize, advice) };
        if r == 0 {
            0
        } else {
            std::io::Error::last_os_error().raw_os_error().unwrap()
        }
    }

    /// smaps's `VmFlags:` of the mapping, without the flags softmm does
    /// not model (`sd` soft-dirty, `um`/`uw` userfaultfd).
    fn vm_flags(&self) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let head = format!("{:x}-", self.addr());
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&head));
        let flags = lines.find_map(|l| l.strip_prefix("VmFlags:")).expect("the mapping's smaps");
        flags.split_whitespace().filter(|f| !matches!(*f, "sd" | "um" | "uw")).collect::<Vec<_>>().join(" ")
    }

    /// A write through `/proc/self/mem` (forced remote access): bytes
    /// written, or 0 for the kernel's `EIO`.
    fn poke(&self, off: u64, bytes: &[u8]) -> usize {
        let mem = std::fs::OpenOptions::new().read(true).write(true).open("/proc/self/mem").unwrap();
        mem.write_at(bytes, self.addr() + off).unwrap_or(0)
    }

    /// A read through `/proc/self/mem`: bytes read, or 0 for `EIO`.
    fn peek(&self, off: u64, buf: &mut [u8]) -> usize {
        let mem = std::fs::File::open("/proc/self/mem").unwrap();
        mem.read_at(buf, self.addr() + off).unwrap_or(0)
    }
}

impl Drop for HostMap {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, unmapped once.
        unsafe { libc::munmap(self.0.cast(), self.1) };
    }
}

/// What Linux does with a `MAP_SHARED` file mapping, done on the host and
/// on a coherent window side by side, over the same file: the same smaps
/// flags and offset (no `VM_PFNMAP`), `MADV_DONTNEED` keeps the bytes
/// (they are the file's), `MADV_FREE` refused, forced remote access reads
/// and writes the file and stops at its end, and a pin holds the file's
/// page, written through by the device and seen by both sides.
#[test]
fn a_coherent_window_is_a_linux_shared_file_mapping_against_the_host() {
    // Four pages; both sides map three of them from page 1, so the
    // mappings' last page is past a later truncation.
    let (phys, mm, tf, open) = coherent_file("coherent-linux", &[6u8; 4 * PAGE as usize]);
    let file = tf.open(true);
    let host = HostMap::new(&file, 3 * PAGE, libc::PROT_READ | libc::PROT_WRITE, PAGE);
    let a = mm.mmap(0, 3 * PAGE, RW, MAP_SHARED, Some(&open), PAGE).unwrap();
    let e = mm.maps().into_iter().find(|e| e.start == a).unwrap();
    assert_eq!(e.vm_flags, host.vm_flags(), "a shared file mapping's flags, not VM_PFNMAP's");
    assert_eq!((e.offset, e.perms.as_str()), (PAGE, "rw-s"));

    // MADV_DONTNEED: 0 on both, the bytes stay the file's.
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a + 8, 0xfeed).unwrap();
    assert_eq!(host.madvise(0, 3 * PAGE, libc::MADV_DONTNEED), 0);
    assert_eq!(mm.madvise(a, 3 * PAGE, MADV_DONTNEED), Ok(()));
    assert_eq!(cpu.read_u64(a + 8).unwrap(), 0xfeed);
    let mut b = [0u8; 8];
    file.read_exact_at(&mut b, PAGE + 8).unwrap();
    assert_eq!(u64::from_le_bytes(b), 0xfeed);
    // A host write after the drop: the guest's next access fills anew.
    file.write_all_at(&7u64.to_le_bytes(), PAGE + 16).unwrap();
    assert_eq!(cpu.read_u64(a + 16).unwrap(), 7);
    // MADV_FREE of a file mapping: EINVAL on both.
    assert_eq!(host.madvise(0, PAGE, libc::MADV_FREE), libc::EINVAL);
    assert_eq!(mm.madvise(a, PAGE, MADV_FREE), Err(Errno::Inval));

    // Forced remote access: written and read as the file's bytes.
    assert_eq!(host.poke(PAGE + 1, &[0xa1; 3]), 3);
    assert_eq!(mm.access_remote_write(a + PAGE + 4, &[0xb2; 3], true), 3);
    let (mut h, mut g) = ([0u8; 8], [0u8; 8]);
    assert_eq!(host.peek(PAGE, &mut h), 8);
    assert_eq!(mm.access_remote_read(a + PAGE, &mut g, false), 8);
    assert_eq!(h, g, "both sides read the same file bytes");
    assert_eq!(h, [6, 0xa1, 0xa1, 0xa1, 0xb2, 0xb2, 0xb2, 6]);

    // A pin: the file's page, written by the device, seen by all.
    let pin = mm.pin_user_pages(a + 2 * PAGE, 1, Foll::WRITE).unwrap();
    pin.write(24, &9u64.to_le_bytes()).unwrap();
    assert_eq!(cpu.read_u64(a + 2 * PAGE + 24).unwrap(), 9);
    // SAFETY: inside the host's own mapping, which lives until `host` drops.
    assert_eq!(unsafe { (host.0.add(2 * PAGE as usize + 24) as *const u64).read_volatile() }, 9);
    let mut p = [0u8; 8];
    file.write_all_at(&11u64.to_le_bytes(), 3 * PAGE + 32).unwrap();
    pin.read(32, &mut p).unwrap();
    assert_eq!(u64::from_le_bytes(p), 11, "the pin reads the host's write");
    // A long-term write pin of a shared writable file mapping needs dirty
    // tracking (`writable_file_mapping_allowed`): EFAULT.
    assert_eq!(mm.pin_user_pages(a, 1, Foll::WRITE | Foll::LONGTERM).err(), Some(Errno::Fault));
    let read_pin = mm.pin_user_pages(a, 1, Foll::LONGTERM).unwrap();

    // The file shrinks to end inside the mapping's second page: past its
    // end, remote access stops on both (the host's EIO is 0 bytes).
    drop(cpu);
    file.set_len(2 * PAGE).unwrap();
    assert_eq!(host.peek(PAGE, &mut h), 0);
    assert_eq!(mm.access_remote_read(a + PAGE, &mut g, false), 0);
    assert_eq!(mm.access_remote_read(a + PAGE - 4, &mut g, false), 4, "stops at the page past the end");
    // The munmap: the pins still hold the host mapping and descriptor.
    mm.munmap(a, 3 * PAGE).unwrap();
    drop(open);
    let path = path_of("coherent-linux");
    assert_eq!(host_uses(&path).0, 2, "the host's own mapping and the pinned window");
    assert_eq!(pin.read(0, &mut p), Err(Errno::Fault), "past the file's end now");
    assert_eq!(read_pin.read(0, &mut p), Ok(()));
    drop((pin, read_pin));
    assert_eq!(host_uses(&path).0, 1, "the last pin's release unmaps the window");
    drop(host);
    drop(mm);
    assert_no_leaks(&phys);
}

/// `mremap` growth of a coherent window, as Linux grows a shared file
/// mapping over more of the file, beside the host's own mapping: in place
/// and moved, the grown pages are the file's on both sides, a CPU that
/// cached the old window refills from the new one, the old host mapping
/// goes, and a page grown past the file's end is `SIGBUS`.
#[test]
fn mremap_grows_a_coherent_window_over_more_of_the_file_as_the_host() {
    let (phys, mm, tf, open) = coherent_file("coherent-grow", &numbered_pages(4));
    let path = path_of("coherent-grow");
    let file = tf.open(true);
    // In place: one page with room after it, grown to three.
    let host = HostMap::new(&file, 3 * PAGE, libc::PROT_READ | libc::PROT_WRITE, 0);
    // SAFETY: the tail of the host's own mapping, unmapped, then grown back
    // over by mremap in place (the range after it is free).
    let grown = unsafe {
        assert_eq!(libc::munmap(host.0.add(PAGE as usize).cast(), 2 * PAGE as usize), 0);
        libc::mremap(host.0.cast(), PAGE as usize, 3 * PAGE as usize, 0)
    };
    assert_eq!(grown as u64, host.addr(), "the host grows in place");
    let a = mm.mmap(0, 3 * PAGE, RW, MAP_SHARED, Some(&open), 0).unwrap();
    mm.munmap(a + PAGE, 2 * PAGE).unwrap();
    let mut cpu = Cpu::attached(&mm);
    assert_eq!(cpu.read_u8(a).unwrap(), 1, "cached from the one-page window");
    assert_eq!(mm.mremap(a, PAGE, 3 * PAGE, 0, 0), Ok(a));
    for page in 0..3 {
        // SAFETY: inside the host's grown mapping.
        let h = unsafe { host.0.add((page * PAGE) as usize).read_volatile() };
        assert_eq!(cpu.read_u8(a + page * PAGE).unwrap(), h, "page {page}");
    }
    cpu.write_u8(a + 2 * PAGE + 1, 0x77).unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { host.0.add(2 * PAGE as usize + 1).read_volatile() }, 0x77);
    let e = mm.maps().into_iter().find(|e| e.start == a).unwrap();
    assert_eq!((e.end, e.offset, e.vm_flags.clone()), (a + 3 * PAGE, 0, host.vm_flags()));
    assert_eq!(host_uses(&path).0, 2, "the host's mapping and the new window; the old one went");
    // Moved: grown past what fits, and past the file's end.
    let hold = mm.mmap(a + 3 * PAGE, PAGE, PROT_NONE, ANON | MAP_FIXED, None, 0).unwrap();
    let b = mm.mremap(a + PAGE, 2 * PAGE, 4 * PAGE, MREMAP_MAYMOVE, 0).unwrap();
    assert_ne!(b, a + PAGE);
    assert_eq!(cpu.read_u8(b).unwrap(), 2);
    assert_eq!(cpu.read_u8(b + 2 * PAGE).unwrap(), 4);
    assert_eq!(cpu.read_u8(b + 3 * PAGE), Err(Fault::Bus { addr: b + 3 * PAGE }), "past the file's end");
    assert_eq!(cpu.read_u8(a).unwrap(), 1, "the page left behind keeps its window");
    drop(cpu);
    mm.munmap(hold, PAGE).unwrap();
    mm.munmap(a, PAGE).unwrap();
    mm.munmap(b, 4 * PAGE).unwrap();
    drop((open, host));
    assert_eq!(host_uses(&path), (0, 1), "every window went; the test's own descriptor stays");
    drop(mm);
    assert_no_leaks(&phys);
}

/// `MREMAP_DONTUNMAP` of a coherent window (no `VM_DONTEXPAND` refuses it
/// now), as Linux 6.12's `vma_to_resize` allows it for a shared file
/// mapping (only `VM_DONTEXPAND | VM_PFNMAP` are `EINVAL`) and as the same
/// file under `Cache` does: both ranges stay the file's, so a store through
/// the moved range is read through the one left behind and by the host.
/// (The host kernel the tests run on, 6.18, refuses every `DONTUNMAP` move
/// of a non-anonymous mapping with `EINVAL`; softmm follows 6.12, its
/// reference, as for its other `DONTUNMAP` cases.)
#[test]
fn a_dontunmap_move_of_a_coherent_window_keeps_both_ranges_the_files() {
    let phys = phys(4);
    for coherence in HostFileCoherence::ALL {
        let mm = mm(&phys, coherence);
        let tf = TempFile::new("coherent-dontunmap", &[3u8; PAGE as usize]);
        let file = tf.open(true);
        let open = OpenFile::from_host(&phys, tf.open(true), "coherent-dontunmap").unwrap();
        let a = mm.mmap(0, PAGE, RW, MAP_SHARED, Some(&open), 0).unwrap();
        let b = mm.mremap(a, PAGE, PAGE, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, 0).unwrap();
        assert_ne!(a, b);
        let mut cpu = Cpu::attached(&mm);
        cpu.write_u8(b + 5, 0x55).unwrap();
        assert_eq!(cpu.read_u8(a + 5).unwrap(), 0x55, "{coherence:?}: the range left behind is the file's");
        mm.msync(a, PAGE, MS_SYNC).unwrap();
        let mut byte = [0u8];
        file.read_exact_at(&mut byte, 5).unwrap();
        assert_eq!(byte[0], 0x55, "{coherence:?}: the host reads the store");
        drop(cpu);
        drop((mm, open));
    }
    assert_no_leaks(&phys);
}

/// `page_maybe_dma_pinned` of a coherent window's page, as Linux's for a
/// page-cache page: true while a `FOLL_PIN` pin holds it, seen through
/// every mapping of the file's page (another `mmap` of it too), not for a
/// `FOLL_GET` reference, and false after the unpin.
#[test]
fn a_pinned_host_file_page_is_maybe_dma_pinned_until_unpinned() {
    let (phys, mm, _tf, open) = coherent_file("coherent-pinned", &[1u8; 3 * PAGE as usize]);
    let a = mm.mmap(0, 3 * PAGE, RW, MAP_SHARED, Some(&open), 0).unwrap();
    // The same file page 1, mapped a second time elsewhere.
    let b = mm.mmap(0, PAGE, RW, MAP_SHARED, Some(&open), PAGE).unwrap();
    assert!(!mm.page_maybe_dma_pinned(a + PAGE));
    let got = mm.get_user_pages(a + PAGE, 1, Foll::empty()).unwrap();
    assert!(!mm.page_maybe_dma_pinned(a + PAGE), "FOLL_GET is no pin");
    let pin = mm.pin_user_pages(a + PAGE, 1, Foll::WRITE).unwrap();
    let again = mm.pin_user_pages(b, 1, Foll::empty()).unwrap();
    assert!(mm.page_maybe_dma_pinned(a + PAGE) && mm.page_maybe_dma_pinned(b));
    assert!(!mm.page_maybe_dma_pinned(a) && !mm.page_maybe_dma_pinned(a + 2 * PAGE));
    drop(pin);
    assert!(mm.page_maybe_dma_pinned(a + PAGE), "the second pin still holds it");
    drop((again, got));
    assert!(!mm.page_maybe_dma_pinned(a + PAGE) && !mm.page_maybe_dma_pinned(b));
    drop((mm, open));
    assert_no_leaks(&phys);
}

/// The host's `/proc/self/maps` lines inside `[base, base + len)`, as
/// `(start - base, end - base, offset)`.
fn host_lines(base: u64, len: u64) -> Vec<(u64, u64, u64)> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (s, e) = f.next()?.split_once('-')?;
            let (s, e) = (u64::from_str_radix(s, 16).ok()?, u64::from_str_radix(e, 16).ok()?);
            let off = u64::from_str_radix(f.nth(1)?, 16).ok()?;
            (s >= base && e <= base + len).then(|| (s - base, e - base, off))
        })
        .collect()
}

/// softmm's mappings inside `[base, base + len)`, as [`host_lines`].
fn guest_lines(mm: &AddressSpace, base: u64, len: u64) -> Vec<(u64, u64, u64)> {
    mm.maps()
        .into_iter()
        .filter(|e| e.start >= base && e.end <= base + len)
        .map(|e| (e.start - base, e.end - base, e.offset))
        .collect()
}

/// Host `mmap` of `len` bytes of `file` at `offset`, `MAP_SHARED`, at the
/// fixed address `at` (inside a reservation of the test's).
fn host_map_at(file: &std::fs::File, at: u64, len: u64, prot: i32, offset: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: `at` lies in a reservation the test made and owns; nothing
    // else uses that range.
    let p = unsafe {
        libc::mmap(
            at as *mut _,
            len as usize,
            prot,
            libc::MAP_SHARED | libc::MAP_FIXED,
            file.as_raw_fd(),
            offset as i64,
        )
    };
    assert_eq!(p as u64, at);
}

/// Adjacent coherent mappings of one host file merge as Linux's
/// `vma_merge` merges them, beside the host doing the same in a
/// reservation of its own: two `mmap`s at contiguous addresses and
/// offsets through one open are one VMA, a third filling a hole between
/// two joins them, an `mprotect` of the middle splits and one back to the
/// same flags merges again, and mappings through two opens stay apart.
/// The bytes stay the file's throughout, a CPU that cached a page before
/// a merge reads the file after it, and a pin taken before a merge keeps
/// its page (the old window) until it goes.
#[test]
fn adjacent_mappings_of_a_host_file_merge_as_the_hosts() {
    let (phys, mm, tf, open) = coherent_file("coherent-merge", &numbered_pages(4));
    let path = path_of("coherent-merge");
    let file = tf.open(true);
    let other = tf.open(true);
    let open2 = OpenFile::from_host(&phys, tf.open(true), "coherent-merge").unwrap();
    let len = 4 * PAGE;
    // SAFETY: a fresh reservation the kernel places, owned by the test.
    let host =
        unsafe { libc::mmap(std::ptr::null_mut(), len as usize, 0, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
    assert_ne!(host, libc::MAP_FAILED);
    let h = host as u64;
    let g = mm.mmap(0, len, PROT_NONE, ANON, None, 0).unwrap();
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    let fixed = MAP_SHARED | MAP_FIXED;

    // Pages 0 and 1, then 3: two VMAs on both sides.
    host_map_at(&file, h, PAGE, prot, 0);
    host_map_at(&file, h + PAGE, PAGE, prot, PAGE);
    host_map_at(&file, h + 3 * PAGE, PAGE, prot, 3 * PAGE);
    mm.mmap(g, PAGE, RW, fixed, Some(&open), 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    assert_eq!(cpu.read_u8(g).unwrap(), 1, "cached from the first window");
    let pin = mm.pin_user_pages(g, 1, Foll::WRITE).unwrap();
    mm.mmap(g + PAGE, PAGE, RW, fixed, Some(&open), PAGE).unwrap();
    mm.mmap(g + 3 * PAGE, PAGE, RW, fixed, Some(&open), 3 * PAGE).unwrap();
    let want = vec![(0, 2 * PAGE, 0), (2 * PAGE, 3 * PAGE, 0), (3 * PAGE, 4 * PAGE, 3 * PAGE)];
    assert_eq!(host_lines(h, len), want, "the host merges the first two");
    assert_eq!(guest_lines(&mm, g, len), want);
    // The hole filled: one VMA over all four pages on both.
    host_map_at(&file, h + 2 * PAGE, PAGE, prot, 2 * PAGE);
    mm.mmap(g + 2 * PAGE, PAGE, RW, fixed, Some(&open), 2 * PAGE).unwrap();
    assert_eq!(host_lines(h, len), vec![(0, len, 0)]);
    assert_eq!(guest_lines(&mm, g, len), vec![(0, len, 0)]);
    for page in 0..4 {
        assert_eq!(cpu.read_u8(g + page * PAGE).unwrap(), page as u8 + 1, "page {page}");
    }
    cpu.write_u8(g + 3 * PAGE + 1, 0x44).unwrap();
    let mut b = [0u8];
    file.read_exact_at(&mut b, 3 * PAGE + 1).unwrap();
    assert_eq!(b[0], 0x44, "the host reads the guest's store through the merged VMA");
    // The pin taken before the merges: still the file's page, and pinned.
    pin.write(8, &[0x99]).unwrap();
    assert_eq!(cpu.read_u8(g + 8).unwrap(), 0x99);
    assert!(mm.page_maybe_dma_pinned(g));
    drop(pin);
    assert!(!mm.page_maybe_dma_pinned(g));

    // mprotect of the middle: three VMAs; back: one again, on both.
    // SAFETY: inside the host's own mapping of the file.
    assert_eq!(unsafe { libc::mprotect((h + PAGE) as *mut _, PAGE as usize, libc::PROT_READ) }, 0);
    mm.mprotect(g + PAGE, PAGE, PROT_READ).unwrap();
    let split = vec![(0, PAGE, 0), (PAGE, 2 * PAGE, PAGE), (2 * PAGE, len, 2 * PAGE)];
    assert_eq!(host_lines(h, len), split);
    assert_eq!(guest_lines(&mm, g, len), split);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::mprotect((h + PAGE) as *mut _, PAGE as usize, prot) }, 0);
    mm.mprotect(g + PAGE, PAGE, RW).unwrap();
    assert_eq!(host_lines(h, len), vec![(0, len, 0)]);
    assert_eq!(guest_lines(&mm, g, len), vec![(0, len, 0)]);

    // Through another open (another `struct file`): never merged.
    host_map_at(&other, h + 2 * PAGE, 2 * PAGE, prot, 2 * PAGE);
    mm.mmap(g + 2 * PAGE, 2 * PAGE, RW, fixed, Some(&open2), 2 * PAGE).unwrap();
    let apart = vec![(0, 2 * PAGE, 0), (2 * PAGE, len, 2 * PAGE)];
    assert_eq!(host_lines(h, len), apart);
    assert_eq!(guest_lines(&mm, g, len), apart);
    assert_eq!(cpu.read_u8(g + 3 * PAGE + 1).unwrap(), 0x44);

    // Two mappings with different flags, each its own window, then an
    // mprotect that makes them equal: merged there, on both.
    host_map_at(&file, h + 2 * PAGE, PAGE, libc::PROT_READ, 2 * PAGE);
    host_map_at(&file, h + 3 * PAGE, PAGE, prot, 3 * PAGE);
    mm.mmap(g + 2 * PAGE, PAGE, PROT_READ, fixed, Some(&open), 2 * PAGE).unwrap();
    mm.mmap(g + 3 * PAGE, PAGE, RW, fixed, Some(&open), 3 * PAGE).unwrap();
    let two = vec![(0, 2 * PAGE, 0), (2 * PAGE, 3 * PAGE, 2 * PAGE), (3 * PAGE, len, 3 * PAGE)];
    assert_eq!(host_lines(h, len), two);
    assert_eq!(guest_lines(&mm, g, len), two);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::mprotect((h + 2 * PAGE) as *mut _, PAGE as usize, prot) }, 0);
    mm.mprotect(g + 2 * PAGE, PAGE, RW).unwrap();
    assert_eq!(host_lines(h, len), vec![(0, len, 0)]);
    assert_eq!(guest_lines(&mm, g, len), vec![(0, len, 0)]);
    assert_eq!(cpu.read_u8(g + 3 * PAGE + 1).unwrap(), 0x44);

    drop(cpu);
    mm.munmap(g, len).unwrap();
    // SAFETY: the test's reservation, unmapped once.
    unsafe { libc::munmap(host, len as usize) };
    drop((open, open2));
    assert_eq!(host_uses(&path).0, 0, "every window was released");
    drop(mm);
    assert_no_leaks(&phys);
}

/// The host's smaps `Rss` in bytes summed over its mappings inside
/// `[base, base + len)`.
fn host_rss(base: u64, len: u64) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    let mut rss = 0;
    for l in smaps.lines() {
        if let Some((range, _)) = l.split_once(' ').filter(|(r, _)| r.contains('-') && !r.ends_with(':')) {
            let (s, e) = range.split_once('-').unwrap();
            let (s, e) = (u64::from_str_radix(s, 16).unwrap(), u64::from_str_radix(e, 16).unwrap());
            inside = s >= base && e <= base + len;
        } else if let Some(kb) = l.strip_prefix("Rss:").filter(|_| inside) {
            rss += kb.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap() * 1024;
        }
    }
    rss
}

/// A file in `/dev/shm` (tmpfs), removed when dropped.
struct ShmFile(PathBuf);

fn tempfile_in_shm(tag: &str, content: &[u8]) -> std::io::Result<ShmFile> {
    let path = PathBuf::from(format!("/dev/shm/softmm-host-file-{}-{tag}", std::process::id()));
    std::fs::write(&path, content)?;
    Ok(ShmFile(path))
}

impl ShmFile {
    fn open(&self) -> std::fs::File {
        std::fs::OpenOptions::new().read(true).write(true).open(&self.0).unwrap()
    }
}

impl Drop for ShmFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// softmm's `Rss` summed over its mappings inside `[base, base + len)`.
fn guest_rss(mm: &AddressSpace, base: u64, len: u64) -> u64 {
    mm.maps().into_iter().filter(|e| e.start >= base && e.end <= base + len).map(|e| e.rss).sum()
}

/// The `Rss` tests' start: one tmpfs file of `PAGES` pages, mapped shared
/// and read-write by the host at `h` and by softmm at `g`, both at a 2 MiB
/// boundary (fault-around aligns by address) with a second 2 MiB of
/// reservation above. `None` (the test skips) without `/dev/shm`.
struct RssPair {
    phys: Arc<PhysMem>,
    mm: Arc<AddressSpace>,
    open: OpenFile,
    /// The host's open of the file.
    file: std::fs::File,
    shm: ShmFile,
    /// The host's reservation, `2 * PMD` past its 2 MiB boundary `h`.
    resv: *mut libc::c_void,
    h: u64,
    g: u64,
}

const RSS_PAGES: u64 = 48;
const PMD: u64 = 2 << 20;

impl RssPair {
    fn new(tag: &str) -> Option<RssPair> {
        let phys = phys(4);
        let mm = mm(&phys, HostFileCoherence::Shared);
        let len = RSS_PAGES * PAGE;
        let Ok(shm) = tempfile_in_shm(tag, &vec![1u8; len as usize]) else {
            eprintln!("skipped: no /dev/shm");
            return None;
        };
        let file = shm.open();
        let open = OpenFile::from_host(&phys, shm.open(), tag).unwrap();
        // SAFETY: a fresh reservation the kernel places, owned by the test.
        let resv = unsafe {
            libc::mmap(std::ptr::null_mut(), 3 * PMD as usize, 0, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        assert_ne!(resv, libc::MAP_FAILED);
        let h = (resv as u64).next_multiple_of(PMD);
        let g = mm.mmap(0, 3 * PMD, PROT_NONE, ANON, None, 0).unwrap().next_multiple_of(PMD);
        host_map_at(&file, h, len, libc::PROT_READ | libc::PROT_WRITE, 0);
        mm.mmap(g, len, RW, MAP_SHARED | MAP_FIXED, Some(&open), 0).unwrap();
        Some(RssPair { phys, mm, open, file, shm, resv, h, g })
    }

    /// softmm's `Rss` over the two 2 MiB from `g`, which must be the host's
    /// from `h` (`what` names the step); in pages.
    fn check(&self, what: &str) -> u64 {
        let host = host_rss(self.h, 2 * PMD);
        assert_eq!(guest_rss(&self.mm, self.g, 2 * PMD), host, "{what}: softmm's Rss against the host's");
        host / PAGE
    }

    /// The reservation unmapped, the address space and the open dropped:
    /// nothing of softmm's left.
    fn finish(self) {
        // SAFETY: the test's reservation, unmapped once.
        unsafe { libc::munmap(self.resv, 3 * PMD as usize) };
        let RssPair { phys, mm, open, file, shm, .. } = self;
        drop((mm, open, file, shm));
        assert_no_leaks(&phys);
    }
}

/// smaps `Rss` of a coherent window counts the pages the guest has mapped,
/// as Linux's counts the present entries of a shared file mapping, beside
/// the host mapping the same file at an address of the same alignment and
/// doing the same: a read maps the cached pages around it (fault-around),
/// a write only its page, `MADV_DONTNEED` takes pages out and a read maps
/// them back, `mprotect` keeps them, `munmap` takes its part, `mremap`
/// moves them, a pin maps its page; a fork's child starts at 0.
#[test]
fn smaps_rss_of_a_coherent_window_counts_the_mapped_pages_as_the_hosts() {
    // On tmpfs, whose folios are single pages unless shmem THP is on:
    // Linux 6.18 maps a whole large folio on a read fault (ext4's page
    // cache has them), where 6.12, softmm's reference, maps one
    // `fault_around_bytes` window.
    let Some(pair) = RssPair::new("coherent-rss") else { return };
    let (mm, h, g) = (&pair.mm, pair.h, pair.g);
    let mut cpu = Cpu::attached(mm);
    let check = |what: &str| pair.check(what);
    assert_eq!(check("untouched"), 0);
    let hread = |page: u64| {
        // SAFETY: a page of the host's mapping of the file (the callers'
        // pages stay mapped), which lives until the test unmaps it.
        unsafe { ((h + page * PAGE) as *const u8).read_volatile() }
    };
    let hwrite = |page: u64| {
        // SAFETY: as in `hread`; the mapping is writable there.
        unsafe { ((h + page * PAGE + 1) as *mut u8).write_volatile(9) }
    };
    hread(0);
    cpu.read_u8(g).unwrap();
    assert_eq!(check("a read of page 0"), 16, "fault-around");
    hwrite(20);
    cpu.write_u8(g + 20 * PAGE + 1, 9).unwrap();
    assert_eq!(check("a write of page 20"), 17);
    // SAFETY: advice on the host's own file mapping (its bytes stay).
    assert_eq!(unsafe { libc::madvise((h + 4 * PAGE) as *mut _, 4 * PAGE as usize, libc::MADV_DONTNEED) }, 0);
    mm.madvise(g + 4 * PAGE, 4 * PAGE, MADV_DONTNEED).unwrap();
    assert_eq!(check("MADV_DONTNEED of pages 4-7"), 13);
    hread(5);
    cpu.read_u8(g + 5 * PAGE).unwrap();
    assert_eq!(check("a read of page 5"), 17);
    hread(40);
    cpu.read_u8(g + 40 * PAGE).unwrap();
    assert_eq!(check("a read of page 40"), 33, "its aligned window, 32-47");
    // SAFETY: mprotect of part of the host's own mapping.
    assert_eq!(unsafe { libc::mprotect((h + 8 * PAGE) as *mut _, 8 * PAGE as usize, libc::PROT_READ) }, 0);
    mm.mprotect(g + 8 * PAGE, 8 * PAGE, PROT_READ).unwrap();
    assert_eq!(check("mprotect of pages 8-15"), 33);
    // SAFETY: munmap of part of the host's own mapping.
    assert_eq!(unsafe { libc::munmap((h + 44 * PAGE) as *mut _, 4 * PAGE as usize) }, 0);
    mm.munmap(g + 44 * PAGE, 4 * PAGE).unwrap();
    assert_eq!(check("munmap of pages 44-47"), 29);
    // A pin (gup's read fault) of page 30, in a window only a write touched.
    let pin = mm.pin_user_pages(g + 30 * PAGE, 1, Foll::empty()).unwrap();
    hread(30);
    let with_pin = check("a read pin of page 30");
    assert_eq!(with_pin, 29 + 15, "its aligned window, 16-31, but for page 20");
    drop(pin);
    // A fork's child has none of the parent's (shared file entries are
    // not copied), the parent keeps its own.
    let child = mm.fork().unwrap();
    assert_eq!(guest_rss(&child, g, 2 * PMD), 0);
    drop(child);
    // mremap moves the pages: the host's too (moved within its
    // reservation, to the second 2 MiB half).
    // SAFETY: a move of part of the host's own mapping inside its reservation.
    let moved = unsafe {
        libc::mremap(
            (h + 16 * PAGE) as *mut _,
            8 * PAGE as usize,
            8 * PAGE as usize,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            (h + PMD) as *mut libc::c_void,
        )
    };
    assert_eq!(moved as u64, h + PMD);
    assert_eq!(mm.mremap(g + 16 * PAGE, 8 * PAGE, 8 * PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, g + PMD), Ok(g + PMD));
    assert_eq!(check("mremap of pages 16-23"), with_pin);
    assert_eq!(host_rss(h + PMD, 8 * PAGE), 8 * PAGE);
    drop(cpu);
    pair.finish();
}

/// smaps `Rss` of a coherent window after a forced remote read
/// (`access_remote_read`, as `/proc/pid/mem` reads: gup's fault maps the
/// page and the cached pages around it) and after the host's own
/// truncate, hole punch and regrowth of the file (a dropped page is
/// unmapped from every mapping of the file, and growing the file back
/// maps nothing), against the host doing the same: its remote read
/// through `/proc/self/mem`, the file calls on the one file both map.
#[test]
fn smaps_rss_after_a_remote_read_and_the_hosts_truncate_is_the_hosts() {
    use std::os::fd::AsRawFd;
    let Some(pair) = RssPair::new("remote-rss") else { return };
    let (mm, file, h, g) = (&pair.mm, &pair.file, pair.h, pair.g);
    let check = |what: &str| pair.check(what);
    assert_eq!(check("untouched"), 0);
    let proc_mem = std::fs::File::open("/proc/self/mem").unwrap();
    let mut byte = [0u8; 1];
    assert_eq!(proc_mem.read_at(&mut byte, h + 5 * PAGE).unwrap(), 1);
    assert_eq!(mm.access_remote_read(g + 5 * PAGE, &mut byte, true), 1);
    assert_eq!(check("a remote read of page 5"), 16, "fault-around");
    assert_eq!(proc_mem.read_at(&mut byte, h + 40 * PAGE).unwrap(), 1);
    assert_eq!(mm.access_remote_read(g + 40 * PAGE, &mut byte, true), 1);
    assert_eq!(check("a remote read of page 40"), 32, "its aligned window, 32-47");
    // The host's own calls on the file both map.
    file.set_len(36 * PAGE).unwrap();
    assert_eq!(check("the host's truncate to 36 pages"), 20);
    // SAFETY: a hole punched in the test's own file.
    let punched = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            2 * PAGE as i64,
            2 * PAGE as i64,
        )
    };
    assert_eq!(punched, 0);
    assert_eq!(check("the host's hole punch of pages 2-3"), 18);
    file.set_len(RSS_PAGES * PAGE).unwrap();
    assert_eq!(check("the file grown back"), 18, "what was dropped stays unmapped");
    pair.finish();
}

/// smaps `Rss` of a coherent window after the host punched a page out
/// and a CPU, whose translation of the page the punch left in place (the
/// host shoots no softmm TLB down), read it again, caching it anew: the
/// host's mapping, whose entry the punch removed, faults it back in and
/// counts it, and so does softmm. Before, reading `Rss` between the two
/// took the page out of the record for good (15 against 16), so that
/// reading smaps changed what later smaps said.
#[test]
fn smaps_rss_counts_a_punched_page_that_a_cached_translation_reads_again() {
    use std::os::fd::AsRawFd;
    let Some(pair) = RssPair::new("punch-reread") else { return };
    let (mm, h, g) = (&pair.mm, pair.h, pair.g);
    let mut cpu = Cpu::attached(mm);
    // SAFETY: page 5 of the host's mapping of the file, which lives until
    // the test unmaps it.
    let hread = || unsafe { ((h + 5 * PAGE) as *const u8).read_volatile() };
    hread();
    cpu.read_u8(g + 5 * PAGE).unwrap();
    assert_eq!(pair.check("a read of page 5"), 16, "fault-around");
    // SAFETY: a hole punched in the test's own file.
    let punched = unsafe {
        libc::fallocate(
            pair.file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            5 * PAGE as i64,
            PAGE as i64,
        )
    };
    assert_eq!(punched, 0);
    assert_eq!(pair.check("the host's hole punch of page 5"), 15);
    assert_eq!(cpu.stats().fault.faults, 1);
    hread();
    assert_eq!(cpu.read_u8(g + 5 * PAGE), Ok(0), "the punched page reads zero");
    assert_eq!(cpu.stats().fault.faults, 1, "the read went through the translation it had");
    assert_eq!(pair.check("page 5 read again"), 16);
    drop(cpu);
    pair.finish();
}

/// smaps `Rss` of a coherent window 1 TiB long, of a 48-page file of which
/// a read mapped 16 pages: counting them asks the host about those pages
/// only. Before, it asked about every page of the window, into two
/// buffers of a byte per page (268 MB here, and 32 GiB for a 64 TiB
/// window) allocated while the window's record was locked.
#[test]
fn smaps_rss_of_a_huge_coherent_window_costs_what_is_mapped() {
    let phys = phys(4);
    let mm = mm(&phys, HostFileCoherence::Shared);
    let Ok(shm) = tempfile_in_shm("huge-window", &[1u8; 48 * PAGE as usize]) else {
        eprintln!("skipped: no /dev/shm");
        return;
    };
    let open = OpenFile::from_host(&phys, shm.open(), "huge-window").unwrap();
    let len = 1u64 << 40;
    let a = mm.mmap(0, len, PROT_READ, MAP_SHARED, Some(&open), 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.read_u8(a + 5 * PAGE).unwrap();
    let (rss, largest) = crate::alloc_watch::largest_allocation_in(|| guest_rss(&mm, a, len));
    assert_eq!(rss, 16 * PAGE, "fault-around");
    assert!(largest < 1 << 20, "{largest} bytes allocated at once to count 16 pages");
    drop(cpu);
    mm.munmap(a, len).unwrap();
    drop((mm, open, shm));
    assert_no_leaks(&phys);
}
