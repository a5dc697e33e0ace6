//! The commit charge (Linux's `vm_committed_as`, `__vm_enough_memory` in
//! `mm/util.c`): one per arena, so it lives with the arena. What an
//! address space charges (its VMAs' pages) and the memlock limit are the
//! core's (`mm/commit.rs`).
//!
//! The committed total is one per-CPU counter per [`PhysMem`], as Linux's is
//! one per machine (see [`CommitState`]'s protocol): every private writable mapping (`VM_ACCOUNT`) of every address
//! space on the arena is charged to it when it is made or grows (mmap, brk,
//! mremap, mprotect making it writable, fork) and uncharged when it goes
//! (munmap, mprotect making an untouched one read-only, exit). The policy is
//! the `vm.overcommit_*` sysctls, changed at run time with
//! [`PhysMem::set_overcommit`]; its default is what Linux computes for a
//! machine whose RAM is the arena.

use crossbeam_epoch::{Atomic, Owned, Shared};

use crate::sync::percpu::PercpuCounter;
use crate::sync::{Mutex, Ordering};

use crate::error::{Errno, Result};
use crate::phys::PhysMem;
use crate::{PAGE_SHIFT, PAGE_SIZE};

#[cfg(all(test, loom))]
mod loom_tests;

/// `vm.overcommit_memory`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OvercommitMode {
    /// 0, `OVERCOMMIT_GUESS`: only a single charge larger than RAM + swap fails.
    #[default]
    Guess,
    /// 1, `OVERCOMMIT_ALWAYS`: never fails.
    Always,
    /// 2, `OVERCOMMIT_NEVER`: the committed total may not pass the commit limit.
    Never,
}

/// The overcommit sysctls and the machine sizes they are computed from.
/// The type may gain fields: start from [`Overcommit::for_ram`] or
/// [`PhysMem::overcommit`] and change it with the setters, named after the
/// fields.
///
/// ```
/// use softmm::{OvercommitMode, PhysConfig, PhysMem};
/// let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
/// phys.set_overcommit(phys.overcommit().mode(OvercommitMode::Never).ratio(100));
/// assert_eq!(phys.overcommit().commit_limit(), 256);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Overcommit {
    /// `vm.overcommit_memory`.
    pub mode: OvercommitMode,
    /// `vm.overcommit_ratio`: percent of RAM in the commit limit (Linux: 50).
    pub ratio: u64,
    /// `vm.overcommit_kbytes`: the commit limit's RAM part in KiB; 0 = use `ratio`.
    pub kbytes: u64,
    /// `vm.admin_reserve_kbytes` (Linux: min(3% of free memory, 8 MiB)).
    pub admin_reserve_kbytes: u64,
    /// `vm.user_reserve_kbytes` (Linux: min(3% of free memory, 128 MiB)).
    pub user_reserve_kbytes: u64,
    /// The caller has `CAP_SYS_ADMIN` (exempt from the admin reserve).
    pub cap_sys_admin: bool,
    /// `totalram_pages()`: RAM pages as the kernel counts them.
    pub totalram_pages: u64,
    /// `total_swap_pages`.
    pub swap_pages: u64,
}

impl Overcommit {
    /// Linux's defaults on a machine with `totalram_pages` pages of RAM, all
    /// free, and no swap: heuristic mode, ratio 50, reserves as
    /// `init_admin_reserve`/`init_user_reserve` compute them.
    pub fn for_ram(totalram_pages: u64) -> Overcommit {
        let free_kbytes = totalram_pages * (PAGE_SIZE >> 10);
        Overcommit {
            mode: OvercommitMode::Guess,
            ratio: 50,
            kbytes: 0,
            admin_reserve_kbytes: (free_kbytes / 32).min(1 << 13),
            user_reserve_kbytes: (free_kbytes / 32).min(1 << 17),
            cap_sys_admin: false,
            totalram_pages,
            swap_pages: 0,
        }
    }

    /// `vm_commit_limit()`: the most pages `OVERCOMMIT_NEVER` lets be committed.
    pub fn commit_limit(&self) -> u64 {
        let ram = if self.kbytes != 0 {
            self.kbytes >> (PAGE_SHIFT - 10)
        } else {
            // u128: a ratio above 100 is allowed and must not overflow.
            (u128::from(self.totalram_pages) * u128::from(self.ratio) / 100).min(u128::from(u64::MAX)) as u64
        };
        ram.saturating_add(self.swap_pages)
    }

    /// Sets `mode`: `vm.overcommit_memory`.
    #[must_use]
    pub fn mode(mut self, mode: OvercommitMode) -> Overcommit {
        self.mode = mode;
        self
    }

