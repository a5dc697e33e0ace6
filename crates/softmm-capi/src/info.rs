//! The library's version, and the text of its results and configuration
//! errors.

use std::ffi::c_char;

use softmm::Errno;

use crate::config::{mm_config, mm_config_default, softmm_mm_config};
use crate::sized::read_sized;
use crate::SOFTMM_FAULTED;

/// The major version of the header (`softmm_version` gives the library's).
pub const SOFTMM_VERSION_MAJOR: u32 = 0;
/// The minor version of the header.
pub const SOFTMM_VERSION_MINOR: u32 = 2;
/// The patch version of the header.
pub const SOFTMM_VERSION_PATCH: u32 = 3;

/// The library's version, `"MAJOR.MINOR.PATCH"`: compare it with the
/// header's `SOFTMM_VERSION_*` to detect a header and library mismatch.
/// The string is static.
#[no_mangle]
pub extern "C" fn softmm_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// A static NUL-terminated copy of `s`, kept for the process's life: the
/// texts are a fixed set, made once each.
fn leak_c(s: String) -> *const c_char {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static TEXTS: Mutex<Option<HashMap<String, &'static std::ffi::CStr>>> = Mutex::new(None);
    let mut texts = TEXTS.lock().unwrap_or_else(|e| e.into_inner());
    let map = texts.get_or_insert_with(HashMap::new);
    let c = map.entry(s).or_insert_with_key(|s| {
        Box::leak(std::ffi::CString::new(s.as_str()).expect("no NUL in a message").into_boxed_c_str())
    });
    c.as_ptr()
}

/// What a result of a softmm function means, as a static string: for
/// `-errno`, the errno's name and Linux's description
/// (`"ENOMEM: cannot allocate memory"`); for `SOFTMM_FAULTED`, that the
/// guest access faulted; for `-ENOTRECOVERABLE`, that softmm panicked (a
/// bug to report); `"success"` for any other non-negative value, and
/// `"unknown error"` for a negative value softmm never returns.
#[no_mangle]
pub extern "C" fn softmm_strerror(result: i64) -> *const c_char {
    // No unwinding into C: a panic (none is known) answers as the bug it is.
    std::panic::catch_unwind(|| strerror(result))
        .unwrap_or_else(|_| c"ENOTRECOVERABLE: softmm panicked (a bug in softmm, to be reported)".as_ptr())
}

/// [`softmm_strerror`]'s text.
fn strerror(result: i64) -> *const c_char {
    let text = match result {
        r if r == i64::from(SOFTMM_FAULTED) => {
            "SOFTMM_FAULTED: the guest access faulted (its softmm_fault says how)".to_string()
        }
        r if r >= 0 => "success".to_string(),
        r if r == -i64::from(libc::ENOTRECOVERABLE) => {
            "ENOTRECOVERABLE: softmm panicked (a bug in softmm, to be reported)".to_string()
        }
        r => match r.checked_neg().and_then(|n| i32::try_from(n).ok()).and_then(Errno::from_code) {
            Some(e) => e.to_string(),
            None => "unknown error".to_string(),
        },
    };
    leak_c(text)
}

/// Why `softmm_mm_new_config` would refuse `config` with `-EINVAL`, as a
/// static string naming the field and its rule (`"mmap_base must be page
/// aligned, ..."`), or `NULL` if it would accept it. A `NULL` config, a
/// wrong `size` and an unknown policy name are named too.
///
/// # Safety
///
/// `config` is null or valid for reads of its `size` bytes, its policy
/// pointers null or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn softmm_mm_config_check(config: *const softmm_mm_config) -> *const c_char {
    let text = std::panic::catch_unwind(|| {
        if config.is_null() {
            return Some("config is NULL".to_string());
        }
        // SAFETY: valid for its size (the caller's contract).
        let c = match unsafe { read_sized(config, mm_config_default()) } {
            Ok(c) => c,
            Err(e) if e == -libc::E2BIG => {
                return Some("size is larger than this library's softmm_mm_config and a field it does not know is set (a newer header)".to_string())
            }
            Err(_) => return Some("size is not sizeof(softmm_mm_config): fill it with softmm_mm_config_default".to_string()),
        };
        // SAFETY: the policy pointers are null or strings (the caller's contract).
        let Some(m) = (unsafe { mm_config(&c) }) else {
            return Some("a policy name is not one softmm knows, or max_map_count is too large".to_string());
        };
        m.check().err().map(|e| e.to_string())
    })
    .unwrap_or_else(|_| Some("softmm panicked (a bug in softmm, to be reported)".to_string()));
    text.map_or(std::ptr::null(), leak_c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn text(p: *const c_char) -> &'static str {
        // SAFETY: the functions return static NUL-terminated strings.
        unsafe { CStr::from_ptr(p) }.to_str().unwrap()
    }

    #[test]
    fn the_version_matches_the_header_constants() {
        let want = format!("{SOFTMM_VERSION_MAJOR}.{SOFTMM_VERSION_MINOR}.{SOFTMM_VERSION_PATCH}");
        assert_eq!(text(softmm_version()), want);
        assert_eq!(want, env!("CARGO_PKG_VERSION"), "update the SOFTMM_VERSION_* constants");
    }

    #[test]
    fn each_result_has_its_text() {
        assert_eq!(text(softmm_strerror(-i64::from(libc::ENOMEM))), "ENOMEM: cannot allocate memory");
        assert_eq!(text(softmm_strerror(-i64::from(libc::EINVAL))), "EINVAL: invalid argument");
        assert!(text(softmm_strerror(i64::from(SOFTMM_FAULTED))).starts_with("SOFTMM_FAULTED"));
        assert!(text(softmm_strerror(-i64::from(libc::ENOTRECOVERABLE))).starts_with("ENOTRECOVERABLE"));
        assert_eq!(text(softmm_strerror(0)), "success");
        assert_eq!(text(softmm_strerror(0x7fff_0000)), "success");
        assert_eq!(text(softmm_strerror(-100_000)), "unknown error");
        assert_eq!(text(softmm_strerror(i64::MIN)), "unknown error");
        // The same text is the same pointer: nothing is made twice.
        assert_eq!(softmm_strerror(-i64::from(libc::ENOMEM)), softmm_strerror(-i64::from(libc::ENOMEM)));
    }

    #[test]
    fn a_bad_configuration_is_named() {
        let mut c = std::mem::MaybeUninit::<softmm_mm_config>::uninit();
        // SAFETY: valid for a write.
        assert_eq!(unsafe { crate::softmm_mm_config_default(c.as_mut_ptr()) }, 0);
        // SAFETY: just written.
        let mut c = unsafe { c.assume_init() };
        // SAFETY: valid, policy pointers null.
        assert!(unsafe { softmm_mm_config_check(&c) }.is_null());
        c.task_size = 0xffff_e000;
        // SAFETY: as above.
        assert!(text(unsafe { softmm_mm_config_check(&c) }).starts_with("mmap_base must"));
        c.mmap_base = 0xf7ff_e000;
        c.start_brk = 0x5655_9000;
        // SAFETY: as above.
        assert!(unsafe { softmm_mm_config_check(&c) }.is_null());
        c.size = 3;
        // SAFETY: as above.
        assert!(text(unsafe { softmm_mm_config_check(&c) }).starts_with("size"));
        // SAFETY: null is allowed.
        assert_eq!(text(unsafe { softmm_mm_config_check(std::ptr::null()) }), "config is NULL");
    }
}
