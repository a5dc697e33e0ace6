//! The shared-write counts of the address-space writers (issue 32; build
//! with `--features shared-write-stats`): will-it-scale's mmap1 op, a map
//! and an unmap of 128 MiB never touched, under each writer policy.
#![cfg(feature = "shared-write-stats")]

use softmm::uapi::*;
use softmm::{AddressSpace, File, MmConfig, OpenFile, Overcommit, OvercommitMode, PhysConfig, PhysMem, WriterPolicy};

/// The tests take turns: each counts its own thread's shared writes,
/// which include the deferred frees its epoch collections run, and the
/// other test's would be among them.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

const LEN: u64 = 128 << 20;

/// Shared-line writes per mmap1 op of the calling thread, in steady state.
fn per_op(policy: WriterPolicy) -> f64 {
    per_op_of(policy, false)
}

/// Shared-line writes per mmap1 op (mmap2's, a shared mapping of a file of
/// the thread's own, with `file`) of the calling thread, in steady state:
/// the op's own, not the frees of other threads' garbage that its epoch
/// collections run (another test's, before it: which thread collects is
/// the scheduler's doing, and run after the other tests of this binary,
/// the default's count came to 10.53 of which 0.53 were such frees).
fn per_op_of(policy: WriterPolicy, file: bool) -> f64 {
    let phys = PhysMem::new(PhysConfig::new(8 << 20)).unwrap();
    // Charged (it is private and writable), and let through by `always`
    // although it is larger than the arena.
    phys.set_overcommit(Overcommit::for_ram(2048).mode(OvercommitMode::Always));
    let mm = AddressSpace::new(&phys, MmConfig::default().writer_policy(policy)).unwrap();
    let open = file.then(|| OpenFile::read_write(&File::create(&phys, "mmap2", LEN).unwrap()));
    let op = || map_unmap(&mm, open.as_ref(), MAP_SHARED);
    op();
    let (own, _, _) = shared_writes_per_call(64, op);
    assert_eq!(phys.committed_pages(), 0);
    own
}

/// One mmap1 op: a map and an unmap of `LEN` never touched, of anonymous
/// memory, or (mmap2's) of `file` with `file_type` (`MAP_SHARED` or
/// `MAP_PRIVATE`).
fn map_unmap(mm: &AddressSpace, file: Option<&OpenFile>, file_type: i32) {
    let a = match file {
        Some(f) => mm.mmap(0, LEN, PROT_READ | PROT_WRITE, file_type, Some(f), 0),
        None => mm.mmap(0, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0),
    };
    mm.munmap(a.unwrap(), LEN).unwrap();
}

/// The calling thread's shared-line writes per call of `op`, over `calls`
/// calls: its own, and apart from them the frees of other threads'
/// garbage that its epoch collections ran (reclaim), with the sites of
/// all of them, for the record.
fn shared_writes_per_call(calls: u64, op: impl Fn()) -> (f64, f64, String) {
    let (before, sites) = (softmm::shared_writes_this_thread(), softmm::shared_writes_by_site_this_thread());
    for _ in 0..calls {
        op();
    }
    let n = softmm::shared_writes_this_thread() - before;
    let (sites, reclaim) = sites_since(&sites);
    ((n - reclaim) as f64 / calls as f64, reclaim as f64 / calls as f64, sites)
}

/// The default policy's op writes the `mmap_lock` word and sequence count
/// of its two write sections (8) and its two publications (2): nothing for
/// the commit charge, the statistics or the VMA it makes and drops (counted
/// in the calling thread's slot of the arena, not by a reference to the
/// arena). `reserve`'s third section and its unreachable-range updates
/// write about ten more. One test, on one thread: another thread's epoch
/// collection may drop this one's VMAs, writing their slots' lines.
#[test]
fn an_mmap1_op_writes_ten_shared_lines() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // First: a `short-own-rcu` run leaves batch markers in this thread's
    // epoch bag, which a later run's collections would run and count.
    let default = per_op(WriterPolicy::default());
    let reserve = per_op(WriterPolicy::Reserve);
    let file = per_op_of(WriterPolicy::default(), true);
    for &policy in WriterPolicy::ALL {
        // Printed for the record (`-- --nocapture`).
        eprintln!("{:13} {:.2} shared writes per mmap1 op", policy.name(), per_op(policy));
    }
    assert!(default <= 10.0, "{default} shared writes per op");
    assert!(reserve >= default + 8.0, "reserve: {reserve}, default: {default}");
    // mmap2's op, a file of the thread's own mapped and unmapped, writes
    // what mmap1's does: whether the address space is in the file's reverse
    // map is the file's to answer, under the file's lock, which only its
    // mappers write; the address space's list of linked files (a mutex
    // every thread of it writes) is taken only on the first link.
    eprintln!("mmap2 (default) {file:.2} shared writes per op");
    assert!(file <= default, "mmap2: {file}, mmap1: {default}");
}

