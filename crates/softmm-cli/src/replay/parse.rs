//! Parsing `strace -f -y` output (or the same syntax written by hand): the
//! memory calls (`-e trace=memory`: mmap, munmap, mprotect, mremap, brk,
//! madvise), the process calls when the log has them (`-e trace=process`:
//! execve, clone, clone3, fork, vfork, exit, exit_group) and the descriptor
//! calls (open, openat, creat, close, dup, dup2, dup3, memfd_create); pid
//! prefixes (`123 ` or `[pid 123] `), optional timestamps, `<unfinished ...>`
//! / `<... NAME resumed>` pairs of interleaved threads, fd annotations
//! (`3</usr/lib/x.so>`, `3</tmp/x>(deleted)`), symbolic flags
//! (`PROT_READ|PROT_WRITE`, `MAP_PRIVATE|MAP_FIXED`, `MADV_DONTNEED`, `0x...`
//! for unknown bits) and results (`0x7f...`, `0`, `3</path>`, `-1 ENOMEM
//! (Cannot allocate memory)`, `?` for an exit).

use std::collections::HashMap;

/// The fd argument of an `mmap`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fd {
    /// `-1` (or any negative number).
    None,
    /// A descriptor without a path (`3`).
    Num(i64),
    /// A descriptor with `-y`'s path (`3</usr/lib/libc.so.6>`).
    Path(i64, String),
}

impl Fd {
    /// The name its in-memory file gets, if it is a descriptor.
    pub fn key(&self) -> Option<String> {
        match self {
            Fd::None => None,
            Fd::Num(n) => Some(format!("fd {n}")),
            Fd::Path(_, p) => Some(p.clone()),
        }
    }
}

/// A traced call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// `mmap(addr, len, prot, flags, fd, offset)`.
    Mmap { addr: u64, len: u64, prot: i32, flags: i32, fd: Fd, off: u64 },
    /// `munmap(addr, len)`.
    Munmap { addr: u64, len: u64 },
    /// `mprotect(addr, len, prot)`.
    Mprotect { addr: u64, len: u64, prot: i32 },
    /// `mremap(old, old_len, new_len, flags[, new_addr])`.
    Mremap { old: u64, old_len: u64, new_len: u64, flags: i32, new_addr: u64 },
    /// `brk(addr)`.
    Brk { addr: u64 },
    /// `madvise(addr, len, advice)`.
    Madvise { addr: u64, len: u64, advice: i32 },
    /// `mlock(addr, len)` (`flags` `None`) or `mlock2(addr, len, flags)`.
    Mlock { addr: u64, len: u64, flags: Option<i32> },
    /// `munlock(addr, len)`.
    Munlock { addr: u64, len: u64 },
    /// `mlockall(flags)`.
    Mlockall { flags: i32 },
    /// `munlockall()`.
    Munlockall,
    /// `mseal(addr, len, flags)` (strace 6.1 prints it `syscall_0x1ce`).
    Mseal { addr: u64, len: u64, flags: u64 },
    /// `prctl(PR_SET_MDWE, ...)` or (`get`) `prctl(PR_GET_MDWE, ...)`: the
    /// four arguments after the option (missing ones 0).
    Mdwe { get: bool, args: [u64; 4] },
    /// `execve(path, argv, envp)` or `execveat`: on success the thread's
    /// process runs a new program in a new address space.
    Execve { path: String, argv: Vec<String> },
    /// `clone`, `clone3`, `fork` (flags 0) or `vfork` (`CLONE_VM |
    /// CLONE_VFORK`): a new thread or process, whose pid is the result.
    Clone { flags: u64 },
    /// `exit_group` (the whole process) or `exit` (one thread).
    Exit { group: bool },
    /// `open`, `openat` or `creat`: a new descriptor (the result) for `path`
    /// with `O_*` flags `flags`.
    Open { path: String, flags: i32 },
    /// `close(fd)`.
    Close { fd: i64 },
    /// `dup(old)`, `dup2(old, new)` or `dup3(old, new, flags)`: the result is
    /// a descriptor for the same open file, close-on-exec if `dup3` said so.
    Dup { old: i64, cloexec: bool },
    /// `memfd_create(name, flags)`: a new read-write descriptor, on
    /// hugetlbfs with `MFD_HUGETLB`.
    MemfdCreate { name: String, cloexec: bool, hugetlb: bool },
    /// `setrlimit(resource, {rlim_cur=...})` or `prlimit64` of the caller
    /// (pid 0 or its own) with a new limit: the soft limit `cur` of
    /// `resource` (`RLIMIT_STACK`), `u64::MAX` for `RLIM_INFINITY`.
    Rlimit { resource: String, cur: u64 },
    /// `unlink(path)` or `unlinkat(dirfd, path, flags)`, the path made
    /// absolute with the `-y` path of the directory descriptor (or of
    /// `AT_FDCWD`).
    Unlink { path: String },
}

/// `CLONE_VM`: the child shares the parent's address space.
pub const CLONE_VM: u64 = 0x100;
/// `CLONE_FILES`: the child shares the parent's descriptor table.
pub const CLONE_FILES: u64 = 0x400;
/// `CLONE_VFORK`: the parent waits until the child execs or exits.
pub const CLONE_VFORK: u64 = 0x4000;
/// `CLONE_THREAD`: the child is a thread of the parent's process.
pub const CLONE_THREAD: u64 = 0x10000;

impl Call {
    /// The syscall's name.
    pub fn name(&self) -> &'static str {
        match self {
            Call::Mmap { .. } => "mmap",
            Call::Munmap { .. } => "munmap",
            Call::Mprotect { .. } => "mprotect",
            Call::Mremap { .. } => "mremap",
            Call::Brk { .. } => "brk",
            Call::Madvise { .. } => "madvise",
            Call::Mlock { flags: None, .. } => "mlock",
            Call::Mlock { .. } => "mlock2",
            Call::Munlock { .. } => "munlock",
            Call::Mlockall { .. } => "mlockall",
            Call::Munlockall => "munlockall",
            Call::Mseal { .. } => "mseal",
            Call::Mdwe { .. } => "prctl",
            Call::Execve { .. } => "execve",
            Call::Clone { .. } => "clone",
            Call::Exit { .. } => "exit",
            Call::Open { .. } => "open",
            Call::Close { .. } => "close",
            Call::Dup { .. } => "dup",
            Call::MemfdCreate { .. } => "memfd_create",
            Call::Rlimit { .. } => "setrlimit",
            Call::Unlink { .. } => "unlink",
        }
    }

    /// Whether it is one of the memory calls softmm replays.
    pub fn is_memory(&self) -> bool {
        matches!(
            self,
            Call::Mmap { .. }
                | Call::Munmap { .. }
                | Call::Mprotect { .. }
                | Call::Mremap { .. }
                | Call::Brk { .. }
                | Call::Madvise { .. }
                | Call::Mlock { .. }
                | Call::Munlock { .. }
                | Call::Mlockall { .. }
                | Call::Munlockall
                | Call::Mseal { .. }
                | Call::Mdwe { .. }
        )
    }

    /// Whether it creates or ends a process or thread.
    pub fn is_process(&self) -> bool {
        matches!(self, Call::Execve { .. } | Call::Clone { .. } | Call::Exit { .. })
    }
}