    /// Sets `ratio`: `vm.overcommit_ratio`, the percent of RAM in the commit limit.
    #[must_use]
    pub fn ratio(mut self, ratio: u64) -> Overcommit {
        self.ratio = ratio;
        self
    }

    /// Sets `kbytes`: `vm.overcommit_kbytes`, the commit limit's RAM part in KiB (0: use `ratio`).
    #[must_use]
    pub fn kbytes(mut self, kbytes: u64) -> Overcommit {
        self.kbytes = kbytes;
        self
    }

    /// Sets `admin_reserve_kbytes`: `vm.admin_reserve_kbytes`.
    #[must_use]
    pub fn admin_reserve_kbytes(mut self, admin_reserve_kbytes: u64) -> Overcommit {
        self.admin_reserve_kbytes = admin_reserve_kbytes;
        self
    }

    /// Sets `user_reserve_kbytes`: `vm.user_reserve_kbytes`.
    #[must_use]
    pub fn user_reserve_kbytes(mut self, user_reserve_kbytes: u64) -> Overcommit {
        self.user_reserve_kbytes = user_reserve_kbytes;
        self
    }

    /// Sets `cap_sys_admin`: whether the caller has `CAP_SYS_ADMIN` (exempt from the admin reserve).
    #[must_use]
    pub fn cap_sys_admin(mut self, cap_sys_admin: bool) -> Overcommit {
        self.cap_sys_admin = cap_sys_admin;
        self
    }

    /// Sets `totalram_pages`: the RAM pages the limits are computed from.
    #[must_use]
    pub fn totalram_pages(mut self, totalram_pages: u64) -> Overcommit {
        self.totalram_pages = totalram_pages;
        self
    }

    /// Sets `swap_pages`: the swap pages counted in the commit limit.
    #[must_use]
    pub fn swap_pages(mut self, swap_pages: u64) -> Overcommit {
        self.swap_pages = swap_pages;
        self
    }
}

/// The committed total and the policy of one [`PhysMem`].
///
/// # Protocol
///
/// The total is a per-CPU counter (Linux's `vm_committed_as`, a
/// `percpu_counter`): a charge or an uncharge adds to the caller's slot
/// only ([`PercpuCounter::add`]), so the `mmap` and `munmap` of different
/// address spaces write no line in common. Nothing on the
/// `OVERCOMMIT_GUESS` and `OVERCOMMIT_ALWAYS` paths reads the total, so
/// the slots are never folded (Linux folds at a batch because its readers
/// read the approximate global count; there is none here).
///
/// `OVERCOMMIT_NEVER` compares the total with the limit, and must refuse
/// as an exact counter would: of two charges that together pass the
/// limit, one fails. Its charges therefore run under `never` (the exact
/// slow path, Linux's `percpu_counter_sum` under the counter's lock): each
/// adds to its slot and sums every slot while holding the mutex, so the
/// next one, ordered after it by the mutex, sees its charge. Uncharges
/// take no lock; one racing a check is seen or not, as it would be with a
/// single counter (a check may refuse a charge that a concurrent uncharge
/// would have made room for, as in Linux).
///
/// The policy is read on every charge, so it is published through the
/// epoch (no lock word to write); `set_overcommit` replaces it.
pub(crate) struct CommitState {
    committed: PercpuCounter,
    /// Serializes `OVERCOMMIT_NEVER` charges with their exact sum.
    never: Mutex<()>,
    policy: Atomic<Overcommit>,
}

impl CommitState {
    /// Nothing committed, Linux's default policy for `frames` pages of RAM.
    pub(crate) fn new(frames: u64) -> CommitState {
        CommitState {
            committed: PercpuCounter::default(),
            never: Mutex::new(()),
            policy: Atomic::new(Overcommit::for_ram(frames)),
        }
    }
}

impl Drop for CommitState {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no other reference to the policy is left, and
        // every reader copied it out under a guard that has been dropped.
        unsafe {
            let guard = crossbeam_epoch::unprotected();
            let p = self.policy.swap(Shared::null(), Ordering::Relaxed, guard);
            if !p.is_null() {
                drop(p.into_owned());
            }
        }
    }
}

// The loom models' broken switches: `sync/broken.rs`.
pub(crate) use crate::sync::broken::commit as broken;

impl PhysMem {
    /// Pages charged to the commit limit (`Committed_AS`) by the address
    /// spaces on this arena: the exact sum of the per-CPU counts.
    pub fn committed_pages(&self) -> u64 {
        self.commit.committed.sum().max(0) as u64
    }

