//! Host memory in the guest (`AddressSpace::mmap_host`, unicorn's
//! `uc_mem_map_ptr`): guest accesses reach the caller's buffer and the
//! caller's stores reach the guest; the release callback runs exactly
//! once, at the last unmap (fork, mremap, partial munmap, a `with_slice`
//! still using the page), never while a CPU can still reach the memory;
//! mprotect; Linux's `VM_PFNMAP` refusals; bad input.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, Errno, Fault, Foll, MmConfig, PhysMem, SegvCode};
use softmm_testkit::common::{assert_no_leaks, phys, spawn, PAGE, RW};

/// A page-aligned buffer of `pages` pages the test owns, with a release
/// callback that counts its runs and then poisons and frees the buffer.
struct Buffer {
    ptr: *mut u8,
    len: usize,
    released: Arc<AtomicUsize>,
}

const POISON: u64 = 0xdead_dead_dead_dead;

impl Buffer {
    fn new(pages: usize) -> Buffer {
        let len = pages * PAGE as usize;
        // SAFETY: a non-zero size and a valid alignment.
        let ptr = unsafe { alloc_zeroed(Layout::from_size_align(len, PAGE as usize).unwrap()) };
        assert!(!ptr.is_null());
        Buffer { ptr, len, released: Arc::new(AtomicUsize::new(0)) }
    }

    /// Word `i` of the buffer, read and written atomically as the guest does.
    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i * 8 < self.len);
        // SAFETY: in bounds, aligned, and alive until the release (the
        // tests read it only before their last unmap).
        unsafe { &*(self.ptr.add(i * 8) as *const AtomicU64) }
    }

    /// The release callback: counts, poisons every word (so that a CPU
    /// still reading would see it), then frees the buffer.
    fn release(&self) -> Box<dyn FnOnce() + Send> {
        let (addr, len, released) = (self.ptr as usize, self.len, self.released.clone());
        Box::new(move || {
            for i in 0..len / 8 {
                // SAFETY: the buffer is still allocated; only atomics touch it.
                unsafe { (*((addr + i * 8) as *const AtomicU64)).store(POISON, Ordering::SeqCst) };
            }
            released.fetch_add(1, Ordering::SeqCst);
            // SAFETY: allocated in `Buffer::new` with this layout, freed once.
            unsafe { dealloc(addr as *mut u8, Layout::from_size_align(len, PAGE as usize).unwrap()) };
        })
    }

    fn releases(&self) -> usize {
        self.released.load(Ordering::SeqCst)
    }

    /// Maps the whole buffer with `prot` and the release callback.
    fn map(&self, mm: &AddressSpace, prot: i32) -> u64 {
        // SAFETY: the buffer stays allocated until the callback frees it.
        unsafe { mm.mmap_host(0, self.len as u64, prot, 0, self.ptr, Some(self.release())) }.unwrap()
    }
}

fn setup() -> (Arc<PhysMem>, Arc<AddressSpace>) {
    let phys = phys(4);
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    (phys, mm)
}

#[test]
fn guest_and_host_see_each_others_stores_at_once() {
    let (phys, mm) = setup();
    let buf = Buffer::new(2);
    let a = buf.map(&mm, RW);
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a + 8, 0x1122_3344).unwrap();
    assert_eq!(buf.word(1).load(Ordering::SeqCst), 0x1122_3344, "a guest store is in the buffer");
    // A host store after the guest cached the page: seen by the next load.
    buf.word(1).store(7, Ordering::SeqCst);
    assert_eq!(cpu.read_u64(a + 8).unwrap(), 7);
    buf.word(512 + 3).store(0xabc, Ordering::SeqCst);
    assert_eq!(cpu.read_u64(a + PAGE + 24).unwrap(), 0xabc, "the second page is the buffer's second page");
    assert_eq!(cpu.fetch_add_u64(a + PAGE + 24, 1).unwrap(), 0xabc);
    assert_eq!(buf.word(512 + 3).load(Ordering::SeqCst), 0xabd, "atomics work on it too");
    let mut bytes = [0u8; 16];
    cpu.read(a + 8, &mut bytes).unwrap();
    assert_eq!(bytes[..8], 7u64.to_le_bytes());
    // No frame, page table or anything else of the arena is used.
    assert_eq!(phys.stats().frames_used, 0);
    let m = mm.maps_text();
    assert!(m.contains("[host]"), "{m}");
    drop(cpu);
    mm.munmap(a, 2 * PAGE).unwrap();
    assert_eq!(buf.releases(), 1);
    drop(mm);
    assert_no_leaks(&phys);
}

