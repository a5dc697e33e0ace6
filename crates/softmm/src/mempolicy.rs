//! NUMA memory policies (Linux's `mm/mempolicy.c`): which node a new page
//! comes from.
//!
//! A policy is set for a whole address space (`set_mempolicy`, Linux's task
//! policy: softmm's threads share one) or for a range of VMAs (`mbind`); a
//! VMA's policy wins over the address space's, which wins over the default
//! (allocate on the local node). softmm has no CPU topology: every thread
//! counts as running on node 0, so "local" is node 0.
//!
//! Interleaving picks the node from the page's linear index (the VMA's
//! `pgoff` plus its page offset in the VMA), for VMA and address-space
//! policies alike, as Linux's `get_vma_policy` does since 6.8: the fault path
//! writes no shared round-robin counter.
//!
//! The policies are immutable values behind an `Arc`: a VMA holds its own,
//! the address space publishes its own through an epoch-protected pointer
//! (see [`crate::mm`]), so a lock-free fault reads either without a lock.

use crate::error::{Errno, Result};
use crate::phys::{NodeMask, Placement};

/// `MPOL_DEFAULT`: the address space's policy, or local allocation.
pub const MPOL_DEFAULT: i32 = 0;
/// `MPOL_PREFERRED`: the first node of the mask first, then any node.
pub const MPOL_PREFERRED: i32 = 1;
/// `MPOL_BIND`: only the nodes of the mask.
pub const MPOL_BIND: i32 = 2;
/// `MPOL_INTERLEAVE`: the nodes of the mask in turn, by page index.
pub const MPOL_INTERLEAVE: i32 = 3;
/// `MPOL_LOCAL`: the local node first.
pub const MPOL_LOCAL: i32 = 4;
/// `MPOL_PREFERRED_MANY`: the nodes of the mask first, then any node.
pub const MPOL_PREFERRED_MANY: i32 = 5;
/// `MPOL_WEIGHTED_INTERLEAVE`: interleave by node weights (all weights are
/// 1 in softmm, so it is `MPOL_INTERLEAVE`).
pub const MPOL_WEIGHTED_INTERLEAVE: i32 = 6;
/// One past the last mode.
pub const MPOL_MAX: i32 = 7;

/// Mode flag: the mask is not remapped when the allowed nodes change.
pub const MPOL_F_STATIC_NODES: i32 = 1 << 15;
/// Mode flag: the mask is relative to the allowed nodes.
pub const MPOL_F_RELATIVE_NODES: i32 = 1 << 14;
/// Mode flag: NUMA balancing for `MPOL_BIND`/`MPOL_PREFERRED_MANY`.
pub const MPOL_F_NUMA_BALANCING: i32 = 1 << 13;
const MPOL_MODE_FLAGS: i32 = MPOL_F_STATIC_NODES | MPOL_F_RELATIVE_NODES | MPOL_F_NUMA_BALANCING;

/// `mbind` flag: fail with `EIO` if a page of the range is misplaced.
pub const MPOL_MF_STRICT: u32 = 1 << 0;
/// `mbind`/`move_pages` flag: move the pages mapped only by this address space.
pub const MPOL_MF_MOVE: u32 = 1 << 1;
/// `mbind`/`move_pages` flag: move every page, shared ones too.
pub const MPOL_MF_MOVE_ALL: u32 = 1 << 2;
/// The `mbind` flags a caller may pass.
pub(crate) const MPOL_MF_VALID: u32 = MPOL_MF_STRICT | MPOL_MF_MOVE | MPOL_MF_MOVE_ALL;

/// The node every softmm thread runs on (no CPU topology).
pub(crate) const LOCAL_NODE: usize = 0;

