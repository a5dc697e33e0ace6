//! `File`'s byte-level calls against the host kernel: for a table of offsets
//! and lengths (zero, one, page edges, `i64::MAX`, `i64::MAX + 1`,
//! `u64::MAX`, `1 << 63`, and values whose sums wrap), each softmm call
//! returns what the matching syscall returns on a host memfd (tmpfs), and
//! leaves the file with the same size and bytes:
//!
//! | softmm | host |
//! |---|---|
//! | `File::read_at` | `pread` |
//! | `File::write_at` | `pwrite` |
//! | `File::punch_hole` | `fallocate(FALLOC_FL_PUNCH_HOLE \| FALLOC_FL_KEEP_SIZE)` |
//! | `File::set_len` | `ftruncate` |
//! | `File::create` | `memfd_create` + `ftruncate` |
//!
//! The offsets above `i64::MAX` reach the host as negative `off_t`s, exactly
//! as a C caller passing the same bits would.

use std::sync::Arc;

use softmm::{Errno, File, PhysConfig, PhysMem};

const PAGE: u64 = 4096;

/// Offsets and lengths worth trying: page edges, the signed limits of `off_t`,
/// and values whose sums with each other wrap past `i64::MAX` or `u64::MAX`.
const VALUES: [u64; 14] = [
    0,
    1,
    PAGE - 1,
    PAGE,
    PAGE + 1,
    3 * PAGE,
    i64::MAX as u64 - PAGE,
    i64::MAX as u64 - 1,
    i64::MAX as u64,
    i64::MAX as u64 + 1,
    1 << 63 | PAGE,
    u64::MAX - PAGE + 1,
    u64::MAX - 1,
    u64::MAX,
];

/// Buffer lengths for reads and writes (a buffer must exist, so no huge ones).
const LENS: [usize; 5] = [0, 1, 4095, 4096, 8193];

fn phys() -> Arc<PhysMem> {
    PhysMem::new(PhysConfig::new(4 << 20)).unwrap()
}

/// A host memfd, closed on drop.
struct Memfd(i32);

impl Memfd {
    fn new() -> Memfd {
        // SAFETY: a plain syscall with a NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"file_errnos".as_ptr(), 0) };
        assert!(fd >= 0, "memfd_create failed");
        Memfd(fd)
    }

    fn ret(r: i64) -> Result<u64, i32> {
        if r < 0 {
            Err(std::io::Error::last_os_error().raw_os_error().unwrap())
        } else {
            Ok(r as u64)
        }
    }

    fn pread(&self, off: u64, buf: &mut [u8]) -> Result<u64, i32> {
        // SAFETY: `buf` is valid for `buf.len()` bytes.
        Self::ret(unsafe { libc::pread(self.0, buf.as_mut_ptr().cast(), buf.len(), off as i64) } as i64)
    }

    fn pwrite(&self, off: u64, data: &[u8]) -> Result<u64, i32> {
        // SAFETY: `data` is valid for `data.len()` bytes.
        Self::ret(unsafe { libc::pwrite(self.0, data.as_ptr().cast(), data.len(), off as i64) } as i64)
    }

    fn punch(&self, off: u64, len: u64) -> Result<u64, i32> {
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: a plain syscall on our own descriptor.
        Self::ret(unsafe { libc::fallocate(self.0, mode, off as i64, len as i64) } as i64)
    }

    fn truncate(&self, size: u64) -> Result<u64, i32> {
        // SAFETY: a plain syscall on our own descriptor.
        Self::ret(unsafe { libc::ftruncate(self.0, size as i64) } as i64)
    }

    fn size(&self) -> u64 {
        // SAFETY: `st` is written by fstat before it is read.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a plain syscall into our own buffer.
        assert_eq!(unsafe { libc::fstat(self.0, &mut st) }, 0);
        st.st_size as u64
    }
}

impl Drop for Memfd {
    fn drop(&mut self) {
        // SAFETY: we own the descriptor.
        unsafe { libc::close(self.0) };
    }
}

fn soft<T: Into<u64>>(r: Result<T, Errno>) -> Result<u64, i32> {
    r.map(Into::into).map_err(Errno::code)
}

/// Both files hold three pages of a pattern, so that reads, punches and
/// truncates have data to return or remove.
fn pair(p: &Arc<PhysMem>) -> (Memfd, Arc<File>) {
    let data: Vec<u8> = (0..3 * PAGE).map(|i| (i % 251) as u8 + 1).collect();
    let host = Memfd::new();
    assert_eq!(host.pwrite(0, &data), Ok(3 * PAGE));
    let f = File::create(p, "f", 0).unwrap();
    assert_eq!(f.write_at(0, &data), Ok(3 * PAGE as usize));
    (host, f)
}

