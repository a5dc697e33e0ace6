//! Loom model of the commit charge's protocol (`phys/commit.rs`,
//! [`super::CommitState`]): per-CPU counts, and the exact check of
//! `OVERCOMMIT_NEVER` under its mutex. Two address spaces' charges run
//! `PhysMem::vm_enough_memory`, the real code, against a limit that only
//! one of them fits under: exactly one must be refused, as with one exact
//! counter. With `broken::UNLOCKED_NEVER_CHECK` (the check without the
//! mutex) some execution lets both through, each summing the slots before
//! the other's charge is visible.

use super::{broken, Overcommit, OvercommitMode};
use crate::phys::{PhysConfig, PhysMem};
use crate::PAGE_SIZE;

/// Pages each charge asks for: one fits under the limit, two do not.
const CHARGE: u64 = 2;

/// One execution: two threads charge `CHARGE` pages each under a commit
/// limit of `2 * CHARGE` (the check is `committed < limit`). `Err` names
/// what went wrong (a panic would abort the process as loom objects unwind).
fn two_charges_at_the_limit() -> Result<(), String> {
    let phys = PhysMem::new(PhysConfig::new(16 * PAGE_SIZE)).unwrap();
    let policy = Overcommit::for_ram(16)
        .mode(OvercommitMode::Never)
        .kbytes(2 * CHARGE * (PAGE_SIZE >> 10))
        .admin_reserve_kbytes(0)
        .user_reserve_kbytes(0);
    phys.set_overcommit(policy);
    let t = {
        let phys = phys.clone();
        crate::sync::model::spawn(move || phys.vm_enough_memory(CHARGE, || 0).is_ok())
    };
    let here = phys.vm_enough_memory(CHARGE, || 0).is_ok();
    let there = t.join().unwrap();
    let committed = phys.committed_pages();
    match (here, there) {
        (true, true) => Err(format!("both charges passed the limit: {committed} pages committed")),
        (false, false) => Err("both charges refused, with room for one".into()),
        _ if committed != CHARGE => Err(format!("{committed} pages committed after one charge")),
        _ => Ok(()),
    }
}

/// Exactly one of two charges that together pass the limit is refused,
/// and the model catches the check made without the `never` mutex.
#[test]
fn never_mode_refuses_one_of_two_charges_at_the_limit() {
    crate::sync::broken::check_model(two_charges_at_the_limit, &broken::UNLOCKED_NEVER_CHECK);
}
