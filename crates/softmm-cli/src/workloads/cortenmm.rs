//! The CortenMM microbenchmarks on 16 KiB regions, each an operation timed
//! on its own:
//!
//! * `mmap` — map a free 16 KiB region (unmapped again, untimed, in batches);
//! * `mmap-pf` — map it and write its 4 pages;
//! * `pf` — write the 4 pages of a region of a mapping made beforehand
//!   (dropped again, untimed, with `MADV_DONTNEED` in batches);
//! * `unmap-virt` — unmap a mapped, never touched region (mapped untimed);
//! * `unmap` — unmap a populated region (mapped and written untimed).
//!
//! `-low`: each thread works on a private 4 MiB area (areas 4 MiB apart, so
//! they share no page table); `-high`: all threads pick random regions of one
//! shared area. A region is claimed by a thread before it is used, so two
//! threads never work on the same region at once. Free regions are holes in
//! the address space, filled with `MAP_FIXED_NOREPLACE`: on the host, a region
//! something else mapped meanwhile is skipped, never overwritten.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Instant;

use super::harness::{run_threads, TaskCtx, TaskOut};
use super::space::{HostSpace, Space, PAGE};
use super::{host_measured, soft_measured, Measured, Params, SoftEnv};

/// Bytes of one region.
const CHUNK: u64 = 16 << 10;
/// Regions per thread.
const CHUNKS: u64 = 256;
/// Bytes of each thread's area (and its share of the shared one).
pub const REGION: u64 = CHUNK * CHUNKS;
/// Distance between private areas.
const STRIDE: u64 = 2 * REGION;
/// Regions handled per untimed clean-up.
const BATCH: usize = 64;
const HUGE: u64 = 2 << 20;

const FREE: u8 = 0;
const BUSY: u8 = 1;
const LOST: u8 = 2;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Mmap,
    MmapPf,
    Pf,
    UnmapVirt,
    Unmap,
}

fn parse(mode: &str) -> Result<(Op, bool), String> {
    let (op, level) = mode.rsplit_once('-').ok_or_else(|| format!("unknown cortenmm mode {mode}"))?;
    let op = match op {
        "mmap" => Op::Mmap,
        "mmap-pf" => Op::MmapPf,
        "pf" => Op::Pf,
        "unmap-virt" => Op::UnmapVirt,
        "unmap" => Op::Unmap,
        _ => return Err(format!("unknown cortenmm operation in {mode}")),
    };
    match level {
        "low" => Ok((op, false)),
        "high" => Ok((op, true)),
        _ => Err(format!("unknown cortenmm contention in {mode}")),
    }
}

struct Layout {
    base: u64,
    high: bool,
    ntasks: u64,
    states: Vec<AtomicU8>,
}

impl Layout {
    fn span(high: bool, ntasks: u64) -> u64 {
        if high {
            ntasks * REGION
        } else {
            ntasks * STRIDE
        }
    }

    fn addr(&self, idx: u64) -> u64 {
        if self.high {
            self.base + idx * CHUNK
        } else {
            self.base + (idx / CHUNKS) * STRIDE + (idx % CHUNKS) * CHUNK
        }
    }

    /// The areas to map for `pf`: one shared one, or one per thread.
    fn areas(&self) -> Vec<(u64, u64)> {
        if self.high {
            vec![(self.base, self.ntasks * REGION)]
        } else {
            (0..self.ntasks).map(|t| (self.base + t * STRIDE, REGION)).collect()
        }
    }
}

struct Picker {
    rng: u64,
    cursor: u64,
}

impl Picker {
    /// Claims a free region.
    fn pick(&mut self, lay: &Layout, tid: usize) -> Result<u64, i32> {
        let total = lay.ntasks * CHUNKS;
        for _ in 0..4 * total {
            let idx = if lay.high {
                // xorshift64
                self.rng ^= self.rng << 13;
                self.rng ^= self.rng >> 7;
                self.rng ^= self.rng << 17;
                self.rng % total
            } else {
                self.cursor += 1;
                tid as u64 * CHUNKS + self.cursor % CHUNKS
            };
            if lay.states[idx as usize].compare_exchange(FREE, BUSY, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                return Ok(idx);
            }
        }
        Err(libc::ENOSPC)
    }
}

fn touch<S: Space>(cpu: &mut S::Cpu, a: u64) -> Result<(), i32> {
    let mut off = 0;
    while off < CHUNK {
        S::write(cpu, a + off, 1)?;
        off += PAGE;
    }
    Ok(())
}

fn release(lay: &Layout, idx: u64) {
    lay.states[idx as usize].store(FREE, Ordering::Release);
}

