//! The softmm arena a run's samples share.
//!
//! A leaf: it imports nothing else of the lab.

use std::sync::Arc;

use softmm::{FreeLists, PhysConfig, PhysMem};

/// A softmm arena reused across samples, grown on demand.
#[derive(Default)]
pub struct Arena {
    phys: Option<Arc<PhysMem>>,
    bytes: u64,
    free_lists: FreeLists,
}

impl Arena {
    /// An arena (made on first use) whose nodes keep their free frames as
    /// `free_lists` says.
    pub fn with_free_lists(free_lists: FreeLists) -> Arena {
        Arena { free_lists, ..Arena::default() }
    }

    /// An arena of at least `bytes`.
    pub fn get(&mut self, bytes: u64) -> Result<Arc<PhysMem>, String> {
        if self.phys.is_none() || self.bytes < bytes {
            self.phys = None;
            let phys = PhysMem::new(PhysConfig::new(bytes).free_lists(self.free_lists))
                .map_err(|e| format!("cannot make a {} MiB softmm arena: {e}", bytes >> 20))?;
            self.phys = Some(phys);
            self.bytes = bytes;
        }
        Ok(self.phys.clone().expect("made above"))
    }

    /// Gives the memory back to the host.
    pub fn release(&mut self) {
        self.phys = None;
        self.bytes = 0;
    }
}