#[test]
fn the_release_runs_once_after_the_last_mapping_goes() {
    let (phys, mm) = setup();
    let buf = Buffer::new(4);
    let a = buf.map(&mm, RW);
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a + 3 * PAGE, 42).unwrap();
    // Part of it goes; the rest still maps the buffer.
    mm.munmap(a, PAGE).unwrap();
    assert_eq!(cpu.read_u64(a), Err(Fault::Segv { addr: a, code: SegvCode::MapErr }));
    // mremap moves it (shrinking is allowed too) without a release.
    let b = mm.mremap(a + PAGE, 3 * PAGE, 2 * PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, a + 64 * PAGE).unwrap();
    assert_eq!(cpu.read_u64(a + PAGE), Err(Fault::Segv { addr: a + PAGE, code: SegvCode::MapErr }));
    buf.word(2 * 512).store(5, Ordering::SeqCst);
    assert_eq!(cpu.read_u64(b + PAGE).unwrap(), 5, "the moved mapping keeps its offset in the buffer");
    // Growing it is EFAULT (VM_PFNMAP, vma_to_resize), and changes nothing.
    assert_eq!(mm.mremap(b, 2 * PAGE, 4 * PAGE, MREMAP_MAYMOVE, 0), Err(Errno::Fault));
    // A fork shares it: the child's stores reach the buffer.
    let child = mm.fork().unwrap();
    let mut ccpu = Cpu::attached(&child);
    ccpu.write_u64(b, 9).unwrap();
    assert_eq!(buf.word(512).load(Ordering::SeqCst), 9);
    assert_eq!(cpu.read_u64(b).unwrap(), 9, "nothing is copy-on-write");
    drop(cpu);
    mm.munmap(b, 2 * PAGE).unwrap();
    assert_eq!(buf.releases(), 0, "the child still maps it");
    assert_eq!(ccpu.read_u64(b + PAGE).unwrap(), 5);
    drop(ccpu);
    drop(child);
    assert_eq!(buf.releases(), 1);
    drop(mm);
    assert_no_leaks(&phys);
}

#[test]
fn mprotect_narrows_cached_translations() {
    let (phys, mm) = setup();
    let buf = Buffer::new(1);
    let a = buf.map(&mm, RW);
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a, 1).unwrap();
    mm.mprotect(a, PAGE, PROT_READ).unwrap();
    assert_eq!(cpu.write_u64(a, 2), Err(Fault::Segv { addr: a, code: SegvCode::AccErr }));
    assert_eq!(cpu.read_u64(a).unwrap(), 1);
    let mut insn = [0u8; 4];
    assert_eq!(cpu.fetch(a, &mut insn), Err(Fault::Segv { addr: a, code: SegvCode::AccErr }));
    mm.mprotect(a, PAGE, PROT_NONE).unwrap();
    assert_eq!(cpu.read_u64(a), Err(Fault::Segv { addr: a, code: SegvCode::AccErr }));
    mm.mprotect(a, PAGE, PROT_READ | PROT_WRITE | PROT_EXEC).unwrap();
    cpu.write_u64(a, 3).unwrap();
    cpu.fetch(a, &mut insn).unwrap();
    assert_eq!(insn, [3, 0, 0, 0]);
    assert_eq!(buf.releases(), 0, "mprotect releases nothing");
    drop(cpu);
    drop(mm);
    assert_eq!(buf.releases(), 1, "the exit of the address space is the last unmap");
    assert_no_leaks(&phys);
}

