//! The runner, on the host under strace: runs each sequence with raw
//! system calls in a forked child, writes its maps, forks and execs as the
//! sequence says.

use super::*;

/// Set in an exec'd program: `SEQ NEXT I0 I1 I2 I3 S0 S1 S2 S3`, the
/// sequence, the index of its next op, the inherited descriptors and the
/// slots' descriptors (-1 for none) as the process had them at its execve.
pub(super) const EXEC_ENV: &str = "SOFTMM_REPLAY_EXEC";

/// What a sequence's processes use, made before any fork: they run raw
/// system calls only (no allocation), exec included.
pub(super) struct Ctx {
    /// The runner's descriptors: read-write, read-only, write-only, memfd.
    inherited: Vec<i32>,
    /// The files the ops open.
    paths: Vec<std::ffi::CString>,
    /// Starts each block of maps on standard output.
    header: String,
    /// This test binary.
    exe: std::ffi::CString,
    /// `exe runner_entry --exact ...`, then a null pointer.
    argv: Vec<*const libc::c_char>,
    _args: Vec<std::ffi::CString>,
    /// `RUNNER_ENV=ops file`.
    input_env: std::ffi::CString,
    /// The sequence's index in the ops file.
    seq: usize,
}

impl Ctx {
    fn new(input: &Path, seq: usize, inherited: &[i32], paths: &[std::ffi::CString]) -> Ctx {
        let exe = std::env::current_exe().expect("current_exe");
        let exe = std::ffi::CString::new(exe.to_str().expect("utf-8 path")).expect("path");
        let args: Vec<std::ffi::CString> =
            [exe.to_str().expect("utf-8"), "runner_entry", "--exact", "--ignored", "--nocapture", "--test-threads=1"]
                .iter()
                .map(|a| std::ffi::CString::new(*a).expect("arg"))
                .collect();
        let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        let input_env =
            std::ffi::CString::new(format!("{RUNNER_ENV}={}", input.to_str().expect("utf-8 path"))).expect("env");
        let (inherited, paths) = (inherited.to_vec(), paths.to_vec());
        Ctx { inherited, paths, header: format!("{MARK} seq {seq} pid "), exe, argv, _args: args, input_env, seq }
    }
}

/// The size of the runner's files (sparse): past every offset a sequence
/// maps (`1 << 40` and a window's length beyond), so that no page of a
/// file mapping lies past the end of its file. strace shows no file's size
/// and the replay sizes a file to cover what the log mapped, so a lock
/// (whose populate fails with `ENOMEM` on a page past the end) would see
/// a different file.
const FILE_SIZE: u64 = 1 << 41;

/// `mseal`'s number (x86-64; Linux 6.10).
const SYS_MSEAL: libc::c_long = 462;
const PR_SET_MDWE: libc::c_int = 65;
const PR_GET_MDWE: libc::c_int = 66;
/// Takes `CAP_IPC_LOCK` away from the runner and every program it and its
/// children exec (from the bounding set too: root regains its permitted
/// set at `execve`), and sets `RLIMIT_MEMLOCK` to softmm's default (8
/// MiB): strace does not print capabilities, so the replay, which infers
/// them only from a lock past the limit that succeeded, locks as a process
/// without them, and the limit is the same on every host. Without the
/// capability, a lock longer than the limit is refused before any change:
/// the sequences' huge lengths never lock (nor populate) the runner's
/// memory.
fn drop_ipc_lock() {
    use softmm_testkit::caps::{drop_capabilities, Caps, CAP_IPC_LOCK};
    let limit = libc::rlimit { rlim_cur: 8 << 20, rlim_max: 8 << 20 };
    assert_eq!(drop_capabilities(Caps::one(CAP_IPC_LOCK), true), Ok(()));
    // SAFETY: a plain system call on this function's own structure.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) }, 0, "setrlimit");
}

/// A line built on the stack (a forked child must not allocate).
pub(super) struct Line {
    b: [u8; 256],
    n: usize,
}

impl Line {
    fn new() -> Line {
        Line { b: [0; 256], n: 0 }
    }
    fn push(&mut self, s: &[u8]) {
        self.b[self.n..self.n + s.len()].copy_from_slice(s);
        self.n += s.len();
    }
    /// `v` in decimal.
    fn num(&mut self, v: i64) {
        if v < 0 {
            self.push(b"-");
        }
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        let mut u = v.unsigned_abs();
        loop {
            at -= 1;
            digits[at] = b'0' + (u % 10) as u8;
            u /= 10;
            if u == 0 {
                break;
            }
        }
        self.push(&digits[at..]);
    }
}

