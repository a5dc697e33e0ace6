//! The reservation guard against the real host: it grows the pool, mounts a
//! working hugetlbfs, and puts both back on drop, on unwind, and after a
//! holder that died without unwinding. Each test prints the host's reason
//! and passes where the host refuses (not root, no hugetlb, no memory).

use std::ffi::CString;
use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use softmm_hostsys::{pool_counters, HostError, HugePages, HUGE_PAGE_SIZE, MAX_PAGES};

/// `statfs`'s `f_type` of hugetlbfs.
const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;

/// Reserves, or prints why the host refused and returns `None`.
#[track_caller]
fn reserve(pages: usize, mount: bool) -> Option<HugePages> {
    let r = if mount { HugePages::reserve_with_mount(pages) } else { HugePages::reserve(pages) };
    match r {
        Ok(g) => Some(g),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

/// The pool's size with nobody holding a reservation, read under the lock
/// (so a reservation of another process is not counted).
fn base_total() -> Option<u64> {
    reserve(0, false).map(|g| g.total_before())
}

fn fs_type(p: &Path) -> i64 {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: `statfs` writes only into `buf`, which is a valid,
    // properly aligned `libc::statfs` on this stack frame.
    unsafe {
        let mut buf: libc::statfs = std::mem::zeroed();
        assert_eq!(libc::statfs(c.as_ptr(), &mut buf), 0, "statfs {}", p.display());
        buf.f_type as i64
    }
}

/// Maps `pages` huge pages of a new file on `dir` shared, writes each, and
/// unmaps; returns the pool's free count seen while they were mapped.
fn use_pages(dir: &Path, pages: usize) -> u64 {
    let path = dir.join("f");
    let file = OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&path).unwrap();
    let len = pages * HUGE_PAGE_SIZE as usize;
    // SAFETY: a fresh shared mapping of our own file, at an address the
    // kernel picks; it is written only inside `len` and unmapped below.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "mmap of the hugetlbfs file: {}", std::io::Error::last_os_error());
        for i in 0..pages {
            *(p as *mut u8).add(i * HUGE_PAGE_SIZE as usize) = 1;
        }
        let free = pool_counters().unwrap().free;
        assert_eq!(libc::munmap(p, len), 0);
        free
    }
}

#[test]
fn reserve_grows_the_pool_mounts_hugetlbfs_and_drop_restores_both() {
    let Some(g) = reserve(4, true) else { return };
    let before = g.total_before();
    assert_eq!(g.pages(), 4);
    assert_eq!(pool_counters().unwrap().total, before + 4);
    let dir = g.mount_dir().expect("a mount was asked for").to_path_buf();
    assert_eq!(fs_type(&dir), HUGETLBFS_MAGIC);
    let free_before = pool_counters().unwrap().free;
    let free_while = use_pages(&dir, 3);
    assert_eq!(free_while, free_before - 3, "the file's pages come from the pool");
    drop(g);
    assert!(!dir.exists(), "the mount point is removed");
    assert_eq!(base_total(), Some(before));
}

#[test]
fn a_panic_while_holding_the_reservation_restores_the_host() {
    let Some(before) = base_total() else { return };
    let mut dir = None;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let g = HugePages::reserve_with_mount(2).unwrap();
        dir = g.mount_dir().map(Path::to_path_buf);
        panic!("on purpose");
    }));
    assert!(r.is_err());
    assert!(!dir.unwrap().exists());
    assert_eq!(base_total(), Some(before));
}

#[test]
fn too_many_pages_is_refused_and_changes_nothing() {
    let Some(before) = base_total() else { return };
    let e = HugePages::reserve(MAX_PAGES + 1).unwrap_err();
    assert!(matches!(e, HostError::TooMany { asked } if asked == MAX_PAGES + 1), "{e}");
    assert!(e.to_string().contains("1281 huge pages asked"), "{e}");
    assert_eq!(base_total(), Some(before));
}

#[test]
fn a_thread_asking_twice_is_refused_instead_of_waiting_for_itself() {
    let Some(g) = reserve(0, false) else { return };
    let e = HugePages::reserve(1).unwrap_err();
    assert!(matches!(e, HostError::Busy { .. }), "{e}");
    drop(g);
}

#[test]
fn reservations_of_parallel_threads_do_not_overlap() {
    let Some(before) = base_total() else { return };
    let threads: Vec<_> = (0..3)
        .map(|i| {
            std::thread::spawn(move || {
                let g = HugePages::reserve(i + 1).unwrap();
                // While a guard lives, the pool is its own base plus its
                // own pages: no other reservation is in between.
                for _ in 0..20 {
                    assert_eq!(pool_counters().unwrap().total, g.total_before() + (i + 1) as u64);
                    std::thread::yield_now();
                }
                g.total_before()
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), before);
    }
    assert_eq!(base_total(), Some(before));
}

/// Set in the child process of the test below.
const CHILD: &str = "SOFTMM_HOSTSYS_DYING_HOLDER";

/// Not a test of its own: in the child process that the test below starts
/// (this binary again, with [`CHILD`] set), reserves 3 pages with a mount,
/// prints the mount point and exits without unwinding or dropping anything.
#[test]
fn dying_holder_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let code = match HugePages::reserve_with_mount(3) {
        Ok(g) => {
            println!("MOUNT={}", g.mount_dir().unwrap().display());
            std::mem::forget(g);
            0
        }
        Err(e) => {
            println!("ERR={e}");
            1
        }
    };
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    // SAFETY: ends this child process at once, without unwinding or running
    // destructors: the death this test is about.
    unsafe { libc::_exit(code) };
}

#[test]
fn a_holder_that_dies_without_unwinding_is_undone_by_the_next_reservation() {
    let Some(before) = base_total() else { return };
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "dying_holder_child", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = stdout
        .split_once("MOUNT=")
        .and_then(|(_, rest)| rest.lines().next())
        .unwrap_or_else(|| panic!("the child could not reserve: {stdout}"));
    let dir = std::path::PathBuf::from(dir);
    assert_eq!(pool_counters().unwrap().total, before + 3, "the dead child left its pages");
    assert!(dir.exists());
    assert_eq!(base_total(), Some(before), "the next reservation restored the pool");
    assert!(!dir.exists(), "and removed the mount");
}
