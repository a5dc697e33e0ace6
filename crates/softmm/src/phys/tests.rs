//! Unit tests of the physical memory arena (`super`).

use super::*;
use std::sync::Arc;

/// Frame `n`.
fn pfn(n: u64) -> Pfn {
    Pfn::new(n)
}

/// A one-node arena of `frames` frames, frame 0 being the zero page.
fn arena(frames: u64) -> Arc<PhysMem> {
    PhysMem::new(PhysConfig::new(frames * PAGE_SIZE)).unwrap()
}

#[test]
fn guest_copies_cross_frames_and_stop_at_the_arena_end() {
    let phys = arena(8);
    let last = pfn(phys.desc.len() as u64 - 1);
    let data: Vec<u8> = (0..PAGE_SIZE as usize + 100).map(|i| i as u8 ^ 0x5a).collect();
    // From the middle of one frame into the next, at an odd offset.
    phys.write(pfn(2), 4000, &data);
    let mut back = vec![0; data.len()];
    phys.read(pfn(2), 4000, &mut back);
    assert_eq!(back, data);
    phys.fill(pfn(3), 10, 0xcc, 7);
    let mut b = [0; 9];
    phys.read(pfn(3), 9, &mut b);
    assert_eq!(
        b,
        [
            data[PAGE_SIZE as usize - 4000 + 9],
            0xcc,
            0xcc,
            0xcc,
            0xcc,
            0xcc,
            0xcc,
            0xcc,
            data[PAGE_SIZE as usize - 4000 + 17]
        ]
    );
    phys.copy_frames(pfn(2), pfn(5), 2);
    let mut c = vec![0; data.len()];
    phys.read(pfn(5), 4000, &mut c);
    assert_eq!(c[..9 + PAGE_SIZE as usize - 4000], back[..9 + PAGE_SIZE as usize - 4000]);
    // The last byte of the arena is in range; one past it is not.
    phys.write(last, PAGE_SIZE as usize - 1, &[1]);
    for bad in [
        || arena(8).read(pfn(7), PAGE_SIZE as usize - 1, &mut [0; 2]),
        || arena(8).write(pfn(8), 0, &[0]),
        || arena(8).fill(pfn(0), usize::MAX, 0, 2),
        || arena(8).copy_frames(pfn(6), pfn(0), 3),
        || arena(8).read(pfn(u64::MAX), 0, &mut [0]),
    ] {
        let r = std::panic::catch_unwind(bad);
        assert!(r.is_err(), "a copy past the arena's end was not refused");
    }
}

/// A frame's reference as a number, as a page-table entry holds it.
fn alloc_raw(phys: &PhysMem, node: usize) -> Option<Pfn> {
    phys.alloc(node).map(FrameRef::into_raw)
}

/// Puts a reference held as a number.
fn put(phys: &PhysMem, pfn: Pfn) {
    drop(FrameRef::from_raw(phys, pfn));
}

/// Allocates from `node` until the arena runs out, in allocation order.
fn alloc_all(phys: &PhysMem, node: usize) -> Vec<Pfn> {
    std::iter::from_fn(|| alloc_raw(phys, node)).collect()
}

#[test]
fn config_constructor_and_setters() {
    let c = PhysConfig::new(5 << 20);
    assert_eq!((c.bytes, c.nodes), (5 << 20, 1));
    let c = c.nodes(3).bytes(7 << 20);
    assert_eq!((c.bytes, c.nodes), (7 << 20, 3));
    let d = PhysConfig::default();
    assert_eq!((d.bytes, d.nodes), (256 << 20, 1));
}

#[test]
fn fresh_arena_counts_every_frame_and_uses_none() {
    let phys = arena(16);
    assert_eq!(phys.stats(), PhysStats { frames_total: 16, frames_used: 0, page_tables: 0, vmas: 0, rmap_entries: 0 });
    assert_eq!(phys.nodes(), 1);
    assert_eq!(phys.zero_pfn(), pfn(0));
    assert_eq!(phys.quiesce(), phys.stats());
}

#[test]
fn arena_size_rounds_up_to_whole_frames_per_node() {
    // 5 frames over 2 nodes: 3 per node.
    let phys = PhysMem::new(PhysConfig::new(5 * PAGE_SIZE).nodes(2)).unwrap();
    assert_eq!(phys.stats().frames_total, 6);
    // The smallest arena: the zero page and one frame to allocate.
    let phys = PhysMem::new(PhysConfig::new(PAGE_SIZE + 1)).unwrap();
    assert_eq!(phys.stats().frames_total, 2);
    assert_eq!(alloc_all(&phys, 0), vec![pfn(1)]);
}