pub(super) fn runner_main(input: &Path) -> ! {
    let seqs = decode(&std::fs::read_to_string(input).expect("ops file"));
    let dir = input.parent().expect("ops file dir");
    drop_ipc_lock();
    // Everything the children use is made before the first fork: they run
    // raw system calls only (no allocation).
    let paths: Vec<std::ffi::CString> = (0..FILES)
        .map(|i| {
            let p = dir.join(format!("file{i}"));
            std::fs::write(&p, vec![7u8; 16 * P as usize]).expect("file");
            std::fs::File::options().write(true).open(&p).and_then(|f| f.set_len(FILE_SIZE)).expect("file size");
            std::ffi::CString::new(p.to_str().expect("utf-8 path")).expect("path")
        })
        .collect();
    let modes = [libc::O_RDWR, libc::O_RDONLY, libc::O_WRONLY];
    // SAFETY: plain system calls on valid NUL-terminated paths.
    let inherited: Vec<i32> = unsafe {
        let mut v: Vec<i32> = paths.iter().zip(modes).map(|(p, m)| libc::open(p.as_ptr(), m)).collect();
        let m = libc::memfd_create(c"replay".as_ptr(), 0);
        libc::ftruncate(m, FILE_SIZE as i64);
        v.push(m);
        v
    };
    let mut maps_buf = vec![0u8; 1 << 20];
    for (i, seq) in seqs.iter().enumerate() {
        let ctx = Ctx::new(input, i, &inherited, &paths);
        // SAFETY: the child makes only system calls on memory allocated
        // before the fork, then _exit or execve.
        unsafe {
            let pid = libc::fork();
            if pid == 0 {
                run_child(seq, 0, [-1; SLOTS], &ctx, &mut maps_buf);
            }
            let mut st = 0;
            libc::waitpid(pid, &mut st, 0);
        }
    }
    // SAFETY: ends the runner without libtest's summary.
    unsafe { libc::_exit(0) }
}

/// An exec'd program: runs the rest of its sequence from the state in
/// `state` (see [`EXEC_ENV`]).
pub(super) fn exec_main(input: &Path, state: &str) -> ! {
    let v: Vec<i64> = state.split_whitespace().map(|t| t.parse().expect("exec state")).collect();
    let (seq, next) = (v[0] as usize, v[1] as usize);
    let inherited: Vec<i32> = v[2..6].iter().map(|&f| f as i32).collect();
    let mut slots = [-1i32; SLOTS];
    for (s, &f) in slots.iter_mut().zip(&v[6..6 + SLOTS]) {
        *s = f as i32;
    }
    let seqs = decode(&std::fs::read_to_string(input).expect("ops file"));
    let dir = input.parent().expect("ops file dir");
    let paths: Vec<std::ffi::CString> = (0..FILES)
        .map(|i| std::ffi::CString::new(dir.join(format!("file{i}")).to_str().expect("utf-8")).expect("path"))
        .collect();
    let mut maps_buf = vec![0u8; 1 << 20];
    let ctx = Ctx::new(input, seq, &inherited, &paths);
    // SAFETY: as for a forked child (its own forks' children make only
    // system calls on memory allocated here).
    unsafe { run_child(&seqs[seq][next..], next, slots, &ctx, &mut maps_buf) }
}

/// Writes `/proc/self/smaps` to standard output as a block of the runner's
/// output: `header`, the pid, the smaps, `@@end` (the maps lines with their
/// `VmFlags`: locks and seals show there only).
///
/// # Safety
/// Only system calls, on `buf` and `header` (allocated before any fork).
unsafe fn dump_maps(buf: &mut [u8], header: &str) {
    // SAFETY: open/read/write/close on valid buffers.
    unsafe {
        let fd = libc::open(c"/proc/self/smaps".as_ptr(), libc::O_RDONLY);
        let mut n = 0usize;
        loop {
            let r = libc::read(fd, buf[n..].as_mut_ptr().cast(), buf.len() - n);
            if r <= 0 {
                break;
            }
            n += r as usize;
        }
        libc::close(fd);
        let mut line = Line::new();
        line.push(header.as_bytes());
        line.num(libc::getpid() as i64);
        line.push(b"\n");
        libc::write(1, line.b.as_ptr().cast(), line.n);
        libc::write(1, buf.as_ptr().cast(), n);
        let end = "@@end\n";
        libc::write(1, end.as_ptr().cast(), end.len());
    }
}

