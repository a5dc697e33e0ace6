//! Instruction fetches (`Access::Execute`): x86-64's NX rules, checked
//! against the host kernel where a fetch can be run (a forked child jumps
//! into a mapped page), and the software TLB's execute bit.

use softmm::uapi::*;
use softmm::{Access, AddressSpace, Cpu, Fault, FaultPolicy, File, MmConfig, OpenFile, PhysConfig, PhysMem, SegvCode};

const PAGE: u64 = 4096;
const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;
const PROTS: [i32; 8] = [
    PROT_NONE,
    PROT_READ,
    PROT_WRITE,
    PROT_EXEC,
    PROT_READ | PROT_WRITE,
    PROT_READ | PROT_EXEC,
    PROT_WRITE | PROT_EXEC,
    PROT_READ | PROT_WRITE | PROT_EXEC,
];

#[track_caller]
fn assert_no_leaks(phys: &PhysMem) {
    let s = phys.quiesce();
    assert_eq!((s.frames_used, s.page_tables, s.vmas, s.rmap_entries), (0, 0, 0, 0), "{s:?}");
}

fn segv(addr: u64, code: SegvCode) -> Result<(), Fault> {
    Err(Fault::Segv { addr, code })
}

/// What the host does when a forked child jumps to a page holding `ret`
/// (0xc3) that was then `mprotect`ed to `prot`: `Ok(())` if the call
/// returns, else the SIGSEGV's `si_code`, and whether the page is resident
/// after the fault (`mincore` in the signal handler), as `(code, resident)`.
#[cfg(target_arch = "x86_64")]
fn host_fetch(prot: i32, touch_first: bool) -> Result<(), (i32, bool)> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static PAGE_ADDR: AtomicUsize = AtomicUsize::new(0);

    extern "C" fn on_segv(_: i32, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
        let mut vec = [0u8; 1];
        let page = PAGE_ADDR.load(Ordering::Relaxed) as *mut libc::c_void;
        // SAFETY: the kernel passes a valid siginfo; mincore writes one byte
        // into `vec`; _exit is async-signal-safe.
        unsafe {
            if (*info).si_addr() != page {
                // The fetch worked; the instruction it fetched faulted.
                libc::_exit(1);
            }
            let code = (*info).si_code;
            libc::mincore(page, PAGE as usize, vec.as_mut_ptr());
            libc::_exit(100 + code * 2 + i32::from(vec[0] & 1));
        }
    }

    // SAFETY: a fresh private anonymous page; the child only calls into it
    // and async-signal-safe functions; the parent unmaps it after the wait.
    unsafe {
        let p = libc::mmap(std::ptr::null_mut(), PAGE as usize, PROT_READ | PROT_WRITE, ANON, -1, 0);
        assert_ne!(p, libc::MAP_FAILED);
        if touch_first {
            *(p as *mut u8) = 0xc3;
        } else {
            // Leave the page not present: drop what a test before us wrote.
            libc::madvise(p, PAGE as usize, libc::MADV_DONTNEED);
        }
        assert_eq!(libc::mprotect(p, PAGE as usize, prot), 0);
        let pid = libc::fork();
        if pid == 0 {
            PAGE_ADDR.store(p as usize, Ordering::Relaxed);
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_segv as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut());
            libc::sigaction(libc::SIGILL, &sa, std::ptr::null_mut());
            let f: extern "C" fn() = std::mem::transmute(p);
            f();
            libc::_exit(0);
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        libc::munmap(p, PAGE as usize);
        assert!(libc::WIFEXITED(status), "child status {status:#x}");
        match libc::WEXITSTATUS(status) {
            0 | 1 => Ok(()),
            s => Err(((s - 100) / 2, (s - 100) % 2 == 1)),
        }
    }
}

