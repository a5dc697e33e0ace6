use super::*;
use crate::phys::{Pfn, PhysConfig, PhysMem};
use crate::sync::Ordering;
use crate::uapi::*;
use crate::{Cpu, MmConfig, PAGE_SIZE};

/// The family, index and frame of the anonymous page at `addr` of `mm`.
fn page_of(mm: &AddressSpace, addr: u64) -> (Arc<AnonFamily>, u64, Pfn) {
    let st = mm.read_lock();
    let v = st.vmas.find(addr).unwrap();
    let family = v.anon_vma.get().unwrap().family.clone();
    let pfn = mm.pte_at(addr).pfn();
    (family, mm.phys.desc(pfn).index.load(Ordering::Relaxed), pfn)
}

fn sorted(v: Vec<(Arc<AddressSpace>, u64)>) -> Vec<(usize, u64)> {
    let mut v: Vec<(usize, u64)> = v.into_iter().map(|(m, a)| (Arc::as_ptr(&m) as usize, a)).collect();
    v.sort();
    v
}

#[test]
fn finds_every_mapping_through_fork_and_mremap() {
    let phys = PhysMem::new(PhysConfig::new(8 << 20)).unwrap();
    let parent = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let a = parent.mmap(0, 4 * PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    Cpu::attached(&parent).write_u64(a + PAGE_SIZE, 7).unwrap();
    let (family, index, pfn) = page_of(&parent, a + PAGE_SIZE);
    assert_eq!(sorted(anon_mappings(&family, index, pfn)), sorted(vec![(parent.clone(), a + PAGE_SIZE)]));
    // Two children share the page copy-on-write; a grandchild too.
    let c1 = parent.fork().unwrap();
    let c2 = parent.fork().unwrap();
    let g = c1.fork().unwrap();
    // c2 moves the page elsewhere with mremap (MAYMOVE to a new place).
    let b = c2.mmap(0, 8 * PAGE_SIZE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    let moved = c2.mremap(a, 4 * PAGE_SIZE, 4 * PAGE_SIZE, MREMAP_MAYMOVE | MREMAP_FIXED, b + 2 * PAGE_SIZE).unwrap();
    assert_eq!(moved, b + 2 * PAGE_SIZE);
    let want = vec![
        (parent.clone(), a + PAGE_SIZE),
        (c1.clone(), a + PAGE_SIZE),
        (c2.clone(), moved + PAGE_SIZE),
        (g.clone(), a + PAGE_SIZE),
    ];
    assert_eq!(sorted(anon_mappings(&family, index, pfn)), sorted(want));
    // c1 writes: its COW copy is a new frame; the old one is no longer mapped there.
    Cpu::attached(&c1).write_u64(a + PAGE_SIZE, 8).unwrap();
    assert_ne!(c1.pte_at(a + PAGE_SIZE).pfn(), pfn);
    // A split by mprotect keeps the address.
    parent.mprotect(a, PAGE_SIZE, PROT_READ).unwrap();
    drop(g);
    let want = vec![(parent.clone(), a + PAGE_SIZE), (c2.clone(), moved + PAGE_SIZE)];
    assert_eq!(sorted(anon_mappings(&family, index, pfn)), sorted(want), "c1 copied, g is gone");
    // The copy c1 made belongs to the same family at the same index.
    let (f1, i1, p1) = page_of(&c1, a + PAGE_SIZE);
    assert!(Arc::ptr_eq(&f1, &family) && i1 == index);
    assert_eq!(sorted(anon_mappings(&family, index, p1)), sorted(vec![(c1.clone(), a + PAGE_SIZE)]));
}
