//! The runner child: the forked test binary that sets up the window, runs
//! each op of a scenario on the host kernel and writes what it saw to
//! stdout, with no allocation after the setup.

use super::*;

// ---------------------------------------------------------------------------
// Runner child
// ---------------------------------------------------------------------------

pub(super) fn die(msg: &str) -> ! {
    let m = format!("host runner: {msg} (errno {})\n", errno());
    // SAFETY: writing a byte buffer to stderr, then leaving without unwinding.
    unsafe {
        libc::write(2, m.as_ptr().cast(), m.len());
        libc::_exit(3)
    }
}

fn errno() -> i32 {
    // SAFETY: errno location is always valid for the calling thread.
    unsafe { *libc::__errno_location() }
}

/// Fixed-capacity output buffer streamed to fd 1; never reallocates.
struct Out {
    buf: Vec<u8>,
}

impl Out {
    const CAP: usize = 1 << 20;

    fn new() -> Self {
        Out { buf: Vec::with_capacity(Self::CAP) }
    }

    fn flush(&mut self) {
        let mut p = 0;
        while p < self.buf.len() {
            // SAFETY: writes initialized bytes of our buffer to fd 1.
            let r = unsafe { libc::write(1, self.buf[p..].as_ptr().cast(), self.buf.len() - p) };
            if r < 0 {
                if errno() == libc::EINTR {
                    continue;
                }
                die("write to stdout failed");
            }
            p += r as usize;
        }
        self.buf.clear();
    }

    fn put(&mut self, b: &[u8]) {
        if self.buf.len() + b.len() > Self::CAP {
            self.flush();
        }
        if b.len() > Self::CAP {
            for c in b.chunks(Self::CAP) {
                self.put(c);
            }
            return;
        }
        self.buf.extend_from_slice(b);
    }

    fn hex(&mut self, v: u64) {
        let mut tmp = [0u8; 16];
        let mut n = 0;
        let mut x = v;
        loop {
            tmp[15 - n] = b"0123456789abcdef"[(x & 15) as usize];
            n += 1;
            x >>= 4;
            if x == 0 {
                break;
            }
        }
        self.put(&tmp[16 - n..]);
    }

    fn dec(&mut self, v: i32) {
        if v < 0 {
            self.put(b"-");
        }
        let mut tmp = [0u8; 12];
        let mut n = 0;
        let mut x = v.unsigned_abs();
        loop {
            tmp[11 - n] = b'0' + (x % 10) as u8;
            n += 1;
            x /= 10;
            if x == 0 {
                break;
            }
        }
        self.put(&tmp[12 - n..]);
    }

    fn mark(&mut self, kw: &[u8]) {
        self.put(MARK.as_bytes());
        self.put(kw);
    }
}

struct MapsEntry {
    start: u64,
    end: u64,
    perms: [u8; 4],
    offset: u64,
    inode: u64,
    is_stack: bool,
}

fn parse_hex_prefix(s: &[u8]) -> (u64, usize) {
    let mut v = 0u64;
    let mut i = 0;
    while i < s.len() {
        let d = match s[i] {
            c @ b'0'..=b'9' => c - b'0',
            c @ b'a'..=b'f' => c - b'a' + 10,
            c @ b'A'..=b'F' => c - b'A' + 10,
            _ => break,
        };
        v = (v << 4) | u64::from(d);
        i += 1;
    }
    (v, i)
}

/// Parses one line of /proc/self/maps: `start-end perms offset dev inode [path]`.
fn parse_maps_line(l: &[u8]) -> Option<MapsEntry> {
    let (start, n) = parse_hex_prefix(l);
    let l = l.get(n..)?.strip_prefix(b"-")?;
    let (end, n) = parse_hex_prefix(l);
    let l = l.get(n..)?.strip_prefix(b" ")?;
    let perms: [u8; 4] = l.get(..4)?.try_into().ok()?;
    let l = l.get(4..)?.strip_prefix(b" ")?;
    let (offset, n) = parse_hex_prefix(l);
    let l = l.get(n..)?.strip_prefix(b" ")?;
    let sp = l.iter().position(|&c| c == b' ')?; // dev
    let l = &l[sp + 1..];
    let mut inode = 0u64;
    let mut i = 0;
    while i < l.len() && l[i].is_ascii_digit() {
        inode = inode * 10 + u64::from(l[i] - b'0');
        i += 1;
    }
    let rest = &l[i..];
    let is_stack = rest.windows(7).any(|w| w == b"[stack]");
    Some(MapsEntry { start, end, perms, offset, inode, is_stack })
}

