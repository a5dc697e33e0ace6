//! Shootdown targets (issue 26, `ShootdownTargets`): a zap or a COW break
//! asks only the CPUs that filled their TLB from the entries it changed, and
//! every CPU that did is asked, whatever rewrote the entry in between. Each
//! scenario runs under every policy; the counts of requests and barriers are
//! those of `FillOwners` and `FillOwnersRanges` (under `Broadcast` every
//! other thread's CPU is asked).

use std::sync::mpsc;
use std::sync::Arc;

use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, MmConfig, ShootdownTargets, TlbStats};
use softmm_testkit::common::*;

/// What a [`Remote`] runs on its CPU.
type Job = Box<dyn FnOnce(&mut Cpu) + Send>;

/// A thread with its own CPU attached to `mm`, running what it is sent, one
/// job at a time, outside any access in between (it may then block on its
/// channel for as long as it likes).
struct Remote {
    jobs: mpsc::Sender<Job>,
    thread: std::thread::JoinHandle<()>,
}

impl Remote {
    fn attached(mm: &Arc<AddressSpace>) -> Remote {
        let (jobs, rx) = mpsc::channel::<Job>();
        let mm = mm.clone();
        let thread = std::thread::spawn(move || {
            let mut cpu = Cpu::attached(&mm);
            for job in rx {
                job(&mut cpu);
            }
        });
        Remote { jobs, thread }
    }

    /// Runs `f` on the remote CPU and returns its result.
    fn run<R: Send + 'static>(&self, f: impl FnOnce(&mut Cpu) -> R + Send + 'static) -> R {
        let (tx, rx) = mpsc::channel();
        self.jobs.send(Box::new(move |cpu| tx.send(f(cpu)).unwrap())).unwrap();
        rx.recv().unwrap()
    }

    fn read(&self, a: u64) -> u64 {
        self.run(move |cpu| cpu.read_u64(a).unwrap())
    }

    fn stop(self) {
        drop(self.jobs);
        self.thread.join().unwrap();
    }
}

fn mm_under(p: &Arc<softmm::PhysMem>, targets: ShootdownTargets) -> Arc<AddressSpace> {
    AddressSpace::new(p, MmConfig::default().shootdown_targets(targets)).unwrap()
}

/// The change in the counters from `before` to now.
fn since(mm: &AddressSpace, before: TlbStats) -> (u64, u64, u64, u64) {
    let s = mm.stats().tlb;
    // A remote request is covered once, by a barrier this shootdown issued,
    // one it joined, or (adaptive posting) the target's own fences.
    let covered = |t: &TlbStats| t.barriers + t.barriers_joined + t.barriers_skipped;
    (
        s.flushes - before.flushes,
        s.flush_requests - before.flush_requests,
        covered(&s) - covered(&before),
        s.local_flushes - before.local_flushes,
    )
}

/// Writes `value` to a fresh page of another mapping: the frame allocator
/// hands out a frame freed just before, so a CPU still translating to it
/// would read `value`.
fn reuse_a_frame(mm: &AddressSpace, cpu: &mut Cpu, value: u64) -> u64 {
    let c = mm.mmap(0, PAGE, RW, ANON, None, 0).unwrap();
    cpu.write_u64(c, value).unwrap();
    c
}

/// will-it-scale's tlb_flush: each thread writes, drops and reads back its
/// own page. Under `FillOwners` no shootdown asks the other thread's CPU:
/// no request, no barrier, each one local.
#[test]
fn a_thread_private_page_is_dropped_with_no_request_and_no_barrier() {
    for &targets in ShootdownTargets::ALL {
        let p = phys(4);
        let mm = mm_under(&p, targets);
        let (a, b) = (mm.mmap(0, PAGE, RW, ANON, None, 0).unwrap(), mm.mmap(0, PAGE, RW, ANON, None, 0).unwrap());
        let remote = Remote::attached(&mm);
        remote.run(move |cpu| cpu.write_u64(b, 5).unwrap());
        let mut cpu = Cpu::attached(&mm);
        let before = mm.stats().tlb;
        for i in 1..=3 {
            cpu.write_u64(a, i).unwrap();
            mm.madvise(a, PAGE, MADV_DONTNEED).unwrap();
            assert_eq!(cpu.read_u64(a), Ok(0), "{targets:?}");
        }
        let (flushes, requests, barriers, local) = since(&mm, before);
        // Each pass: the zap, and before it, but the first time, the zero
        // page's COW break.
        assert_eq!(flushes, 5, "{targets:?}");
        if targets != ShootdownTargets::Broadcast {
            assert_eq!((requests, barriers, local), (0, 0, 5));
        } else {
            assert_eq!((requests, barriers, local), (5, 5, 0), "{targets:?}");
        }
        assert_eq!(remote.read(b), 5);
        remote.stop();
        drop((cpu, mm));
        assert_no_leaks(&p);
    }
}