/// The size and the first four pages of both files agree.
#[track_caller]
fn same_contents(host: &Memfd, f: &File, what: &str) {
    assert_eq!(host.size(), f.len(), "{what}: size");
    let mut hb = vec![0u8; 4 * PAGE as usize];
    let mut sb = vec![0u8; 4 * PAGE as usize];
    let hn = host.pread(0, &mut hb);
    let sn = soft(f.read_at(0, &mut sb).map(|n| n as u64));
    assert_eq!(hn, sn, "{what}: read back");
    assert_eq!(hb, sb, "{what}: bytes");
}

#[test]
fn read_at_returns_what_pread_returns() {
    let p = phys();
    let (host, f) = pair(&p);
    for &off in &VALUES {
        for &len in &LENS {
            let mut hb = vec![0xeeu8; len];
            let mut sb = vec![0xeeu8; len];
            let want = host.pread(off, &mut hb);
            let got = soft(f.read_at(off, &mut sb).map(|n| n as u64));
            assert_eq!(got, want, "read_at({off:#x}, {len})");
            assert_eq!(sb, hb, "read_at({off:#x}, {len}): bytes");
        }
    }
}

#[test]
fn write_at_returns_what_pwrite_returns() {
    let p = phys();
    for &off in &VALUES {
        for &len in &LENS {
            let (host, f) = pair(&p);
            let data = vec![0x5au8; len];
            let want = host.pwrite(off, &data);
            let got = soft(f.write_at(off, &data).map(|n| n as u64));
            let what = format!("write_at({off:#x}, {len})");
            assert_eq!(got, want, "{what}");
            same_contents(&host, &f, &what);
            if let (Ok(n), true) = (want, off < i64::MAX as u64) {
                // What was written reads back the same on both.
                let mut hb = vec![0u8; n as usize];
                let mut sb = vec![0u8; n as usize];
                assert_eq!(soft(f.read_at(off, &mut sb).map(|n| n as u64)), host.pread(off, &mut hb), "{what}");
                assert_eq!(sb, hb, "{what}: written bytes");
            }
        }
    }
}

#[test]
fn punch_hole_returns_what_fallocate_returns() {
    let p = phys();
    for &off in &VALUES {
        for &len in &VALUES {
            let (host, f) = pair(&p);
            let want = host.punch(off, len);
            let got = soft(f.punch_hole(off, len).map(|()| 0u64));
            let what = format!("punch_hole({off:#x}, {len:#x})");
            assert_eq!(got, want, "{what}");
            same_contents(&host, &f, &what);
        }
    }
}

#[test]
fn set_len_returns_what_ftruncate_returns() {
    let p = phys();
    for &size in &VALUES {
        let (host, f) = pair(&p);
        let want = host.truncate(size);
        let got = soft(f.set_len(size).map(|()| 0u64));
        let what = format!("set_len({size:#x})");
        assert_eq!(got, want, "{what}");
        same_contents(&host, &f, &what);
    }
}

#[test]
fn create_returns_what_memfd_create_and_ftruncate_return() {
    let p = phys();
    for &size in &VALUES {
        let host = Memfd::new();
        let want = host.truncate(size).map(|_| host.size());
        let got = soft(File::create(&p, "c", size).map(|f| f.len()));
        assert_eq!(got, want, "create({size:#x})");
    }
}

/// Linux caps one read or write at `MAX_RW_COUNT` (`INT_MAX` rounded down to
/// a page) bytes; a bigger buffer gets a short count, not an error. (Not
/// compared with the host: it needs a 2 GiB buffer.)
#[test]
fn reads_and_writes_are_capped_at_max_rw_count() {
    let p = PhysMem::new(PhysConfig::new(8 << 20)).unwrap();
    let f = File::create(&p, "big", 0).unwrap();
    let max = File::MAX_RW_COUNT;
    f.set_len(max as u64 + 2 * PAGE).unwrap();
    // A sparse file reads as zeros without allocating, so a huge read is cheap.
    let mut buf = vec![1u8; max + PAGE as usize];
    assert_eq!(f.read_at(0, &mut buf), Ok(max));
    assert!(buf[..max].iter().all(|&b| b == 0));
    assert!(buf[max..].iter().all(|&b| b == 1), "nothing past the cap is written");
    assert_eq!(p.stats().frames_used, 0);
}