    /// The overcommit policy in force.
    pub fn overcommit(&self) -> Overcommit {
        let guard = crossbeam_epoch::pin();
        let p = self.commit.policy.load(Ordering::Acquire, &guard);
        // SAFETY: never null (set in `new`, replaced by non-null in
        // `set_overcommit`), and freed only after every guard that could
        // have loaded it is dropped.
        *unsafe { p.deref() }
    }

    /// Sets the overcommit policy (writing the `vm.overcommit_*` sysctls);
    /// later charges follow it, what is committed stays.
    pub fn set_overcommit(&self, policy: Overcommit) {
        let guard = crossbeam_epoch::pin();
        let old = self.commit.policy.swap(Owned::new(policy), Ordering::AcqRel, &guard);
        // SAFETY: `old` is unreachable from `policy` now; readers that loaded
        // it hold a guard the deferred destruction waits for.
        unsafe { crate::sync::rcu::defer_destroy(&guard, old) };
    }

    /// `vm_acct_memory`: charges `pages` without a check.
    pub(crate) fn vm_acct_memory(&self, pages: u64) {
        if pages != 0 {
            self.commit.committed.add(pages as i64);
        }
    }

    /// `vm_unacct_memory`: returns `pages` charged earlier.
    pub(crate) fn vm_unacct_memory(&self, pages: u64) {
        if pages != 0 {
            self.commit.committed.add(-(pages as i64));
        }
    }

    /// `__vm_enough_memory`: charges `pages` if the policy allows it, else
    /// `ENOMEM` with nothing charged. `total_vm` is the charging address
    /// space's size in pages (it shrinks the user reserve in never mode).
    pub(crate) fn vm_enough_memory(&self, pages: u64, total_vm: impl FnOnce() -> u64) -> Result<()> {
        let p = self.overcommit();
        let ok = match p.mode {
            OvercommitMode::Guess => pages <= p.totalram_pages.saturating_add(p.swap_pages),
            OvercommitMode::Always => true,
            OvercommitMode::Never => {
                let mut allowed = p.commit_limit() as i64;
                if !p.cap_sys_admin {
                    allowed -= (p.admin_reserve_kbytes >> (PAGE_SHIFT - 10)) as i64;
                }
                let reserve = (p.user_reserve_kbytes >> (PAGE_SHIFT - 10)) as i64;
                allowed -= ((total_vm() / 32) as i64).min(reserve);
                let unlocked = broken::unlocked_never_check();
                let _never = (!unlocked).then(|| self.commit.never.lock());
                // The mutex, locked and unlocked: the one shared line of a
                // never-mode charge.
                crate::sync::shared_write(2);
                self.vm_acct_memory(pages);
                if self.commit.committed.sum().max(0) < allowed {
                    return Ok(());
                }
                self.vm_unacct_memory(pages);
                return Err(Errno::NoMem);
            }
        };
        if ok {
            self.vm_acct_memory(pages);
            Ok(())
        } else {
            Err(Errno::NoMem)
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_linux_for_the_ram_size() {
        // 24 GiB of RAM: reserves capped at 8 MiB and 128 MiB, limit half of RAM.
        let o = Overcommit::for_ram(6 << 20);
        assert_eq!((o.admin_reserve_kbytes, o.user_reserve_kbytes), (8192, 131072));
        assert_eq!(o.commit_limit(), 3 << 20);
        // A 64 MiB arena: 3% of it.
        let o = Overcommit::for_ram(16384);
        assert_eq!((o.admin_reserve_kbytes, o.user_reserve_kbytes), (2048, 2048));
        let o = Overcommit { kbytes: 4096, swap_pages: 10, ..o };
        assert_eq!(o.commit_limit(), 1024 + 10);
        let o = Overcommit { kbytes: 0, ratio: u64::MAX, totalram_pages: u64::MAX, ..o };
        assert_eq!(o.commit_limit(), u64::MAX, "saturates");
    }

    #[test]
    fn each_overcommit_setter_sets_its_own_field() {
        let built = Overcommit::for_ram(1000)
            .mode(OvercommitMode::Never)
            .ratio(70)
            .kbytes(12)
            .admin_reserve_kbytes(34)
            .user_reserve_kbytes(56)
            .cap_sys_admin(true)
            .totalram_pages(2000)
            .swap_pages(78);
        let want = Overcommit {
            mode: OvercommitMode::Never,
            ratio: 70,
            kbytes: 12,
            admin_reserve_kbytes: 34,
            user_reserve_kbytes: 56,
            cap_sys_admin: true,
            totalram_pages: 2000,
            swap_pages: 78,
        };
        assert_eq!(built, want);
    }
}