/// `get_mempolicy` flag: return the node (of the page at `addr` with
/// [`MPOL_F_ADDR`]) instead of the mode.
pub const MPOL_F_NODE: u32 = 1 << 0;
/// `get_mempolicy` flag: the policy of the VMA at `addr`, not the address
/// space's.
pub const MPOL_F_ADDR: u32 = 1 << 1;
/// `get_mempolicy` flag: the nodes a policy may use (every node of the
/// arena: softmm has no cpusets).
pub const MPOL_F_MEMS_ALLOWED: u32 = 1 << 2;

/// A memory policy other than the default (Linux's `struct mempolicy`; the
/// default is `None` wherever a policy is held).
#[derive(Debug, Clone, Eq)]
pub(crate) struct MemPolicy {
    /// `MPOL_*`, never `MPOL_DEFAULT`.
    pub(crate) mode: i32,
    /// `MPOL_F_*` mode flags.
    pub(crate) flags: i32,
    /// The nodes after `mpol_set_nodemask` (empty for `MPOL_LOCAL`; one node
    /// for `MPOL_PREFERRED`).
    pub(crate) nodes: NodeMask,
    /// The mask as the caller gave it, kept (and reported by
    /// `get_mempolicy`) under `MPOL_F_STATIC_NODES` or
    /// `MPOL_F_RELATIVE_NODES` (Linux's `w.user_nodemask`); empty otherwise.
    pub(crate) user_nodes: NodeMask,
}

/// Linux's `mpol_equal`: two policies are the same (and their VMAs may
/// merge) when mode and flags are, the masks the caller gave are where they
/// are kept, and the effective nodes are (every `MPOL_LOCAL` is the same).
impl PartialEq for MemPolicy {
    fn eq(&self, other: &MemPolicy) -> bool {
        self.mode == other.mode
            && self.flags == other.flags
            && self.user_nodes == other.user_nodes
            && (self.mode == MPOL_LOCAL || self.nodes == other.nodes)
    }
}

impl MemPolicy {
    /// Whether the caller's mask is kept (Linux's `mpol_store_user_nodemask`).
    fn stores_user_nodemask(flags: i32) -> bool {
        flags & (MPOL_F_STATIC_NODES | MPOL_F_RELATIVE_NODES) != 0
    }

    /// The mask `get_mempolicy` reports for `policy` (`None`: the default):
    /// the caller's mask where it is kept, else the effective nodes (empty
    /// for the default and `MPOL_LOCAL`), as Linux's `do_get_mempolicy`.
    pub(crate) fn reported_nodes(policy: Option<&MemPolicy>) -> NodeMask {
        match policy {
            None => NodeMask::default(),
            Some(p) if Self::stores_user_nodemask(p.flags) => p.user_nodes,
            Some(p) => p.nodes,
        }
    }
}

/// Splits `mode` into mode and flags and checks them (Linux's
/// `sanitize_mpol_flags`): `EINVAL` for an unknown mode, both STATIC and
/// RELATIVE, or NUMA_BALANCING outside BIND and PREFERRED_MANY.
pub(crate) fn sanitize_mode(mode: i32) -> Result<(i32, i32)> {
    let flags = mode & MPOL_MODE_FLAGS;
    let mode = mode & !MPOL_MODE_FLAGS;
    if (mode as u32) >= MPOL_MAX as u32 {
        return Err(Errno::Inval);
    }
    if flags & MPOL_F_STATIC_NODES != 0 && flags & MPOL_F_RELATIVE_NODES != 0 {
        return Err(Errno::Inval);
    }
    if flags & MPOL_F_NUMA_BALANCING != 0 && mode != MPOL_BIND && mode != MPOL_PREFERRED_MANY {
        return Err(Errno::Inval);
    }
    Ok((mode, flags))
}