/// A recorded result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ret {
    /// A value (an address, or 0).
    Val(u64),
    /// `-1 ERRNO`.
    Err(i32),
}

/// One call with its result.
#[derive(Debug, Clone)]
pub struct Record {
    /// Line where the call starts (1-based).
    pub line: usize,
    /// Line where its result is (the `resumed` line of a split call).
    pub end_line: usize,
    /// The thread, if the log names it.
    pub pid: Option<u64>,
    /// The call.
    pub call: Call,
    /// What it returned.
    pub ret: Ret,
    /// The path `-y` wrote after a descriptor result (`= 3</usr/lib/x.so>`).
    pub ret_path: Option<String>,
    /// The call as written (`name(args)`), rejoined if it was split.
    pub text: String,
}

/// A parsed log.
#[derive(Debug, Default)]
pub struct Log {
    /// The calls, in the order their results were written.
    pub records: Vec<Record>,
    /// Lines of traced calls that could not be understood: `(line, why)`.
    pub bad: Vec<(usize, String)>,
    /// Calls without a result (`= ?`, or never resumed).
    pub incomplete: Vec<usize>,
    /// Calls of other syscalls, ignored.
    pub other_calls: usize,
}

const NAMES: &[&str] = &[
    "mmap",
    "munmap",
    "mprotect",
    "mremap",
    "brk",
    "madvise",
    "mlock",
    "mlock2",
    "munlock",
    "mlockall",
    "munlockall",
    "mseal",
    "syscall_0x1ce",
    "prctl",
    "execve",
    "execveat",
    "clone",
    "clone3",
    "fork",
    "vfork",
    "exit",
    "exit_group",
    "open",
    "openat",
    "creat",
    "close",
    "dup",
    "dup2",
    "dup3",
    "memfd_create",
    "setrlimit",
    "prlimit64",
    "unlink",
    "unlinkat",
];

/// Parses a whole log.
pub fn parse(text: &str) -> Log {
    let mut log = Log::default();
    // Per thread: (line, text up to the `<unfinished ...>` marker).
    let mut pending: HashMap<Option<u64>, (usize, String)> = HashMap::new();
    for (i, raw) in text.lines().enumerate() {
        let lineno = i + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (pid, rest) = split_pid(line);
        let rest = strip_timestamp(rest);
        if rest.starts_with("+++") || rest.starts_with("---") || rest.starts_with("strace:") {
            continue;
        }
        if let Some(after) = rest.strip_prefix("<...") {
            // `<... mmap resumed>) = 0x...`
            let Some(close) = after.find('>') else {
                log.bad.push((lineno, "malformed `resumed` line".into()));
                continue;
            };
            let name = after[..close].trim().trim_end_matches("resumed").trim();
            let tail = &after[close + 1..];
            match pending.remove(&pid) {
                Some((start, head)) => {
                    if !head.starts_with(name) {
                        log.bad.push((lineno, format!("`{name}` resumed, but line {start} started another call")));
                        continue;
                    }
                    let full = format!("{head}{tail}");
                    finish(&mut log, start, lineno, pid, &full);
                }
                None => {
                    if NAMES.contains(&name) {
                        log.bad.push((lineno, format!("`{name}` resumed without its start")));
                    }
                }
            }
            continue;
        }
        if let Some(head) = rest.strip_suffix("<unfinished ...>") {
            let head = head.trim_end().to_string();
            if let Some((old, _)) = pending.insert(pid, (lineno, head)) {
                log.incomplete.push(old);
            }
            continue;
        }
        finish(&mut log, lineno, lineno, pid, rest);
    }
    let mut left: Vec<usize> = pending.into_values().map(|(l, _)| l).collect();
    left.sort_unstable();
    log.incomplete.extend(left);
    log
}

/// `123 rest` or `[pid 123] rest` → the pid and the rest.
fn split_pid(line: &str) -> (Option<u64>, &str) {
    if let Some(r) = line.strip_prefix("[pid") {
        if let Some(end) = r.find(']') {
            if let Ok(pid) = r[..end].trim().parse() {
                return (Some(pid), r[end + 1..].trim_start());
            }
        }
    }
    let digits = line.bytes().take_while(|b| b.is_ascii_digit()).count();
    if digits > 0 && line[digits..].starts_with([' ', '\t']) {
        let rest = line[digits..].trim_start();
        // A timestamp (`12:00:01.5`) is not a pid: it is followed by `:` or `.`.
        if let Ok(pid) = line[..digits].parse() {
            return (Some(pid), rest);
        }
    }
    (None, line)
}

/// Drops a leading `-t`/`-tt`/`-ttt`/`-r` timestamp.
fn strip_timestamp(s: &str) -> &str {
    let end = s.find([' ', '\t']).unwrap_or(0);
    let tok = &s[..end];
    if !tok.is_empty() && tok.bytes().all(|b| b.is_ascii_digit() || b == b':' || b == b'.') && tok.contains([':', '.'])
    {
        s[end..].trim_start()
    } else {
        s
    }
}