#[track_caller]
fn refused(bytes: u64, nodes: usize) -> Errno {
    match PhysMem::new(PhysConfig::new(bytes).nodes(nodes)) {
        Ok(_) => panic!("PhysConfig {{ bytes: {bytes:#x}, nodes: {nodes} }} was accepted"),
        Err(e) => e,
    }
}

#[test]
fn nonsensical_configs_are_einval() {
    // No nodes, or more than Linux's MAX_NUMNODES (1 << 10 on x86-64).
    assert_eq!(refused(1 << 20, 0), Errno::Inval);
    assert_eq!(refused(1 << 20, usize::MAX), Errno::Inval);
    assert_eq!(refused(1 << 40, MAX_NODES + 1), Errno::Inval);
    // No bytes, or too few for the zero page plus one frame on every node.
    assert_eq!(refused(0, 1), Errno::Inval);
    assert_eq!(refused(1, 1), Errno::Inval);
    assert_eq!(refused(PAGE_SIZE, 1), Errno::Inval);
    assert_eq!(refused(2 * PAGE_SIZE, 2), Errno::Inval);
    assert_eq!(refused(1 << 20, 512), Errno::Inval, "one frame per node");
    assert_eq!(PhysMem::new(PhysConfig::new(3 * PAGE_SIZE).nodes(2)).unwrap().stats().frames_total, 4);
    // Sizes whose rounding to whole frames per node overflows.
    assert_eq!(refused(u64::MAX, 1), Errno::Inval);
    // 2^52 - 1 frames: 2^51 per node on two nodes, 2^64 bytes in all.
    assert_eq!(refused(u64::MAX - PAGE_SIZE, 2), Errno::Inval);
}

/// The host's free memory, from /proc/meminfo.
fn mem_available() -> u64 {
    host_mem_available().expect("MemAvailable in /proc/meminfo")
}

#[test]
#[cfg_attr(miri, ignore = "reads the host's /proc/meminfo")]
fn an_arena_the_host_cannot_back_is_enomem_not_the_oom_killer() {
    // Refused before anything is mapped or allocated: the test itself
    // touches no memory (an accepted arena this size would be prefaulted
    // and meet the host's OOM killer).
    let avail = mem_available();
    assert_eq!(refused(2 * avail, 1), Errno::NoMem);
    assert_eq!(refused(avail + (avail >> 6), 4), Errno::NoMem, "descriptors count too");
    assert_eq!(refused(1 << 50, 16), Errno::NoMem);
    // Representable but far beyond any host.
    assert_eq!(refused(u64::MAX - 2 * PAGE_SIZE, 1), Errno::NoMem);
}

#[test]
fn arena_size_rounds_a_partial_frame_up() {
    // The doc promises rounding up: a partial fifth frame is a whole one.
    let phys = PhysMem::new(PhysConfig::new(4 * PAGE_SIZE + 1)).unwrap();
    assert_eq!(phys.stats().frames_total, 5);
}

#[test]
fn alloc_hands_out_distinct_frames_never_the_zero_page() {
    let phys = arena(16);
    let mut got = alloc_all(&phys, 0);
    assert_eq!(got.len(), 15, "every frame but the zero page");
    assert_eq!(phys.stats().frames_used, 15);
    for &p in &got {
        assert_eq!(phys.desc(p).refcount.load(Ordering::Relaxed), 1);
    }
    got.sort_unstable();
    assert_eq!(got, (1..16).map(pfn).collect::<Vec<_>>());
    for p in got {
        put(&phys, p);
    }
    assert_eq!(phys.stats().frames_used, 0);
}

#[test]
fn out_of_frames_is_none_and_recovers_after_a_free() {
    let phys = arena(8);
    let got = alloc_all(&phys, 0);
    assert_eq!(got.len(), 7);
    assert_eq!(alloc_raw(&phys, 0), None);
    assert!(phys.alloc_zeroed(0).is_none());
    assert!(phys.alloc_copy(got[0], 0).is_none());
    assert_eq!(phys.stats().frames_used, 7, "failed allocations are not counted");
    put(&phys, got[3]);
    assert_eq!(phys.stats().frames_used, 6);
    assert_eq!(alloc_raw(&phys, 0), Some(got[3]), "the only free frame");
    assert_eq!(alloc_raw(&phys, 0), None);
    for p in got {
        put(&phys, p);
    }
    assert_eq!(phys.stats().frames_used, 0);
    assert_eq!(alloc_all(&phys, 0).len(), 7, "every frame is free again");
}