/// Reads a user node mask of `maxnode` bits (Linux's `get_nodes`): `maxnode`
/// counts one more bit than it reads; `EINVAL` for more than a page of bits
/// or a set bit at or above [`crate::MAX_NODES`]; `EFAULT` when `nmask` is
/// shorter than `maxnode - 1` bits (the copy from user memory would fault).
pub(crate) fn get_nodes(nmask: Option<&[u64]>, maxnode: u64) -> Result<NodeMask> {
    let maxnode = maxnode.wrapping_sub(1);
    let Some(words) = nmask else { return Ok(NodeMask::default()) };
    if maxnode == 0 {
        return Ok(NodeMask::default());
    }
    if maxnode > crate::PAGE_SIZE * 8 {
        return Err(Errno::Inval);
    }
    let nlongs = maxnode.div_ceil(64) as usize;
    let words = words.get(..nlongs).ok_or(Errno::Fault)?;
    let bit = |i: u64| words[(i / 64) as usize] & (1 << (i % 64)) != 0;
    // Bits past MAX_NODES must be clear (Linux checks them word by word).
    if (crate::MAX_NODES as u64..maxnode).any(bit) {
        return Err(Errno::Inval);
    }
    let mut m = NodeMask::default();
    for i in (0..maxnode.min(crate::MAX_NODES as u64)).filter(|&i| bit(i)) {
        m.set(i as usize);
    }
    Ok(m)
}

impl MemPolicy {
    /// Linux's `mpol_new` then `mpol_set_nodemask` against the arena's nodes
    /// `online`: `Ok(None)` for `MPOL_DEFAULT` (with an empty mask);
    /// `EINVAL` for a non-empty mask with DEFAULT or LOCAL, an empty one
    /// with BIND/INTERLEAVE/PREFERRED_MANY (PREFERRED with an empty mask is
    /// LOCAL, unless STATIC or RELATIVE is asked), or a mask with no online
    /// node once restricted to them.
    pub(crate) fn new(mode: i32, flags: i32, nodes: &NodeMask, online: &NodeMask) -> Result<Option<MemPolicy>> {
        let mut mode = mode;
        let static_or_relative = flags & (MPOL_F_STATIC_NODES | MPOL_F_RELATIVE_NODES) != 0;
        match mode {
            MPOL_DEFAULT => {
                return if nodes.is_empty() { Ok(None) } else { Err(Errno::Inval) };
            }
            MPOL_PREFERRED if nodes.is_empty() => {
                if static_or_relative {
                    return Err(Errno::Inval);
                }
                mode = MPOL_LOCAL;
            }
            MPOL_LOCAL if !nodes.is_empty() || static_or_relative => return Err(Errno::Inval),
            MPOL_LOCAL => {}
            _ if nodes.is_empty() => return Err(Errno::Inval),
            _ => {}
        }
        let user_nodes = if Self::stores_user_nodemask(flags) { *nodes } else { NodeMask::default() };
        if mode == MPOL_LOCAL {
            return Ok(Some(MemPolicy { mode, flags, nodes: NodeMask::default(), user_nodes }));
        }
        // mpol_set_nodemask: the mask is limited to the nodes with memory
        // (relative masks are folded onto them first).
        let usable = if flags & MPOL_F_RELATIVE_NODES != 0 { relative(nodes, online) } else { nodes.and(online) };
        if usable.is_empty() {
            return Err(Errno::Inval);
        }
        let nodes =
            if mode == MPOL_PREFERRED { NodeMask::single(usable.iter().next().expect("not empty")) } else { usable };
        Ok(Some(MemPolicy { mode, flags, nodes, user_nodes }))
    }

    /// Where the page of linear index `ilx` goes: the node to try first and
    /// the nodes allowed or preferred (Linux's `policy_nodemask`,
    /// `interleave_nid` and, for `MPOL_PREFERRED_MANY`,
    /// `alloc_pages_preferred_many`).
    pub(crate) fn placement(policy: Option<&MemPolicy>, ilx: u64) -> Placement {
        let Some(p) = policy else { return Placement::LOCAL };
        let first = || p.nodes.iter().next().unwrap_or(LOCAL_NODE);
        let local_or_first = || if p.nodes.contains(LOCAL_NODE) { LOCAL_NODE } else { first() };
        match p.mode {
            MPOL_PREFERRED => Placement::new(first(), None),
            MPOL_BIND => Placement::new(local_or_first(), Some(p.nodes)),
            MPOL_PREFERRED_MANY => Placement::preferring(local_or_first(), p.nodes),
            MPOL_INTERLEAVE | MPOL_WEIGHTED_INTERLEAVE => {
                let w = p.nodes.weight() as u64;
                let node =
                    if w == 0 { LOCAL_NODE } else { p.nodes.iter().nth((ilx % w) as usize).unwrap_or(LOCAL_NODE) };
                Placement::new(node, None)
            }
            _ => Placement::LOCAL,
        }
    }
}

