//! Write watches and the dirty log: an emulator's own state per guest page,
//! kept apart from the guest's protections (QEMU's `PAGE_WRITE_ORG` and
//! `TLB_NOTDIRTY` for translated code, KVM's dirty log for snapshots and
//! live migration). The calls are `AddressSpace::write_watch`,
//! `write_unwatch` and `dirty_log` (`sys/watch.rs`); the enforcement is in
//! the TLB fill (`Cpu::translate_slow`).
//!
//! A page may be watched in two modes at once ([`WatchMode`]):
//!
//! * **notify**: a store to it is not made; the access returns
//!   [`crate::Fault::WriteWatch`] to the embedder's loop, which invalidates
//!   what it derived from the page (its translations) and unwatches it, or
//!   not, before it retries the store;
//! * **log**: a store to it is made and marks it dirty; `dirty_log` reads
//!   the marks and, if asked, clears them.
//!
//! The watches are on guest virtual addresses of one address space, as a
//! hardware watchpoint is: `munmap`, `mremap` and `mprotect` leave them and
//! the dirty bits where they are (a page mapped later in a watched range is
//! watched; the pages `mremap` moves are not watched at their new address
//! unless it is), and a `fork`'s child starts with none. Only stores
//! through a [`crate::Cpu`] are watched and logged, not forced remote
//! writes (`access_remote_vm`) nor a device's through pinned pages (as
//! KVM's log holds the vCPUs' writes only).
//!
//! # Protocol
//!
//! The TLB hit path knows nothing of watches: a watched page is never
//! filled with write permission while a store to it must trap (notify, or
//! log with its dirty bit clear), so every such store misses and reaches
//! the fill, which checks the page here. The fill runs inside an access
//! section (`crate::tlb`), and reads the watches after the page table.
//!
//! * **Arming** (`write_watch`): insert the watch under the lock, then shoot
//!   the range down and wait. A fill that read the watches before the
//!   insert ran in a section the shootdown either waits for or finds ended,
//!   and that CPU drops its entries at its next entry; a fill after the
//!   insert sees it. So no store through an entry filled writable before
//!   the call lands after it returns (`loom_tests.rs`, with
//!   `broken::ARM_WITHOUT_SHOOTDOWN`).
//! * **Targeted arming** (`ShootdownTargets::FillOwners`, the default, and
//!   `FillOwnersRanges`):
//!   the shootdown asks only the range's fill owners (`tlb/targets.rs`).
//!   Arm: insert, the process-wide barrier (`tlb::initiator_barrier`),
//!   then read the owners of the range's entries. Fill: name this CPU in
//!   the entry (its compare-exchange), the reader's barrier, then check
//!   the watches again before caching or accessing. Dekker's: either the
//!   arm's read sees the fill's owner, and the shootdown waits for that
//!   section, or the recheck sees the watch. A fill that finds this CPU
//!   already named exchanges nothing: the arm's read sees it too (owners
//!   leave an entry only through a change, which shoots them down). Where
//!   no owner is recorded (2 MiB entries, embedder memory), every CPU.
//!   The fill's first check stays before the exchange, so that a store
//!   refused outside a race sets no accessed or dirty bit (`loom_tests.rs`,
//!   with `broken::FILL_WITHOUT_RECHECK`).
//! * **Logging**: a store to a logged page sets the dirty bit before the
//!   fill caches write permission; a read fill caches it only if the bit
//!   is set already.
//! * **Clearing** (`dirty_log` with `clear`): take the bits, then shoot the
//!   range down (targeted as arming; the fill reads the dirty bit after its
//!   barrier). A store through an entry cached before the clear lands
//!   before the call returns (the shootdown waits for it), so a copy of
//!   the page made after the call sees it; the next store misses and marks
//!   the page again (`loom_tests.rs`, with
//!   `broken::CLEAR_WITHOUT_SHOOTDOWN`).
//!
//! With no watch at all, the fill's one extra step is a load of a count.
//!
//! # Watchpoints
//!
//! A watchpoint ([`AddressSpace::watchpoint_insert`], QEMU's
//! `cpu_watchpoint_insert`) is a byte range of any length and alignment
//! with an access mask ([`WatchAccess`]: reads, writes, fetches, or any of
//! them). An access of a kind in the mask whose bytes overlap the range
//! returns [`crate::Fault::Watchpoint`] before it is made (QEMU's
//! `BP_STOP_BEFORE_ACCESS`), after the guest's own faults; the embedder
//! reports it, and resumes with `Cpu::pass_watchpoint` (the next
//! access that hits one is made) or removes the watchpoint. The protocol
//! is the write watch's, for every kind of access: a page holding a
//! watchpoint is never filled into the TLB for the kinds it watches, so
//! those accesses miss and reach the fill, which checks the access's bytes
//! here; arming inserts under the lock, then shoots the pages down and
//! waits (`loom_tests.rs`, with `broken::POINT_WITHOUT_SHOOTDOWN`).
//! Accesses of other kinds, and of other pages, keep the hit path.
//!
//! [`AddressSpace::watchpoint_insert`]: crate::AddressSpace::watchpoint_insert