#[test]
fn get_and_put_count_references_and_the_last_put_frees() {
    let phys = arena(4);
    let p = alloc_raw(&phys, 0).unwrap();
    phys.get(p).into_raw();
    phys.get(p).into_raw();
    assert_eq!(phys.desc(p).refcount.load(Ordering::Relaxed), 3);
    put(&phys, p);
    put(&phys, p);
    assert_eq!(phys.desc(p).refcount.load(Ordering::Relaxed), 1);
    assert_eq!(phys.stats().frames_used, 1, "still referenced");
    put(&phys, p);
    assert_eq!(phys.desc(p).refcount.load(Ordering::Relaxed), 0);
    assert_eq!(phys.stats().frames_used, 0);
}

#[test]
fn zero_page_is_not_reference_counted() {
    let phys = arena(4);
    let z = phys.zero_pfn();
    phys.get(z).into_raw();
    put(&phys, z);
    // A counted put would underflow (debug) or free the zero page.
    put(&phys, z);
    assert_eq!(phys.desc(z).refcount.load(Ordering::Relaxed), 0);
    assert_eq!(phys.stats().frames_used, 0);
    let got = alloc_all(&phys, 0);
    assert!(!got.contains(&z), "the zero page was handed out: {got:?}");
    assert_eq!(got.len(), 3);
}

#[test]
fn alloc_resets_the_descriptor_of_a_reused_frame() {
    let phys = arena(4);
    let got = alloc_all(&phys, 0);
    for &p in &got {
        let d = phys.desc(p);
        d.flags.store(PG_FILE | PG_DIRTY | PG_LAZYFREE, Ordering::Relaxed);
        d.mapping.store(77, Ordering::Relaxed);
        put(&phys, p);
    }
    let p = alloc_raw(&phys, 0).unwrap();
    let d = phys.desc(p);
    assert_eq!(d.flags.load(Ordering::Relaxed), 0);
    assert_eq!(d.mapping.load(Ordering::Relaxed), 0);
    assert_eq!(d.refcount.load(Ordering::Relaxed), 1);
}

#[test]
fn alloc_zeroed_and_alloc_copy_fill_the_frame() {
    let phys = arena(4);
    // Dirty every frame so the one handed back cannot be zero by chance.
    for p in alloc_all(&phys, 0) {
        // SAFETY: the frame is allocated to this test and referenced by nothing else.
        unsafe { std::ptr::write_bytes(phys.frame_ptr(p), 0xa5, PAGE_SIZE as usize) };
        put(&phys, p);
    }
    let src = phys.alloc_zeroed(0).unwrap().into_raw();
    let frame = |p: Pfn| {
        let mut buf = vec![0u8; PAGE_SIZE as usize];
        // SAFETY: one frame of this test's live arena.
        unsafe { crate::access::copy_from_host(phys.frame_ptr(p), &mut buf) };
        buf
    };
    assert!(frame(src).iter().all(|&b| b == 0), "alloc_zeroed left old contents");
    let pattern: Vec<u8> = (0..PAGE_SIZE).map(|i| (i * 7 % 251) as u8).collect();
    // SAFETY: one frame of this test's live arena.
    unsafe { crate::access::copy_to_host(&pattern, phys.frame_ptr(src)) };
    let dst = phys.alloc_copy(src, 0).unwrap().into_raw();
    assert_ne!(dst, src);
    assert_eq!(frame(dst), pattern);
    assert_eq!(phys.stats().frames_used, 2);
}