/// Linux's `mpol_relative_nodemask`: `nodes` folded modulo the weight of
/// `rel`, then the n-th bit mapped onto the n-th node of `rel`.
fn relative(nodes: &NodeMask, rel: &NodeMask) -> NodeMask {
    let w = rel.weight();
    let mut out = NodeMask::default();
    if w == 0 {
        return out;
    }
    let targets: Vec<usize> = rel.iter().collect();
    for n in nodes.iter() {
        out.set(targets[n % w]);
    }
    out
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn mask(nodes: &[usize]) -> NodeMask {
        let mut m = NodeMask::default();
        nodes.iter().for_each(|&n| m.set(n));
        m
    }

    #[test]
    fn sanitize_refuses_unknown_modes_and_conflicting_flags() {
        assert_eq!(sanitize_mode(MPOL_BIND | MPOL_F_STATIC_NODES), Ok((MPOL_BIND, MPOL_F_STATIC_NODES)));
        assert_eq!(sanitize_mode(MPOL_MAX), Err(Errno::Inval));
        assert_eq!(sanitize_mode(-1), Err(Errno::Inval));
        assert_eq!(sanitize_mode(MPOL_BIND | MPOL_F_STATIC_NODES | MPOL_F_RELATIVE_NODES), Err(Errno::Inval));
        assert_eq!(sanitize_mode(MPOL_INTERLEAVE | MPOL_F_NUMA_BALANCING), Err(Errno::Inval));
        assert!(sanitize_mode(MPOL_BIND | MPOL_F_NUMA_BALANCING).is_ok());
    }

    #[test]
    fn get_nodes_reads_maxnode_minus_one_bits() {
        // maxnode 2 reads bit 0 only.
        assert_eq!(get_nodes(Some(&[0b11]), 2), Ok(mask(&[0])));
        assert_eq!(get_nodes(Some(&[0b11]), 3), Ok(mask(&[0, 1])));
        assert_eq!(get_nodes(Some(&[0b1]), 0), Err(Errno::Inval), "maxnode 0 wraps to a huge count, as on Linux");
        assert_eq!(get_nodes(Some(&[0b1]), 1), Ok(NodeMask::default()), "no bit read");
        assert_eq!(get_nodes(None, 100), Ok(NodeMask::default()));
        assert_eq!(get_nodes(Some(&[1]), crate::PAGE_SIZE * 8 + 2), Err(Errno::Inval));
        assert_eq!(get_nodes(Some(&[1]), 66), Err(Errno::Fault), "two words asked, one given");
        let mut big = vec![0u64; 17];
        big[16] = 1; // bit 1024 = MAX_NODES
        assert_eq!(get_nodes(Some(&big), 17 * 64 + 1), Err(Errno::Inval));
        big[16] = 0;
        big[15] = 1 << 63;
        assert_eq!(get_nodes(Some(&big), 17 * 64 + 1), Ok(mask(&[1023])));
    }

    #[test]
    fn new_follows_mpol_new() {
        let online = mask(&[0, 1]);
        let n = |mode, flags, nodes: &[usize]| MemPolicy::new(mode, flags, &mask(nodes), &online);
        assert_eq!(n(MPOL_DEFAULT, 0, &[]), Ok(None));
        assert_eq!(n(MPOL_DEFAULT, 0, &[0]), Err(Errno::Inval));
        assert_eq!(n(MPOL_BIND, 0, &[]), Err(Errno::Inval));
        assert_eq!(n(MPOL_INTERLEAVE, 0, &[]), Err(Errno::Inval));
        assert_eq!(n(MPOL_PREFERRED, 0, &[]).unwrap().unwrap().mode, MPOL_LOCAL);
        assert_eq!(n(MPOL_PREFERRED, MPOL_F_STATIC_NODES, &[]), Err(Errno::Inval));
        assert_eq!(n(MPOL_LOCAL, 0, &[1]), Err(Errno::Inval));
        assert_eq!(n(MPOL_BIND, 0, &[2]), Err(Errno::Inval), "no online node in the mask");
        assert_eq!(n(MPOL_BIND, 0, &[1, 2]).unwrap().unwrap().nodes, mask(&[1]));
        assert_eq!(n(MPOL_PREFERRED, 0, &[1, 0]).unwrap().unwrap().nodes, mask(&[0]), "first node only");
        // Relative: node 3 folds onto 3 % 2 = 1, the second online node.
        assert_eq!(n(MPOL_BIND, MPOL_F_RELATIVE_NODES, &[3]).unwrap().unwrap().nodes, mask(&[1]));
    }

    /// `mpol_equal`: the effective nodes decide, and the mask the caller
    /// gave too where it is kept (static or relative nodes).
    #[test]
    fn equal_policies_follow_mpol_equal() {
        let online = mask(&[0]);
        let n = |flags, nodes: &[usize]| MemPolicy::new(MPOL_BIND, flags, &mask(nodes), &online).unwrap().unwrap();
        assert_eq!(n(0, &[0, 1]), n(0, &[0]), "the same nodes in use");
        assert_ne!(n(MPOL_F_STATIC_NODES, &[0, 1]), n(MPOL_F_STATIC_NODES, &[0]), "different masks kept");
        assert_eq!(n(MPOL_F_STATIC_NODES, &[0, 1]), n(MPOL_F_STATIC_NODES, &[0, 1]));
        assert_ne!(n(MPOL_F_STATIC_NODES, &[0]), n(0, &[0]), "different flags");
        assert_eq!(MemPolicy::reported_nodes(Some(&n(MPOL_F_STATIC_NODES, &[0, 1]))), mask(&[0, 1]));
        assert_eq!(MemPolicy::reported_nodes(Some(&n(0, &[0, 1]))), mask(&[0]));
        assert_eq!(MemPolicy::reported_nodes(None), NodeMask::default());
    }

    #[test]
    fn placement_per_mode() {
        let online = mask(&[0, 1, 2]);
        let p = |mode, nodes: &[usize]| MemPolicy::new(mode, 0, &mask(nodes), &online).unwrap();
        assert_eq!(MemPolicy::placement(None, 5), Placement::new(0, None));
        assert_eq!(MemPolicy::placement(p(MPOL_PREFERRED, &[2]).as_ref(), 5), Placement::new(2, None));
        assert_eq!(MemPolicy::placement(p(MPOL_BIND, &[1, 2]).as_ref(), 5), Placement::new(1, Some(mask(&[1, 2]))));
        assert_eq!(MemPolicy::placement(p(MPOL_BIND, &[0, 2]).as_ref(), 5), Placement::new(0, Some(mask(&[0, 2]))));
        let many = MemPolicy::placement(p(MPOL_PREFERRED_MANY, &[0, 2]).as_ref(), 5);
        assert_eq!(many, Placement::preferring(0, mask(&[0, 2])));
        assert_eq!(many.zonelist(3).collect::<Vec<_>>(), [0, 2, 1], "the preferred nodes, then the others");
        let il = p(MPOL_INTERLEAVE, &[0, 2]);
        let nodes: Vec<usize> = (0..4).map(|i| MemPolicy::placement(il.as_ref(), i).node).collect();
        assert_eq!(nodes, [0, 2, 0, 2]);
    }
}