#[cfg(all(test, loom))]
mod loom_tests;

use std::collections::BTreeMap;

use crate::error::{Errno, Result};
use crate::sync::{AtomicU32, AtomicUsize, Ordering, RwLock};
use crate::PAGE_SIZE;

/// The most watchpoints an address space may hold at once: the fill scans
/// them on a miss of a page that holds one, so the bound keeps that scan
/// and the lock's hold short.
pub const MAX_WATCHPOINTS: usize = 1024;

/// Which accesses a watchpoint traps (QEMU's `BP_MEM_READ`,
/// `BP_MEM_WRITE`, `BP_MEM_ACCESS`, and fetches): a set of access kinds,
/// whose bits are those of [`crate::Access`]'s discriminants (read 1,
/// write 2, fetch 4, C's `SOFTMM_ACCESS_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WatchAccess(u8);

impl WatchAccess {
    /// Loads.
    pub const READ: WatchAccess = WatchAccess(1);
    /// Stores (an atomic read-modify-write is a store).
    pub const WRITE: WatchAccess = WatchAccess(2);
    /// Instruction fetches.
    pub const FETCH: WatchAccess = WatchAccess(4);
    /// Loads and stores (QEMU's `BP_MEM_ACCESS`).
    pub const ACCESS: WatchAccess = WatchAccess(1 | 2);

    /// Both sets.
    pub const fn union(self, other: WatchAccess) -> WatchAccess {
        WatchAccess(self.0 | other.0)
    }

    /// The set of the access bits in `bits`; `None` for 0 or an unknown
    /// bit.
    pub const fn from_bits(bits: u32) -> Option<WatchAccess> {
        if bits == 0 || bits & !7 != 0 {
            return None;
        }
        Some(WatchAccess(bits as u8))
    }

    /// The set's access bits.
    pub const fn bits(self) -> u32 {
        self.0 as u32
    }

    /// Whether the set holds the access whose bit is `bit`.
    const fn has(self, bit: u8) -> bool {
        self.0 & bit != 0
    }
}

/// One watchpoint: the bytes `[start, end)` and the accesses it traps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Watchpoint {
    start: u64,
    end: u64,
    mask: WatchAccess,
}

/// The most pages an address space may watch at once (16 GiB of guest
/// memory; a page's state costs a map entry, some 30 bytes): the bound
/// that keeps a watch of a huge range from exhausting host memory, or
/// holding the lock long.
pub const MAX_WATCHED_PAGES: u64 = 1 << 22;

/// How a page is watched (`AddressSpace::write_watch`). A page may have
/// both; each is set and cleared on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WatchMode {
    /// A store faults with [`crate::Fault::WriteWatch`] before it is made.
    Notify,
    /// A store is made and marks the page dirty (`AddressSpace::dirty_log`).
    Log,
}

impl WatchMode {
    /// Every mode.
    pub const ALL: &'static [WatchMode] = &[WatchMode::Notify, WatchMode::Log];

    /// The mode's name: `notify` or `log`.
    pub fn name(self) -> &'static str {
        match self {
            WatchMode::Notify => "notify",
            WatchMode::Log => "log",
        }
    }

    /// The mode named `name` ([`WatchMode::name`]).
    pub fn from_name(name: &str) -> Option<WatchMode> {
        Self::ALL.iter().copied().find(|m| m.name() == name)
    }

    /// The mode's bit of a page's state.
    fn bit(self) -> u32 {
        match self {
            WatchMode::Notify => NOTIFY,
            WatchMode::Log => LOG,
        }
    }
}

/// A page's state: watched for notify,
const NOTIFY: u32 = 1;
/// logged,
const LOG: u32 = 2;
/// and written since its log was last cleared.
const DIRTY: u32 = 4;

/// What a store to a page may do ([`Watches::store`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreCheck {
    /// Not this store: the page is watched for notify.
    Notify,
    /// Go ahead (the page was marked dirty if logged).
    Proceed,
}