/// Every protection, on a page written then protected (the `ret` is there)
/// and on a never-touched one: softmm's fetch agrees with the host's, the
/// fault code and whether the page ends up mapped included.
#[cfg(target_arch = "x86_64")]
#[test]
fn fetch_permissions_match_the_host() {
    for &policy in FaultPolicy::ALL {
        let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
        let mm = AddressSpace::new(&phys, MmConfig::default().policy(policy)).unwrap();
        let mut cpu = Cpu::attached(&mm);
        for prot in PROTS {
            for touch_first in [true, false] {
                let a = mm.mmap(0, PAGE, PROT_READ | PROT_WRITE, ANON, None, 0).unwrap();
                if touch_first {
                    cpu.write_u8(a, 0xc3).unwrap();
                }
                mm.mprotect(a, PAGE, prot).unwrap();
                let mut insn = [0];
                let soft = match cpu.fetch(a, &mut insn) {
                    Ok(()) => Ok(()),
                    Err(Fault::Segv { addr, code }) => {
                        assert_eq!(addr, a);
                        let mut vec = [0];
                        mm.mincore(a, PAGE, &mut vec).unwrap();
                        Err((code.code(), vec[0] & 1 == 1))
                    }
                    Err(f) => panic!("{f:?}"),
                };
                // A never-touched executable page holds zeros, which the
                // host's CPU decodes as `add [rax], al` and may fault on
                // elsewhere: the host side tells a fault at the page itself
                // (the fetch) from one after it.
                let host = host_fetch(prot, touch_first);
                assert_eq!(soft, host, "{policy:?} prot {prot:#x} touched {touch_first}");
                mm.munmap(a, PAGE).unwrap();
            }
        }
        drop((cpu, mm));
        assert_no_leaks(&phys);
    }
}

/// The documented x86-64 table, on any host: everything mapped reads,
/// `PROT_WRITE` writes, `PROT_EXEC` executes.
#[test]
fn permissions_follow_the_x86_64_table() {
    let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let mut cpu = Cpu::attached(&mm);
    for prot in PROTS {
        let a = mm.mmap(0, PAGE, prot, ANON, None, 0).unwrap();
        let acc = |allowed: bool| if allowed { Ok(()) } else { segv(a, SegvCode::AccErr) };
        let mut b = [0];
        assert_eq!(cpu.read(a, &mut b), acc(prot != PROT_NONE), "read {prot:#x}");
        assert_eq!(cpu.fetch(a, &mut b), acc(prot & PROT_EXEC != 0), "fetch {prot:#x}");
        assert_eq!(cpu.write(a, &[1]), acc(prot & PROT_WRITE != 0), "write {prot:#x}");
        // Once more through the filled TLB entry.
        assert_eq!(cpu.fetch(a, &mut b), acc(prot & PROT_EXEC != 0), "fetch again {prot:#x}");
        assert_eq!(mm.handle_fault(a, Access::Execute), acc(prot & PROT_EXEC != 0), "handle_fault {prot:#x}");
        mm.munmap(a, PAGE).unwrap();
        assert_eq!(cpu.fetch(a, &mut b), segv(a, SegvCode::MapErr), "unmapped");
    }
    drop((cpu, mm));
    assert_no_leaks(&phys);
}

/// The TLB keeps execute apart from read, and `mprotect` adding or removing
/// `PROT_EXEC` reaches a translation this CPU already holds.
#[test]
fn mprotect_exec_reaches_a_cached_translation() {
    let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let mut cpu = Cpu::attached(&mm);
    let a = mm.mmap(0, PAGE, PROT_READ | PROT_WRITE, ANON, None, 0).unwrap();
    cpu.write_u32(a, 0x9090_90c3).unwrap();
    assert_eq!(cpu.read_u32(a), Ok(0x9090_90c3));
    assert_eq!(cpu.fetch_u32(a), Err(Fault::Segv { addr: a, code: SegvCode::AccErr }));
    mm.mprotect(a, PAGE, PROT_READ | PROT_EXEC).unwrap();
    assert_eq!(cpu.fetch_u32(a), Ok(0x9090_90c3));
    // The entry is in this CPU's TLB now; taking exec away must flush it.
    mm.mprotect(a, PAGE, PROT_READ).unwrap();
    assert_eq!(cpu.fetch_u32(a), Err(Fault::Segv { addr: a, code: SegvCode::AccErr }));
    assert_eq!(cpu.read_u32(a), Ok(0x9090_90c3));
    // A fetch crossing from an executable page into a non-executable one
    // faults at the first byte of the second page.
    let b = mm.mmap(0, 2 * PAGE, PROT_READ | PROT_EXEC, ANON, None, 0).unwrap();
    mm.mprotect(b + PAGE, PAGE, PROT_READ).unwrap();
    let mut buf = [0; 8];
    assert_eq!(cpu.fetch(b + PAGE - 4, &mut buf), Err(Fault::Segv { addr: b + PAGE, code: SegvCode::AccErr }));
    drop((cpu, mm));
    assert_no_leaks(&phys);
}

