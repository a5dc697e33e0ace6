//! Memory-deny-write-execute (Linux 6.3+, `prctl(PR_SET_MDWE)`,
//! `kernel/sys.c` and `include/linux/mman.h`'s `map_deny_write_exec`):
//! once set, no mapping may be writable and executable at once, and none
//! may become executable that was not (`EACCES` from `mmap` and
//! `mprotect`). The bits can be set, never cleared; a child made by
//! `fork` keeps them unless `PR_MDWE_NO_INHERIT`.

use crate::error::{Errno, Result};
use crate::uapi::*;
use crate::vma::VmFlags;

use crate::mm::AddressSpace;

/// Linux's `map_deny_write_exec(old, new)` under the MDWE bits `mdwe`:
/// `true` (the caller returns `EACCES`) if `new` is executable and either
/// writable or not executable before.
pub(crate) fn map_deny_write_exec(mdwe: u64, old: VmFlags, new: VmFlags) -> bool {
    mdwe & PR_MDWE_REFUSE_EXEC_GAIN != 0
        && new.contains(VmFlags::EXEC)
        && (new.contains(VmFlags::WRITE) || !old.contains(VmFlags::EXEC))
}

impl AddressSpace {
    /// `prctl(PR_SET_MDWE, bits, arg3, arg4, arg5)`: sets
    /// `PR_MDWE_REFUSE_EXEC_GAIN`, with `PR_MDWE_NO_INHERIT` if a child
    /// should not keep it. `EINVAL` for a non-zero `arg3`..`arg5`, an
    /// unknown bit or `NO_INHERIT` alone; `EPERM` for bits other than the
    /// ones already set (they cannot be cleared or changed); setting the
    /// same bits again succeeds.
    ///
    /// ```
    /// use softmm::{uapi::*, AddressSpace, Errno, MmConfig, PhysConfig, PhysMem};
    /// let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    /// let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    /// mm.prctl_set_mdwe(PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0).unwrap();
    /// let wx = PROT_READ | PROT_WRITE | PROT_EXEC;
    /// assert_eq!(mm.mmap(0, 4096, wx, MAP_PRIVATE | MAP_ANONYMOUS, None, 0), Err(Errno::Acces));
    /// assert_eq!(mm.prctl_get_mdwe(0, 0, 0, 0), Ok(PR_MDWE_REFUSE_EXEC_GAIN));
    /// ```
    pub fn prctl_set_mdwe(&self, bits: u64, arg3: u64, arg4: u64, arg5: u64) -> Result<()> {
        let _q = crate::tlb::QuiescentGuard::enter();
        if arg3 != 0 || arg4 != 0 || arg5 != 0 {
            return Err(Errno::Inval);
        }
        if bits & !(PR_MDWE_REFUSE_EXEC_GAIN | PR_MDWE_NO_INHERIT) != 0 {
            return Err(Errno::Inval);
        }
        if bits & PR_MDWE_NO_INHERIT != 0 && bits & PR_MDWE_REFUSE_EXEC_GAIN == 0 {
            return Err(Errno::Inval);
        }
        let mut st = self.write_lock();
        if st.mdwe != 0 && st.mdwe != bits {
            return Err(Errno::Perm);
        }
        st.mdwe = bits;
        Ok(())
    }

    /// `prctl(PR_GET_MDWE, arg2, arg3, arg4, arg5)`: the MDWE bits set;
    /// `EINVAL` for any non-zero argument.
    pub fn prctl_get_mdwe(&self, arg2: u64, arg3: u64, arg4: u64, arg5: u64) -> Result<u64> {
        let _q = crate::tlb::QuiescentGuard::enter();
        if arg2 != 0 || arg3 != 0 || arg4 != 0 || arg5 != 0 {
            return Err(Errno::Inval);
        }
        Ok(self.read_lock().mdwe)
    }
}