/// Maps region `idx` into its hole; `Ok(false)` if something else is there.
fn map_region<S: Space>(s: &S, lay: &Layout, idx: u64) -> Result<bool, i32> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE;
    match s.mmap(lay.addr(idx), CHUNK, libc::PROT_READ | libc::PROT_WRITE, flags, None, 0) {
        Ok(a) if a == lay.addr(idx) => Ok(true),
        Ok(a) => {
            // A kernel without MAP_FIXED_NOREPLACE treats it as a hint.
            s.munmap(a, CHUNK)?;
            lay.states[idx as usize].store(LOST, Ordering::Release);
            Ok(false)
        }
        Err(libc::EEXIST) => {
            lay.states[idx as usize].store(LOST, Ordering::Release);
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

fn body<S: Space>(s: &S, cpu: &mut S::Cpu, ctx: &TaskCtx, lay: &Layout, op: Op) -> Result<TaskOut, i32> {
    let mut out = TaskOut { timed: true, ..TaskOut::default() };
    let mut picker = Picker { rng: 0x9e37_79b9_7f4a_7c15 ^ ((ctx.tid as u64 + 1) * 0x2545_f491_4f6c_dd1d), cursor: 0 };
    let mut batch = [0u64; BATCH];
    let mut nb = 0;
    let mut it = 0;
    while ctx.more(it) {
        match op {
            Op::Mmap | Op::MmapPf => {
                let idx = picker.pick(lay, ctx.tid)?;
                let t0 = Instant::now();
                if !map_region(s, lay, idx)? {
                    continue;
                }
                if op == Op::MmapPf {
                    touch::<S>(cpu, lay.addr(idx))?;
                }
                out.timed_ns += t0.elapsed().as_nanos() as u64;
                batch[nb] = idx;
                nb += 1;
                if nb == BATCH {
                    for &idx in &batch {
                        s.munmap(lay.addr(idx), CHUNK)?;
                        release(lay, idx);
                    }
                    nb = 0;
                }
            }
            Op::Pf => {
                let idx = picker.pick(lay, ctx.tid)?;
                let t0 = Instant::now();
                touch::<S>(cpu, lay.addr(idx))?;
                out.timed_ns += t0.elapsed().as_nanos() as u64;
                batch[nb] = idx;
                nb += 1;
                if nb == BATCH {
                    for &idx in &batch {
                        s.madvise(lay.addr(idx), CHUNK, libc::MADV_DONTNEED)?;
                        release(lay, idx);
                    }
                    nb = 0;
                }
            }
            Op::UnmapVirt | Op::Unmap => {
                while nb < BATCH {
                    let idx = picker.pick(lay, ctx.tid)?;
                    if map_region(s, lay, idx)? {
                        if op == Op::Unmap {
                            touch::<S>(cpu, lay.addr(idx))?;
                        }
                        batch[nb] = idx;
                        nb += 1;
                    }
                }
                nb -= 1;
                let idx = batch[nb];
                let t0 = Instant::now();
                s.munmap(lay.addr(idx), CHUNK)?;
                out.timed_ns += t0.elapsed().as_nanos() as u64;
                release(lay, idx);
            }
        }
        out.ops += 1;
        it += 1;
    }
    for &idx in &batch[..nb] {
        if op != Op::Pf {
            s.munmap(lay.addr(idx), CHUNK)?;
        }
        release(lay, idx);
    }
    Ok(out)
}

fn run_on<S: Space>(s: &S, p: &Params) -> Result<super::harness::RunOut, String> {
    let (op, high) = parse(p.mode)?;
    let n = p.threads as u64;
    let span = Layout::span(high, n);
    let err = |what: &str, e: i32| format!("cortenmm {what}: {}", std::io::Error::from_raw_os_error(e));
    // Find free address space: reserve, align, release.
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    let r = s.mmap(0, span + HUGE, libc::PROT_NONE, flags, None, 0).map_err(|e| err("reserve", e))?;
    s.munmap(r, span + HUGE).map_err(|e| err("release", e))?;
    let base = r.div_ceil(HUGE) * HUGE;
    let lay = Layout { base, high, ntasks: n, states: (0..n * CHUNKS).map(|_| AtomicU8::new(FREE)).collect() };
    let areas = if op == Op::Pf { lay.areas() } else { Vec::new() };
    for &(a, len) in &areas {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE;
        s.mmap(a, len, libc::PROT_READ | libc::PROT_WRITE, flags, None, 0).map_err(|e| err("mmap", e))?;
    }
    let out = run_threads(&[s], p.threads, p.limit, |s, cpu, ctx| body(s, cpu, ctx, &lay, op), None);
    for &(a, len) in &areas {
        s.munmap(a, len).map_err(|e| err("munmap", e))?;
    }
    out
}

pub fn run(env: Option<&SoftEnv>, p: &Params) -> Result<Measured, String> {
    match env {
        Some(env) => {
            let s = env.space();
            let out = run_on(&s, p)?;
            Ok(soft_measured(env.policy(), &out, &[&s]))
        }
        None => Ok(host_measured(&run_on(&HostSpace, p)?)),
    }
}
