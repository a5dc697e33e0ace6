//! Edge cases of `brk` and `madvise` run on the host kernel and
//! on softmm and compared: a heap grown from empty next to a mapping that
//! ends at `start_brk`, `MADV_POPULATE_READ`/`WRITE` of device memory,
//! `MADV_MERGEABLE` on a droppable mapping.

use std::sync::Arc;

use softmm::uapi::*;
use softmm::{AddressSpace, Errno, MmConfig, MmioDevice, PhysConfig, PhysMem};

const P: u64 = 4096;

/// Maps lines as (start, end) in pages from the heap's start, and perms.
type Lines = Vec<(i64, i64, String)>;

/// `mm->start_brk`, field 47 of `/proc/self/stat`.
fn host_start_brk() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    // Field 3 is the first after the command.
    after.split(' ').nth(47 - 3).unwrap().parse().unwrap()
}

/// The maps lines around `sb`, as (start, end) in pages from `sb` and perms.
fn lines_near(text: &str, sb: u64) -> Lines {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (s, e) = f.next()?.split_once('-')?;
            let (s, e) = (u64::from_str_radix(s, 16).ok()?, u64::from_str_radix(e, 16).ok()?);
            let perms = f.next()?.to_string();
            (e > sb - 8 * P && s < sb + 8 * P)
                .then(|| ((s as i64 - sb as i64) / P as i64, (e as i64 - sb as i64) / P as i64, perms))
        })
        .collect()
}

/// The steps, relative to the start of the heap `sb`: the heap emptied,
/// a read-write anonymous page mapped right below `sb`, then the heap
/// grown by one page and by two more. Results relative to `sb`.
fn brk_on_host(sb: u64) -> Option<(Vec<i64>, Lines)> {
    const TEXT: usize = 1 << 20;
    // SAFETY: a fresh shared mapping of this test's own.
    let shared = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            TEXT + 64,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    } as *mut u8;
    assert!(shared as *mut libc::c_void != libc::MAP_FAILED);
    // SAFETY: the child makes raw system calls only (its heap is gone
    // after the first brk) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: the child's own address space.
        unsafe {
            let res = shared.cast::<i64>();
            let rel = |v: i64| v - sb as i64;
            res.write(rel(libc::syscall(libc::SYS_brk, sb)));
            let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE;
            let m = libc::mmap((sb - P) as *mut _, P as usize, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0);
            res.add(1).write(if m == libc::MAP_FAILED { i64::MIN } else { rel(m as i64) });
            res.add(2).write(rel(libc::syscall(libc::SYS_brk, sb + P)));
            res.add(3).write(rel(libc::syscall(libc::SYS_brk, sb + 3 * P)));
            softmm_testkit::common::read_raw_nul(c"/proc/self/maps", shared.add(64), TEXT);
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "host child failed: {status:#x}");
    // SAFETY: the child wrote four results and a NUL-terminated text.
    let (res, text) = unsafe {
        let r = shared.cast::<i64>();
        let res: Vec<i64> = (0..4).map(|i| r.add(i).read()).collect();
        (res, std::ffi::CStr::from_ptr(shared.add(64).cast()).to_string_lossy().into_owned())
    };
    // SAFETY: our own mapping.
    unsafe { libc::munmap(shared.cast(), TEXT + 64) };
    if res[1] == i64::MIN {
        eprintln!("SKIP: the page below the host's start_brk is mapped (no heap randomization?)");
        return None;
    }
    Some((res, lines_near(&text, sb)))
}

