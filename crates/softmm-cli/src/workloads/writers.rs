//! Address-space writers that change VMAs in place, for the writer
//! policies' range `madvise` and `mremap` paths (issue 32): each thread
//! owns a small anonymous mapping and loops on one page of it.
//!
//! * `madvise-flags`: `MADV_DONTFORK` then `MADV_DOFORK` on the middle page
//!   of a 3-page VMA: a split in three and a merge back per operation.
//! * `mremap-move`: `mremap(MREMAP_MAYMOVE | MREMAP_FIXED)` of the last
//!   page of a 2-page VMA onto the hole above it and back: a move that
//!   splits the VMA and a move that merges it again per operation (the
//!   moved page keeps its offset, so it merges only back in its place).
//!
//! Each thread's mapping is 5 pages with its first and last pages
//! unmapped again, so that its VMAs never touch a neighbour's (which Linux
//! placement puts next to it) nor the end of a placement arena's window.
//! Threads of one address space only (`threads` mode).

use super::harness::{run_threads, TaskCtx, TaskOut};
use super::space::{HostSpace, Space, PAGE};
use super::{host_measured, soft_measured, Measured, Params, SoftEnv, Workload};

/// Bytes each thread maps; pages 0 and 4 are unmapped again.
const SPAN: u64 = 5 * PAGE;

/// A thread's mapping (`SPAN` bytes at `base`) and what its operation
/// does there.
#[derive(Clone, Copy)]
pub struct Region {
    base: u64,
    workload: Workload,
}

impl Region {
    /// Maps the thread's region for `w` (`madvise-flags`: pages 1-3 mapped;
    /// `mremap-move`: pages 1-2, page 2 written with 1).
    pub fn new<S: Space>(s: &S, cpu: &mut S::Cpu, w: Workload) -> Result<Region, i32> {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        let base = s.mmap(0, SPAN, libc::PROT_READ | libc::PROT_WRITE, flags, None, 0)?;
        s.munmap(base, PAGE)?;
        s.munmap(base + 4 * PAGE, PAGE)?;
        if w == Workload::MremapMove {
            s.munmap(base + 3 * PAGE, PAGE)?;
            S::write(cpu, base + 2 * PAGE, 1)?;
        }
        Ok(Region { base, workload: w })
    }

    /// The first half of an operation: the split (`MADV_DONTFORK` on page
    /// 2; page 2 moved onto page 3).
    pub fn split<S: Space>(&self, s: &S) -> Result<(), i32> {
        let page = self.base + 2 * PAGE;
        match self.workload {
            Workload::MremapMove => self.moved(s, page, page + PAGE),
            _ => s.madvise(page, PAGE, libc::MADV_DONTFORK),
        }
    }

    /// The second half: the merge back (`MADV_DOFORK`; the page moved back).
    pub fn merge<S: Space>(&self, s: &S) -> Result<(), i32> {
        let page = self.base + 2 * PAGE;
        match self.workload {
            Workload::MremapMove => self.moved(s, page + PAGE, page),
            _ => s.madvise(page, PAGE, libc::MADV_DOFORK),
        }
    }

    fn moved<S: Space>(&self, s: &S, from: u64, to: u64) -> Result<(), i32> {
        let flags = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED;
        match s.mremap(from, PAGE, PAGE, flags, to)? {
            got if got == to => Ok(()),
            _ => Err(libc::EIO),
        }
    }

    /// After whole operations: the moved page still holds its byte; the
    /// region unmapped.
    pub fn finish<S: Space>(self, s: &S, cpu: &mut S::Cpu) -> Result<(), i32> {
        if self.workload == Workload::MremapMove && S::read(cpu, self.base + 2 * PAGE)? != 1 {
            return Err(libc::EIO);
        }
        s.munmap(self.base, SPAN)
    }
}

/// The task loop. Allocation-free.
fn body<S: Space>(s: &S, cpu: &mut S::Cpu, ctx: &TaskCtx, w: Workload) -> Result<TaskOut, i32> {
    let r = Region::new(s, cpu, w)?;
    let mut out = TaskOut::default();
    let mut it = 0;
    while ctx.more(it) {
        r.split(s)?;
        r.merge(s)?;
        out.ops += 1;
        it += 1;
    }
    r.finish(s, cpu)?;
    Ok(out)
}