#[test]
fn linux_refuses_what_it_refuses_for_vm_pfnmap() {
    let (phys, mm) = setup();
    let buf = Buffer::new(2);
    let a = buf.map(&mm, RW);
    assert_eq!(mm.madvise(a, PAGE, MADV_DONTNEED), Err(Errno::Inval));
    assert_eq!(mm.madvise(a, PAGE, MADV_POPULATE_READ), Err(Errno::Inval));
    assert_eq!(mm.pin_user_pages(a, 1, Foll::WRITE).err(), Some(Errno::Fault));
    let mut b = [0u8; 8];
    assert_eq!(mm.access_remote_read(a, &mut b, true), 0);
    // MAP_POPULATE-like populates skip it; mlock succeeds as Linux's does.
    mm.mlock(a, 2 * PAGE).unwrap();
    let m = mm.maps_text();
    assert!(m.lines().any(|l| l.contains("[host]") && l.contains("rw-s")), "{m}");
    assert_eq!(phys.stats().frames_used, 0, "nothing was faulted into the arena");
    drop(mm);
    assert_eq!(buf.releases(), 1);
    assert_no_leaks(&phys);
}

#[test]
fn bad_input_maps_nothing_and_drops_the_release_unrun() {
    let (phys, mm) = setup();
    let buf = Buffer::new(2);
    let ran = Arc::new(AtomicBool::new(false));
    let cb = |ran: &Arc<AtomicBool>| -> Option<Box<dyn FnOnce() + Send>> {
        let ran = ran.clone();
        Some(Box::new(move || ran.store(true, Ordering::SeqCst)))
    };
    let p = buf.ptr;
    // SAFETY: every call's memory is the buffer, which outlives the
    // address space (its release frees nothing).
    unsafe {
        assert_eq!(mm.mmap_host(0, PAGE, RW, 0, std::ptr::null_mut(), cb(&ran)), Err(Errno::Inval));
        assert_eq!(mm.mmap_host(0, PAGE, RW, 0, p.add(8), cb(&ran)), Err(Errno::Inval));
        assert_eq!(mm.mmap_host(0, 0, RW, 0, p, cb(&ran)), Err(Errno::Inval));
        assert_eq!(mm.mmap_host(0, PAGE + 1, RW, 0, p, cb(&ran)), Err(Errno::Inval));
        assert_eq!(mm.mmap_host(0, PAGE, RW, MAP_PRIVATE, p, cb(&ran)), Err(Errno::Inval));
        assert_eq!(mm.mmap_host(0, PAGE, RW, MAP_POPULATE, p, cb(&ran)), Err(Errno::Inval));
        assert_eq!(mm.mmap_host(12345, PAGE, RW, MAP_FIXED, p, cb(&ran)), Err(Errno::Inval));
        let a = mm.mmap_host(0, PAGE, RW, 0, p, None).unwrap();
        assert_eq!(mm.mmap_host(a, PAGE, RW, MAP_FIXED_NOREPLACE, p, cb(&ran)), Err(Errno::Exist));
        // MAP_FIXED over it replaces it, as mmap does.
        let b = mm.mmap_host(a, PAGE, PROT_READ, MAP_FIXED, p.add(PAGE as usize), cb(&ran)).unwrap();
        assert_eq!(a, b);
    }
    assert_eq!(mm.maps_text().matches("[host]").count(), 1);
    assert!(!ran.load(Ordering::SeqCst));
    drop(mm);
    assert!(ran.load(Ordering::SeqCst), "the mapping that was made releases");
    assert_no_leaks(&phys);
}