#[test]
fn numa_nodes_split_the_arena_and_alloc_prefers_the_asked_node() {
    // 16 frames on 2 nodes: node 0 holds frames 0..8 (0 is the zero page), node 1 frames 8..16.
    let phys = PhysMem::new(PhysConfig::new(16 * PAGE_SIZE).nodes(2)).unwrap();
    assert_eq!(phys.nodes(), 2);
    assert_eq!((phys.node_of(pfn(0)), phys.node_of(pfn(7)), phys.node_of(pfn(8)), phys.node_of(pfn(15))), (0, 0, 1, 1));
    let on1: Vec<Pfn> = (0..8).map(|_| alloc_raw(&phys, 1).unwrap()).collect();
    assert!(on1.iter().all(|&p| phys.node_of(p) == 1 && (pfn(8)..pfn(16)).contains(&p)), "{on1:?}");
    // Node 1 is empty: the allocation falls back to node 0 rather than failing.
    let fallback = alloc_raw(&phys, 1).unwrap();
    assert_eq!(phys.node_of(fallback), 0);
    let on0 = alloc_raw(&phys, 0).unwrap();
    assert_eq!(phys.node_of(on0), 0);
    assert_eq!(phys.stats().frames_used, 10);
    // The 5 frames left on node 0.
    assert_eq!(alloc_all(&phys, 0).len(), 5);
    assert_eq!(alloc_raw(&phys, 0), None);
}

#[test]
fn fallback_allocations_can_use_every_frame_of_the_other_node() {
    // Every softmm caller asks for node 0. Once node 0 is empty, refill moves a batch of node 1
    // frames into the thread cache and hands out one; the next alloc(0) finds no node-0 frame
    // in the cache, finds both free lists empty, and fails with 7 free frames in the cache.
    let phys = PhysMem::new(PhysConfig::new(16 * PAGE_SIZE).nodes(2)).unwrap();
    let got = alloc_all(&phys, 0);
    assert_eq!(got.len(), 15, "frames_used = {}", phys.stats().frames_used);
}

#[test]
fn freeing_past_the_cache_limit_spills_to_the_node() {
    // More frames than a thread cache keeps (4 * CACHE_BATCH), so frees drain to the free list.
    let phys = arena(256);
    let got = alloc_all(&phys, 0);
    assert_eq!(got.len(), 255);
    for &p in &got {
        put(&phys, p);
    }
    assert_eq!(phys.stats().frames_used, 0);
    assert!(phys.shard().lock().frames.len() < 4 * CACHE_BATCH, "the thread cache never drained");
    assert_eq!(alloc_all(&phys, 0).len(), 255, "a frame was lost between the cache and the node");
}

#[test]
fn frames_cached_by_another_thread_are_still_allocatable() {
    // Linux drains the per-cpu pagesets (drain_all_pages) before it reports an allocation failure.
    let phys = arena(8);
    let got = alloc_all(&phys, 0);
    assert_eq!(got.len(), 7);
    // Free from a thread whose cache is not this thread's (threads share
    // caches modulo their count). A thread of this shard gives the frames
    // back and stays alive, holding its number, so that the next one takes
    // another (threads alive together hold different numbers).
    let number = || crate::sync::percpu::this_thread_number().unwrap_or(0);
    let here = number() % phys.shards.len();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut parked = Vec::new();
    let mut frames = got;
    loop {
        let (freer, done2) = (phys.clone(), done.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            if number() % freer.shards.len() == here {
                tx.send(Some(frames)).unwrap();
                while !done2.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::park();
                }
                return;
            }
            frames.into_iter().for_each(|p| put(&freer, p));
            tx.send(None).unwrap();
        });
        match rx.recv().unwrap() {
            Some(back) => {
                frames = back;
                parked.push(t);
            }
            None => {
                t.join().unwrap();
                break;
            }
        }
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in parked {
        t.thread().unpark();
        t.join().unwrap();
    }
    assert_eq!(phys.stats().frames_used, 0);
    assert_eq!(alloc_all(&phys, 0).len(), 7);
}

#[test]
fn allocation_counts_add_up_across_threads() {
    let phys = arena(64);
    let got = alloc_all(&phys, 0);
    assert_eq!(got.len(), 63);
    // Frees on other threads land in other thread caches but the totals still balance.
    let halves: Vec<Vec<Pfn>> = got.chunks(32).map(<[Pfn]>::to_vec).collect();
    std::thread::scope(|s| {
        for half in halves {
            let phys = &phys;
            s.spawn(move || half.into_iter().for_each(|p| put(phys, p)));
        }
    });
    assert_eq!(phys.stats().frames_used, 0);
}