/// Runs `seq` (the ops from index `base` of its sequence) with the slots'
/// descriptors `slots`, writes the maps, and exits.
///
/// # Safety
/// Runs in a forked child of the runner or in an exec'd program: only
/// system calls on memory allocated before the fork.
unsafe fn run_child(seq: &[Op], base: usize, mut slots: [i32; SLOTS], ctx: &Ctx, buf: &mut [u8]) -> ! {
    let (inherited, paths, header) = (&ctx.inherited, &ctx.paths, ctx.header.as_str());
    for (k, op) in seq.iter().enumerate() {
        // SAFETY: raw system calls (all arms) whose ranges the generator
        // keeps in the window or makes the kernel refuse (see module docs).
        unsafe {
            match *op {
                Op::Open { slot, file, mode } => {
                    if slots[slot] >= 0 {
                        libc::close(slots[slot]);
                    }
                    slots[slot] = libc::openat(libc::AT_FDCWD, paths[file].as_ptr(), mode);
                }
                Op::Close { slot } => {
                    if slots[slot] >= 0 {
                        libc::close(slots[slot]);
                        slots[slot] = -1;
                    }
                }
                Op::Mmap { addr, len, prot, flags, fd, off } => {
                    let fd = match fd {
                        FdSrc::Anon => -1,
                        FdSrc::Inherited(i) => inherited[i],
                        FdSrc::Slot(s) if slots[s] >= 0 => slots[s],
                        FdSrc::Slot(s) => 90 + s as i32,
                    };
                    libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off);
                }
                Op::Munmap { addr, len } => {
                    libc::syscall(libc::SYS_munmap, addr, len);
                }
                Op::Mprotect { addr, len, prot } => {
                    libc::syscall(libc::SYS_mprotect, addr, len, prot);
                }
                Op::Madvise { addr, len, advice } => {
                    libc::syscall(libc::SYS_madvise, addr, len, advice);
                }
                Op::Mremap { old, old_len, new_len, flags, new_addr } => {
                    libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new_addr);
                }
                Op::Mlock { addr, len, flags: None } => {
                    libc::syscall(libc::SYS_mlock, addr, len);
                }
                Op::Mlock { addr, len, flags: Some(f) } => {
                    libc::syscall(libc::SYS_mlock2, addr, len, f);
                }
                Op::Munlock { addr, len } => {
                    libc::syscall(libc::SYS_munlock, addr, len);
                }
                Op::Mlockall { flags } => {
                    libc::syscall(libc::SYS_mlockall, flags);
                }
                Op::Munlockall => {
                    libc::syscall(libc::SYS_munlockall);
                }
                Op::Mseal { addr, len, flags } => {
                    libc::syscall(SYS_MSEAL, addr, len, flags);
                }
                Op::Mdwe { get: false, arg2, arg3 } => {
                    libc::syscall(libc::SYS_prctl, PR_SET_MDWE, arg2, arg3, 0u64, 0u64);
                }
                Op::Mdwe { get: true, arg2, .. } => {
                    libc::syscall(libc::SYS_prctl, PR_GET_MDWE, arg2, 0u64, 0u64, 0u64);
                }
                Op::Fork => {
                    let pid = libc::fork();
                    if pid > 0 {
                        let mut st = 0;
                        libc::waitpid(pid, &mut st, 0);
                    }
                }
                Op::Exec => {
                    // The maps at the execve, then the new program. A
                    // close-on-exec slot keeps its number in the state: the
                    // new program's use of it must fail as on the host.
                    dump_maps(buf, header);
                    let mut state = Line::new();
                    state.push(EXEC_ENV.as_bytes());
                    state.push(b"=");
                    state.num(ctx.seq as i64);
                    state.push(b" ");
                    state.num((base + k + 1) as i64);
                    for &f in inherited.iter().chain(&slots) {
                        state.push(b" ");
                        state.num(f as i64);
                    }
                    state.push(b"\0");
                    let envp = [ctx.input_env.as_ptr(), state.b.as_ptr().cast(), std::ptr::null()];
                    libc::execve(ctx.exe.as_ptr(), ctx.argv.as_ptr(), envp.as_ptr());
                    let msg = "execve failed\n";
                    libc::write(2, msg.as_ptr().cast(), msg.len());
                    libc::_exit(1)
                }
            }
        }
    }
    // SAFETY: system calls on buffers allocated before the fork.
    unsafe {
        dump_maps(buf, header);
        libc::_exit(0)
    }
}
