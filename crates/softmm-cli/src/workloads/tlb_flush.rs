//! will-it-scale's `tlb_flush1-3`: each task owns a small anonymous region
//! and, page after page, writes a byte, drops the page with
//! `MADV_DONTNEED` (a TLB shootdown to every other CPU of the address space)
//! and checks that it reads back zero. One operation is one page.

use super::harness::{run_processes, run_threads, TaskCtx, TaskOut};
use super::space::{HostSpace, Space, PAGE};
use super::{host_measured, soft_measured, Measured, Params, SoftEnv};

/// Bytes of each task's region: `size`, at most 1 MiB.
pub fn region(size: u64) -> u64 {
    size.clamp(PAGE, 1 << 20).div_ceil(PAGE) * PAGE
}

/// The task loop. Allocation-free: it runs in forked children.
fn body<S: Space>(s: &S, cpu: &mut S::Cpu, ctx: &TaskCtx, len: u64) -> Result<TaskOut, i32> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    let base = s.mmap(0, len, libc::PROT_READ | libc::PROT_WRITE, flags, None, 0)?;
    let pages = len / PAGE;
    let mut out = TaskOut::default();
    let mut it = 0;
    while ctx.more(it) {
        let a = base + (it % pages) * PAGE;
        S::write(cpu, a, 1)?;
        s.madvise(a, PAGE, libc::MADV_DONTNEED)?;
        if S::read(cpu, a)? != 0 {
            return Err(libc::EIO);
        }
        out.ops += 1;
        it += 1;
    }
    s.munmap(base, len)?;
    Ok(out)
}

pub fn run(env: Option<&SoftEnv>, p: &Params) -> Result<Measured, String> {
    let n = p.threads;
    let len = region(p.size);
    let processes = p.mode == "processes";
    match env {
        Some(env) => {
            let spaces: Vec<_> = (0..if processes { n } else { 1 }).map(|_| env.space()).collect();
            let refs: Vec<_> = spaces.iter().collect();
            let out = run_threads(&refs, n, p.limit, |s, cpu, ctx| body(s, cpu, ctx, len), None)?;
            Ok(soft_measured(env.policy(), &out, &refs))
        }
        None => {
            let out = if processes {
                run_processes(n, p.limit, |s, cpu, ctx| body(s, cpu, ctx, len))?
            } else {
                run_threads(&[&HostSpace], n, p.limit, |s, cpu, ctx| body(s, cpu, ctx, len), None)?
            };
            Ok(host_measured(&out))
        }
    }
}