pub fn run(w: Workload, env: Option<&SoftEnv>, p: &Params) -> Result<Measured, String> {
    let n = p.threads;
    match env {
        Some(env) => {
            let space = env.space();
            let out = run_threads(&[&space], n, p.limit, |s, cpu, ctx| body(s, cpu, ctx, w), None)?;
            Ok(soft_measured(env.policy(), &out, &[&space]))
        }
        None => Ok(host_measured(&run_threads(&[&HostSpace], n, p.limit, |s, cpu, ctx| body(s, cpu, ctx, w), None)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::space::SoftSpace;
    use softmm::{AddressSpace, MmConfig, PhysConfig, PhysMem, PlacementPolicy, WriterPolicy};

    /// The VMAs inside `[lo, hi)` of this process (`/proc/self/maps`), as
    /// offsets from `lo`.
    fn host_spans(lo: u64, hi: u64) -> Vec<(u64, u64)> {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines()
            .filter_map(|l| {
                let (s, e) = l.split_whitespace().next()?.split_once('-')?;
                Some((u64::from_str_radix(s, 16).ok()?, u64::from_str_radix(e, 16).ok()?))
            })
            .filter(|&(s, e)| s >= lo && e <= hi)
            .map(|(s, e)| (s - lo, e - lo))
            .collect()
    }

    fn soft_spans(mm: &AddressSpace, lo: u64, hi: u64) -> Vec<(u64, u64)> {
        mm.maps().iter().filter(|e| e.start >= lo && e.end <= hi).map(|e| (e.start - lo, e.end - lo)).collect()
    }

    /// The region's VMAs after it is made, after the split and after the
    /// merge, twice, on `s`.
    fn steps<S: Space>(s: &S, w: Workload, spans: impl Fn(u64, u64) -> Vec<(u64, u64)>) -> Vec<Vec<(u64, u64)>> {
        let mut cpu = s.cpu();
        let r = Region::new(s, &mut cpu, w).unwrap();
        let at = || spans(r.base, r.base + SPAN);
        let mut out = vec![at()];
        for _ in 0..2 {
            r.split(s).unwrap();
            out.push(at());
            r.merge(s).unwrap();
            out.push(at());
        }
        r.finish(s, &mut cpu).unwrap();
        out
    }

    /// Each workload's operation on the host and on softmm, under `short`
    /// and `range` (Linux placement and arenas): the same VMAs after each
    /// half (a split and a merge), the moved page's byte kept; under
    /// `range` every call a range write.
    fn the_op_matches_the_host(w: Workload, want: &[&[(u64, u64)]]) {
        let host = steps(&HostSpace, w, host_spans);
        assert_eq!(host, want, "{} on the host", w.name());
        for (policy, placement) in [
            (WriterPolicy::Short, PlacementPolicy::Linux),
            (WriterPolicy::Range, PlacementPolicy::Linux),
            (WriterPolicy::Range, PlacementPolicy::Arenas),
        ] {
            let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
            let config = MmConfig::default().writer_policy(policy).placement(placement);
            let space = SoftSpace { mm: AddressSpace::new(&phys, config).unwrap() };
            let got = steps(&space, w, |lo, hi| soft_spans(&space.mm, lo, hi));
            assert_eq!(got, host, "{} under {policy:?} {placement:?}", w.name());
            let range = space.mm.stats().range;
            if policy == WriterPolicy::Range {
                assert_eq!(range.fallbacks, 0, "{} under {placement:?}: {range:?}", w.name());
                assert!(range.writes >= 4, "{} under {placement:?}: {range:?}", w.name());
            }
        }
    }

    #[test]
    fn madvise_flags_splits_and_merges_as_on_the_host() {
        let (whole, split): (&[_], &[_]) =
            (&[(PAGE, 4 * PAGE)], &[(PAGE, 2 * PAGE), (2 * PAGE, 3 * PAGE), (3 * PAGE, 4 * PAGE)]);
        the_op_matches_the_host(Workload::MadviseFlags, &[whole, split, whole, split, whole]);
    }

    #[test]
    fn mremap_move_splits_and_merges_as_on_the_host() {
        let (whole, moved): (&[_], &[_]) = (&[(PAGE, 3 * PAGE)], &[(PAGE, 2 * PAGE), (3 * PAGE, 4 * PAGE)]);
        the_op_matches_the_host(Workload::MremapMove, &[whole, moved, whole, moved, whole]);
    }
}