/// A `with_slice` callback that unmaps the very page keeps the memory:
/// the release waits for the callback.
#[test]
fn with_slice_holds_the_release_until_it_returns() {
    let (phys, mm) = setup();
    let buf = Buffer::new(1);
    let a = buf.map(&mm, RW);
    buf.word(0).store(77, Ordering::SeqCst);
    let mut cpu = Cpu::attached(&mm);
    let mm2 = mm.clone();
    let released = buf.released.clone();
    cpu.with_slice(a, 8, |_, bytes| {
        mm2.munmap(a, PAGE).unwrap();
        assert_eq!(released.load(Ordering::SeqCst), 0, "released under the callback");
        assert_eq!(bytes.get(0), 77);
    })
    .unwrap();
    // The callback only borrowed it: dropped here, or the address space
    // lives to the end of the test.
    drop(mm2);
    assert_eq!(buf.releases(), 1);
    assert_eq!(cpu.read_u64(a), Err(Fault::Segv { addr: a, code: SegvCode::MapErr }));
    drop(cpu);
    drop(mm);
    assert_no_leaks(&phys);
}

/// Readers on other threads read the buffer through cached translations
/// while it is unmapped; the release poisons it. No read may ever return
/// the poison: the release comes after the last shootdown.
#[test]
fn no_cpu_reads_the_memory_after_its_release() {
    const ROUNDS: usize = 200;
    const READERS: usize = 2;
    let (phys, mm) = setup();
    for _ in 0..ROUNDS {
        let buf = Buffer::new(1);
        buf.word(5).store(0x600d, Ordering::SeqCst);
        let a = buf.map(&mm, RW);
        let started = Arc::new(AtomicUsize::new(0));
        let readers: Vec<_> = (0..READERS)
            .map(|i| {
                let (mm, started) = (mm.clone(), started.clone());
                spawn(format!("reader-{i}"), move || {
                    let mut cpu = Cpu::attached(&mm);
                    let mut reads = 0u64;
                    loop {
                        match cpu.read_u64(a + 40) {
                            Ok(v) => {
                                assert_eq!(v, 0x600d, "read memory the embedder released");
                                reads += 1;
                                if reads == 1 {
                                    started.fetch_add(1, Ordering::SeqCst);
                                }
                            }
                            Err(f) => {
                                assert_eq!(f, Fault::Segv { addr: a + 40, code: SegvCode::MapErr });
                                return reads;
                            }
                        }
                    }
                })
            })
            .collect();
        while started.load(Ordering::SeqCst) < READERS {
            std::hint::spin_loop();
        }
        mm.munmap(a, PAGE).unwrap();
        assert_eq!(buf.releases(), 1);
        for r in readers {
            assert!(r.join().unwrap() > 0);
        }
    }
    drop(mm);
    assert_no_leaks(&phys);
}

/// The release callback that a `with_slice` runs (its hold was the last:
/// the callback unmapped the memory) runs after the slice's section ended,
/// so it may block on another thread's shootdown of a page this CPU
/// cached. Before, it ran inside that section, which the shootdown waited
/// for, while the section's thread waited for the shootdown's.
#[test]
fn a_release_run_by_with_slice_runs_outside_its_section() {
    softmm_testkit::common::watchdog("release-outside-section", 30, || {
        let (phys, mm) = setup();
        let anon = mm.mmap(0, PAGE, RW, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        cpu.write_u64(anon, 1).unwrap();
        let buf = Buffer::new(1);
        let free = buf.release();
        let blocking: Box<dyn FnOnce() + Send> = {
            let mm = mm.clone();
            Box::new(move || {
                // Another thread's munmap of the page the CPU cached: it
                // shoots the CPU down.
                let mm2 = mm.clone();
                std::thread::spawn(move || mm2.munmap(anon, PAGE).unwrap()).join().unwrap();
                free();
            })
        };
        // SAFETY: the buffer stays allocated until `free` frees it.
        let a = unsafe { mm.mmap_host(0, PAGE, RW, 0, buf.ptr, Some(blocking)) }.unwrap();
        let mm2 = mm.clone();
        cpu.with_slice(a, 8, |_, _| mm2.munmap(a, PAGE).unwrap()).unwrap();
        assert_eq!(buf.releases(), 1);
        assert!(cpu.read_u64(anon).is_err(), "the release's munmap ran");
        drop((cpu, mm, mm2));
        assert_no_leaks(&phys);
    });
}