/// A thread whose mapping merges with another thread's VMA, and whose
/// unmap splits the merged VMA again, counts the copies it makes in its
/// own slot of the arena's VMA count (as Linux's `vm_area_dup` allocates
/// from the calling CPU's slab), and so writes what an op on a VMA of its
/// own writes: before, each copy held a reference of the other thread's
/// slot (one shared write when made and one when dropped), 10.6-10.7
/// writes per mmap1 op at 2 threads under Linux placement, where the two
/// threads' mappings lie side by side.
#[test]
fn merging_with_another_threads_vma_writes_none_of_its_lines() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let phys = PhysMem::new(PhysConfig::new(8 << 20)).unwrap();
    phys.set_overcommit(Overcommit::for_ram(2048).mode(OvercommitMode::Always));
    // `short-own-rcu`: this thread frees only its own old versions, so its
    // count is its own ops' (under `short` its collections also run other
    // threads' frees, which the count includes).
    let config = MmConfig::default().writer_policy(WriterPolicy::ShortOwnRcu);
    let mm = AddressSpace::new(&phys, config).unwrap();
    let (prot, flags) = (PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED);
    let base = 1u64 << 40;
    // This thread takes its slot (its first VMA's) before the other one
    // does: they differ.
    mm.mmap(base, LEN, prot, flags, None, 0).unwrap();
    mm.munmap(base, LEN).unwrap();
    std::thread::scope(|s| s.spawn(|| mm.mmap(base, LEN, prot, flags, None, 0).unwrap()).join().unwrap());
    // Merged into the other thread's VMA, then split off it again.
    let map = || mm.mmap(base + LEN, LEN, prot, flags, None, 0).unwrap();
    map();
    assert_eq!(mm.maps().len(), 1, "merged");
    mm.munmap(base + LEN, LEN).unwrap();
    // The op's own writes: not the frees of other threads' garbage that
    // its epoch collections run (the other thread's batch marker, or, when
    // other tests of this binary ran first, their old versions: 10.50 per
    // op once in 13 runs, where the op's own are 10.02).
    let op = || {
        map();
        mm.munmap(base + LEN, LEN).unwrap();
    };
    let (per_op, reclaim, sites) = shared_writes_per_call(64, op);
    eprintln!(
        "{per_op:.2} shared writes per op merging with another thread's VMA, and {reclaim:.2} reclaiming \
         other threads' frees\n{sites}"
    );
    assert!(per_op <= 10.1, "{per_op} shared writes per op:\n{sites}");
}

/// The per-site difference of two readings of
/// [`softmm::shared_writes_by_site_this_thread`], for the record, and how
/// many of those writes were reclaim (frees the thread's epoch collection
/// ran for other threads).
fn sites_since(before: &[softmm::SharedWriteSite]) -> (String, u64) {
    let (mut out, mut reclaim) = (String::new(), 0);
    for s in softmm::shared_writes_by_site_this_thread() {
        let was = before.iter().find(|b| (b.file, b.line, b.reclaim) == (s.file, s.line, s.reclaim));
        let n = s.writes - was.map_or(0, |b| b.writes);
        if n != 0 {
            let kind = if s.reclaim { " (reclaim)" } else { "" };
            out += &format!("  {}:{}{kind}: {n}\n", s.file, s.line);
            if s.reclaim {
                reclaim += n;
            }
        }
    }
    (out, reclaim)
}

/// Under range-parallel writers with placement arenas, an mmap1 op (both
/// its calls range writes, each thread in its own arena's window) writes
/// at most one line another thread also writes, on average, at 1 thread
/// and with 2 threads working at once: its window's lock and version and
/// its slot of the shared mode are its own thread's lines, and the map
/// count's bound reads no other slot. Before, each range write counted
/// its slot's line and its window's line as shared: 4 per op. So does
/// mmap2's op (a private mapping of a file of the thread's own, as
/// will-it-scale's): the file's reverse map already holds the address
/// space, which the file answers under its own lock. Before file `mmap`
/// was a range write, its `mmap_lock` section wrote 5. The bound is on the
/// op's own writes ([`range_arenas_per_op`]).
#[test]
fn range_writers_with_arenas_write_at_most_one_shared_line_per_op() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for (threads, op) in [(1, Op::Mmap1), (2, Op::Mmap1), (1, Op::Mmap2), (2, Op::Mmap2)] {
        for (per_op, sites) in range_arenas_per_op(threads, op) {
            assert!(per_op <= 1.0, "{per_op} shared writes per {op:?} op at {threads} thread(s):\n{sites}");
        }
    }
}

/// A shared anonymous mapping's op (map, unmap: a new shmem object each
/// time, `shmem_zero_setup`'s) as a range write with arenas writes one line
/// of the arena itself: its reference count, which the object takes when it
/// is made (and drops when it goes, in the deferred free of its last VMA,
/// counted apart), as Linux's `new_inode` and `evict` take the shmem
/// superblock's inode-list lock. The object's number comes from the
/// thread's slot in batches (Linux's `get_next_ino`), and the reverse-map
/// count is per slot: before, each was one more shared write (3 per op,
/// and 2 in the deferred free). The bound allows the one write per 1,024
/// objects that takes a batch of numbers.
#[test]
fn a_shared_anonymous_range_mmap_writes_only_the_arenas_reference_count() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for threads in [1, 2] {
        for (per_op, sites) in range_arenas_per_op(threads, Op::SharedAnon) {
            assert!(per_op <= 1.01, "{per_op} shared writes per shared anonymous op at {threads} thread(s):\n{sites}");
        }
    }
}