fn finish(log: &mut Log, line: usize, end_line: usize, pid: Option<u64>, text: &str) {
    let Some(open) = text.find('(') else {
        log.bad.push((line, "not a call".into()));
        return;
    };
    let name = text[..open].trim();
    if !NAMES.contains(&name) {
        if name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            log.other_calls += 1;
        } else {
            log.bad.push((line, "not a call".into()));
        }
        return;
    }
    // Of prctl's options only MDWE's concern the address space.
    if name == "prctl" && mdwe_option(&text[open + 1..]).is_none() {
        log.other_calls += 1;
        return;
    }
    // The result follows the last `)` that is followed by `=`.
    let Some((close, ret)) = split_result(text) else {
        log.bad.push((line, "no result (`= ...`)".into()));
        return;
    };
    let ret_path = ret_path(ret);
    let ret = match parse_ret(ret) {
        Ok(Some(r)) => r,
        // An exit never returns: strace writes `= ?`.
        Ok(None) if name == "exit" || name == "exit_group" => Ret::Val(0),
        Ok(None) => {
            log.incomplete.push(line);
            return;
        }
        Err(e) => {
            log.bad.push((end_line, e));
            return;
        }
    };
    let args = split_args(&text[open + 1..close]);
    match parse_call(name, &args) {
        Ok(call) => {
            let text = format!("{}({})", name, args.join(", "));
            log.records.push(Record { line, end_line, pid, call, ret, ret_path, text })
        }
        Err(e) => log.bad.push((line, e)),
    }
}

/// `Some(get)` if `args` (a `prctl` line after its `(`) starts with
/// `PR_SET_MDWE` (65) or `PR_GET_MDWE` (66), by name or number.
fn mdwe_option(args: &str) -> Option<bool> {
    let first = args.split([',', ')']).next()?;
    match strip_comments(first).trim() {
        "PR_SET_MDWE" | "0x41" | "65" => Some(false),
        "PR_GET_MDWE" | "0x42" | "66" => Some(true),
        _ => None,
    }
}

fn split_result(text: &str) -> Option<(usize, &str)> {
    let bytes = text.as_bytes();
    let mut i = text.len();
    while let Some(eq) = text[..i].rfind('=') {
        let before = text[..eq].trim_end();
        if before.ends_with(')') && (eq + 1 == bytes.len() || bytes[eq + 1] == b' ') {
            return Some((before.len() - 1, text[eq + 1..].trim()));
        }
        i = eq;
    }
    None
}

/// `Ok(None)` for an unknown result (`?`).
fn parse_ret(s: &str) -> Result<Option<Ret>, String> {
    let mut toks = s.split_whitespace();
    let v = toks.next().ok_or("empty result")?;
    if v == "?" {
        return Ok(None);
    }
    if v.starts_with('-') {
        let name = toks.next().ok_or_else(|| format!("result {v} without an errno name"))?;
        let code = errno_code(name).ok_or_else(|| format!("unknown errno {name}"))?;
        return Ok(Some(Ret::Err(code)));
    }
    // `3</usr/lib/x.so>`: a descriptor with its path.
    let v = v.split_once('<').map_or(v, |(n, _)| n);
    Ok(Some(Ret::Val(number(v)?)))
}

/// The path of a descriptor result (`3</a b>`, `3</tmp/x>(deleted)`).
fn ret_path(s: &str) -> Option<String> {
    let s = s.trim();
    let (n, rest) = s.split_once('<')?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let rest = rest.trim_end();
    let rest = rest.strip_suffix(DELETED).unwrap_or(rest).trim_end();
    Some(rest.strip_suffix('>')?.to_string())
}

