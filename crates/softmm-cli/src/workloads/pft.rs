//! `pft`, mmtests' page-fault test: one private anonymous mapping is made
//! before timing; each of N threads writes one byte per page of its own
//! slice (`size` bytes per thread); the timed part is the touching only.
//! One iteration is one such pass; the mapping is remade for the next.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::Instant;

use super::harness::{run_threads, Background, TaskCtx, TaskOut};
use super::space::{HostSpace, SoftSpace, Space, PAGE};
use super::{host_measured, soft_measured, Measured, Params, SoftEnv};

struct Pass {
    barrier: Barrier,
    base: AtomicU64,
    cont: AtomicBool,
}

fn body<S: Space>(s: &S, cpu: &mut S::Cpu, ctx: &TaskCtx, pass: &Pass, size: u64) -> Result<TaskOut, i32> {
    let total = size * ctx.ntasks as u64;
    let leader = ctx.tid == 0;
    let mut out = TaskOut { timed: leader, ..TaskOut::default() };
    let mut it = 0;
    let fatal = |what: &str, e: i32| -> ! {
        // Others wait at the barrier: a failure cannot be returned.
        eprintln!("softmm: pft: {what}: {}", std::io::Error::from_raw_os_error(e));
        std::process::exit(2)
    };
    loop {
        if leader {
            let cont = ctx.more(it);
            if cont {
                let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
                let a = s.mmap(0, total, libc::PROT_READ | libc::PROT_WRITE, flags, None, 0);
                pass.base.store(a.unwrap_or_else(|e| fatal("mmap", e)), Ordering::Relaxed);
            }
            pass.cont.store(cont, Ordering::Relaxed);
        }
        S::park(cpu);
        pass.barrier.wait();
        if !pass.cont.load(Ordering::Relaxed) {
            break;
        }
        let t0 = Instant::now();
        S::resume(cpu);
        let slice = pass.base.load(Ordering::Relaxed) + ctx.tid as u64 * size;
        let mut off = 0;
        while off < size {
            S::write(cpu, slice + off, 1).unwrap_or_else(|e| fatal("write", e));
            off += PAGE;
        }
        out.ops += size / PAGE;
        S::park(cpu);
        pass.barrier.wait();
        if leader {
            out.timed_ns += t0.elapsed().as_nanos() as u64;
            s.munmap(pass.base.load(Ordering::Relaxed), total).unwrap_or_else(|e| fatal("munmap", e));
        }
        it += 1;
    }
    S::resume(cpu);
    Ok(out)
}

/// The interfering thread of `interference`'s interfered mode: a thread of
/// the address space (the harness gives it a parked CPU, so the address
/// space counts as multithreaded) that only maps and unmaps.
pub fn mapper<S: Space>(s: &S, stop: &AtomicBool, size: u64) -> Result<u64, i32> {
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        let a = s.mmap(0, size, libc::PROT_READ, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, None, 0)?;
        s.munmap(a, size)?;
        n += 1;
    }
    Ok(n)
}

/// Runs pft; with `interfere`, one more thread of the address space loops
/// mmap/munmap of an unrelated region meanwhile (the `interference` workload).
pub fn run_passes(env: Option<&SoftEnv>, p: &Params, interfere: bool) -> Result<Measured, String> {
    let n = p.threads;
    let pass = Pass { barrier: Barrier::new(n), base: AtomicU64::new(0), cont: AtomicBool::new(false) };
    let size = p.size.div_ceil(PAGE) * PAGE;
    match env {
        Some(env) => {
            let s = env.space();
            let bg = |s: &SoftSpace, stop: &AtomicBool| mapper(s, stop, size);
            let background: Option<Background<SoftSpace>> = if interfere { Some(&bg) } else { None };
            let out = run_threads(&[&s], n, p.limit, |s, cpu, ctx| body(s, cpu, ctx, &pass, size), background)?;
            Ok(soft_measured(env.policy(), &out, &[&s]))
        }
        None => {
            let bg = |s: &HostSpace, stop: &AtomicBool| mapper(s, stop, size);
            let background: Option<Background<HostSpace>> = if interfere { Some(&bg) } else { None };
            let out = run_threads(&[&HostSpace], n, p.limit, |s, cpu, ctx| body(s, cpu, ctx, &pass, size), background)?;
            Ok(host_measured(&out))
        }
    }
}

pub fn run(env: Option<&SoftEnv>, p: &Params) -> Result<Measured, String> {
    run_passes(env, p, false)
}