/// The ops of [`range_arenas_per_op`].
#[derive(Clone, Copy, Debug)]
enum Op {
    /// will-it-scale's mmap1: private anonymous memory.
    Mmap1,
    /// mmap2's: a private mapping of a file of the thread's own.
    Mmap2,
    /// Shared anonymous memory: a new object per map.
    SharedAnon,
}

/// Under range writers and placement arenas, `threads` threads doing `op`
/// at once: each thread's own shared-line writes per op and their sites.
/// The frees that a thread's epoch collection runs for the other thread
/// (its VMAs' counts) are printed, not returned: which thread collects is
/// the scheduler's doing, and on the loaded 2-CPU VM they came to 0.07-1.6
/// per op at 2 threads (more with the old versions freed on their own
/// thread, `short-own-rcu`'s way, whose batch markers another thread's
/// collection then runs).
fn range_arenas_per_op(threads: usize, op: Op) -> Vec<(f64, String)> {
    let phys = PhysMem::new(PhysConfig::new(8 << 20)).unwrap();
    phys.set_overcommit(Overcommit::for_ram(2048).mode(OvercommitMode::Always));
    let config = MmConfig::default().writer_policy(WriterPolicy::Range).placement(softmm::PlacementPolicy::Arenas);
    let mm = AddressSpace::new(&phys, config).unwrap();
    let start = std::sync::Barrier::new(threads);
    const OPS: u64 = 256;
    let results: Vec<(f64, f64, String)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let open = matches!(op, Op::Mmap2)
                        .then(|| OpenFile::read_write(&File::create(&phys, "mmap2", LEN).unwrap()));
                    let call = || match op {
                        Op::Mmap1 | Op::Mmap2 => map_unmap(&mm, open.as_ref(), MAP_PRIVATE),
                        Op::SharedAnon => {
                            let flags = MAP_SHARED | MAP_ANONYMOUS;
                            let a = mm.mmap(0, LEN, PROT_READ | PROT_WRITE, flags, None, 0).unwrap();
                            mm.munmap(a, LEN).unwrap();
                        }
                    };
                    call();
                    start.wait();
                    shared_writes_per_call(OPS, call)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(phys.committed_pages(), 0);
    // Every call of every op, the first ones too, was a range write (the
    // statistics are read only now: reading them takes `mmap_lock`, which
    // would send a running writer there).
    let range = mm.stats().range;
    assert_eq!((range.writes, range.fallbacks), (threads as u64 * 2 * (OPS + 1), 0), "{op:?}: {range:?}");
    results
        .into_iter()
        .map(|(per_op, reclaim, sites)| {
            eprintln!(
                "range+arenas, {threads} thread(s): {per_op:.3} shared writes per {op:?} op, and {reclaim:.3} \
                 reclaiming other threads' frees\n{sites}"
            );
            (per_op, sites)
        })
        .collect()
}

/// The count sees a window's line move: two range writers taking turns in
/// one window (`MAP_FIXED` inside it) each take the line from the other at
/// their turn's first call, one shared write per op, where writers in
/// windows of their own write none.
#[test]
fn range_writers_taking_turns_in_one_window_count_its_line() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let phys = PhysMem::new(PhysConfig::new(8 << 20)).unwrap();
    phys.set_overcommit(Overcommit::for_ram(2048).mode(OvercommitMode::Always));
    let mm = AddressSpace::new(&phys, MmConfig::default().writer_policy(WriterPolicy::Range)).unwrap();
    let turn = std::sync::Barrier::new(2);
    const OPS: u64 = 64;
    let per_op: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2u64)
            .map(|t| {
                let (mm, turn) = (&mm, &turn);
                s.spawn(move || {
                    // Both in the window at 1 TiB + 1 GiB, at addresses of
                    // their own. (At 1 TiB, the first window of a directory
                    // leaf, the first mapping's lock of the window below
                    // would need the leaf below, which no VMA made: every
                    // call would take `mmap_lock`.)
                    let at = (1u64 << 40) + (1 << 30) + t * LEN;
                    let (prot, flags) = (PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED);
                    let mut n = 0;
                    for i in 0..2 * OPS + 2 {
                        // Turn `i` is thread `i % 2`'s; the first two warm up.
                        if i % 2 == t {
                            let before = softmm::shared_writes_this_thread();
                            mm.mmap(at, LEN, prot, flags, None, 0).unwrap();
                            mm.munmap(at, LEN).unwrap();
                            if i >= 2 {
                                n += softmm::shared_writes_this_thread() - before;
                            }
                        }
                        turn.wait();
                    }
                    n as f64 / OPS as f64
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(mm.stats().range.fallbacks, 0);
    for p in per_op {
        eprintln!("{p:.3} shared writes per op taking turns in one window");
        assert!(p >= 1.0, "{p} shared writes per op: the window's line moved every turn");
    }
}