struct Runner {
    window: (u64, u64),
    filler_fd: i32,
    fds: Vec<i32>,
    out: Out,
    maps: Vec<u8>,
    maps_len: usize,
    ranges: Vec<(u64, u64)>,
    mincore_buf: *mut u8,
    mincore_cap: usize,
}

impl Runner {
    fn read_maps(&mut self) {
        // SAFETY: raw open/read/close into our preallocated buffer.
        unsafe {
            let fd = libc::open(c"/proc/self/maps".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if fd < 0 {
                die("open /proc/self/maps");
            }
            let mut len = 0usize;
            loop {
                if len == self.maps.len() {
                    die("/proc/self/maps larger than 1 MiB");
                }
                let r = libc::read(fd, self.maps.as_mut_ptr().add(len).cast(), self.maps.len() - len);
                if r < 0 {
                    if errno() == libc::EINTR {
                        continue;
                    }
                    die("read /proc/self/maps");
                }
                if r == 0 {
                    break;
                }
                len += r as usize;
            }
            libc::close(fd);
            self.maps_len = len;
        }
    }

    /// Calls `f` for every parsed line of the last read maps.
    fn each_line(&self, mut f: impl FnMut(&MapsEntry)) {
        for l in self.maps[..self.maps_len].split(|&c| c == b'\n') {
            if l.is_empty() {
                continue;
            }
            match parse_maps_line(l) {
                Some(e) => f(&e),
                None => die("unparsable /proc/self/maps line"),
            }
        }
    }

    /// Maps a filler: `PROT_NONE`, `MAP_SHARED` of a memfd of its own, so that
    /// no mapping a scenario makes can ever merge with it.
    fn mmap_fixed_noreplace_filler(&self, start: u64, end: u64) {
        let flags = libc::MAP_SHARED | libc::MAP_NORESERVE | MAP_FIXED_NOREPLACE;
        // SAFETY: MAP_FIXED_NOREPLACE never replaces existing mappings.
        let r =
            unsafe { libc::mmap(start as *mut _, (end - start) as usize, libc::PROT_NONE, flags, self.filler_fd, 0) };
        if r as u64 != start {
            die("filler mmap failed");
        }
    }

    /// Fills the address space above the window so that the window's end
    /// acts as mmap_base for the top-down allocator.
    fn setup_window(&mut self) {
        let (lo, hi) = self.window;
        self.read_maps();
        let mut stack = None;
        let mut overlap = false;
        let mut ranges = std::mem::take(&mut self.ranges);
        ranges.clear();
        self.each_line(|e| {
            if e.is_stack {
                stack = Some(e.start);
            }
            if e.start < hi && e.end > lo {
                overlap = true;
            }
            if ranges.len() < ranges.capacity() {
                ranges.push((e.start, e.end));
            }
        });
        if overlap {
            die("the window is not free in the runner process");
        }
        let stack = stack.unwrap_or_else(|| die("no [stack] in /proc/self/maps"));
        let limit = stack.saturating_sub(256 << 20).min(0x7fff_0000_0000);
        if hi >= limit {
            die("window end above the filler limit (stack - 256 MiB)");
        }
        let mut cursor = hi;
        for &(s, e) in ranges.iter() {
            if cursor >= limit {
                break;
            }
            if e <= cursor {
                continue;
            }
            if s > cursor {
                self.mmap_fixed_noreplace_filler(cursor, s.min(limit));
            }
            cursor = cursor.max(e);
        }
        if cursor < limit {
            self.mmap_fixed_noreplace_filler(cursor, limit);
        }
        // Check (and complete) with the allocator itself.
        let mut ok = false;
        for _ in 0..64 {
            let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
            // SAFETY: non-fixed anonymous mmap, harmless.
            let p = unsafe { libc::mmap(std::ptr::null_mut(), PAGE as usize, libc::PROT_NONE, flags, -1, 0) } as u64;
            if p == hi - PAGE {
                // SAFETY: unmapping the page we just mapped.
                unsafe { libc::munmap(p as *mut _, PAGE as usize) };
                ok = true;
                break;
            }
            if p < hi || p == libc::MAP_FAILED as u64 {
                die("top-down allocation does not reach the window's end");
            }
            // Free space above the window below mmap_base: keep p, fill below it.
            self.read_maps();
            let mut below = hi;
            self.each_line(|e| {
                if e.end <= p && e.end > below {
                    below = e.end;
                }
            });
            if below < p {
                self.mmap_fixed_noreplace_filler(below, p);
            }
        }
        if !ok {
            die("could not make the window's end the top of the free space");
        }
        self.ranges = ranges;
    }

    /// Reports every mapping outside the window below `TASK_SIZE` as a
    /// `setup vma <start> <end> <s|->` line (`s` for the stack).
    fn report_outside(&mut self) {
        self.read_maps();
        let (lo, hi) = self.window;
        let maps = std::mem::take(&mut self.maps);
        for l in maps[..self.maps_len].split(|&c| c == b'\n') {
            let Some(e) = parse_maps_line(l) else { continue };
            if (e.end <= lo || e.start >= hi) && e.start < TASK_SIZE {
                self.out.mark(b"setup vma ");
                self.out.hex(e.start);
                self.out.put(b" ");
                self.out.hex(e.end);
                self.out.put(if e.is_stack { b" s\n" } else { b" -\n" });
            }
        }
        self.maps = maps;
    }

    /// The run-time half of [`check_scenario`]: an mprotect that starts in
    /// the window and ends above it walks the VMAs from its start until the
    /// first hole, so the window's last page must be a hole.
    fn guard(&mut self, op: &Op) {
        let hi = self.window.1;
        let Op::Mprotect { addr, len, .. } = *op else { return };
        let end = addr.wrapping_add(page_up(len));
        if !(addr < hi && addr % PAGE == 0 && len != 0 && end > hi) {
            return;
        }
        self.read_maps();
        let mut top_mapped = false;
        self.each_line(|e| top_mapped |= e.start < hi && e.end > hi - PAGE);
        if top_mapped {
            die("an mprotect leaving the window would not stop at a hole in it");
        }
    }

    fn record_maps(&mut self) {
        self.read_maps();
        let (lo, hi) = self.window;
        let maps = std::mem::take(&mut self.maps);
        for l in maps[..self.maps_len].split(|&c| c == b'\n') {
            if l.is_empty() {
                continue;
            }
            let Some(e) = parse_maps_line(l) else { die("unparsable /proc/self/maps line") };
            if e.start < hi && e.end > lo {
                self.out.mark(b"map ");
                self.out.hex(e.start);
                self.out.put(b" ");
                self.out.hex(e.end);
                self.out.put(b" ");
                self.out.put(&e.perms);
                self.out.put(b" ");
                self.out.hex(e.offset);
                self.out.put(if e.inode == 0 { b" a\n" } else { b" f\n" });
            }
        }
        self.maps = maps;
    }

    fn outcome(&mut self, o: &Outcome) {
        match o {
            Outcome::Ok(v) => {
                self.out.mark(b"ok ");
                self.out.hex(*v);
            }
            Outcome::Err(e) => {
                self.out.mark(b"err ");
                self.out.dec(*e);
            }
            Outcome::Read(b) => {
                self.out.mark(b"read ");
                self.out.hex(u64::from(*b));
            }
            Outcome::Segv(c) => {
                self.out.mark(b"segv ");
                self.out.dec(*c);
            }
            Outcome::Bus(c) => {
                self.out.mark(b"bus ");
                self.out.dec(*c);
            }
            Outcome::Mincore(_) => unreachable!("mincore is written by mincore()"),
        }
        self.out.put(b"\n");
    }

    fn sys(r: libc::c_long) -> Outcome {
        if r == -1 {
            Outcome::Err(errno())
        } else {
            Outcome::Ok(r as u64)
        }
    }

    fn fd(&self, file: usize) -> libc::c_long {
        // An index with no file gives a descriptor that is surely closed: EBADF.
        self.fds.get(file).map_or(1_000_000, |&fd| libc::c_long::from(fd))
    }

    fn mincore(&mut self, addr: u64, len: u64) {
        // SAFETY: the vector buffer is followed by a PROT_NONE guard page, so
        // the kernel cannot write past it (it fails with EFAULT instead).
        let r =
            unsafe { libc::syscall(libc::SYS_mincore, addr as libc::c_long, len as libc::c_long, self.mincore_buf) };
        if r == -1 {
            let e = errno();
            self.outcome(&Outcome::Err(e));
            return;
        }
        let pages = (len / PAGE + u64::from(len % PAGE != 0)) as usize;
        let n = pages.min(self.mincore_cap);
        self.out.mark(b"mincore ");
        self.out.hex(n as u64);
        self.out.put(b" ");
        let mut chunk = [0u8; 256];
        let mut i = 0;
        while i < n {
            let k = (n - i).min(chunk.len());
            for (j, c) in chunk[..k].iter_mut().enumerate() {
                // SAFETY: i + j < n <= mincore_cap bytes of our buffer.
                let b = unsafe { *self.mincore_buf.add(i + j) };
                *c = if b & 1 != 0 { b'1' } else { b'0' };
            }
            self.out.put(&chunk[..k]);
            i += k;
        }
        self.out.put(b"\n");
    }

    fn run_op(&mut self, op: &Op) {
        use libc::{c_long, syscall};
        // SAFETY (all syscalls below): check_scenario ran in the parent and is
        // re-run by the runner before any op, so these calls only modify
        // memory inside the window, which holds nothing of ours.
        let o = match *op {
            Op::Mmap { addr, len, prot, flags, file, offset } => {
                let fd = match file {
                    None => -1,
                    Some(i) => self.fd(i),
                };
                // SAFETY: see above.
                Self::sys(unsafe {
                    syscall(
                        libc::SYS_mmap,
                        addr as c_long,
                        len as c_long,
                        c_long::from(prot),
                        c_long::from(flags),
                        fd,
                        offset as c_long,
                    )
                })
            }
            // SAFETY: see above.
            Op::Munmap { addr, len } => Self::sys(unsafe { syscall(libc::SYS_munmap, addr as c_long, len as c_long) }),
            Op::Mprotect { addr, len, prot } => {
                // SAFETY: see above.
                Self::sys(unsafe { syscall(libc::SYS_mprotect, addr as c_long, len as c_long, c_long::from(prot)) })
            }
            Op::Mremap { old_addr, old_len, new_len, flags, new_addr } => {
                // SAFETY: see above.
                Self::sys(unsafe {
                    syscall(
                        libc::SYS_mremap,
                        old_addr as c_long,
                        old_len as c_long,
                        new_len as c_long,
                        c_long::from(flags),
                        new_addr as c_long,
                    )
                })
            }
            Op::Madvise { addr, len, advice } => {
                // SAFETY: see above.
                Self::sys(unsafe { syscall(libc::SYS_madvise, addr as c_long, len as c_long, c_long::from(advice)) })
            }
            Op::Ftruncate { file, len } => {
                let fd = self.fd(file);
                // SAFETY: ftruncate of one of our memfds.
                Self::sys(unsafe { syscall(libc::SYS_ftruncate, fd, len as c_long) })
            }
            Op::MlockOnfault { addr, len } => {
                // SAFETY: see above (inside the window).
                Self::sys(unsafe { syscall(libc::SYS_mlock2, addr as c_long, len as c_long, 1 as c_long) })
            }
            Op::Munlock { addr, len } => {
                // SAFETY: see above (inside the window).
                Self::sys(unsafe { syscall(libc::SYS_munlock, addr as c_long, len as c_long) })
            }
            // SAFETY: mseal (462) of a range inside the window, for this
            // runner process only.
            Op::Mseal { addr, len } => Self::sys(unsafe { syscall(462, addr as c_long, len as c_long, 0 as c_long) }),
            Op::SetMdwe => {
                // SAFETY: PR_SET_MDWE (65), REFUSE_EXEC_GAIN, for this
                // runner process only.
                Self::sys(unsafe {
                    syscall(libc::SYS_prctl, 65 as c_long, 1 as c_long, 0 as c_long, 0 as c_long, 0 as c_long)
                })
            }
            Op::Probe { addr, write } => probe(addr, write),
            Op::Mincore { addr, len } => {
                self.mincore(addr, len);
                return;
            }
        };
        self.outcome(&o);
    }
}

/// Body of the runner child (see the module docs). Never returns: it ends
/// the process with `_exit(0)` after writing the trace, or `_exit(3)` with a
/// message on stderr.
pub fn host_runner_main() -> ! {
    let mut input = String::new();
    if std::io::stdin().read_to_string(&mut input).is_err() {
        die("reading stdin");
    }
    let (s, unprivileged) = decode_scenario(&input).unwrap_or_else(|e| die(&format!("bad input: {e}")));
    if let Err(e) = check_scenario(&s) {
        die(&e);
    }

    // Every allocation happens here, before the fillers.
    let mincore_cap = mincore_cap(&s);
    // SAFETY: anonymous mapping for the mincore vector plus a guard page.
    let mincore_buf = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            mincore_cap + PAGE as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            die("mmap mincore buffer");
        }
        if libc::mprotect(p.cast::<u8>().add(mincore_cap).cast(), PAGE as usize, libc::PROT_NONE) != 0 {
            die("mprotect guard");
        }
        p.cast::<u8>()
    };

    let mut fds = Vec::with_capacity(s.files.len());
    let biggest = s.files.iter().copied().max().unwrap_or(0) as usize;
    let mut content = vec![0u8; biggest.min(64 << 20)];
    for (i, &size) in s.files.iter().enumerate() {
        // SAFETY: memfd_create with a valid C string.
        let fd = unsafe { libc::memfd_create(c"softmm-difftest".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            die("memfd_create");
        }
        // SAFETY: ftruncate of the fresh memfd.
        if unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
            die("ftruncate memfd");
        }
        let n = (size as usize).min(content.len());
        for (k, b) in content[..n].iter_mut().enumerate() {
            *b = file_byte(i, k as u64);
        }
        let mut done = 0;
        while done < n {
            // SAFETY: pwrite from our initialized buffer.
            let r = unsafe { libc::pwrite(fd, content[done..n].as_ptr().cast(), n - done, done as libc::off_t) };
            if r <= 0 {
                die("pwrite memfd");
            }
            done += r as usize;
        }
        fds.push(fd);
    }
    drop(content);

    // SAFETY: memfd_create with a valid C string.
    let filler_fd = unsafe { libc::memfd_create(c"softmm-difftest-filler".as_ptr(), libc::MFD_CLOEXEC) };
    if filler_fd < 0 {
        die("memfd_create (filler)");
    }
    let mut r = Runner {
        window: s.window,
        filler_fd,
        fds,
        out: Out::new(),
        maps: vec![0u8; 1 << 20],
        maps_len: 0,
        ranges: Vec::with_capacity(65536),
        mincore_buf,
        mincore_cap,
    };
    install_fault_handlers();
    r.out.put(b"\n");
    r.setup_window();
    r.report_outside();
    if unprivileged {
        drop_capabilities();
    }
    r.out.mark(b"setup ok\n");

    for op in &s.ops {
        r.guard(op);
        r.run_op(op);
        r.record_maps();
        r.out.mark(b"step\n");
    }
    r.out.mark(b"done\n");
    r.out.flush();
    // SAFETY: leave without running libtest's epilogue or any destructor.
    unsafe { libc::_exit(0) }
}

/// Drops every capability of the runner, so that the kernel checks what it
/// checks for an ordinary process.
fn drop_capabilities() {
    if let Err((call, _)) = crate::caps::drop_capabilities(crate::caps::Caps::ALL, false) {
        die(call);
    }
}
