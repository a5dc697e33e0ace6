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
use softmm_testkit::common::{assert_no_leaks, phys, TempFile, PAGE, RW};

fn mm(phys: &Arc<PhysMem>, coherence: HostFileCoherence) -> Arc<AddressSpace> {
    AddressSpace::new(phys, MmConfig::default().host_file_coherence(coherence)).unwrap()
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
    let phys = phys(4);
    let mm = mm(&phys, HostFileCoherence::Shared);
    let tf = TempFile::new("coherent-rw", &[0u8; 2 * PAGE as usize]);
    let host = tf.open(true);
    let open = OpenFile::from_host(&phys, tf.open(true), "coherent-rw").unwrap();
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
    let phys = phys(4);
    let mm = mm(&phys, HostFileCoherence::Shared);
    let tf = TempFile::new("coherent-eof", &[1u8; 3 * PAGE as usize]);
    let host = tf.open(true);
    let open = OpenFile::from_host(&phys, tf.open(true), "coherent-eof").unwrap();
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
    assert_eq!(mm.madvise(a, PAGE, MADV_DONTNEED), Err(Errno::Inval), "VM_PFNMAP");
    assert_eq!(mm.pin_user_pages(a, 1, Foll::empty()).err(), Some(Errno::Fault));
    // The file grows again: the page is back, as zeros.
    host.set_len(3 * PAGE).unwrap();
    assert_eq!(cpu.read_u8(a + 2 * PAGE).unwrap(), 0);
    drop(cpu);
    drop((mm, open));
    assert_no_leaks(&phys);
}

#[test]
fn a_fork_shares_and_the_last_unmap_closes_the_host_mapping_and_descriptor() {
    let phys = phys(4);
    let mm = mm(&phys, HostFileCoherence::Shared);
    let tf = TempFile::new("coherent-fork", &[0u8; PAGE as usize]);
    let path = path_of("coherent-fork");
    let open = OpenFile::from_host(&phys, tf.open(true), "coherent-fork").unwrap();
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
    let phys = phys(4);
    let mm = mm(&phys, HostFileCoherence::Shared);
    let tf = TempFile::new("coherent-set-len", &[2u8; 3 * PAGE as usize]);
    let open = OpenFile::from_host(&phys, tf.open(true), "coherent-set-len").unwrap();
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
