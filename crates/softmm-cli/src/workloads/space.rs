//! The two memory systems a workload runs on: a softmm address space, and the
//! host kernel through libc. Workloads are written once, generically over
//! [`Space`].
//!
//! Host calls must stay free of heap allocation and locks: in `--mode
//! processes` they run in `fork()`ed children of a multithreaded process.

use std::os::fd::RawFd;
use std::sync::Arc;

use softmm::{AddressSpace, Cpu, Fault, FaultStats, OpenFile};

/// Page size of both systems.
pub const PAGE: u64 = 4096;

/// An address space a workload maps and touches memory in.
pub trait Space: Sync {
    /// What a thread accesses memory through (a softmm [`Cpu`]; nothing on the host).
    type Cpu;
    /// An open file to map.
    type File: Sync;

    /// Makes the calling thread's accessor (a softmm `Cpu` is `!Send`: call
    /// this inside the thread that uses it).
    fn cpu(&self) -> Self::Cpu;
    /// `mmap`; `Err(errno)` on failure.
    fn mmap(&self, addr: u64, len: u64, prot: i32, flags: i32, file: Option<&Self::File>, off: u64)
        -> Result<u64, i32>;
    /// `munmap`.
    fn munmap(&self, addr: u64, len: u64) -> Result<(), i32>;
    /// `madvise`.
    fn madvise(&self, addr: u64, len: u64, advice: i32) -> Result<(), i32>;
    /// `mremap`; the new address.
    fn mremap(&self, addr: u64, old_len: u64, new_len: u64, flags: i32, new_addr: u64) -> Result<u64, i32>;
    /// Stores a byte (faulting the page in as needed).
    fn write(cpu: &mut Self::Cpu, addr: u64, v: u8) -> Result<(), i32>;
    /// Loads a byte.
    fn read(cpu: &mut Self::Cpu, addr: u64) -> Result<u8, i32>;
    /// Before the thread blocks outside the space (a barrier): shootdowns must
    /// not wait for it.
    fn park(_cpu: &mut Self::Cpu) {}
    /// After [`Space::park`].
    fn resume(_cpu: &mut Self::Cpu) {}
    /// The accessor's fault counters, where the space keeps them.
    fn fault_stats(_cpu: &Self::Cpu) -> Option<FaultStats> {
        None
    }
}

/// A softmm address space.
pub struct SoftSpace {
    /// The address space.
    pub mm: Arc<AddressSpace>,
}

fn fault_errno(f: Fault) -> i32 {
    match f {
        Fault::Oom { .. } => libc::ENOMEM,
        Fault::Bus { .. } | Fault::Unaligned { .. } => libc::EIO,
        // SIGSEGV, and any signal a later softmm adds.
        _ => libc::EFAULT,
    }
}

impl Space for SoftSpace {
    type Cpu = Cpu;
    type File = OpenFile;

    fn cpu(&self) -> Cpu {
        Cpu::attached(&self.mm)
    }

    fn mmap(&self, addr: u64, len: u64, prot: i32, flags: i32, file: Option<&OpenFile>, off: u64) -> Result<u64, i32> {
        self.mm.mmap(addr, len, prot, flags, file, off).map_err(|e| e.code())
    }

    fn munmap(&self, addr: u64, len: u64) -> Result<(), i32> {
        self.mm.munmap(addr, len).map_err(|e| e.code())
    }

    fn madvise(&self, addr: u64, len: u64, advice: i32) -> Result<(), i32> {
        self.mm.madvise(addr, len, advice).map_err(|e| e.code())
    }

    fn mremap(&self, addr: u64, old_len: u64, new_len: u64, flags: i32, new_addr: u64) -> Result<u64, i32> {
        self.mm.mremap(addr, old_len, new_len, flags, new_addr).map_err(|e| e.code())
    }

    #[inline]
    fn write(cpu: &mut Cpu, addr: u64, v: u8) -> Result<(), i32> {
        cpu.write_u8(addr, v).map_err(fault_errno)
    }

    #[inline]
    fn read(cpu: &mut Cpu, addr: u64) -> Result<u8, i32> {
        cpu.read_u8(addr).map_err(fault_errno)
    }

    fn park(cpu: &mut Cpu) {
        cpu.park();
    }

    fn resume(cpu: &mut Cpu) {
        cpu.resume();
    }

    fn fault_stats(cpu: &Cpu) -> Option<FaultStats> {
        Some(cpu.stats().fault)
    }
}

/// The host kernel: this process's own address space.
pub struct HostSpace;

/// The calling thread's errno (no allocation).
pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

impl Space for HostSpace {
    type Cpu = ();
    type File = RawFd;

    fn cpu(&self) {}

