//! `softmm replay --run -- CMD ARGS...`: records CMD with strace, with the
//! calls the replay follows, and, where `perf` can trace, its page faults
//! beside it (see [`super::faults`]); hands both to the replay.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The `-e trace=` set: the memory calls, the process calls (one address
/// space per program, forks, exits), the descriptor calls (open modes) and
/// `prctl` (`PR_SET_MDWE` changes what `mmap` and `mprotect` allow; strace's
/// `memory` class leaves it out, and the replay counts its other options as
/// other calls).
pub const TRACE_SET: &str =
    "trace=memory,process,open,openat,creat,close,dup,dup2,dup3,memfd_create,unlink,unlinkat,setrlimit,prlimit64,prctl";

/// What a recording produced.
pub struct Recording {
    /// The log's text.
    pub text: String,
    /// How the traced command ended (`exit status 0`).
    pub status: String,
    /// The page faults (`perf script` text), or why there are none.
    pub faults: Result<String, String>,
}

/// Whether `perf` runs here, or what to install.
fn perf_available() -> Result<(), String> {
    match Command::new("perf").arg("--version").output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!("`perf --version` failed ({}): {}", o.status, super::faults::INSTALL)),
        Err(_) => Err(format!("perf is not installed: {}", super::faults::INSTALL)),
    }
}

/// Runs `cmd` under `strace -f -y -e TRACE_SET -o LOG`, itself under `perf
/// record` of the fault events ([`super::faults::perf_events`]) where perf
/// runs, its standard streams the caller's, and returns the log and the
/// faults. `keep`: where the log stays, the perf data beside it with the
/// extension `.perf.data` (else temporary files, removed). A clear error when strace is missing or cannot
/// trace (ptrace refused), or `cmd` is empty.
pub fn record(cmd: &[String], keep: Option<&Path>) -> Result<Recording, String> {
    if cmd.is_empty() {
        return Err("--run needs a command: softmm replay --run -- CMD [ARGS...]".into());
    }
    let log: PathBuf = match keep {
        Some(p) => p.to_path_buf(),
        None => std::env::temp_dir().join(format!("softmm-replay-{}.strace", std::process::id())),
    };
    // The faults: `perf record` runs strace, whose children it follows, so
    // it sees the traced threads' faults and calls (and strace's own, which
    // the log does not name and the replay leaves out).
    let perf_data = log.with_extension("perf.data");
    let mut faults = perf_available();
    let strace = |prog: &str| {
        let mut c = Command::new(prog);
        if prog == "perf" {
            c.args(["record", "-q"]);
            for e in super::faults::perf_events() {
                c.args(["-e", &e]);
            }
            c.arg("-o").arg(&perf_data).args(["--", "strace"]);
        }
        c.args(["-f", "-y", "-e", TRACE_SET, "-o"]).arg(&log).arg("--").args(cmd);
        c
    };
    // A log left from an earlier recording must not pass for this one's.
    let _ = std::fs::remove_file(&log);
    let mut status = strace(if faults.is_ok() { "perf" } else { "strace" }).status();
    if faults.is_ok() && !std::fs::metadata(&log).is_ok_and(|m| m.len() > 0) {
        // perf could not trace (perf_event_paranoid, no tracefs): strace
        // alone.
        faults = Err(format!(
            "`perf record` could not trace the command ({}): run as root or lower \
             kernel.perf_event_paranoid; {}",
            status.as_ref().map_or_else(|e| e.to_string(), |s| s.to_string()),
            super::faults::INSTALL
        ));
        status = strace("strace").status();
    }
    let status = status.map_err(|e| match e.kind() {
        ErrorKind::NotFound => {
            "strace is not installed (or not on PATH): --run records the command with \
                                    strace; install it (`apt-get install strace`) or record a log yourself with \
                                    `strace -f -y -e "
                .to_string()
                + TRACE_SET
                + " -o LOG CMD` and run `softmm replay LOG`"
        }
        _ => format!("cannot run strace: {e}"),
    })?;
    let text = std::fs::read(&log).map(|b| String::from_utf8_lossy(&b).into_owned());
    let faults = faults.and_then(|()| super::faults::read(&perf_data));
    if keep.is_none() {
        let _ = std::fs::remove_file(&log);
        let _ = std::fs::remove_file(&perf_data);
    }
    let text = match text {
        Ok(t) if !t.trim().is_empty() => t,
        _ => {
            return Err(format!(
                "strace wrote no log ({status}): it may not be allowed to trace here (ptrace refused, e.g. in a \
                 container without CAP_SYS_PTRACE), or `{}` could not be started",
                cmd[0]
            ))
        }
    };
    // strace exits with the traced command's status; a command that ran and
    // failed still has a log worth replaying.
    let status = match status.code() {
        Some(c) => format!("exit status {c}"),
        None => status.to_string(),
    };
    Ok(Recording { text, status, faults })
}

/// One untraced run of a recorded command: the host's own time for it.
#[derive(Debug, Clone, Copy)]
pub struct HostRun {
    /// Wall-clock seconds from spawn to exit.
    pub seconds: f64,
    /// CPU seconds (user and system) of the command and its children.
    pub cpu_seconds: f64,
}

/// Runs `cmd` once untraced, its standard streams discarded, and returns its
/// wall and CPU time (`wait4`'s resource usage, which counts the children it
/// waited for): the recorded program's own time, computation included, for
/// the bench's host row.
pub fn run_untraced(cmd: &[String]) -> Result<HostRun, String> {
    let (prog, args) = cmd.split_first().ok_or("no command")?;
    let t0 = std::time::Instant::now();
    let child = Command::new(prog)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("{prog}: {e}"))?;
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero `rusage` is valid (plain integers).
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our unwaited child; the pointers are to locals.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let seconds = t0.elapsed().as_secs_f64();
    if r != pid {
        return Err(format!("wait4: {}", std::io::Error::last_os_error()));
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    Ok(HostRun { seconds, cpu_seconds: tv(usage.ru_utime) + tv(usage.ru_stime) })
}

#[cfg(test)]
mod tests {
    use super::TRACE_SET;

    /// strace's `memory` class has no `prctl`: without it a program's
    /// `PR_SET_MDWE` never reached the log, and `mdwe_test`'s refused
    /// `PROT_WRITE|PROT_EXEC` mappings replayed as successes.
    #[test]
    fn trace_set_records_mdwe() {
        let calls: Vec<&str> = TRACE_SET.trim_start_matches("trace=").split(',').collect();
        for call in ["memory", "process", "prctl", "memfd_create", "prlimit64"] {
            assert!(calls.contains(&call), "{call} missing from {TRACE_SET}");
        }
    }
}
