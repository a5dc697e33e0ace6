//! `--compare-maps`: the replay's final mappings against the real
//! `/proc/PID/maps` the program left, where the log says what is there.
//!
//! The kernel's own mappings of a new program (the executable, the
//! interpreter, the stack, the vDSO) are made before tracing begins and no
//! traced call names them; the replay knows only the ranges traced calls
//! touched. So a real mapping is compared where it overlaps a range the log
//! made or changed (and that is no placeholder for pre-trace memory), and a
//! replayed one likewise: each must be in the other with the same bounds,
//! permissions, offset (for a file) and name. Device and inode numbers are
//! the host's and are not compared.

use super::ranges::RangeSet;

/// One line of a maps file, as far as it is compared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Line {
    pub start: u64,
    pub end: u64,
    pub perms: String,
    /// The offset of a file mapping (0 for anonymous memory).
    pub offset: u64,
    pub name: String,
}

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:08x}-{:08x} {} {:08x}", self.start, self.end, self.perms, self.offset)?;
        if !self.name.is_empty() {
            write!(f, " {}", self.name)?;
        }
        Ok(())
    }
}

/// Parses `/proc/PID/maps` text; lines that are not maps lines are skipped.
pub(super) fn parse(text: &str) -> Vec<Line> {
    let mut out = Vec::new();
    for l in text.lines() {
        let mut f = l.split_whitespace();
        let (Some(range), Some(perms), Some(off), Some(_dev), Some(inode)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let Some((s, e)) = range.split_once('-') else { continue };
        let (Ok(start), Ok(end), Ok(offset)) =
            (u64::from_str_radix(s, 16), u64::from_str_radix(e, 16), u64::from_str_radix(off, 16))
        else {
            continue;
        };
        // The name is the rest of the line after the inode, spaces kept
        // (` (deleted)`).
        let name = after_fields(l, 5).to_string();
        let offset = if inode == "0" && !name.starts_with('/') { 0 } else { offset };
        out.push(Line { start, end, perms: perms.to_string(), offset, name });
    }
    out
}

/// `l` after its first `n` whitespace-separated fields, trimmed.
fn after_fields(l: &str, n: usize) -> &str {
    let mut rest = l.trim_start();
    for _ in 0..n {
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        rest = rest[end..].trim_start();
    }
    rest.trim_end()
}

/// The differences between `real` and `replayed` where they overlap
/// `region`, each a line saying which side lacks which mapping.
pub(super) fn compare(real: &[Line], replayed: &[Line], region: &RangeSet) -> Vec<String> {
    let inside = |l: &Line| region.gaps(l.start, l.end) != [(l.start, l.end)];
    let mut out = Vec::new();
    for r in real.iter().filter(|l| inside(l)) {
        if !replayed.contains(r) {
            out.push(format!("real {r} not replayed"));
        }
    }
    for r in replayed.iter().filter(|l| inside(l)) {
        if !real.contains(r) {
            out.push(format!("replayed {r} not real"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compares_only_where_the_log_knows() {
        let real = parse(
            "55d1e0a00000-55d1e0a01000 r--p 00000000 08:01 1234   /usr/bin/t\n\
             7f0000000000-7f0000004000 rw-p 00000000 00:00 0 \n\
             7f0000004000-7f0000006000 rw-p 00000000 00:00 0 \n\
             7f0000010000-7f0000011000 r--s 00002000 00:01 99     /memfd:x (deleted)\n\
             7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0      [stack]\n",
        );
        assert_eq!(real[3].name, "/memfd:x (deleted)");
        let mut region = RangeSet::default();
        region.insert(0x7f0000000000, 0x7f0000020000);
        let same = parse(
            "7f0000000000-7f0000004000 rw-p 00000000 00:00 0\n\
             7f0000004000-7f0000006000 rw-p 00000000 00:00 0\n\
             7f0000010000-7f0000011000 r--s 00002000 00:01 7 /memfd:x (deleted)\n",
        );
        assert!(compare(&real, &same, &region).is_empty());
        // Merged where the real ones are not: both sides named.
        let merged = parse(
            "7f0000000000-7f0000006000 rw-p 00000000 00:00 0\n\
             7f0000010000-7f0000011000 r--s 00002000 00:01 7 /memfd:x (deleted)\n",
        );
        let d = compare(&real, &merged, &region);
        assert_eq!(d.len(), 3, "{d:?}");
        assert!(d[2].starts_with("replayed 7f0000000000-7f0000006000 rw-p"), "{d:?}");
    }
}
