//! `get_mempolicy` against the host kernel (one node here, as the arena):
//! the same layout and policies on both sides, then every flag, mask size
//! and address case, comparing the returned mode or node, the errno, and
//! every word written into the mask (and left alone after it).

use softmm::uapi::*;
use softmm::*;

const PAGE: u64 = PAGE_SIZE;
/// The host's mask buffers: words past what a call may write keep it.
const POISON: u64 = 0xdead_beef_dead_beef;
/// Mask buffers long enough for a page of bits and more.
const WORDS: usize = 600;

/// One call's result: the mode or node, or the errno; and the mask buffer.
type Outcome = (std::result::Result<i32, i32>, Vec<u64>);

/// The host's `get_mempolicy` with a mask buffer of `words` words (`None`:
/// NULL), placed to end where `short` says: right before an inaccessible
/// page when `short`, so that a longer copy faults.
struct Host {
    /// Two pages: the second `PROT_NONE`.
    guard: *mut u64,
}

impl Host {
    fn new() -> Host {
        let p = host_anon(2);
        // SAFETY: the second page of the test's own fresh mapping.
        assert_eq!(unsafe { libc::mprotect(p.add(PAGE as usize).cast(), PAGE as usize, libc::PROT_NONE) }, 0);
        Host { guard: p.cast() }
    }

    fn call(&self, mask: Option<usize>, maxnode: u64, addr: u64, flags: u32) -> Outcome {
        let mut words = vec![POISON; WORDS];
        let mut mode: i32 = -1;
        let r = match mask {
            None => {
                // SAFETY: the mode is written to a local; no mask.
                unsafe {
                    libc::syscall(libc::SYS_get_mempolicy, &mut mode, std::ptr::null_mut::<u64>(), maxnode, addr, flags)
                }
            }
            Some(n) if n < WORDS => {
                // `n` words right before the inaccessible page.
                // SAFETY: inside the first page of the test's mapping; the
                // kernel faults (EFAULT) on the second page, never writes it.
                let buf = unsafe { self.guard.add(PAGE as usize / 8 - n) };
                for i in 0..n {
                    // SAFETY: as above.
                    unsafe { buf.add(i).write(POISON) };
                }
                // SAFETY: as above; the mode is written to a local.
                let r = unsafe { libc::syscall(libc::SYS_get_mempolicy, &mut mode, buf, maxnode, addr, flags) };
                for (i, w) in words.iter_mut().take(n).enumerate() {
                    // SAFETY: as above.
                    *w = unsafe { buf.add(i).read() };
                }
                r
            }
            Some(_) => {
                // SAFETY: `WORDS` words, a page of bits and more.
                unsafe { libc::syscall(libc::SYS_get_mempolicy, &mut mode, words.as_mut_ptr(), maxnode, addr, flags) }
            }
        };
        let r = if r < 0 { Err(std::io::Error::last_os_error().raw_os_error().unwrap()) } else { Ok(mode) };
        (r, words)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // SAFETY: the test's own mapping; and this thread's policy back to the default.
        unsafe {
            libc::munmap(self.guard.cast(), 2 * PAGE as usize);
            libc::syscall(libc::SYS_set_mempolicy, MPOL_DEFAULT, std::ptr::null::<u64>(), 0u64);
        }
    }
}

/// A fresh private anonymous read-write mapping of `pages` pages on the
/// host, which the test owns.
fn host_anon(pages: u64) -> *mut u8 {
    // SAFETY: a new mapping; nothing else is touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            (pages * PAGE) as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p.cast()
}

fn soft(mm: &AddressSpace, mask: Option<usize>, maxnode: u64, addr: u64, flags: u32) -> Outcome {
    let mut words = vec![POISON; WORDS];
    let r = match mask {
        None => mm.get_mempolicy(None, maxnode, addr, flags),
        Some(n) => mm.get_mempolicy(Some(&mut words[..n.min(WORDS)]), maxnode, addr, flags),
    };
    (r.map_err(|e| e.code()), words)
}