#[test]
fn stats_count_vmas_and_page_tables_and_quiesce_waits_for_deferred_frees() {
    let phys = arena(4);
    let vmas = [phys.account_vma(), phys.account_vma()];
    phys.account_page_table(3);
    assert_eq!((phys.stats().vmas, phys.stats().page_tables), (2, 3));
    drop(vmas);
    phys.account_page_table(-1);
    // Free the last two page tables after a grace period, as detached page tables are.
    let guard = crossbeam_epoch::pin();
    let deferred = phys.clone();
    guard.defer(move || deferred.account_page_table(-2));
    drop(guard);
    assert_eq!(phys.quiesce(), PhysStats { frames_total: 4, frames_used: 0, page_tables: 0, vmas: 0, rmap_entries: 0 });
}

/// `put_batch` frees the frames whose last reference it drops, on every
/// node (more than a thread cache keeps, so frees reach the node free
/// lists), keeps the others and skips the zero page: afterwards every
/// freed frame can be allocated again, and only the shared one is used.
#[test]
fn put_batch_frees_last_references_on_every_node() {
    for nodes in [1, 2] {
        put_batch_frees_last_references_on(nodes);
    }
}

fn put_batch_frees_last_references_on(nodes: usize) {
    let phys = PhysMem::new(PhysConfig::new(512 * PAGE_SIZE).nodes(nodes)).unwrap();
    let all: Vec<Pfn> = (0..nodes).flat_map(|n| alloc_all(&phys, n)).collect();
    assert_eq!(all.len(), 511, "every frame but the zero page");
    let shared = all[7];
    let _second = phys.get(shared).into_raw();
    let mut batch = all.clone();
    batch.push(phys.zero_page().into_raw());
    phys.put_batch(&mut batch);
    assert!(batch.is_empty());
    assert_eq!(phys.stats().frames_used, 1, "only the frame with another reference stays used");
    assert_eq!(phys.desc(shared).refcount.load(Ordering::Relaxed), 1);
    let again: Vec<Pfn> = (0..nodes).flat_map(|n| alloc_all(&phys, n)).collect();
    assert_eq!(again.len(), 510, "a freed frame was lost");
    assert!(!again.contains(&shared));
    let mut batch = again;
    batch.push(shared);
    phys.put_batch(&mut batch);
    assert_eq!(phys.quiesce().frames_used, 0);
}

/// `alloc_bulk_at` takes the placement's node first, then the other
/// allowed nodes in `alloc_in`'s fallback order (node + 1, node + 2,
/// ... wrapping), each emptied before the next; never a node outside
/// the mask; fewer frames only when every allowed node is empty.
#[test]
fn alloc_bulk_at_falls_back_over_the_allowed_nodes_in_order() {
    let phys = PhysMem::new(PhysConfig::new(3 * 64 * PAGE_SIZE).nodes(3)).unwrap();
    let total: Vec<u64> = phys.node_stats().iter().map(|s| s.frames_total).collect();
    let mut mask = NodeMask::single(2);
    mask.set(0);
    // Node 2 first, then node 0 (2 + 1 wraps to 0), never node 1.
    let at = Placement::new(2, Some(mask));
    let got = phys.alloc_bulk_at(&at, total[2] as usize + 10);
    let nodes: Vec<usize> = got.iter().map(|f| phys.node_of(f.pfn())).collect();
    assert_eq!(nodes.len() as u64, total[2] + 10);
    assert!(nodes[..total[2] as usize].iter().all(|&n| n == 2), "node 2 emptied first: {nodes:?}");
    assert!(nodes[total[2] as usize..].iter().all(|&n| n == 0), "then node 0: {nodes:?}");
    let rest = phys.alloc_bulk_at(&at, usize::MAX >> 1);
    assert_eq!(rest.len() as u64, total[0] - 10, "all of node 0, none of node 1");
    assert_eq!(phys.node_stats()[1].frames_used, 0);
    // Without a mask the fallback reaches node 1; a one-node placement
    // does not.
    assert!(phys.alloc_bulk_at(&Placement::this_node(2), 1).is_empty());
    assert!(phys.alloc_bulk_at(&Placement::this_node(7), 1).is_empty(), "no node 7");
    assert!(phys.alloc_bulk_at(&Placement::this_node(MAX_NODES), 1).is_empty());
    let any = phys.alloc_bulk_at(&Placement::new(2, None), 5);
    assert!(any.len() == 5 && any.iter().all(|f| phys.node_of(f.pfn()) == 1));
    drop((got, rest, any));
    assert_eq!(phys.quiesce().frames_used, 0);
}

