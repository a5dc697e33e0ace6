//! What the library's unit tests share: a seeded generator for their
//! random calls, so that a failing sequence is the same on every run.

/// A draw function over the xorshift64 sequence from `seed` (non-zero):
/// each call returns the next number modulo `n` (`n > 0`).
pub(crate) fn xorshift(mut seed: u64) -> impl FnMut(u64) -> u64 {
    move |n| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    }
}
