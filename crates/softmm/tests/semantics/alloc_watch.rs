//! The binary's allocator: the system's, which also records, per thread and
//! only while a test asks ([`largest_allocation_in`]), the largest single
//! allocation made: how a test bounds the memory a call takes, whatever the
//! size of its input.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// [`System`], watched.
pub struct Watch;

thread_local! {
    /// The largest size allocated by this thread while watched (`None`: not watched).
    static LARGEST: Cell<Option<usize>> = const { Cell::new(None) };
}

fn note(size: usize) {
    // `try_with`: the thread's locals may be gone (an allocation at thread exit).
    let _ = LARGEST.try_with(|l| {
        if let Some(largest) = l.get() {
            l.set(Some(largest.max(size)));
        }
    });
}

// SAFETY: every call is forwarded to `System` with its own arguments; the
// bookkeeping touches a const-initialized thread-local `Cell` only (no
// allocation, no reentry).
unsafe impl GlobalAlloc for Watch {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract is `System.alloc`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as in `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: as in `alloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as in `alloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static WATCH: Watch = Watch;

/// Runs `f` on this thread and returns its result with the largest single
/// allocation the thread made meanwhile, in bytes.
pub fn largest_allocation_in<R>(f: impl FnOnce() -> R) -> (R, usize) {
    LARGEST.with(|l| l.set(Some(0)));
    let r = f();
    let largest = LARGEST.with(|l| l.replace(None)).unwrap_or(0);
    (r, largest)
}