/// `alloc_bulk_on` hands out frames of the asked node only, from this
/// thread's cache and the node's free list and, once those run out,
/// from other threads' caches; it returns fewer only when the node is
/// empty, and each frame comes with one reference, counted as used.
#[test]
fn alloc_bulk_on_takes_only_the_node_and_all_of_it() {
    let phys = PhysMem::new(PhysConfig::new(512 * PAGE_SIZE).nodes(2)).unwrap();
    let per_node: Vec<u64> = phys.node_stats().iter().map(|s| s.frames_total).collect();
    // Fill this thread's cache with frames of both nodes, and another
    // thread's with frames of node 1.
    let mut mixed: Vec<Pfn> = (0..40).flat_map(|_| [alloc_raw(&phys, 0), alloc_raw(&phys, 1)]).flatten().collect();
    phys.put_batch(&mut mixed);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut other: Vec<Pfn> = (0..20).filter_map(|_| alloc_raw(&phys, 1)).collect();
            phys.put_batch(&mut other);
        });
    });
    let some = phys.alloc_bulk_on(1, 50);
    assert_eq!(some.len(), 50);
    assert!(some.iter().all(|f| phys.node_of(f.pfn()) == 1 && f.desc().refcount.load(Ordering::Relaxed) == 1));
    let rest = phys.alloc_bulk_on(1, usize::MAX >> 1);
    assert_eq!(rest.len() as u64, per_node[1] - 50, "frames of node 1 left behind");
    assert!(rest.iter().all(|f| phys.node_of(f.pfn()) == 1));
    assert!(phys.alloc_bulk_on(1, 1).is_empty(), "node 1 is empty");
    assert!(phys.alloc_bulk_on(2, 1).is_empty(), "no node 2");
    assert_eq!(phys.stats().frames_used, per_node[1]);
    assert_eq!(phys.node_stats()[0].frames_used, 0);
    drop((some, rest));
    assert_eq!(phys.quiesce().frames_used, 0);
}

/// Under `FreeLists::Striped` a thread's refill takes a batch from its own
/// slot's list and leaves the others' lists (other lines) alone; under
/// `Node` there is one list, which every refill takes from.
#[test]
fn a_refill_takes_from_the_threads_own_list_when_striped() {
    for &policy in FreeLists::ALL {
        let phys = PhysMem::new(PhysConfig::new(4 << 20).free_lists(policy)).unwrap();
        let node = &phys.nodes[0];
        assert_eq!(node.free.len(), if policy == FreeLists::Node { 1 } else { crate::sync::percpu::SLOTS });
        for _ in 0..2 {
            std::thread::scope(|s| {
                s.spawn(|| {
                    // Empty caches: the allocation below refills.
                    phys.drain_all_caches();
                    let lens: Vec<usize> = node.free.iter().map(|l| l.lock().len()).collect();
                    let pfn = alloc_raw(&phys, 0).unwrap();
                    let after: Vec<usize> = node.free.iter().map(|l| l.lock().len()).collect();
                    for (i, (b, a)) in lens.iter().zip(&after).enumerate() {
                        let taken = if i == node.mine() { CACHE_BATCH } else { 0 };
                        assert_eq!(b - a, taken, "{policy:?}: list {i} of {}", lens.len());
                    }
                    put(&phys, pfn);
                });
            });
        }
    }
}

/// Under every policy one thread can take every frame (its own list first,
/// then the others), an allocation fails only then, and every frame comes
/// back.
#[test]
fn every_free_list_policy_hands_out_every_frame_once() {
    for &policy in FreeLists::ALL {
        let phys = PhysMem::new(PhysConfig::new(1 << 20).free_lists(policy)).unwrap();
        let total = phys.stats().frames_total;
        let frames = alloc_all(&phys, 0);
        assert_eq!(frames.len() as u64, total - 1, "{policy:?}: every frame but the zero page");
        let mut sorted = frames.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), frames.len(), "{policy:?}: each once");
        assert!(alloc_raw(&phys, 0).is_none());
        for p in frames {
            put(&phys, p);
        }
        assert_eq!(phys.stats().frames_used, 0);
        assert_eq!(FreeLists::from_name(policy.name()), Some(policy));
    }
}