/// The watched pages of one address space.
#[derive(Default)]
pub(crate) struct Watches {
    /// The number of watched pages: the fill looks no further while it is 0.
    pages: AtomicUsize,
    /// Page number to state (`NOTIFY`, `LOG`, `DIRTY`); a page with no
    /// watch has no entry. The bits change under the read lock too (a
    /// store's `DIRTY`), the entries under the write lock only.
    map: RwLock<BTreeMap<u64, AtomicU32>>,
    /// The number of watchpoints: the fill looks no further while it is 0.
    points: AtomicUsize,
    /// The watchpoints, changed under the write lock only.
    point_list: RwLock<Vec<Watchpoint>>,
}

impl Watches {
    /// No watch.
    pub(crate) fn new() -> Watches {
        Watches::default()
    }

    /// True if no page is watched: the fill needs no other check. Acquire:
    /// a fill that sees a watch count sees the watches inserted before it.
    #[inline]
    pub(crate) fn none(&self) -> bool {
        self.pages.load(Ordering::Acquire) == 0
    }

    /// The check of a store to `va`, made by the fill before it caches
    /// anything: `Notify` if its page is watched for notify; else marks the
    /// page dirty if it is logged, and lets the store proceed.
    pub(crate) fn store(&self, va: u64) -> StoreCheck {
        if self.none() {
            return StoreCheck::Proceed;
        }
        let map = self.map.read();
        match map.get(&(va / PAGE_SIZE)) {
            Some(s) if s.load(Ordering::Relaxed) & NOTIFY != 0 => StoreCheck::Notify,
            Some(s) => {
                if s.load(Ordering::Relaxed) & LOG != 0 {
                    s.fetch_or(DIRTY, Ordering::Relaxed);
                }
                StoreCheck::Proceed
            }
            None => StoreCheck::Proceed,
        }
    }

    /// True if a TLB entry of the `pages` pages from `va` (page aligned)
    /// may allow stores: none of them is watched for notify, or logged
    /// with its dirty bit clear.
    pub(crate) fn may_cache_write(&self, va: u64, pages: u64) -> bool {
        if self.none() {
            return true;
        }
        let first = va / PAGE_SIZE;
        let map = self.map.read();
        map.range(first..first + pages).all(|(_, s)| {
            let s = s.load(Ordering::Relaxed);
            s & NOTIFY == 0 && (s & LOG == 0 || s & DIRTY != 0)
        })
    }

    /// Adds `mode` to the pages `[first, end)` (page numbers). The caller
    /// shoots the range down before it returns to its own caller.
    /// `ENOMEM`, with nothing changed, if more than [`MAX_WATCHED_PAGES`]
    /// pages would be watched.
    pub(crate) fn watch(&self, first: u64, end: u64, mode: WatchMode) -> Result<()> {
        let mut map = self.map.write();
        let watched_here = map.range(first..end).count() as u64;
        let new = end - first - watched_here;
        if self.pages.load(Ordering::Relaxed) as u64 + new > MAX_WATCHED_PAGES {
            return Err(Errno::NoMem);
        }
        let mut added = 0;
        for page in first..end {
            map.entry(page)
                .or_insert_with(|| {
                    added += 1;
                    AtomicU32::new(0)
                })
                .fetch_or(mode.bit(), Ordering::Relaxed);
        }
        // Under the write lock, before the shootdown: a fill that sees the
        // count sees the entries (`none`'s Acquire, and the read lock).
        self.pages.fetch_add(added, Ordering::Release);
        Ok(())
    }

    /// Removes `mode` from the pages `[first, end)`, and their dirty bits
    /// with the log; a page left with no mode is no longer watched. No
    /// shootdown is needed: what is left only traps less.
    pub(crate) fn unwatch(&self, first: u64, end: u64, mode: WatchMode) {
        let mut map = self.map.write();
        let clear = match mode {
            WatchMode::Notify => NOTIFY,
            WatchMode::Log => LOG | DIRTY,
        };
        let pages: Vec<u64> = map.range(first..end).map(|(&p, _)| p).collect();
        let mut removed = 0;
        for page in pages {
            let left = map[&page].fetch_and(!clear, Ordering::Relaxed) & !clear;
            if left & (NOTIFY | LOG) == 0 {
                map.remove(&page);
                removed += 1;
            }
        }
        self.pages.fetch_sub(removed, Ordering::Release);
    }