    fn mmap(&self, addr: u64, len: u64, prot: i32, flags: i32, file: Option<&RawFd>, off: u64) -> Result<u64, i32> {
        let fd = file.copied().unwrap_or(-1);
        // SAFETY: mapping calls only ever target ranges the workload itself
        // reserved or lets the kernel choose (MAP_FIXED only over its own
        // mappings, MAP_FIXED_NOREPLACE into holes), so no Rust object's
        // memory is replaced.
        let p = unsafe { libc::mmap(addr as *mut libc::c_void, len as usize, prot, flags, fd, off as libc::off_t) };
        if p == libc::MAP_FAILED {
            Err(errno())
        } else {
            Ok(p as u64)
        }
    }

    fn munmap(&self, addr: u64, len: u64) -> Result<(), i32> {
        // SAFETY: the workload unmaps only ranges it mapped itself.
        if unsafe { libc::munmap(addr as *mut libc::c_void, len as usize) } != 0 {
            Err(errno())
        } else {
            Ok(())
        }
    }

    fn madvise(&self, addr: u64, len: u64, advice: i32) -> Result<(), i32> {
        // SAFETY: advice on a range the workload mapped itself; MADV_DONTNEED
        // zeroes memory no Rust object lives in.
        if unsafe { libc::madvise(addr as *mut libc::c_void, len as usize, advice) } != 0 {
            Err(errno())
        } else {
            Ok(())
        }
    }

    fn mremap(&self, addr: u64, old_len: u64, new_len: u64, flags: i32, new_addr: u64) -> Result<u64, i32> {
        // SAFETY: the workload moves only pages of its own mappings, and with
        // `MREMAP_FIXED` only onto ranges it mapped or unmapped itself, where
        // no Rust object lives.
        let p = unsafe {
            libc::mremap(
                addr as *mut libc::c_void,
                old_len as usize,
                new_len as usize,
                flags,
                new_addr as *mut libc::c_void,
            )
        };
        if p == libc::MAP_FAILED {
            Err(errno())
        } else {
            Ok(p as u64)
        }
    }

    #[inline]
    fn write(_: &mut (), addr: u64, v: u8) -> Result<(), i32> {
        // SAFETY: `addr` lies in a writable mapping the workload made and no
        // Rust reference covers it; volatile keeps the store (the fault) in.
        unsafe { std::ptr::write_volatile(addr as *mut u8, v) };
        Ok(())
    }

    #[inline]
    fn read(_: &mut (), addr: u64) -> Result<u8, i32> {
        // SAFETY: as in `write`, for a readable mapping.
        Ok(unsafe { std::ptr::read_volatile(addr as *const u8) })
    }
}

/// Nanoseconds of CPU time used by the calling thread.
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// Nanoseconds of CPU time used by the calling process.
pub fn process_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Minor page faults so far of the calling thread (`RUSAGE_THREAD`) or the
/// whole process.
pub fn minor_faults(thread: bool) -> u64 {
    // SAFETY: an all-zero rusage is valid, and getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let who = if thread { libc::RUSAGE_THREAD } else { libc::RUSAGE_SELF };
    // SAFETY: `ru` is a valid out-pointer.
    unsafe { libc::getrusage(who, &mut ru) };
    ru.ru_minflt as u64
}

/// An unlinked file of `size` bytes on tmpfs (`/dev/shm`, else the temporary
/// directory), for the host's file workloads. Closed by [`close_files`].
pub fn host_file(size: u64, tag: &str) -> Result<RawFd, String> {
    use std::ffi::CString;
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let path = dir.join(format!("softmm-{tag}-{}-XXXXXX", std::process::id()));
    let c = CString::new(path.to_string_lossy().into_owned()).map_err(|e| e.to_string())?;
    let mut buf = c.into_bytes_with_nul();
    // SAFETY: `buf` is a NUL-terminated template mkstemp may rewrite.
    let fd = unsafe { libc::mkstemp(buf.as_mut_ptr() as *mut libc::c_char) };
    if fd < 0 {
        return Err(format!("cannot create a file in {}: {}", dir.display(), std::io::Error::last_os_error()));
    }
    // SAFETY: `buf` still holds the NUL-terminated path mkstemp created.
    unsafe { libc::unlink(buf.as_ptr() as *const libc::c_char) };
    // SAFETY: `fd` is the file just opened.
    if unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: closing our own descriptor.
        unsafe { libc::close(fd) };
        return Err(format!("cannot size a {size}-byte file: {e}"));
    }
    Ok(fd)
}

/// Closes files made by [`host_file`].
pub fn close_files(fds: &[RawFd]) {
    for &fd in fds {
        // SAFETY: descriptors this module opened and nothing else uses now.
        unsafe { libc::close(fd) };
    }
}