#[test]
fn get_mempolicy_matches_the_host() {
    let phys = PhysMem::new(PhysConfig::new(16 << 20)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let host = Host::new();
    // Four pages at the same address on both sides: the first written, the
    // third a hole, the fourth PROT_NONE.
    let p = host_anon(4);
    // SAFETY: pages of the test's own fresh mapping.
    let base = unsafe {
        libc::munmap(p.add(2 * PAGE as usize).cast(), PAGE as usize);
        libc::mprotect(p.add(3 * PAGE as usize).cast(), PAGE as usize, libc::PROT_NONE);
        *(p as *mut u64) = 1;
        p as u64
    };
    mm.mmap(base, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, None, 0).unwrap();
    mm.munmap(base + 2 * PAGE, PAGE).unwrap();
    mm.mprotect(base + 3 * PAGE, PAGE, PROT_NONE).unwrap();
    Cpu::attached(&mm).write_u64(base, 1).unwrap();

    let node = MPOL_F_NODE;
    let addr = MPOL_F_ADDR;
    // (what, mask words or NULL, maxnode, address, flags)
    let calls: &[(&str, Option<usize>, u64, u64, u32)] = &[
        ("mode only", None, 0, 0, 0),
        ("mask of 1 bit", Some(WORDS), 2, 0, 0),
        ("maxnode 0 with a mask", Some(WORDS), 0, 0, 0),
        ("maxnode 1: no bit", Some(WORDS), 1, 0, 0),
        ("one word", Some(WORDS), 65, 0, 0),
        ("two words, the second cleared", Some(WORDS), 66, 0, 0),
        ("a page of bits", Some(WORDS), 8 * PAGE + 1, 0, 0),
        ("more than a page of bits", Some(WORDS), 8 * PAGE + 2, 0, 0),
        ("huge maxnode", Some(WORDS), 1 << 40, 0, 0),
        ("wrapping maxnode", Some(WORDS), u64::MAX, 0, 0),
        ("a mask shorter than maxnode", Some(1), 129, 0, 0),
        ("a mask as long as maxnode", Some(2), 129, 0, 0),
        ("unknown flag", None, 0, 0, 8),
        ("mems allowed", Some(WORDS), 65, 0, MPOL_F_MEMS_ALLOWED),
        ("mems allowed with node", Some(WORDS), 65, 0, MPOL_F_MEMS_ALLOWED | node),
        ("mems allowed with addr", Some(WORDS), 65, base, MPOL_F_MEMS_ALLOWED | addr),
        ("an address without MPOL_F_ADDR", None, 0, base, 0),
        ("addr: written page", Some(WORDS), 65, base, addr),
        ("addr: inside the page", Some(WORDS), 65, base + 100, addr),
        ("addr: the hole", Some(WORDS), 65, base + 2 * PAGE, addr),
        ("addr: PROT_NONE", Some(WORDS), 65, base + 3 * PAGE, addr),
        ("node alone", None, 0, 0, node),
        ("node of the written page", None, 0, base, node | addr),
        ("node of an untouched page", None, 0, base + PAGE, node | addr),
        ("node of the hole", None, 0, base + 2 * PAGE, node | addr),
        ("node of PROT_NONE", None, 0, base + 3 * PAGE, node | addr),
    ];
    let compare = |stage: &str| {
        for &(what, mask, maxnode, a, flags) in calls {
            let want = host.call(mask, maxnode, a, flags);
            let got = soft(&mm, mask, maxnode, a, flags);
            assert_eq!(got.0, want.0, "{stage}, {what}: softmm {:?}, host {:?}", got.0, want.0);
            assert_eq!(got.1[..8], want.1[..8], "{stage}, {what}: mask words");
            assert_eq!(got.1, want.1, "{stage}, {what}: mask words past the eighth");
        }
    };
    compare("default policies");

    // (stage, set_mempolicy mode and mask, mbind of the first page's mode and mask)
    type Stage = (&'static str, i32, &'static [u64], i32, &'static [u64]);
    let stages: &[Stage] = &[
        ("interleave, bind", MPOL_INTERLEAVE, &[1], MPOL_BIND, &[1]),
        ("preferred empty (local), static bind", MPOL_PREFERRED, &[], MPOL_BIND | MPOL_F_STATIC_NODES, &[0b101]),
        ("relative bind, preferred", MPOL_BIND | MPOL_F_RELATIVE_NODES, &[0b10], MPOL_PREFERRED, &[1]),
        ("weighted interleave, local", MPOL_WEIGHTED_INTERLEAVE, &[1], MPOL_LOCAL, &[]),
    ];
    for &(stage, mode, mask, vma_mode, vma_mask) in stages {
        let maxnode = if mask.is_empty() { 0 } else { 64 };
        let vma_maxnode = if vma_mask.is_empty() { 0 } else { 64 };
        let ptr = |m: &[u64]| if m.is_empty() { std::ptr::null() } else { m.as_ptr() };
        // SAFETY: this thread's policy (reset when `host` drops) and the
        // test's own mapping's.
        unsafe {
            assert_eq!(libc::syscall(libc::SYS_set_mempolicy, mode, ptr(mask), maxnode), 0, "{stage}");
            let r = libc::syscall(libc::SYS_mbind, base, PAGE, vma_mode, ptr(vma_mask), vma_maxnode, 0u32);
            assert_eq!(r, 0, "{stage}");
        }
        let opt = |m: &'static [u64]| (!m.is_empty()).then_some(m);
        mm.set_mempolicy(mode, opt(mask), maxnode).unwrap();
        mm.mbind(base, PAGE, vma_mode, opt(vma_mask), vma_maxnode, 0).unwrap();
        compare(stage);
    }
    // SAFETY: the test's own mapping (the hole may be another thread's by now).
    unsafe {
        libc::munmap(base as *mut libc::c_void, 2 * PAGE as usize);
        libc::munmap((base + 3 * PAGE) as *mut libc::c_void, PAGE as usize);
    }
}