    /// Sets bit `i` of `bits` (bit `i % 64` of word `i / 64`) for each page
    /// `first + i` below `end` that is logged and dirty; with `clear`,
    /// clears those dirty bits. Returns whether it cleared any (the caller
    /// then shoots the range down). `bits` holds at least `end - first`
    /// bits and is zeroed here first.
    pub(crate) fn dirty_log(&self, first: u64, end: u64, bits: &mut [u64], clear: bool) -> bool {
        bits.iter_mut().for_each(|w| *w = 0);
        let map = self.map.read();
        let mut cleared = false;
        for (&page, s) in map.range(first..end) {
            let was = if clear { s.fetch_and(!DIRTY, Ordering::Relaxed) } else { s.load(Ordering::Relaxed) };
            if was & (LOG | DIRTY) == LOG | DIRTY {
                let i = (page - first) as usize;
                bits[i / 64] |= 1 << (i % 64);
                cleared |= clear;
            }
        }
        cleared
    }

    /// Whether a `size`-byte access at `va`, of the kind whose bit is
    /// `access` (`Access::bit`), overlaps a watchpoint that traps it. The
    /// fill asks before it marks or caches anything.
    #[inline]
    pub(crate) fn point_hit(&self, va: u64, size: usize, access: u8) -> bool {
        if self.points.load(Ordering::Acquire) == 0 {
            return false;
        }
        let end = va.saturating_add(size as u64);
        self.point_list.read().iter().any(|w| w.mask.has(access) && w.start < end && va < w.end)
    }

    /// The access bits (`Access::bit`) a TLB entry of the `pages` pages from `va`
    /// (page aligned) must not allow: those of the watchpoints in them.
    #[inline]
    pub(crate) fn point_mask(&self, va: u64, pages: u64) -> u8 {
        if self.points.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let end = va.saturating_add(pages * PAGE_SIZE);
        let list = self.point_list.read();
        list.iter().filter(|w| w.start < end && va < w.end).fold(0, |m, w| m | w.mask.0)
    }

    /// Adds a watchpoint on `[start, end)` (not empty). The caller shoots
    /// its pages down before it returns to its own caller. `ENOSPC`, with
    /// nothing changed, past [`MAX_WATCHPOINTS`].
    pub(crate) fn insert_point(&self, start: u64, end: u64, mask: WatchAccess) -> Result<()> {
        let mut list = self.point_list.write();
        if list.len() >= MAX_WATCHPOINTS {
            return Err(Errno::NoSpc);
        }
        list.push(Watchpoint { start, end, mask });
        // Under the write lock, before the shootdown: a fill that sees the
        // count sees the watchpoint (`point_hit`'s Acquire, and the lock).
        self.points.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Removes one watchpoint inserted with exactly these bounds and mask;
    /// `ENOENT` if there is none (QEMU's `cpu_watchpoint_remove`). No
    /// shootdown is needed: what is left only traps less.
    pub(crate) fn remove_point(&self, start: u64, end: u64, mask: WatchAccess) -> Result<()> {
        let mut list = self.point_list.write();
        let i = list.iter().position(|w| *w == Watchpoint { start, end, mask }).ok_or(Errno::NoEnt)?;
        list.swap_remove(i);
        self.points.fetch_sub(1, Ordering::Release);
        Ok(())
    }

    /// Number of watchpoints.
    pub(crate) fn points(&self) -> usize {
        self.points.load(Ordering::Relaxed)
    }

    /// Number of watched pages (statistics, tests).
    pub(crate) fn pages(&self) -> usize {
        self.pages.load(Ordering::Relaxed)
    }
}

/// Switches for the loom models only (`loom_tests.rs`), each breaking one
/// step of the protocol so that a model shows it catches the race the step
/// closes. Per OS thread, as `tlb::broken`'s.
pub(crate) mod broken {
    use std::cell::Cell;

    std::thread_local! {
        /// `write_watch` returns without shooting the range down.
        pub(crate) static ARM_WITHOUT_SHOOTDOWN: Cell<bool> = const { Cell::new(false) };
        /// `dirty_log` clears the marks without shooting the range down.
        pub(crate) static CLEAR_WITHOUT_SHOOTDOWN: Cell<bool> = const { Cell::new(false) };
        /// `watchpoint_insert` returns without shooting its pages down.
        pub(crate) static POINT_WITHOUT_SHOOTDOWN: Cell<bool> = const { Cell::new(false) };
        /// A TLB fill that recorded itself in an entry does not look at the
        /// watches again after its barrier.
        pub(crate) static FILL_WITHOUT_RECHECK: Cell<bool> = const { Cell::new(false) };
    }
}
