//! Parallel pinning (seed 004's ktask series, never merged into Linux): a
//! range cut into chunks that N worker threads take in turn from a shared
//! counter, as ktask's load balancing does, each chunk starting and ending
//! on a 2 MiB boundary (but for the range's own ends), so that no two workers
//! ever work in the same leaf table and contend on its PTE lock (the seed's
//! remark about split page-table locks). The chunks' pins are put back
//! together in address order; if any chunk fails, every pin is dropped.

use crate::error::Result;
use crate::mm::AddressSpace;
use crate::pgtable::PMD_SIZE;
use crate::sync::{AtomicUsize, Ordering};

use super::{take_range, PinStats, Request, Taken};

/// Chunks per worker: enough for workers finishing at different times to
/// even out (ktask's `KTASK_LOAD_BAL_SHIFT` of 2).
const CHUNKS_PER_THREAD: u64 = 4;

/// The chunk boundaries of `[start, end)` for `threads` workers.
fn chunks(start: u64, end: u64, threads: usize) -> Vec<(u64, u64)> {
    let len = end - start;
    let want = (len / (threads as u64 * CHUNKS_PER_THREAD)).max(1);
    let size = want.div_ceil(PMD_SIZE) * PMD_SIZE;
    let mut out = Vec::new();
    let mut a = start;
    while a < end {
        let b = ((a / PMD_SIZE + 1) * PMD_SIZE + (size - PMD_SIZE)).min(end);
        out.push((a, b));
        a = b;
    }
    out
}

/// Pins (or references) `req`'s range with `threads` workers.
pub(crate) fn take(mm: &AddressSpace, req: &Request, threads: usize) -> Result<super::Pages> {
    let chunks = chunks(req.start, req.end, threads);
    let next = AtomicUsize::new(0);
    let workers = threads.min(chunks.len()).max(1);
    let results: Vec<Result<Vec<(usize, Taken<'_>)>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| {
                    let _q = crate::tlb::QuiescentGuard::enter();
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&(a, b)) = chunks.get(i) else { return Ok(mine) };
                        let mut out = Taken::new(&mm.phys, req.pin, ((b - a) / crate::PAGE_SIZE) as usize);
                        take_range(mm, req, a, b, &mut out)?;
                        mine.push((i, out));
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    });
    let mut parts: Vec<(usize, Taken<'_>)> = Vec::with_capacity(chunks.len());
    let mut err = None;
    for r in results {
        match r {
            Ok(mine) => parts.extend(mine),
            Err(e) => err = err.or(Some(e)),
        }
    }
    if let Some(e) = err {
        return Err(e); // `parts` drop: every pin taken is released
    }
    parts.sort_by_key(|(i, _)| *i);
    let mut pfns = Vec::with_capacity(parts.iter().map(|(_, t)| t.pfns.len()).sum());
    let mut host = Vec::new();
    let mut stats = PinStats::default();
    for (_, mut t) in parts {
        let base = pfns.len();
        host.extend(t.host.drain(..).map(|(i, held)| (base + i, held)));
        pfns.append(&mut t.pfns);
        stats.add(&t.stats);
    }
    Ok((pfns, host, stats))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_range_and_meet_on_2mib_boundaries() {
        for (start, end, threads) in [
            (0x1000u64, 0x1000 + 100 * PMD_SIZE + 0x3000, 3usize),
            (0, PMD_SIZE, 4),
            (0x5000, 0x6000, 2),
            (PMD_SIZE - 0x1000, 3 * PMD_SIZE + 0x1000, 16),
        ] {
            let c = chunks(start, end, threads);
            assert_eq!(c.first().unwrap().0, start);
            assert_eq!(c.last().unwrap().1, end);
            for w in c.windows(2) {
                assert_eq!(w[0].1, w[1].0);
                assert_eq!(w[0].1 % PMD_SIZE, 0, "{c:x?}");
            }
            assert!(c.iter().all(|&(a, b)| a < b));
        }
        assert!(chunks(0, 64 * PMD_SIZE, 4).len() >= 4 * 4 - 1, "enough chunks to balance");
    }
}