/// A page another CPU read is shot down on that CPU, and on no other: its
/// next read sees the page dropped, not the freed frame reused.
#[test]
fn a_zap_asks_the_cpu_that_filled_and_only_it() {
    for &targets in ShootdownTargets::ALL {
        let p = phys(4);
        let mm = mm_under(&p, targets);
        let a = mm.mmap(0, PAGE, RW, ANON, None, 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        let (reader, idle) = (Remote::attached(&mm), Remote::attached(&mm));
        idle.run(|_| ());
        // The reader's CPU alone fills from the entry.
        reader.run(move |cpu| cpu.write_u64(a, 7).unwrap());
        assert_eq!(reader.read(a), 7);
        let before = mm.stats().tlb;
        mm.madvise(a, PAGE, MADV_DONTNEED).unwrap();
        let (_, requests, barriers, _) = since(&mm, before);
        let want = if targets != ShootdownTargets::Broadcast { 1 } else { 2 };
        assert_eq!((requests, barriers), (want, 1), "{targets:?}");
        reuse_a_frame(&mm, &mut cpu, 99);
        assert_eq!(reader.read(a), 0, "{targets:?}: a read through a stale translation");
        [reader, idle].into_iter().for_each(Remote::stop);
        drop((cpu, mm));
        assert_no_leaks(&p);
    }
}

/// mprotect that widens an entry (read-only to read-write) shoots nothing
/// down: the CPU that cached the read-only entry must stay recorded in the
/// new one, or the zap after it would not ask it and it would read the
/// freed frame.
#[test]
fn a_widening_mprotect_keeps_the_cpus_that_filled() {
    for &targets in ShootdownTargets::ALL {
        let p = phys(4);
        let mm = mm_under(&p, targets);
        let a = mm.mmap(0, PAGE, RW, ANON, None, 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        cpu.write_u64(a, 7).unwrap();
        mm.mprotect(a, PAGE, PROT_READ).unwrap();
        let reader = Remote::attached(&mm);
        assert_eq!(reader.read(a), 7);
        mm.mprotect(a, PAGE, PROT_READ | PROT_WRITE).unwrap();
        // Written through this CPU: the entry gets its dirty bit and this
        // CPU as a second owner.
        cpu.write_u64(a, 8).unwrap();
        assert_eq!(reader.read(a), 8);
        mm.madvise(a, PAGE, MADV_DONTNEED).unwrap();
        reuse_a_frame(&mm, &mut cpu, 99);
        assert_eq!(reader.read(a), 0, "{targets:?}: a read through a stale translation");
        reader.stop();
        drop((cpu, mm));
        assert_no_leaks(&p);
    }
}

/// The zero page's COW break (`do_wp_page`) under the PTE lock asks the CPU
/// that read the zero page there, which then reads the written page, not
/// the zero page; a COW of a page only the writer read asks no one.
#[test]
fn a_cow_break_asks_the_cpus_that_read_the_old_page() {
    for &targets in ShootdownTargets::ALL {
        let p = phys(4);
        let mm = mm_under(&p, targets);
        let (a, b) = (mm.mmap(0, PAGE, RW, ANON, None, 0).unwrap(), mm.mmap(0, PAGE, RW, ANON, None, 0).unwrap());
        let mut cpu = Cpu::attached(&mm);
        let reader = Remote::attached(&mm);
        // Only the reader has read `a` (the zero page).
        assert_eq!(reader.read(a), 0);
        let before = mm.stats().tlb;
        cpu.write_u64(a, 42).unwrap();
        let (flushes, requests, ..) = since(&mm, before);
        assert_eq!((flushes, requests), (1, 1), "{targets:?}");
        assert_eq!(reader.read(a), 42, "{targets:?}: the reader kept the zero page");
        // Only this CPU has read `b`.
        assert_eq!(cpu.read_u64(b), Ok(0));
        let before = mm.stats().tlb;
        cpu.write_u64(b, 43).unwrap();
        let (flushes, requests, barriers, local) = since(&mm, before);
        if targets != ShootdownTargets::Broadcast {
            assert_eq!((flushes, requests, barriers, local), (1, 0, 0, 1));
        } else {
            assert_eq!((flushes, requests, barriers, local), (1, 1, 1, 0), "{targets:?}");
        }
        assert_eq!(reader.read(b), 43);
        reader.stop();
        drop((cpu, mm));
        assert_no_leaks(&p);
    }
}

/// Two CPUs besides the zapper's filled from one entry: it records both
/// (as several), and the zap asks every attached CPU.
#[test]
fn an_entry_filled_by_several_cpus_is_shot_down_everywhere() {
    for &targets in ShootdownTargets::ALL {
        let p = phys(4);
        let mm = mm_under(&p, targets);
        let a = mm.mmap(0, PAGE, RW, ANON, None, 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        cpu.write_u64(a, 7).unwrap();
        let readers = [Remote::attached(&mm), Remote::attached(&mm)];
        for r in &readers {
            assert_eq!(r.read(a), 7);
        }
        let before = mm.stats().tlb;
        mm.madvise(a, PAGE, MADV_DONTNEED).unwrap();
        let (_, requests, barriers, _) = since(&mm, before);
        assert_eq!((requests, barriers), (2, 1), "{targets:?}");
        reuse_a_frame(&mm, &mut cpu, 99);
        for r in &readers {
            assert_eq!(r.read(a), 0, "{targets:?}");
        }
        readers.into_iter().for_each(Remote::stop);
        drop((cpu, mm));
        assert_no_leaks(&p);
    }
}

/// A child's copies of the parent's entries record no filler (fork drops
/// them): a CPU of the child that reads the page is its one filler, and a
/// zap from its thread asks no other CPU of the child. Kept, the parent
/// reader's record would make the child's reader a second filler, and the
/// zap would ask every CPU of the child.
#[test]
fn fork_leaves_the_childs_entries_with_no_filler() {
    for &targets in ShootdownTargets::ALL {
        let p = phys(8);
        let mm = mm_under(&p, targets);
        let a = mm.mmap(0, PAGE, RW, ANON, None, 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        cpu.write_u64(a, 7).unwrap();
        let reader = Remote::attached(&mm);
        assert_eq!(reader.read(a), 7);
        let child = mm.fork().unwrap();
        let child_idle = Remote::attached(&child);
        child_idle.run(|_| ());
        let mut ccpu = Cpu::attached(&child);
        assert_eq!(ccpu.read_u64(a), Ok(7));
        let before = child.stats().tlb;
        child.madvise(a, PAGE, MADV_DONTNEED).unwrap();
        let want = u64::from(targets == ShootdownTargets::Broadcast);
        assert_eq!(since(&child, before).1, want, "{targets:?}");
        assert_eq!(ccpu.read_u64(a), Ok(0));
        let before = mm.stats().tlb;
        mm.madvise(a, PAGE, MADV_DONTNEED).unwrap();
        assert_eq!(since(&mm, before).1, 1, "{targets:?}");
        assert_eq!(reader.read(a), 0, "{targets:?}");
        [reader, child_idle].into_iter().for_each(Remote::stop);
        drop((cpu, ccpu, mm, child));
        assert_no_leaks(&p);
    }
}

/// Under `FillOwnersRanges` a request names the page it drops, and the
/// target keeps the rest of its TLB: the other page it cached is still a
/// hit. Under the other policies the whole TLB goes.
#[test]
fn a_ranged_request_keeps_the_rest_of_the_targets_tlb() {
    for &targets in ShootdownTargets::ALL {
        let p = phys(4);
        let mm = mm_under(&p, targets);
        let a = mm.mmap(0, 2 * PAGE, RW, ANON, None, 0).unwrap();
        let b = a + PAGE;
        let reader = Remote::attached(&mm);
        reader.run(move |cpu| {
            cpu.write_u64(a, 1).unwrap();
            cpu.write_u64(b, 2).unwrap();
        });
        mm.madvise(a, PAGE, MADV_DONTNEED).unwrap();
        let (b_value, misses, a_value) = reader.run(move |cpu| {
            let before = cpu.stats().tlb_misses;
            let v = cpu.read_u64(b).unwrap();
            (v, cpu.stats().tlb_misses - before, cpu.read_u64(a).unwrap())
        });
        assert_eq!((b_value, a_value), (2, 0), "{targets:?}");
        let kept = targets == ShootdownTargets::FillOwnersRanges;
        assert_eq!(misses, u64::from(!kept), "{targets:?}: b's translation kept: {kept}");
        reader.stop();
        drop(mm);
        assert_no_leaks(&p);
    }
}