/// Entries made by every fault kind carry NX as their VMA says: file
/// fault-around, a private file COW, an anonymous COW after fork, and the
/// child's copies.
#[test]
fn every_fault_kind_sets_nx_from_the_vma() {
    let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    let f = File::create(&phys, "text", 16 * PAGE).unwrap();
    f.write_at(0, &[0xc3; 16 * PAGE as usize]).unwrap();
    let of = OpenFile::read_only(&f);
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let mut cpu = Cpu::attached(&mm);
    // 64 KiB aligned, so that the fault-around window (16 pages) of the
    // first page covers the second.
    let (data, text) = (0x1000_0000, 0x1010_0000);
    mm.mmap(data, 16 * PAGE, PROT_READ, MAP_PRIVATE | MAP_FIXED, Some(&of), 0).unwrap();
    mm.mmap(text, 16 * PAGE, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED, Some(&of), 0).unwrap();
    // One read fault maps the neighbours by fault-around; their entries must
    // be NX for `data` and executable for `text`.
    cpu.read_u8(data).unwrap();
    cpu.read_u8(text).unwrap();
    let misses = cpu.stats().fault.faults;
    assert_eq!(cpu.fetch_u32(data + PAGE), Err(Fault::Segv { addr: data + PAGE, code: SegvCode::AccErr }));
    assert_eq!(cpu.fetch_u32(text + PAGE), Ok(0xc3c3_c3c3));
    assert_eq!(cpu.stats().fault.faults, misses, "fault-around mapped both pages");

    // Private COW of a file page, in an executable and a writable-only mapping.
    let wx = mm.mmap(0, PAGE, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE, Some(&OpenFile::read_write(&f)), 0);
    let wx = wx.unwrap();
    cpu.read_u8(wx).unwrap();
    cpu.write_u8(wx, 0x90).unwrap();
    assert_eq!(cpu.fetch_u32(wx), Ok(0xc3c3_c390));

    // Anonymous COW after fork, on both sides.
    let rw = mm.mmap(0, PAGE, PROT_READ | PROT_WRITE, ANON, None, 0).unwrap();
    let rwx = mm.mmap(0, PAGE, PROT_READ | PROT_WRITE | PROT_EXEC, ANON, None, 0).unwrap();
    cpu.write_u8(rw, 0xc3).unwrap();
    cpu.write_u8(rwx, 0xc3).unwrap();
    let child = mm.fork().unwrap();
    let mut ccpu = Cpu::attached(&child);
    for c in [&mut cpu, &mut ccpu] {
        assert_eq!(c.fetch_u32(rw), Err(Fault::Segv { addr: rw, code: SegvCode::AccErr }));
        assert_eq!(c.fetch_u32(rwx), Ok(0xc3));
        c.write_u8(rw + 1, 1).unwrap();
        c.write_u8(rwx + 1, 1).unwrap();
        assert_eq!(c.fetch_u32(rw), Err(Fault::Segv { addr: rw, code: SegvCode::AccErr }));
        assert_eq!(c.fetch_u32(rwx), Ok(0x01c3));
    }
    drop((cpu, ccpu, mm, child, of, f));
    assert_no_leaks(&phys);
}
