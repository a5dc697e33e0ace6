//! `softmm replay --run -- CMD ARGS...`: records CMD with strace, with the
//! calls the replay follows, and hands the log to the replay.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The `-e trace=` set: the memory calls, the process calls (one address
/// space per program, forks, exits) and the descriptor calls (open modes).
pub const TRACE_SET: &str = "trace=memory,process,open,openat,creat,close,dup,dup2,dup3,memfd_create";

/// What a recording produced.
pub struct Recording {
    /// The log's text.
    pub text: String,
    /// How the traced command ended (`exit status 0`).
    pub status: String,
}

/// Runs `cmd` under `strace -f -y -e TRACE_SET -o LOG`, its standard streams
/// the caller's, and returns the log. `keep`: where the log stays (else a
/// temporary file, removed). A clear error when strace is missing or cannot
/// trace (ptrace refused), or `cmd` is empty.
pub fn record(cmd: &[String], keep: Option<&Path>) -> Result<Recording, String> {
    if cmd.is_empty() {
        return Err("--run needs a command: softmm replay --run -- CMD [ARGS...]".into());
    }
    let log: PathBuf = match keep {
        Some(p) => p.to_path_buf(),
        None => std::env::temp_dir().join(format!("softmm-replay-{}.strace", std::process::id())),
    };
    let status = Command::new("strace")
        .args(["-f", "-y", "-e", TRACE_SET, "-o"])
        .arg(&log)
        .arg("--")
        .args(cmd)
        .status()
        .map_err(|e| match e.kind() {
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
    if keep.is_none() {
        let _ = std::fs::remove_file(&log);
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
    Ok(Recording { text, status })
}
