//! Host-backed files (`File::from_host`, `OpenFile::from_host`) and
//! `msync`: pages read from the host on fault, shared writes written back
//! on `msync(MS_SYNC)`, `File::sync` and when the file goes, truncate and
//! hole punch applied to the host, a read-only host file's limits; and
//! `msync`'s errnos against the host's. All under the page-cache policy,
//! `HostFileCoherence::Cache`, named here since `Shared` is the default
//! (`host_file_shared.rs`).

use softmm_testkit::common;

use std::sync::Arc;

use common::{assert_no_leaks, phys, TempFile, ANON, PAGE, RW};
use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, Errno, Fault, File, HostFileCoherence, MmConfig, OpenFile, PhysMem};

/// An address space whose shared mappings of host files are softmm's page
/// cache, written back (`Cache`).
fn mm(phys: &Arc<PhysMem>) -> Arc<AddressSpace> {
    AddressSpace::new(phys, MmConfig::default().host_file_coherence(HostFileCoherence::Cache)).unwrap()
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 13 + i / 4096) as u8).collect()
}

/// The test binary itself, mapped as a loader maps an ELF file.
#[test]
fn the_test_binary_maps_as_an_elf_file() {
    let exe = std::env::current_exe().unwrap();
    let bytes = std::fs::read(&exe).unwrap();
    let phys = phys(16);
    let mm = mm(&phys);
    let elf = OpenFile::from_host(&phys, std::fs::File::open(&exe).unwrap(), exe.to_str().unwrap()).unwrap();
    assert!(!elf.writable);
    assert_eq!(elf.file.len(), bytes.len() as u64);
    let len = (bytes.len() as u64).div_ceil(PAGE) * PAGE;
    let text = mm.mmap(0, len, PROT_READ | PROT_EXEC, MAP_PRIVATE, Some(&elf), 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    assert_eq!(cpu.fetch_u32(text).unwrap(), u32::from_le_bytes(*b"\x7fELF"));
    let mut page = vec![0u8; PAGE as usize];
    let at = (bytes.len() as u64 / 2) & !(PAGE - 1);
    cpu.read(text + at, &mut page).unwrap();
    assert!(page == bytes[at as usize..][..PAGE as usize]);
    // The tail of the last page past the end of the file reads as zeros.
    let last = bytes.len() as u64;
    if last % PAGE != 0 {
        assert_eq!(cpu.read_u8(text + last).unwrap(), 0);
    }
    // A loader or debugger writes into the text: a private copy.
    assert_eq!(mm.access_remote_write(text, &[0xcc], true), 1);
    assert_eq!(cpu.fetch_le::<u8>(text).unwrap(), 0xcc);
    assert_eq!(std::fs::read(&exe).unwrap()[0], 0x7f);
    let maps = mm.maps();
    assert_eq!(maps[0].name, exe.to_str().unwrap());
    drop((cpu, mm, elf));
    assert_no_leaks(&phys);
}

/// Shared writes reach the host file on `msync(MS_SYNC)`, on `File::sync`,
/// and when the last mapping and open are gone; private writes never do.
#[test]
fn shared_writes_are_written_back() {
    let content = pattern(3 * PAGE as usize - 100);
    let host = TempFile::new("writeback", &content);
    let phys = phys(8);
    let mm = mm(&phys);
    let f = OpenFile::from_host(&phys, host.open(true), "data").unwrap();
    assert!(f.writable);
    let s = mm.mmap(0, 3 * PAGE, RW, MAP_SHARED, Some(&f), 0).unwrap();
    let p = mm.mmap(0, 3 * PAGE, RW, MAP_PRIVATE, Some(&f), 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    assert_eq!(cpu.read_u8(s + 5).unwrap(), content[5]);
    cpu.write_u64(s + 8, 0x1122_3344_5566_7788).unwrap();
    cpu.write_u8(p + 1, 0xee).unwrap();
    assert_eq!(mm.msync(s, 3 * PAGE, MS_SYNC), Ok(()));
    let mut expect = content.clone();
    expect[8..16].copy_from_slice(&0x1122_3344_5566_7788u64.to_le_bytes());
    assert!(host.read() == expect, "after msync");
    // A write on the last page: the file keeps its size.
    cpu.write_u8(s + 2 * PAGE + 10, 0x99).unwrap();
    f.file.sync().unwrap();
    expect[2 * PAGE as usize + 10] = 0x99;
    assert!(host.read() == expect, "after fsync");
    // Past the end of the file, within the page: not written back.
    cpu.write_u8(s + content.len() as u64 + 1, 0x77).unwrap();
    cpu.write_u8(s + PAGE + 3, 0x55).unwrap();
    drop((cpu, mm, f));
    // The VMAs, which hold the file, go after a grace period, which
    // `quiesce` waits for; the file's last writeback runs when the last
    // of them goes.
    assert_no_leaks(&phys);
    expect[PAGE as usize + 3] = 0x55;
    assert!(host.read() == expect, "after the last unmap and close");
}

/// Writeback writes only the pages written since the last one
/// (`page_mkclean`): it write-protects their shared mappings, so the next
/// store through a CPU whose TLB held the writable entry faults and marks
/// the page dirty again, in this address space and in a forked child's
/// shared mapping alike; `write_at` dirties the page it writes.
#[test]
fn writeback_writes_only_pages_written_since_the_last_one() {
    let content = pattern(4 * PAGE as usize);
    let host = TempFile::new("mkclean", &content);
    let phys = phys(8);
    let mm = mm(&phys);
    let f = OpenFile::from_host(&phys, host.open(true), "data").unwrap();
    let s = mm.mmap(0, 4 * PAGE, RW, MAP_SHARED, Some(&f), 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    let mut expect = content.clone();
    let store = |cpu: &mut Cpu, off: u64, v: u8, expect: &mut Vec<u8>| {
        cpu.write_u8(s + off, v).unwrap();
        expect[off as usize] = v;
    };
    for i in 0..4 {
        store(&mut cpu, i * PAGE + 1, 0x10 + i as u8, &mut expect);
    }
    let written = |f: &OpenFile| f.file.pages_written_back();
    assert_eq!(mm.msync(s, 4 * PAGE, MS_SYNC), Ok(()));
    assert_eq!(written(&f), 4);
    assert!(host.read() == expect);
    // Nothing written since: nothing to write.
    assert_eq!(mm.msync(s, 4 * PAGE, MS_SYNC), Ok(()));
    f.file.sync().unwrap();
    assert_eq!(written(&f), 4, "clean pages were written again");
    // One page stored to (its TLB entry was writable before the
    // writeback): one page written, with the new byte.
    store(&mut cpu, PAGE + 2, 0x21, &mut expect);
    store(&mut cpu, PAGE + 3, 0x22, &mut expect);
    assert_eq!(mm.msync(s, 4 * PAGE, MS_SYNC), Ok(()));
    assert_eq!(written(&f), 5);
    assert!(host.read() == expect, "the store after the writeback was lost");
    // A forked child's shared mapping is write-protected too.
    let child = mm.fork().unwrap();
    let mut ccpu = Cpu::attached(&child);
    ccpu.write_u8(s + 3 * PAGE + 7, 0x37).unwrap();
    expect[3 * PAGE as usize + 7] = 0x37;
    f.file.sync().unwrap();
    assert_eq!(written(&f), 6);
    ccpu.write_u8(s + 3 * PAGE + 8, 0x38).unwrap();
    expect[3 * PAGE as usize + 8] = 0x38;
    f.file.sync().unwrap();
    assert_eq!(written(&f), 7, "the child's store after the writeback");
    assert!(host.read() == expect);
    // write(2) dirties its page.
    f.file.write_at(2 * PAGE + 9, &[0x29]).unwrap();
    expect[2 * PAGE as usize + 9] = 0x29;
    f.file.sync().unwrap();
    assert_eq!(written(&f), 8);
    assert!(host.read() == expect);
    drop((cpu, ccpu, mm, child));
    drop(f);
    assert_no_leaks(&phys);
    assert!(host.read() == expect);
}

/// A device writes through a write pin of a shared mapping, which no page
/// table sees: the unpin marks the pages dirty, as a driver's
/// `unpin_user_pages_dirty_lock(.., true)` does, so the next writeback
/// writes them, including bytes written after a writeback during the pin.
/// The same for a `get_user_pages` write reference (`O_DIRECT` into the
/// mapping: `bio_release_pages` dirties), and the explicit unpin.
#[test]
fn device_writes_through_a_pin_are_written_back() {
    let host = TempFile::new("pin", &pattern(2 * PAGE as usize));
    let phys = phys(8);
    let mm = mm(&phys);
    let f = OpenFile::from_host(&phys, host.open(true), "data").unwrap();
    let s = mm.mmap(0, 2 * PAGE, RW, MAP_SHARED, Some(&f), 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u8(s, 1).unwrap();
    let p = mm.pin_user_pages(s, 2, softmm::Foll::WRITE).unwrap();
    p.write(8, b"AAAA").unwrap();
    f.file.sync().unwrap();
    assert_eq!(&host.read()[8..12], b"AAAA", "written back while pinned");
    p.write(8, b"BBBB").unwrap();
    p.write(PAGE + 8, b"CCCC").unwrap();
    drop(p);
    f.file.sync().unwrap();
    let bytes = host.read();
    assert_eq!((&bytes[8..12], &bytes[PAGE as usize + 8..][..4]), (&b"BBBB"[..], &b"CCCC"[..]), "after the unpin");
    let r = mm.get_user_pages(s + PAGE, 1, softmm::Foll::WRITE).unwrap();
    r.write(16, b"DDDD").unwrap();
    drop(r);
    f.file.sync().unwrap();
    assert_eq!(&host.read()[PAGE as usize + 16..][..4], b"DDDD", "after the reference's put");
    // The explicit unpin: clean for a device that wrote nothing, dirty on
    // request; a read pin never dirties (its device cannot write). A write
    // pin's own write fault dirties the page: synced before each unpin.
    let (w, r) = (mm.pin_user_pages(s, 2, softmm::Foll::WRITE).unwrap(), mm.pin_user_pages(s, 2, Default::default()));
    f.file.sync().unwrap();
    let written = f.file.pages_written_back();
    w.unpin(false);
    r.unwrap().unpin(true);
    f.file.sync().unwrap();
    assert_eq!(f.file.pages_written_back(), written, "clean unpins dirtied a page");
    let w = mm.pin_user_pages(s + PAGE, 1, softmm::Foll::WRITE).unwrap();
    f.file.sync().unwrap();
    let written = f.file.pages_written_back();
    w.unpin(true);
    f.file.sync().unwrap();
    assert_eq!(f.file.pages_written_back(), written + 1, "a dirty unpin");
    drop((cpu, mm, f));
    assert_no_leaks(&phys);
}

/// Writeback racing a writer thread: however the writer's stores
/// interleave with the clear, the write-protect and the copy, the last
/// value stored reaches the host once the writer is done and the file is
/// synced again (a store lost after a writeback marked its page clean
/// would leave an older value).
#[test]
fn writeback_racing_stores_loses_none() {
    let host = TempFile::new("mkclean-race", &pattern(2 * PAGE as usize));
    let phys = phys(8);
    let mm = mm(&phys);
    let f = OpenFile::from_host(&phys, host.open(true), "data").unwrap();
    let s = mm.mmap(0, 2 * PAGE, RW, MAP_SHARED, Some(&f), 0).unwrap();
    for round in 0..20u64 {
        let stop = std::sync::atomic::AtomicBool::new(false);
        let last = std::thread::scope(|t| {
            let writer = t.spawn(|| {
                let mut cpu = Cpu::attached(&mm);
                let mut v = round << 32;
                // At least a few stores, then until the syncs are done.
                while v < (round << 32) + 50 || !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    v += 1;
                    cpu.write_u64(s + PAGE + 8, v).unwrap();
                }
                v
            });
            for _ in 0..5 {
                f.file.sync().unwrap();
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            writer.join().unwrap()
        });
        f.file.sync().unwrap();
        let bytes = host.read();
        let got = u64::from_le_bytes(bytes[PAGE as usize + 8..PAGE as usize + 16].try_into().unwrap());
        assert_eq!(got, last, "round {round}: the host has an older store");
    }
    drop((mm, f));
    assert_no_leaks(&phys);
}

/// An `O_RDONLY` host file: no shared writable mapping (`EACCES`), no
/// write (`EBADF`), no truncate (`EINVAL`), no hole punch (`EBADF`); a
/// private writable mapping is fine and stays private.
#[test]
fn a_read_only_host_file_refuses_writes() {
    let content = pattern(PAGE as usize);
    let host = TempFile::new("ro", &content);
    let phys = phys(4);
    let mm = mm(&phys);
    let f = OpenFile::from_host(&phys, host.open(false), "ro").unwrap();
    assert!(f.readable && !f.writable);
    assert_eq!(mm.mmap(0, PAGE, RW, MAP_SHARED, Some(&f), 0), Err(Errno::Acces));
    // Asking for more than the host allows does not get it.
    let wider = OpenFile::new(&f.file, true, true);
    assert!(!wider.writable);
    assert_eq!(mm.mmap(0, PAGE, RW, MAP_SHARED, Some(&wider), 0), Err(Errno::Acces));
    assert_eq!(f.file.write_at(0, &[1]), Err(Errno::BadF));
    assert_eq!(f.file.set_len(0), Err(Errno::Inval));
    assert_eq!(f.file.punch_hole(0, PAGE), Err(Errno::BadF));
    let s = mm.mmap(0, PAGE, PROT_READ, MAP_SHARED, Some(&f), 0).unwrap();
    let p = mm.mmap(0, PAGE, RW, MAP_PRIVATE, Some(&f), 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u8(p, 0xab).unwrap();
    assert_eq!(cpu.read_u8(s).unwrap(), content[0]);
    assert_eq!(mm.msync(s, PAGE, MS_SYNC), Ok(()));
    drop((cpu, mm, f, wider));
    assert_no_leaks(&phys);
    assert!(host.read() == content);
}

/// The size is the host file's; past it, SIGBUS. Truncate changes the host
/// file at once, and a page cut off and grown back reads as zeros, not as
/// the old bytes; a punched hole too.
#[test]
fn truncate_and_hole_punch_reach_the_host() {
    let content = pattern(2 * PAGE as usize);
    let host = TempFile::new("trunc", &content);
    let phys = phys(4);
    let mm = mm(&phys);
    let f = OpenFile::from_host(&phys, host.open(true), "t").unwrap();
    let s = mm.mmap(0, 3 * PAGE, PROT_READ, MAP_SHARED, Some(&f), 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    assert_eq!(cpu.read_u8(s + PAGE + 1).unwrap(), content[PAGE as usize + 1]);
    assert_eq!(cpu.read_u8(s + 2 * PAGE), Err(Fault::Bus { addr: s + 2 * PAGE }));
    f.file.set_len(PAGE + 10).unwrap();
    assert_eq!(host.read().len(), PAGE as usize + 10);
    assert_eq!(cpu.read_u8(s + PAGE + 9).unwrap(), content[PAGE as usize + 9]);
    assert_eq!(cpu.read_u8(s + PAGE + 10).unwrap(), 0);
    f.file.set_len(2 * PAGE).unwrap();
    assert_eq!(cpu.read_u8(s + PAGE + 20).unwrap(), 0);
    let mut b = [1u8; 4];
    assert_eq!(f.file.read_at(PAGE + 20, &mut b), Ok(4));
    assert_eq!(b, [0; 4]);
    // Punch the first page: the cached copy and the host's both go.
    assert_eq!(cpu.read_u8(s + 7).unwrap(), content[7]);
    f.file.punch_hole(0, PAGE).unwrap();
    assert_eq!(cpu.read_u8(s + 7).unwrap(), 0);
    assert!(host.read()[..PAGE as usize].iter().all(|&b| b == 0));
    assert_eq!(f.file.read_at(0, &mut b), Ok(4));
    assert_eq!(b, [0; 4]);
    // write_at through the page cache, then to the host.
    assert_eq!(f.file.write_at(3, b"abc"), Ok(3));
    assert_eq!(cpu.read_u8(s + 4).unwrap(), b'b');
    f.file.sync().unwrap();
    assert_eq!(&host.read()[3..6], b"abc");
    drop((cpu, mm, f));
    assert_no_leaks(&phys);
}

/// Not a regular file: `ENODEV`, as `mmap` of it would be.
#[test]
fn a_directory_is_refused() {
    let phys = phys(1);
    let dir = std::fs::File::open(std::env::temp_dir()).unwrap();
    assert_eq!(File::from_host(&phys, dir, "dir").err(), Some(Errno::NoDev));
}

/// `msync`'s errnos and their order against the host's, on the same
/// layout: `[a: 2 pages][hole: 1 page][b: 1 page, locked]` of anonymous
/// memory (softmm places it at the same offsets).
#[test]
fn msync_errnos_match_the_host() {
    let cases: Vec<(u64, u64, i32)> = vec![
        (0, PAGE, MS_SYNC),
        (0, PAGE, MS_ASYNC),
        (0, PAGE, 0),
        (0, PAGE, MS_INVALIDATE),
        (0, PAGE, MS_ASYNC | MS_SYNC),
        (0, PAGE, 0x40),
        (1, PAGE, MS_SYNC),
        (0, 0, MS_SYNC),
        (0, 1, MS_SYNC),
        (0, 4 * PAGE, MS_SYNC),
        (0, 4 * PAGE, MS_ASYNC),
        (0, 4 * PAGE, MS_INVALIDATE),
        (0, 3 * PAGE, MS_SYNC),
        (2 * PAGE, PAGE, MS_SYNC),
        (2 * PAGE, 2 * PAGE, MS_ASYNC),
        (2 * PAGE, 2 * PAGE, MS_SYNC),
        (3 * PAGE, PAGE, MS_INVALIDATE),
        (3 * PAGE, PAGE, MS_SYNC | MS_INVALIDATE),
        (PAGE, u64::MAX - PAGE, MS_SYNC),
        (PAGE, u64::MAX, MS_SYNC),
    ];
    // Host: reserve 5 pages, unmap the hole and the page past b.
    // SAFETY: plain system calls on a mapping this test makes and removes.
    let host: Vec<i32> = unsafe {
        let base = libc::mmap(std::ptr::null_mut(), 5 * PAGE as usize, RW, ANON, -1, 0) as u64;
        assert_ne!(base as *mut libc::c_void, libc::MAP_FAILED);
        libc::munmap((base + 2 * PAGE) as *mut _, PAGE as usize);
        libc::munmap((base + 4 * PAGE) as *mut _, PAGE as usize);
        let b = (base + 3 * PAGE) as *mut libc::c_void;
        assert_eq!(libc::mmap(b, PAGE as usize, RW, ANON | MAP_FIXED | MAP_LOCKED, -1, 0), b, "MAP_LOCKED");
        let r = cases
            .iter()
            .map(|&(off, len, flags)| {
                if libc::msync(base.wrapping_add(off) as *mut _, len as usize, flags) == 0 {
                    0
                } else {
                    *libc::__errno_location()
                }
            })
            .collect();
        // Only the pages still this test's: the holes may be another
        // test thread's mappings by now.
        libc::munmap(base as *mut _, 2 * PAGE as usize);
        libc::munmap(b, PAGE as usize);
        r
    };
    let phys = phys(1);
    let mm = mm(&phys);
    let base = mm.mmap(0, 5 * PAGE, RW, ANON, None, 0).unwrap();
    mm.munmap(base + 2 * PAGE, PAGE).unwrap();
    mm.munmap(base + 4 * PAGE, PAGE).unwrap();
    mm.mmap(base + 3 * PAGE, PAGE, RW, ANON | MAP_FIXED | MAP_LOCKED, None, 0).unwrap();
    let soft: Vec<i32> = cases
        .iter()
        .map(|&(off, len, flags)| mm.msync(base.wrapping_add(off), len, flags).err().map_or(0, Errno::code))
        .collect();
    for (i, c) in cases.iter().enumerate() {
        assert_eq!(soft[i], host[i], "msync(base + {:#x}, {:#x}, {:#x})", c.0, c.1, c.2);
    }
}
