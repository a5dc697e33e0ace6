//! will-it-scale's `page_fault1-3` and `mmap1-2`: each task loops { map
//! `size` bytes, write one byte per page (page_fault only), unmap }.
//! page_fault1/mmap1 map anonymous private memory, page_fault2/mmap2 a
//! private file mapping, page_fault3 a shared one; each task has its own file.
//! `threads` mode: tasks are threads of one address space; `processes`: one
//! address space per task (forked processes on the host).

use softmm::{File, OpenFile};

use super::harness::{run_processes, run_threads, TaskCtx, TaskOut};
use super::space::{close_files, host_file, HostSpace, Space, PAGE};
use super::{host_measured, soft_measured, Measured, Params, SoftEnv, Workload};

#[derive(Clone, Copy)]
struct Pattern {
    flags: i32,
    file: bool,
    touch: bool,
}

fn pattern(w: Workload) -> Pattern {
    let (flags, file, touch) = match w {
        Workload::PageFault1 => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, false, true),
        Workload::PageFault2 => (libc::MAP_PRIVATE, true, true),
        Workload::PageFault3 => (libc::MAP_SHARED, true, true),
        Workload::Mmap1 => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, false, false),
        Workload::Mmap2 => (libc::MAP_PRIVATE, true, false),
        _ => unreachable!("not a will-it-scale map workload"),
    };
    Pattern { flags, file, touch }
}

/// The task loop. Allocation-free: it runs in forked children.
fn body<S: Space>(
    s: &S,
    cpu: &mut S::Cpu,
    ctx: &TaskCtx,
    pat: Pattern,
    size: u64,
    files: &[S::File],
) -> Result<TaskOut, i32> {
    let file = if pat.file { files.get(ctx.tid) } else { None };
    let mut out = TaskOut::default();
    let mut it = 0;
    while ctx.more(it) {
        let a = s.mmap(0, size, libc::PROT_READ | libc::PROT_WRITE, pat.flags, file, 0)?;
        if pat.touch {
            let mut off = 0;
            while off < size {
                S::write(cpu, a + off, 0)?;
                off += PAGE;
            }
            out.ops += size / PAGE;
        } else {
            out.ops += 1;
        }
        s.munmap(a, size)?;
        it += 1;
    }
    Ok(out)
}

pub fn run(w: Workload, env: Option<&SoftEnv>, p: &Params) -> Result<Measured, String> {
    let n = p.threads;
    let pat = pattern(w);
    let size = p.size.div_ceil(PAGE) * PAGE;
    let processes = p.mode == "processes";
    match env {
        Some(env) => {
            let files: Vec<OpenFile> = if pat.file {
                (0..n)
                    .map(|i| {
                        File::create(&env.phys, &format!("/tmp/{}-{i}", w.name()), size)
                            .map(|f| OpenFile::read_write(&f))
                            .map_err(|e| format!("File::create: {e}"))
                    })
                    .collect::<Result<_, _>>()?
            } else {
                Vec::new()
            };
            let spaces: Vec<_> = (0..if processes { n } else { 1 }).map(|_| env.space()).collect();
            let refs: Vec<_> = spaces.iter().collect();
            let out = run_threads(&refs, n, p.limit, |s, cpu, ctx| body(s, cpu, ctx, pat, size, &files), None)?;
            Ok(soft_measured(env.policy(), &out, &refs))
        }
        None => {
            let files: Vec<i32> = if pat.file {
                (0..n).map(|_| host_file(size, w.name())).collect::<Result<_, _>>()?
            } else {
                Vec::new()
            };
            let out = if processes {
                run_processes(n, p.limit, |s, cpu, ctx| body(s, cpu, ctx, pat, size, &files))
            } else {
                run_threads(&[&HostSpace], n, p.limit, |s, cpu, ctx| body(s, cpu, ctx, pat, size, &files), None)
            };
            close_files(&files);
            Ok(host_measured(&out?))
        }
    }
}
