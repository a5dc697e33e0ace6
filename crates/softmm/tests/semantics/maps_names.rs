//! The `[heap]` and `[stack]` names of the maps dump: the same lines as the
//! host prints for its own heap and main stack, and Linux's bounds rules
//! (`vma_is_initial_heap` strict, `vma_is_initial_stack` inclusive).

use softmm::uapi::*;
use softmm::{AddressSpace, MmConfig, PhysConfig, PhysMem};

const PAGE: u64 = 4096;
const RW: i32 = PROT_READ | PROT_WRITE;
const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;

#[track_caller]
fn assert_no_leaks(phys: &PhysMem) {
    let s = phys.quiesce();
    assert_eq!((s.frames_used, s.page_tables, s.vmas, s.rmap_entries), (0, 0, 0, 0), "{s:?}");
}

/// The host's maps line that ends with `name`, and its range.
fn host_line(name: &str) -> Option<(String, u64, u64)> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let line = maps.lines().find(|l| l.ends_with(name))?.to_string();
    let range = line.split(' ').next().unwrap();
    let (s, e) = range.split_once('-').unwrap();
    Some((line.clone(), u64::from_str_radix(s, 16).unwrap(), u64::from_str_radix(e, 16).unwrap()))
}

/// Field `n` (1-based, as proc(5) numbers them) of /proc/self/stat.
fn host_stat(n: usize) -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // The command name (field 2) may hold spaces: count from after it.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    rest.split(' ').nth(n - 3).unwrap().parse().unwrap()
}

/// The host's own heap and main stack, rebuilt in softmm at the same
/// addresses with the same `start_brk`, break and `start_stack`, print the
/// same lines (anonymous memory: device and inode 0 on both sides).
#[test]
fn heap_and_stack_lines_match_the_hosts() {
    if host_line(" [heap]").is_none() {
        // SAFETY: moves the break up one page, which malloc tolerates (it
        // treats the break as shared and checks contiguity).
        unsafe { libc::sbrk(PAGE as libc::intptr_t) };
    }
    let (heap_line, heap_start, heap_end) = host_line(" [heap]").expect("the host process has a heap");
    // SAFETY: sbrk(0) only reads the break.
    let brk = unsafe { libc::sbrk(0) } as u64;
    let start_brk = host_stat(47);
    let (stack_line, stack_start, stack_end) = host_line(" [stack]").expect("the host process has a stack");
    let start_stack = host_stat(28);
    assert!(stack_start <= start_stack && start_stack <= stack_end);

    let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default().start_brk(start_brk)).unwrap();
    assert_eq!(mm.brk(brk), brk);
    mm.mmap(stack_start, stack_end - stack_start, RW, ANON | MAP_FIXED | MAP_GROWSDOWN, None, 0).unwrap();
    assert_eq!(mm.start_stack(), None);
    let text = mm.maps_text();
    assert!(!text.contains("[stack]"), "{text}");
    mm.set_start_stack(start_stack);
    assert_eq!(mm.start_stack(), Some(start_stack));
    let maps = mm.maps();
    let line = |start: u64| maps.iter().find(|e| e.start == start).map(|e| e.to_line()).unwrap();
    assert_eq!((maps[0].start, maps[0].end), (heap_start, heap_end), "host heap {heap_line}");
    assert_eq!(line(heap_start), heap_line);
    assert_eq!(line(stack_start), stack_line);
    drop((maps, mm));
    assert_no_leaks(&phys);
}

/// Linux's bounds: a VMA is the heap if it overlaps `[start_brk, brk)`
/// (so an empty heap names nothing), the stack if `start <= sp <= end`;
/// the heap check comes first, file mappings keep their names, a forked
/// child inherits the declaration, and the name follows whichever VMA
/// holds the address.
#[test]
fn names_follow_linuxs_bounds() {
    let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    let start_brk = 0x5555_0000_0000;
    let mm = AddressSpace::new(&phys, MmConfig::default().start_brk(start_brk)).unwrap();
    let names = |mm: &AddressSpace| mm.maps().into_iter().map(|e| (e.start, e.name)).collect::<Vec<_>>();
    // An empty heap, with anonymous VMAs touching its start on both sides.
    // (Read-only, so the heap does not merge into it.)
    mm.mmap(start_brk - PAGE, PAGE, PROT_READ, ANON | MAP_FIXED, None, 0).unwrap();
    mm.mmap(start_brk + 2 * PAGE, PAGE, PROT_READ, ANON | MAP_FIXED, None, 0).unwrap();
    assert_eq!(names(&mm), [(start_brk - PAGE, String::new()), (start_brk + 2 * PAGE, String::new())]);
    assert_eq!(mm.brk(start_brk + 10), start_brk + 10);
    assert_eq!(
        names(&mm),
        [(start_brk - PAGE, String::new()), (start_brk, "[heap]".to_string()), (start_brk + 2 * PAGE, String::new())]
    );
    // The stack: an end equal to the address counts, a start just above it not.
    let top = 0x7000_0000_0000;
    mm.mmap(top - 4 * PAGE, 4 * PAGE, RW, ANON | MAP_FIXED, None, 0).unwrap();
    mm.mmap(top + PAGE, PAGE, RW, ANON | MAP_FIXED, None, 0).unwrap();
    mm.set_start_stack(top);
    let child = mm.fork().unwrap();
    for m in [&mm, &child] {
        let n = names(m);
        assert!(n.contains(&(top - 4 * PAGE, "[stack]".to_string())), "{n:?}");
        assert!(n.contains(&(top + PAGE, String::new())), "{n:?}");
    }
    mm.set_start_stack(top + PAGE);
    assert!(names(&mm).contains(&(top + PAGE, "[stack]".to_string())));
    assert!(names(&mm).contains(&(top - 4 * PAGE, String::new())));
    assert!(names(&child).contains(&(top - 4 * PAGE, "[stack]".to_string())), "the child keeps its own");
    // Heap first: a declared stack inside the heap is still `[heap]`.
    mm.set_start_stack(start_brk);
    assert_eq!(names(&mm)[1], (start_brk, "[heap]".to_string()));
    // A shared anonymous mapping is named by its file, even as the stack.
    let shm = mm.mmap(0, PAGE, RW, MAP_SHARED | MAP_ANONYMOUS, None, 0).unwrap();
    mm.set_start_stack(shm);
    assert!(names(&mm).contains(&(shm, "/dev/zero (deleted)".to_string())));
    drop((mm, child));
    assert_no_leaks(&phys);
}
