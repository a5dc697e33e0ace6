//! The machine description written with every result.

use serde::{Deserialize, Serialize};

/// Where the samples were taken.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    /// CPUs this process may run on.
    pub cores: usize,
    /// CPU model name.
    pub model: String,
    /// Host kernel release.
    pub kernel: String,
    /// The softmm commit the command was built from (`-dirty` with local changes).
    pub softmm_commit: String,
}

impl Machine {
    /// This machine.
    pub fn detect() -> Machine {
        Machine { cores: cores(), model: model(), kernel: kernel(), softmm_commit: env!("SOFTMM_COMMIT").to_string() }
    }
}

/// CPUs this process may run on.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

fn kernel() -> String {
    // SAFETY: an all-zero utsname is valid, and uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid out-pointer.
    if unsafe { libc::uname(&mut u) } != 0 {
        return "unknown".to_string();
    }
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    format!("{} {}", field(&u.sysname), field(&u.release))
}