fn brk_on_softmm() -> (Vec<i64>, Lines) {
    let phys = PhysMem::new(PhysConfig::new(16 << 20)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let sb = mm.config().start_brk;
    let rel = |v: u64| v as i64 - sb as i64;
    let mut res = vec![rel(mm.brk(sb))];
    let m = mm.mmap(sb - P, P, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, None, 0);
    res.push(m.map_or(i64::MIN, rel));
    res.push(rel(mm.brk(sb + P)));
    res.push(rel(mm.brk(sb + 3 * P)));
    let text: String = mm.maps().iter().map(|e| format!("{}\n", e.to_line())).collect();
    (res, lines_near(&text, sb))
}

/// Linux's `brk` grows the heap by expanding only the VMA that
/// `vma_prev_limit(&vmi, mm->start_brk)` finds (one reaching `start_brk`
/// or above); a new heap VMA is never merged with anything. So a heap
/// started next to a compatible mapping that ends at `start_brk` stays a
/// VMA of its own.
#[test]
fn a_heap_grown_from_empty_does_not_merge_with_the_mapping_below_start_brk() {
    let Some(host) = brk_on_host(host_start_brk()) else { return };
    let mine = brk_on_softmm();
    eprintln!("host   {host:?}\nsoftmm {mine:?}");
    assert_eq!(mine, host, "softmm (left) differs from the host (right)");
}

struct Regs;
impl MmioDevice for Regs {
    fn read(&self, _offset: u64, _size: usize) -> u64 {
        0
    }
    fn write(&self, _offset: u64, _size: usize, _value: u64) {}
}

/// `MADV_POPULATE_READ`/`WRITE` of a `VM_IO | VM_PFNMAP` mapping: Linux's
/// `__get_user_pages` with `FOLL_MADV_POPULATE` answers any refusal of
/// `check_vma_flags` with `EINVAL` (mm/gup.c), device memory included.
/// On the host, the `[vvar]` mapping is such a mapping (`pf io` in smaps).
#[test]
fn populating_device_memory_is_einval_as_on_the_host() {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut vvar = None;
    let mut lines = smaps.lines();
    while let Some(l) = lines.next() {
        if l.ends_with("[vvar]") {
            let start = u64::from_str_radix(l.split('-').next().unwrap(), 16).unwrap();
            let flags = lines.by_ref().find(|l| l.starts_with("VmFlags:")).unwrap().to_string();
            vvar = Some((start, flags));
            break;
        }
    }
    let Some((vvar, flags)) = vvar else {
        eprintln!("SKIP: no [vvar] mapping on the host");
        return;
    };
    assert!(flags.contains(" pf") && flags.contains(" io"), "[vvar] is not VM_PFNMAP | VM_IO here: {flags}");
    let host: Vec<i32> = [MADV_POPULATE_READ, MADV_POPULATE_WRITE]
        .iter()
        .map(|&adv| {
            // SAFETY: populate advice on a mapping of this process's own,
            // refused before it touches anything.
            let r = unsafe { libc::madvise(vvar as *mut _, P as usize, adv) };
            if r == 0 {
                0
            } else {
                std::io::Error::last_os_error().raw_os_error().unwrap()
            }
        })
        .collect();
    let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let io = mm.mmap_io(0, 2 * P, PROT_READ | PROT_WRITE, MAP_SHARED, Arc::new(Regs)).unwrap();
    let mine: Vec<i32> = [MADV_POPULATE_READ, MADV_POPULATE_WRITE]
        .iter()
        .map(|&adv| mm.madvise(io, P, adv).map_or_else(|e: Errno| e.code(), |()| 0))
        .collect();
    assert_eq!(mine, host, "softmm (left) and the host (right): errnos of POPULATE_READ, POPULATE_WRITE");
}

/// `MADV_MERGEABLE` on part of a `MAP_DROPPABLE` mapping: Linux's
/// `ksm_madvise` ignores the advice for a VMA `vma_ksm_compatible` refuses
/// (`VM_DROPPABLE` and `VM_HUGETLB` among them, mm/ksm.c), so nothing is
/// split; the maps lines of the range, as (start, end) pages and perms.
#[test]
fn mergeable_advice_on_a_droppable_mapping_is_ignored_as_on_the_host() {
    const DROPPABLE: i32 = 0x08;
    let rw = PROT_READ | PROT_WRITE;
    let lines = |v: Vec<(u64, u64, String)>, base: u64| -> Vec<(u64, u64, String)> {
        v.into_iter()
            .filter(|(s, e, _)| *s >= base && *e <= base + 8 * P)
            .map(|(s, e, p)| ((s - base) / P, (e - base) / P, p))
            .collect()
    };
    // SAFETY: a fresh mapping of this test's own, replaced in place.
    let host = unsafe {
        let base =
            libc::mmap(std::ptr::null_mut(), (8 * P) as usize, libc::PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        assert_ne!(base, libc::MAP_FAILED);
        let d = libc::mmap(base, (4 * P) as usize, rw, DROPPABLE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if d == libc::MAP_FAILED {
            eprintln!("SKIP: the host has no MAP_DROPPABLE");
            libc::munmap(base, (8 * P) as usize);
            return;
        }
        let r = libc::madvise(base.cast::<u8>().add(P as usize).cast(), P as usize, MADV_MERGEABLE);
        let text = std::fs::read_to_string("/proc/self/maps").unwrap();
        libc::munmap(base, (8 * P) as usize);
        let base = base as u64;
        let v = text
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let (s, e) = f.next()?.split_once('-')?;
                Some((u64::from_str_radix(s, 16).ok()?, u64::from_str_radix(e, 16).ok()?, f.next()?.to_string()))
            })
            .collect();
        (r, lines(v, base))
    };
    let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let base = mm.mmap(0, 8 * P, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    mm.mmap(base, 4 * P, rw, DROPPABLE | MAP_ANONYMOUS | MAP_FIXED, None, 0).unwrap();
    let r = mm.madvise(base + P, P, MADV_MERGEABLE).map_or_else(|e| -e.code(), |()| 0);
    let v = mm.maps().into_iter().map(|e| (e.start, e.end, e.perms)).collect();
    let mine = (r, lines(v, base));
    assert_eq!(mine, host, "softmm (left) and the host (right): result and maps lines");
}
