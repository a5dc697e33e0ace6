//! Fixed scenarios taken from the kernel selftests
//! (`tools/testing/selftests/mm/`), each named for the test it follows.

use super::*;

// ---------------------------------------------------------------------------
// Fixed scenarios from the kernel selftests
// ---------------------------------------------------------------------------

fn anon(addr: u64, len: u64, prot: i32, flags: i32) -> Op {
    Op::Mmap { addr, len, prot, flags: flags | MAP_ANONYMOUS, file: None, offset: 0 }
}
fn unmap(addr: u64, len: u64) -> Op {
    Op::Munmap { addr, len }
}
fn remap(old_addr: u64, old_len: u64, new_len: u64, flags: i32, new_addr: u64) -> Op {
    Op::Mremap { old_addr, old_len, new_len, flags, new_addr }
}
fn rd(addr: u64) -> Op {
    Op::Probe { addr, write: None }
}
fn wr(addr: u64, b: u8) -> Op {
    Op::Probe { addr, write: Some(b) }
}
fn mc(addr: u64, len: u64) -> Op {
    Op::Mincore { addr, len }
}

/// Same as [`kselftest_scenarios`], each with the name of the selftest case.
///
/// Addresses the selftests get from a no-hint mmap are written here as the
/// value Linux returns when `window.1` is the top of the free space (the
/// first op of those scenarios is that no-hint mmap, so a difference shows
/// up there first). Needs a window of at least 16 MiB with `window.1` 2 MiB
/// aligned.
pub fn kselftest_scenarios_named(window: (u64, u64)) -> Vec<(&'static str, Scenario)> {
    assert!(window.1 % PMD == 0 && window.1 - window.0 >= 16 << 20);
    let t = window.1;
    let p = PAGE;
    let priv_ = MAP_PRIVATE;
    let nr = MAP_PRIVATE | MAP_FIXED_NOREPLACE;
    let sc = |files: Vec<u64>, ops: Vec<Op>| Scenario { window, files, ops };
    let mut v = Vec::new();

    // map_fixed_noreplace.c
    let b = t - 5 * p;
    v.push((
        "map_fixed_noreplace",
        sc(
            vec![],
            vec![
                anon(0, 5 * p, PROT_NONE, priv_), // find_base_addr -> t - 5p
                unmap(b, 5 * p),
                anon(b, 5 * p, PROT_NONE, nr), // can map all we need
                unmap(b, 5 * p),
                anon(b + p, 3 * p, PROT_NONE, nr),     // middle: ok
                anon(b, 5 * p, PROT_NONE, nr),         // surrounding: EEXIST
                anon(b + p, 3 * p, PROT_NONE, nr),     // exact: EEXIST
                anon(b + 2 * p, p, PROT_NONE, nr),     // inside: EEXIST
                anon(b + 3 * p, 2 * p, PROT_NONE, nr), // overlap end: EEXIST
                anon(b, 2 * p, PROT_NONE, nr),         // overlap start: EEXIST
                anon(b, p, PROT_NONE, nr),             // adjacent before: ok (merges)
                anon(b + 4 * p, p, PROT_NONE, nr),     // adjacent after: ok (merges)
                unmap(b, 5 * p),
            ],
        ),
    ));

    // mremap_test.c: mremap_expand_merge
    let s = t - 3 * p;
    v.push((
        "mremap_expand_merge",
        sc(
            vec![],
            vec![
                anon(0, 3 * p, PROT_RW, priv_),
                unmap(s + p, p),
                remap(s, p, 2 * p, 0, 0), // expands into the hole, merges with the 3rd page
                wr(s + p, 7),
                rd(s + 2 * p),
                mc(s, 3 * p),
                unmap(s, 3 * p),
            ],
        ),
    ));

    // mremap_test.c: mremap_expand_merge_offset
    v.push((
        "mremap_expand_merge_offset",
        sc(
            vec![],
            vec![
                anon(0, 3 * p, PROT_RW, priv_),
                unmap(s + 2 * p, p),
                remap(s + p, p, 2 * p, 0, 0), // grows back into the last page, one VMA again
                unmap(s, 3 * p),
            ],
        ),
    ));

    // mremap_test.c: expected failures (overlapping, misaligned dst, misaligned src).
    let s1 = t - p;
    v.push((
        "mremap_expected_failures",
        sc(
            vec![],
            vec![
                anon(0, p, PROT_RW, MAP_SHARED),
                remap(s1, p, p, MREMAP_MAYMOVE | MREMAP_FIXED, s1), // overlapping: EINVAL
                remap(s1, p, p, MREMAP_MAYMOVE | MREMAP_FIXED, s1 - 8 * p + 1024), // dst misaligned
                remap(s1 + 1024, p, p, MREMAP_MAYMOVE | MREMAP_FIXED, s1 - 8 * p), // src misaligned
                remap(s1, p, p, MREMAP_FIXED, s1 - 8 * p),          // FIXED without MAYMOVE: EINVAL
            ],
        ),
    ));

    // mremap_test.c: remap_region with MAP_SHARED|MAP_ANONYMOUS sources at
    // several alignments, moved with MREMAP_MAYMOVE|MREMAP_FIXED.
    for &(name, src, size, dst) in &[
        ("mremap_8k_pte_to_pte", t - 64 * p, 2 * p, t - 32 * p),
        ("mremap_2m_1m_aligned_to_pte", t - 7 * (1 << 20), PMD, t - PMD - 3 * p),
        ("mremap_2m_1m_aligned_to_1m", t - 7 * (1 << 20), PMD, t - 3 * (1 << 20)),
        ("mremap_4m_pmd_to_pte", t - 6 * PMD, 2 * PMD, t - 2 * PMD - 5 * p),
        ("mremap_4m_pmd_to_1m", t - 6 * PMD, 2 * PMD, t - 2 * PMD - (1 << 20)),
        ("mremap_4m_pmd_to_pmd", t - 6 * PMD, 2 * PMD, t - 2 * PMD),
    ] {
        v.push((
            name,
            sc(
                vec![],
                vec![
                    anon(src, size, PROT_RW, MAP_SHARED | MAP_FIXED_NOREPLACE),
                    wr(src, 0x11),
                    wr(src + size - 1, 0x22),
                    wr(src + size / 2 + 5, 0x33),
                    remap(src, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, dst),
                    rd(dst),
                    rd(dst + size - 1),
                    rd(dst + size / 2 + 5),
                    rd(src),
                    mc(dst, size.min(4 * p)),
                    mc(dst - p, size + p), // starts in a hole: ENOMEM
                    unmap(dst, size),
                    unmap(src, size),
                ],
            ),
        ));
    }

    // Expand in place (free space above), blocked expand -> ENOMEM, then MAYMOVE moves.
    let a = t - 20 * p;
    v.push((
        "mremap_expand_in_place_and_blocked",
        sc(
            vec![],
            vec![
                anon(a, 2 * p, PROT_RW, nr),
                wr(a, 1),
                remap(a, 2 * p, 6 * p, 0, 0), // in place
                rd(a + 5 * p),
                anon(a + 6 * p, p, PROT_READ, nr),         // blocker right above
                remap(a, 6 * p, 8 * p, 0, 0),              // ENOMEM
                remap(a, 6 * p, 8 * p, MREMAP_MAYMOVE, 0), // moves: top-down
                rd(a),
                mc(t - 8 * p, 8 * p),
            ],
        ),
    ));
    let s4 = t - 4 * p;
    let s2 = t - 6 * p;
    v.push((
        "mremap_expand_blocked_maymove",
        sc(
            vec![],
            vec![
                anon(0, 4 * p, PROT_RW, priv_),
                anon(0, 2 * p, PROT_RW, priv_), // right below; merges with the first
                anon(0, p, PROT_READ, priv_),   // different prot: separate VMA below
                Op::Mprotect { addr: s4, len: 4 * p, prot: PROT_READ }, // split off; merges with nothing above
                wr(s2, 0x5a),
                remap(s2, 2 * p, 4 * p, 0, 0),              // blocked by s4: ENOMEM
                remap(s2, 2 * p, 4 * p, MREMAP_MAYMOVE, 0), // moves
                rd(s2),
            ],
        ),
    ));

    // Shrink.
    let s8 = t - 8 * p;
    v.push((
        "mremap_shrink",
        sc(
            vec![],
            vec![
                anon(0, 8 * p, PROT_RW, priv_),
                wr(t - p, 9),
                wr(s8, 8),
                remap(s8, 8 * p, 3 * p, 0, 0),
                rd(t - p),
                rd(s8),
                remap(s8, 3 * p, 3 * p, MREMAP_MAYMOVE, 0), // same size: no-op
                remap(s8 + p, 2 * p, p, MREMAP_MAYMOVE, 0), // shrink a tail part: splits
                mc(s8, 3 * p),
            ],
        ),
    ));

    // mremap FIXED over an existing mapping (mremap_dontunmap.c also does this).
    let d5 = t - 5 * p;
    let s5 = t - 10 * p;
    v.push((
        "mremap_fixed_over_existing",
        sc(
            vec![],
            vec![
                anon(0, 5 * p, PROT_RW, priv_),
                wr(d5, b'X'),
                anon(0, 5 * p, PROT_RW, priv_), // merges with the dest VMA
                wr(s5, b'a'),
                remap(s5, 5 * p, 5 * p, MREMAP_MAYMOVE | MREMAP_FIXED, d5),
                rd(d5),
                rd(s5),
            ],
        ),
    ));

    // mremap_dontunmap.c
    v.push((
        "mremap_dontunmap_simple",
        sc(
            vec![],
            vec![
                anon(0, 5 * p, PROT_RW, priv_),
                wr(d5, b'a'),
                wr(d5 + 4 * p, b'a'),
                remap(d5, 5 * p, 5 * p, MREMAP_DONTUNMAP | MREMAP_MAYMOVE, 0),
                rd(s5),
                rd(s5 + 4 * p),
                rd(d5),
                rd(d5 + 4 * p),
                mc(s5, 10 * p),
                unmap(s5, 5 * p),
                unmap(d5, 5 * p),
            ],
        ),
    ));
    v.push((
        "mremap_dontunmap_simple_shmem",
        sc(
            vec![5 * p],
            vec![
                Op::Mmap { addr: 0, len: 5 * p, prot: PROT_RW, flags: MAP_SHARED, file: Some(0), offset: 0 },
                wr(d5, b'a'),
                remap(d5, 5 * p, 5 * p, MREMAP_DONTUNMAP | MREMAP_MAYMOVE, 0),
                rd(s5),
                rd(d5), // shmem: the source still shows the file's data
                rd(d5 + p),
                unmap(s5, 5 * p),
                unmap(d5, 5 * p),
            ],
        ),
    ));
    v.push((
        "mremap_dontunmap_simple_fixed",
        sc(
            vec![],
            vec![
                anon(0, 5 * p, PROT_RW, priv_), // dest at t - 5p
                wr(d5, b'X'),
                anon(0, 5 * p, PROT_RW, priv_), // source at t - 10p, merges with dest
                wr(s5, b'a'),
                remap(s5, 5 * p, 5 * p, MREMAP_FIXED | MREMAP_DONTUNMAP | MREMAP_MAYMOVE, d5),
                rd(d5),
                rd(s5),
                unmap(d5, 5 * p),
                unmap(s5, 5 * p),
            ],
        ),
    ));
    let s10 = t - 10 * p;
    v.push((
        "mremap_dontunmap_partial_mapping",
        sc(
            vec![],
            vec![
                anon(0, 10 * p, PROT_RW, priv_),
                wr(s10, b'a'),
                wr(s10 + 5 * p, b'a'),
                wr(s10 + 9 * p, b'a'),
                remap(s10 + 5 * p, 5 * p, 5 * p, MREMAP_DONTUNMAP | MREMAP_MAYMOVE, 0),
                rd(s10),
                rd(s10 + 5 * p),
                rd(s10 - 5 * p),
                rd(s10 - p),
                unmap(s10 - 5 * p, 5 * p),
                unmap(s10, 10 * p),
            ],
        ),
    ));
    let src5 = t - 5 * p;
    let dst10 = t - 15 * p;
    v.push((
        "mremap_dontunmap_partial_mapping_overwrite",
        sc(
            vec![],
            vec![
                anon(0, 5 * p, PROT_RW, priv_),
                wr(src5, b'a'),
                anon(0, 10 * p, PROT_RW, priv_), // merges with src
                wr(dst10, b'X'),
                wr(dst10 + 5 * p, b'X'),
                remap(src5, 5 * p, 5 * p, MREMAP_DONTUNMAP | MREMAP_MAYMOVE | MREMAP_FIXED, dst10),
                rd(src5),
                rd(dst10),
                rd(dst10 + 5 * p),
                unmap(dst10, 10 * p),
                unmap(src5, 5 * p),
            ],
        ),
    ));
    v
}

/// The cases of the kernel selftests `map_fixed_noreplace.c`,
/// `mremap_test.c` and `mremap_dontunmap.c`, rewritten as scenarios
/// (see [`kselftest_scenarios_named`] for their names).
pub fn kselftest_scenarios(window: (u64, u64)) -> Vec<Scenario> {
    kselftest_scenarios_named(window).into_iter().map(|(_, s)| s).collect()
}