/// Splits an argument list at top-level commas (not inside brackets, quotes
/// or an fd's `<path>`, which ends at a `>` followed by `,` or the end).
fn split_args(s: &str) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut quote = false;
    let mut path = false;
    let mut cur = String::new();
    for (i, &c) in chars.iter().enumerate() {
        if path {
            cur.push(c);
            if c == '>' && path_ends(&chars[i + 1..]) {
                path = false;
            }
            continue;
        }
        match c {
            '"' if i == 0 || chars[i - 1] != '\\' => quote = !quote,
            '<' if !quote && depth == 0 && !cur.trim().is_empty() && cur.trim().bytes().all(|b| b.is_ascii_digit()) => {
                path = true;
            }
            '(' | '[' | '{' if !quote => depth += 1,
            ')' | ']' | '}' if !quote => depth -= 1,
            ',' if !quote && depth <= 0 => {
                out.push(cur.trim().to_string());
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() || !out.is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// Whether a `>` followed by `rest` closes an fd's `<path>`: what follows is
/// the end of the argument (`,` or nothing), perhaps after strace's
/// `(deleted)` mark of an unlinked file (`3</tmp/x>(deleted)`).
fn path_ends(rest: &[char]) -> bool {
    let rest: String = rest.iter().collect();
    let rest = rest.trim_start();
    let rest = rest.strip_prefix(DELETED).unwrap_or(rest).trim_start();
    rest.is_empty() || rest.starts_with(',')
}

/// strace's mark after the path of an unlinked file.
const DELETED: &str = "(deleted)";

fn strip_comments(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        match rest[i..].find("*/") {
            Some(j) => rest = &rest[i + j + 2..],
            None => {
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out.trim().to_string()
}

/// A decimal or `0x` number; `NULL` is 0; negative numbers wrap (`-1`).
pub fn number(s: &str) -> Result<u64, String> {
    let s = strip_comments(s);
    let s = s.as_str();
    if s == "NULL" {
        return Ok(0);
    }
    let (neg, t) = match s.strip_prefix('-') {
        Some(t) => (true, t),
        None => (false, s),
    };
    let v = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        u64::from_str_radix(h, 16)
    } else {
        t.parse::<u64>()
    }
    .map_err(|_| format!("not a number: `{s}`"))?;
    Ok(if neg { v.wrapping_neg() } else { v })
}

/// Parses `A|B|0x10|21<<MAP_HUGE_SHIFT` against a name table.
fn flags(s: &str, table: &[(&str, i64)]) -> Result<i32, String> {
    let s = strip_comments(s);
    let mut v: i64 = 0;
    for tok in s.split('|').map(str::trim) {
        if let Some((n, shift)) = tok.split_once("<<") {
            let n = number(n.trim())? as i64;
            let sh = match shift.trim() {
                "MAP_HUGE_SHIFT" => 26,
                other => number(other)? as i64,
            };
            v |= n << sh;
        } else if let Some(&(_, x)) = table.iter().find(|(name, _)| *name == tok) {
            v |= x;
        } else {
            v |= number(tok).map_err(|_| format!("unknown flag `{tok}`"))? as i64;
        }
    }
    Ok(v as i32)
}

const PROT: &[(&str, i64)] = &[
    ("PROT_NONE", 0),
    ("PROT_READ", 0x1),
    ("PROT_WRITE", 0x2),
    ("PROT_EXEC", 0x4),
    ("PROT_SEM", 0x8),
    ("PROT_GROWSDOWN", 0x0100_0000),
    ("PROT_GROWSUP", 0x0200_0000),
];

const MAP: &[(&str, i64)] = &[
    ("MAP_FILE", 0),
    ("MAP_SHARED", 0x1),
    ("MAP_PRIVATE", 0x2),
    ("MAP_SHARED_VALIDATE", 0x3),
    ("MAP_FIXED", 0x10),
    ("MAP_ANONYMOUS", 0x20),
    ("MAP_ANON", 0x20),
    ("MAP_32BIT", 0x40),
    ("MAP_GROWSDOWN", 0x100),
    ("MAP_DENYWRITE", 0x800),
    ("MAP_EXECUTABLE", 0x1000),
    ("MAP_LOCKED", 0x2000),
    ("MAP_NORESERVE", 0x4000),
    ("MAP_POPULATE", 0x8000),
    ("MAP_NONBLOCK", 0x10000),
    ("MAP_STACK", 0x20000),
    ("MAP_HUGETLB", 0x40000),
    ("MAP_SYNC", 0x80000),
    ("MAP_FIXED_NOREPLACE", 0x100000),
    ("MAP_UNINITIALIZED", 0x4000000),
    ("MAP_HUGE_64KB", 16 << 26),
    ("MAP_HUGE_512KB", 19 << 26),
    ("MAP_HUGE_1MB", 20 << 26),
    ("MAP_HUGE_2MB", 21 << 26),
    ("MAP_HUGE_8MB", 23 << 26),
    ("MAP_HUGE_16MB", 24 << 26),
    ("MAP_HUGE_32MB", 25 << 26),
    ("MAP_HUGE_256MB", 28 << 26),
    ("MAP_HUGE_512MB", 29 << 26),
    ("MAP_HUGE_1GB", 30 << 26),
    ("MAP_HUGE_2GB", 31 << 26),
    ("MAP_HUGE_16GB", 34 << 26),
];

const MREMAP: &[(&str, i64)] = &[("MREMAP_MAYMOVE", 1), ("MREMAP_FIXED", 2), ("MREMAP_DONTUNMAP", 4)];

const MLOCK: &[(&str, i64)] = &[("MLOCK_ONFAULT", 1)];

const MDWE: &[(&str, i64)] = &[("PR_MDWE_REFUSE_EXEC_GAIN", 1), ("PR_MDWE_NO_INHERIT", 2)];

const MCL: &[(&str, i64)] = &[("MCL_CURRENT", 1), ("MCL_FUTURE", 2), ("MCL_ONFAULT", 4)];

const MADV: &[(&str, i64)] = &[
    ("MADV_NORMAL", 0),
    ("MADV_RANDOM", 1),
    ("MADV_SEQUENTIAL", 2),
    ("MADV_WILLNEED", 3),
    ("MADV_DONTNEED", 4),
    ("MADV_FREE", 8),
    ("MADV_REMOVE", 9),
    ("MADV_DONTFORK", 10),
    ("MADV_DOFORK", 11),
    ("MADV_MERGEABLE", 12),
    ("MADV_UNMERGEABLE", 13),
    ("MADV_HUGEPAGE", 14),
    ("MADV_NOHUGEPAGE", 15),
    ("MADV_DONTDUMP", 16),
    ("MADV_DODUMP", 17),
    ("MADV_WIPEONFORK", 18),
    ("MADV_KEEPONFORK", 19),
    ("MADV_COLD", 20),
    ("MADV_PAGEOUT", 21),
    ("MADV_POPULATE_READ", 22),
    ("MADV_POPULATE_WRITE", 23),
    ("MADV_DONTNEED_LOCKED", 24),
    ("MADV_COLLAPSE", 25),
    ("MADV_HWPOISON", 100),
    ("MADV_SOFT_OFFLINE", 101),
    ("MADV_GUARD_INSTALL", 102),
    ("MADV_GUARD_REMOVE", 103),
];

const ERRNO: &[(&str, i32)] = &[
    ("EPERM", libc::EPERM),
    ("ENOENT", libc::ENOENT),
    ("EINTR", libc::EINTR),
    ("EIO", libc::EIO),
    ("EBADF", libc::EBADF),
    ("EAGAIN", libc::EAGAIN),
    ("ENOMEM", libc::ENOMEM),
    ("EACCES", libc::EACCES),
    ("EFAULT", libc::EFAULT),
    ("EBUSY", libc::EBUSY),
    ("EEXIST", libc::EEXIST),
    ("ENODEV", libc::ENODEV),
    ("EINVAL", libc::EINVAL),
    ("ENFILE", libc::ENFILE),
    ("EMFILE", libc::EMFILE),
    ("ETXTBSY", libc::ETXTBSY),
    ("EFBIG", libc::EFBIG),
    ("ENOSPC", libc::ENOSPC),
    ("ENOSYS", libc::ENOSYS),
    ("EOVERFLOW", libc::EOVERFLOW),
    ("EOPNOTSUPP", libc::EOPNOTSUPP),
    ("ENOTSUP", libc::ENOTSUP),
    ("EHWPOISON", libc::EHWPOISON),
];

/// The other errnos of x86-64 Linux (a descriptor or process call may fail
/// with any of them), by number.
const MORE_ERRNO: &[(&str, i32)] = &[
    ("ESRCH", 3),
    ("ENXIO", 6),
    ("E2BIG", 7),
    ("ENOEXEC", 8),
    ("ECHILD", 10),
    ("ENOTBLK", 15),
    ("EXDEV", 18),
    ("ENOTDIR", 20),
    ("EISDIR", 21),
    ("ENOTTY", 25),
    ("ESPIPE", 29),
    ("EROFS", 30),
    ("EMLINK", 31),
    ("EPIPE", 32),
    ("EDOM", 33),
    ("ERANGE", 34),
    ("EDEADLOCK", 35),
    ("ENAMETOOLONG", 36),
    ("ENOLCK", 37),
    ("ENOTEMPTY", 39),
    ("ELOOP", 40),
    ("ENOMSG", 42),
    ("EIDRM", 43),
    ("ECHRNG", 44),
    ("EL2NSYNC", 45),
    ("EL3HLT", 46),
    ("EL3RST", 47),
    ("ELNRNG", 48),
    ("EUNATCH", 49),
    ("ENOCSI", 50),
    ("EL2HLT", 51),
    ("EBADE", 52),
    ("EBADR", 53),
    ("EXFULL", 54),
    ("ENOANO", 55),
    ("EBADRQC", 56),
    ("EBADSLT", 57),
    ("EBFONT", 59),
    ("ENOSTR", 60),
    ("ENODATA", 61),
    ("ETIME", 62),
    ("ENOSR", 63),
    ("ENONET", 64),
    ("ENOPKG", 65),
    ("EREMOTE", 66),
    ("ENOLINK", 67),
    ("EADV", 68),
    ("ESRMNT", 69),
    ("ECOMM", 70),
    ("EPROTO", 71),
    ("EMULTIHOP", 72),
    ("EDOTDOT", 73),
    ("EBADMSG", 74),
    ("ENOTUNIQ", 76),
    ("EBADFD", 77),
    ("EREMCHG", 78),
    ("ELIBACC", 79),
    ("ELIBBAD", 80),
    ("ELIBSCN", 81),
    ("ELIBMAX", 82),
    ("ELIBEXEC", 83),
    ("EILSEQ", 84),
    ("ERESTART", 85),
    ("ESTRPIPE", 86),
    ("EUSERS", 87),
    ("ENOTSOCK", 88),
    ("EDESTADDRREQ", 89),
    ("EMSGSIZE", 90),
    ("EPROTOTYPE", 91),
    ("ENOPROTOOPT", 92),
    ("EPROTONOSUPPORT", 93),
    ("ESOCKTNOSUPPORT", 94),
    ("EPFNOSUPPORT", 96),
    ("EAFNOSUPPORT", 97),
    ("EADDRINUSE", 98),
    ("EADDRNOTAVAIL", 99),
    ("ENETDOWN", 100),
    ("ENETUNREACH", 101),
    ("ENETRESET", 102),
    ("ECONNABORTED", 103),
    ("ECONNRESET", 104),
    ("ENOBUFS", 105),
    ("EISCONN", 106),
    ("ENOTCONN", 107),
    ("ESHUTDOWN", 108),
    ("ETOOMANYREFS", 109),
    ("ETIMEDOUT", 110),
    ("ECONNREFUSED", 111),
    ("EHOSTDOWN", 112),
    ("EHOSTUNREACH", 113),
    ("EALREADY", 114),
    ("EINPROGRESS", 115),
    ("ESTALE", 116),
    ("EUCLEAN", 117),
    ("ENOTNAM", 118),
    ("ENAVAIL", 119),
    ("EISNAM", 120),
    ("EREMOTEIO", 121),
    ("EDQUOT", 122),
    ("ENOMEDIUM", 123),
    ("EMEDIUMTYPE", 124),
    ("ECANCELED", 125),
    ("ENOKEY", 126),
    ("EKEYEXPIRED", 127),
    ("EKEYREVOKED", 128),
    ("EKEYREJECTED", 129),
    ("EOWNERDEAD", 130),
    ("ENOTRECOVERABLE", 131),
    ("ERFKILL", 132),
    ("EWOULDBLOCK", 11),
    ("EDEADLK", 35),
    ("ERESTARTSYS", 512),
    ("ERESTARTNOINTR", 513),
    ("ERESTARTNOHAND", 514),
    ("ERESTART_RESTARTBLOCK", 516),
];

/// The number of errno `name`.
pub fn errno_code(name: &str) -> Option<i32> {
    ERRNO.iter().chain(MORE_ERRNO).find(|(n, _)| *n == name).map(|&(_, c)| c)
}

/// The name of errno `code`.
pub fn errno_name(code: i32) -> String {
    ERRNO.iter().find(|&&(_, c)| c == code).map_or_else(|| format!("errno {code}"), |(n, _)| n.to_string())
}

fn fd(s: &str) -> Result<Fd, String> {
    match s.find('<') {
        Some(i) => {
            let n = number(&s[..i])? as i64;
            let rest = s[i + 1..].trim_end();
            let rest = rest.strip_suffix(DELETED).unwrap_or(rest).trim_end();
            let path = rest.strip_suffix('>').ok_or_else(|| format!("malformed fd `{s}`"))?;
            Ok(Fd::Path(n, path.to_string()))
        }
        None => {
            let n = number(s)? as i64;
            Ok(if n < 0 { Fd::None } else { Fd::Num(n) })
        }
    }
}

fn parse_call(name: &str, a: &[String]) -> Result<Call, String> {
    let want = |n: usize| {
        if a.len() == n {
            Ok(())
        } else {
            Err(format!("{name} with {} arguments, expected {n}", a.len()))
        }
    };
    Ok(match name {
        "mmap" => {
            want(6)?;
            Call::Mmap {
                addr: number(&a[0])?,
                len: number(&a[1])?,
                prot: flags(&a[2], PROT)?,
                flags: flags(&a[3], MAP)?,
                fd: fd(&a[4])?,
                off: number(&a[5])?,
            }
        }
        "munmap" => {
            want(2)?;
            Call::Munmap { addr: number(&a[0])?, len: number(&a[1])? }
        }
        "mprotect" => {
            want(3)?;
            Call::Mprotect { addr: number(&a[0])?, len: number(&a[1])?, prot: flags(&a[2], PROT)? }
        }
        "mremap" => {
            if a.len() != 4 && a.len() != 5 {
                return Err(format!("mremap with {} arguments, expected 4 or 5", a.len()));
            }
            Call::Mremap {
                old: number(&a[0])?,
                old_len: number(&a[1])?,
                new_len: number(&a[2])?,
                flags: flags(&a[3], MREMAP)?,
                new_addr: a.get(4).map(|s| number(s)).transpose()?.unwrap_or(0),
            }
        }
        "brk" => {
            want(1)?;
            Call::Brk { addr: number(&a[0])? }
        }
        "madvise" => {
            want(3)?;
            Call::Madvise { addr: number(&a[0])?, len: number(&a[1])?, advice: flags(&a[2], MADV)? }
        }
        "mlock" | "munlock" => {
            want(2)?;
            let (addr, len) = (number(&a[0])?, number(&a[1])?);
            if name == "mlock" {
                Call::Mlock { addr, len, flags: None }
            } else {
                Call::Munlock { addr, len }
            }
        }
        "mlock2" => {
            want(3)?;
            Call::Mlock { addr: number(&a[0])?, len: number(&a[1])?, flags: Some(flags(&a[2], MLOCK)?) }
        }
        "mlockall" => {
            want(1)?;
            Call::Mlockall { flags: flags(&a[0], MCL)? }
        }
        "munlockall" => Call::Munlockall,
        "mseal" | "syscall_0x1ce" => {
            // strace 6.1 does not know mseal (462 = 0x1ce) and prints six
            // raw arguments.
            if a.len() < 3 {
                return Err(format!("{name} with {} arguments, expected 3", a.len()));
            }
            Call::Mseal { addr: number(&a[0])?, len: number(&a[1])?, flags: number(&a[2])? }
        }
        "prctl" => {
            let get = mdwe_option(&format!("{})", a.first().map_or("", String::as_str))).ok_or("prctl not of MDWE")?;
            let mut args = [0; 4];
            for (i, v) in a.iter().skip(1).take(4).enumerate() {
                args[i] = if i == 0 && !get { flags(v, MDWE)? as u64 } else { number(v)? };
            }
            Call::Mdwe { get, args }
        }
        "execve" | "execveat" => {
            // execveat(dirfd, path, argv, envp, flags)
            let at = usize::from(name == "execveat");
            let path = a.get(at).ok_or("execve without a path")?;
            Call::Execve { path: unquote(path), argv: a.get(at + 1).map(|v| strings(v)).unwrap_or_default() }
        }
        "clone" => Call::Clone { flags: clone_flags(a.iter().find_map(|x| x.strip_prefix("flags=")).unwrap_or("")) },
        "clone3" => {
            let first = a.first().ok_or("clone3 without arguments")?;
            let f = first.split_once("flags=").map_or("", |(_, r)| r);
            let f = &f[..f.find([',', '}']).unwrap_or(f.len())];
            Call::Clone { flags: clone_flags(f) }
        }
        "fork" => Call::Clone { flags: 0 },
        "vfork" => Call::Clone { flags: CLONE_VM | CLONE_VFORK },
        "exit" | "exit_group" => Call::Exit { group: name == "exit_group" },
        "open" | "openat" | "creat" => {
            // open(path, flags[, mode]), openat(dirfd, path, flags[, mode]),
            // creat(path, mode) = open(path, O_CREAT|O_WRONLY|O_TRUNC, mode).
            let at = usize::from(name == "openat");
            let path = a.get(at).ok_or_else(|| format!("{name} without a path"))?;
            let flags = match name {
                "creat" => libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
                _ => open_flags(a.get(at + 1).ok_or_else(|| format!("{name} without flags"))?),
            };
            Call::Open { path: unquote(path), flags }
        }
        "close" => Call::Close { fd: fd_number(a.first().ok_or("close without a descriptor")?)? },
        "dup" | "dup2" | "dup3" => Call::Dup {
            old: fd_number(a.first().ok_or("dup without a descriptor")?)?,
            cloexec: name == "dup3" && a.get(2).is_some_and(|f| open_flags(f) & libc::O_CLOEXEC != 0),
        },
        "memfd_create" => Call::MemfdCreate {
            name: unquote(a.first().ok_or("memfd_create without a name")?),
            cloexec: a.get(1).is_some_and(|f| f.contains("MFD_CLOEXEC")),
            hugetlb: a.get(1).is_some_and(|f| f.contains("MFD_HUGETLB")),
        },
        "unlink" | "unlinkat" => {
            let at = usize::from(name == "unlinkat");
            let path = unquote(a.get(at).ok_or_else(|| format!("{name} without a path"))?);
            let dir = if at == 1 { a[0].split_once('<').map(|(_, d)| d.trim_end_matches('>')) } else { None };
            match dir {
                Some(d) if !path.starts_with('/') => {
                    Call::Unlink { path: format!("{}/{path}", d.trim_end_matches('/')) }
                }
                _ => Call::Unlink { path },
            }
        }
        "setrlimit" | "prlimit64" => {
            // setrlimit(resource, new), prlimit64(pid, resource, new, old).
            let at = usize::from(name == "prlimit64");
            let resource = a.get(at).ok_or_else(|| format!("{name} without a resource"))?.clone();
            let new = a.get(at + 1).map_or("NULL", |s| s.as_str());
            let cur = new
                .split_once("rlim_cur=")
                .map(|(_, r)| rlim(&r[..r.find([',', '}']).unwrap_or(r.len())]))
                .transpose()?;
            match cur {
                // Only a new limit of the caller itself matters.
                Some(cur) if at == 0 || number(&a[0]).is_ok_and(|p| p == 0) => Call::Rlimit { resource, cur },
                _ => Call::Rlimit { resource: String::new(), cur: 0 },
            }
        }
        _ => unreachable!("filtered by NAMES"),
    })
}

/// A limit as strace writes it: `8192*1024`, `RLIM64_INFINITY`, a number.
fn rlim(s: &str) -> Result<u64, String> {
    let s = s.trim();
    if s.starts_with("RLIM") && s.ends_with("INFINITY") {
        return Ok(u64::MAX);
    }
    s.split('*').try_fold(1u64, |acc, f| Ok(acc.saturating_mul(number(f)?)))
}

/// A quoted string argument without its quotes (strace's escapes kept).
fn unquote(s: &str) -> String {
    let s = s.trim();
    let s = s.strip_suffix("...").unwrap_or(s);
    s.strip_prefix('"').and_then(|t| t.strip_suffix('"')).unwrap_or(s).to_string()
}

/// `["sort", "-n"]` → its strings.
fn strings(s: &str) -> Vec<String> {
    let s = s.trim();
    let inner = s.strip_prefix('[').and_then(|t| t.strip_suffix(']')).unwrap_or(s);
    split_args(inner).iter().map(|x| unquote(x)).filter(|x| !x.is_empty()).collect()
}

/// The descriptor number of `3` or `3</path>`.
fn fd_number(s: &str) -> Result<i64, String> {
    let n = s.split_once('<').map_or(s, |(n, _)| n);
    Ok(number(n)? as i64)
}

/// The clone flags strace names that the replay needs (`CLONE_VM`,
/// `CLONE_FILES`, `CLONE_VFORK`, `CLONE_THREAD`) and any number.
fn clone_flags(s: &str) -> u64 {
    let mut v = 0;
    for tok in s.split('|').map(str::trim) {
        v |= match tok {
            "CLONE_VM" => CLONE_VM,
            "CLONE_FILES" => CLONE_FILES,
            "CLONE_VFORK" => CLONE_VFORK,
            "CLONE_THREAD" => CLONE_THREAD,
            _ => number(tok).unwrap_or(0),
        };
    }
    v
}

/// The access mode and `O_CREAT`/`O_TRUNC` of `O_RDWR|O_CLOEXEC|...`.
fn open_flags(s: &str) -> i32 {
    let mut v = 0;
    for tok in s.split('|').map(str::trim) {
        v |= match tok {
            "O_RDONLY" => libc::O_RDONLY,
            "O_WRONLY" => libc::O_WRONLY,
            "O_RDWR" => libc::O_RDWR,
            "O_CREAT" => libc::O_CREAT,
            "O_TRUNC" => libc::O_TRUNC,
            "O_PATH" => libc::O_PATH,
            "O_CLOEXEC" => libc::O_CLOEXEC,
            "O_DIRECTORY" => libc::O_DIRECTORY,
            _ => number(tok).map_or(0, |n| n as i32),
        };
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_and_seal_lines() {
        let log = parse(
            "7 mlock(0x7f0000001000, 4096)           = 0\n\
             7 mlock2(0x7f0000001000, 4096, MLOCK_ONFAULT) = 0\n\
             7 munlock(0x7f0000001000, 4096)         = 0\n\
             7 mlockall(MCL_CURRENT|MCL_FUTURE)      = -1 ENOMEM (Cannot allocate memory)\n\
             7 munlockall()                          = 0\n\
             7 syscall_0x1ce(0x7f0000001000, 0x1000, 0, 0x7f, 0, 0) = 0\n\
             7 prctl(PR_SET_NAME, \"x\") = 0\n\
             7 prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN|PR_MDWE_NO_INHERIT, 0, 0, 0) = 0\n\
             7 prctl(0x42 /* PR_??? */, 0, 0, 0, 0) = 0x3\n",
        );
        let calls: Vec<&Call> = log.records.iter().map(|r| &r.call).collect();
        assert_eq!(calls[0], &Call::Mlock { addr: 0x7f0000001000, len: 4096, flags: None });
        assert_eq!(calls[1], &Call::Mlock { addr: 0x7f0000001000, len: 4096, flags: Some(1) });
        assert_eq!(calls[2], &Call::Munlock { addr: 0x7f0000001000, len: 4096 });
        assert_eq!(calls[3], &Call::Mlockall { flags: 3 });
        assert_eq!(calls[4], &Call::Munlockall);
        assert_eq!(calls[5], &Call::Mseal { addr: 0x7f0000001000, len: 0x1000, flags: 0 });
        assert_eq!(calls[6], &Call::Mdwe { get: false, args: [3, 0, 0, 0] });
        assert_eq!(calls[7], &Call::Mdwe { get: true, args: [0; 4] });
        assert_eq!((calls.len(), log.other_calls), (8, 1), "PR_SET_NAME is not a memory call");
        assert!(calls.iter().all(|c| c.is_memory()));
        assert_eq!(log.records[3].ret, Ret::Err(libc::ENOMEM));
    }

    #[test]
    fn strace_lines() {
        let log = parse(
            "14737 brk(NULL)                         = 0x55b9ff4e2000\n\
             14737 mmap(NULL, 1974096, PROT_READ, MAP_PRIVATE|MAP_DENYWRITE, 3</usr/lib/x86_64-linux-gnu/libc.so.6>, 0) = 0x7efefba12000\n\
             14801 mmap(NULL, 4198400, PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_STACK, -1, 0 <unfinished ...>\n\
             14809 mprotect(0x7fec48021000, 32768, PROT_READ|PROT_WRITE <unfinished ...>\n\
             14801 <... mmap resumed>)               = 0x7fec53bff000\n\
             14809 <... mprotect resumed>)           = 0\n\
             [pid 7] mremap(0x7f0000000000, 4096, 8192, MREMAP_MAYMOVE|MREMAP_FIXED, 0x7f0000100000) = 0x7f0000100000\n\
             madvise(0x1000, 4096, 0x63 /* MADV_??? */) = -1 EINVAL (Invalid argument)\n\
             mmap(NULL, 8192, PROT_READ, MAP_PRIVATE|MAP_ANONYMOUS|21<<MAP_HUGE_SHIFT, -1, 0) = -1 ENOMEM (Cannot allocate memory)\n\
             14737 +++ exited with 0 +++\n\
             14862 --- SIGSEGV {si_signo=SIGSEGV, si_code=SEGV_MAPERR, si_addr=NULL} ---\n\
             wait4(-1, NULL, 0, NULL) = 3\n\
             12:00:01.123 munmap(0x2000, 4096) = 0\n",
        );
        assert!(log.bad.is_empty(), "{:?}", log.bad);
        assert_eq!(log.other_calls, 1);
        let r = &log.records;
        assert_eq!(r.len(), 8);
        assert_eq!(r[0].call, Call::Brk { addr: 0 });
        assert_eq!(r[0].ret, Ret::Val(0x55b9ff4e2000));
        assert_eq!(
            r[1].call,
            Call::Mmap {
                addr: 0,
                len: 1974096,
                prot: 1,
                flags: 0x802,
                fd: Fd::Path(3, "/usr/lib/x86_64-linux-gnu/libc.so.6".into()),
                off: 0
            }
        );
        assert_eq!((r[2].line, r[2].end_line, r[2].pid), (3, 5, Some(14801)));
        assert_eq!(r[2].ret, Ret::Val(0x7fec53bff000));
        assert_eq!(r[3].call, Call::Mprotect { addr: 0x7fec48021000, len: 32768, prot: 3 });
        assert_eq!(r[4].pid, Some(7));
        assert_eq!(
            r[4].call,
            Call::Mremap { old: 0x7f0000000000, old_len: 4096, new_len: 8192, flags: 3, new_addr: 0x7f0000100000 }
        );
        assert_eq!(r[5].call, Call::Madvise { addr: 0x1000, len: 4096, advice: 0x63 });
        assert_eq!(r[5].ret, Ret::Err(libc::EINVAL));
        assert!(matches!(r[6].call, Call::Mmap { flags, .. } if flags == 0x22 | (21 << 26)));
        assert_eq!(r[6].ret, Ret::Err(libc::ENOMEM));
        assert_eq!(r[7].call, Call::Munmap { addr: 0x2000, len: 4096 });
    }

    #[test]
    fn process_and_descriptor_lines() {
        let log = parse(
            "7 execve(\"/usr/bin/sort\", [\"sort\", \"-n\"], 0x55a82bdd9b98 /* 35 vars */ <unfinished ...>\n\
             7 <... execve resumed>) = 0\n\
             7 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLD, child_tidptr=0x7f) = 8\n\
             7 clone3({flags=CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_THREAD, exit_signal=0, stack=0x7f} => {parent_tid=[9]}, 88) = 9\n\
             7 vfork() = 10\n\
             10 execve(\"/x/as\", [\"as\"], 0x33 /* 39 vars */) = -1 ENOENT (No such file or directory)\n\
             9 exit(0) = ?\n\
             7 exit_group(0) = ?\n\
             7 openat(AT_FDCWD, \"/etc/ld.so.cache\", O_RDONLY|O_CLOEXEC) = 3</etc/ld.so.cache>\n\
             7 dup2(3<pipe:[444347]>, 0</dev/null>) = 0<pipe:[444347]>\n\
             7 close(3</etc/ld.so.cache>) = 0\n\
             7 openat(AT_FDCWD, \"/nope\", O_RDONLY) = -1 ENXIO (No such device or address)\n",
        );
        assert!(log.bad.is_empty(), "{:?}", log.bad);
        let calls: Vec<&Call> = log.records.iter().map(|r| &r.call).collect();
        assert_eq!(calls[0], &Call::Execve { path: "/usr/bin/sort".into(), argv: vec!["sort".into(), "-n".into()] });
        assert_eq!(log.records[0].ret, Ret::Val(0));
        assert_eq!(calls[1], &Call::Clone { flags: 0 });
        assert_eq!(log.records[1].ret, Ret::Val(8));
        assert_eq!(calls[2], &Call::Clone { flags: CLONE_VM | CLONE_FILES | CLONE_THREAD });
        assert_eq!(log.records[2].ret, Ret::Val(9));
        assert_eq!(calls[3], &Call::Clone { flags: CLONE_VM | CLONE_VFORK });
        assert_eq!(log.records[4].ret, Ret::Err(libc::ENOENT));
        assert_eq!((calls[5], calls[6]), (&Call::Exit { group: false }, &Call::Exit { group: true }));
        assert_eq!(calls[7], &Call::Open { path: "/etc/ld.so.cache".into(), flags: libc::O_RDONLY | libc::O_CLOEXEC });
        assert_eq!(log.records[7].ret, Ret::Val(3));
        assert_eq!((calls[8], log.records[8].ret), (&Call::Dup { old: 3, cloexec: false }, Ret::Val(0)));
        assert_eq!(log.records[7].ret_path.as_deref(), Some("/etc/ld.so.cache"));
        assert_eq!(log.records[8].ret_path.as_deref(), Some("pipe:[444347]"));
        assert_eq!(calls[9], &Call::Close { fd: 3 });
        assert_eq!(log.records[10].ret, Ret::Err(libc::ENXIO));
    }

    #[test]
    fn rlimit_lines() {
        let log = parse(
            "prlimit64(0, RLIMIT_STACK, {rlim_cur=16384*1024, rlim_max=RLIM64_INFINITY}, NULL) = 0\n\
             setrlimit(RLIMIT_MEMLOCK, {rlim_cur=RLIM_INFINITY, rlim_max=RLIM_INFINITY}) = 0\n\
             prlimit64(0, RLIMIT_NOFILE, NULL, {rlim_cur=1024, rlim_max=1024*1024}) = 0\n\
             prlimit64(77, RLIMIT_AS, {rlim_cur=4096, rlim_max=4096}, NULL) = 0\n\
             memfd_create(\"hx\", MFD_HUGETLB) = 14</memfd:hx>(deleted)\n\
             unlinkat(AT_FDCWD</tmp/rp>, \"delme\", 0) = 0\n\
             unlink(\"/tmp/x\") = 0\n",
        );
        assert!(log.bad.is_empty(), "{:?}", log.bad);
        let calls: Vec<&Call> = log.records.iter().map(|r| &r.call).collect();
        assert_eq!(calls[0], &Call::Rlimit { resource: "RLIMIT_STACK".into(), cur: 16 << 20 });
        assert_eq!(calls[1], &Call::Rlimit { resource: "RLIMIT_MEMLOCK".into(), cur: u64::MAX });
        // A query, and another process's limit, change nothing here.
        assert_eq!(calls[2], &Call::Rlimit { resource: String::new(), cur: 0 });
        assert_eq!(calls[3], &Call::Rlimit { resource: String::new(), cur: 0 });
        assert_eq!(calls[4], &Call::MemfdCreate { name: "hx".into(), cloexec: false, hugetlb: true });
        assert_eq!(log.records[4].ret_path.as_deref(), Some("/memfd:hx"));
        assert_eq!(calls[5], &Call::Unlink { path: "/tmp/rp/delme".into() });
        assert_eq!(calls[6], &Call::Unlink { path: "/tmp/x".into() });
    }

    #[test]
    fn unfinished_without_resume_is_incomplete() {
        let log = parse("5 mmap(NULL, 4096, PROT_READ, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0 <unfinished ...>\n5 +++ killed by SIGKILL +++\n");
        assert!(log.records.is_empty());
        assert_eq!(log.incomplete, vec![1]);
    }

    #[test]
    fn paths_with_commas_and_parens() {
        let log = parse(
            "mmap(NULL, 4096, PROT_READ, MAP_SHARED, 4</tmp/a, b (1>)>, 0x1000) = 0x7f0000000000\n\
             mmap(NULL, 4096, PROT_READ, MAP_SHARED, 5</tmp/x>y>, 0) = 0x7f0000001000\n\
             mmap(NULL, 4096, PROT_READ, MAP_SHARED, 6</tmp/a>(deleted), 0) = 0x7f0000002000\n",
        );
        assert!(log.bad.is_empty(), "{:?}", log.bad);
        assert!(
            matches!(&log.records[0].call, Call::Mmap { fd: Fd::Path(4, p), off: 0x1000, .. } if p == "/tmp/a, b (1>)")
        );
        assert!(matches!(&log.records[1].call, Call::Mmap { fd: Fd::Path(5, p), .. } if p == "/tmp/x>y"));
        assert!(matches!(&log.records[2].call, Call::Mmap { fd: Fd::Path(6, p), .. } if p == "/tmp/a"));
    }
}
