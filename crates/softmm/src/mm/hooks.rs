//! Test-only hooks into the write section.

// The tests that set the hooks do not run under loom.
#![cfg_attr(loom, allow(dead_code))]

use std::cell::RefCell;

thread_local! {
    static BEFORE_PUBLISH: RefCell<Option<Box<dyn FnOnce()>>> = const { RefCell::new(None) };
    static AFTER_HUGETLB_SPLIT: RefCell<Option<Box<dyn FnOnce()>>> = const { RefCell::new(None) };
    static BEFORE_UNMAP_REF_PRIVATE: RefCell<Option<Box<dyn FnOnce()>>> = const { RefCell::new(None) };
    static AFTER_WINDOW_PUBLISHED: RefCell<Option<WindowHook>> = const { RefCell::new(None) };
}

/// A hook run after each window a write section publishes, with the window.
type WindowHook = Box<dyn FnMut(u64)>;

/// Runs `f` on this thread after each window its write sections publish,
/// with the window, until [`clear_after_window_published`].
pub(crate) fn set_after_window_published(f: impl FnMut(u64) + 'static) {
    AFTER_WINDOW_PUBLISHED.with(|h| *h.borrow_mut() = Some(Box::new(f)));
}

/// Removes the hook of [`set_after_window_published`].
pub(crate) fn clear_after_window_published() {
    AFTER_WINDOW_PUBLISHED.with(|h| *h.borrow_mut() = None);
}

/// Runs the hook set on this thread, if any (after window `w` was published).
pub(super) fn after_window_published(w: u64) {
    // Taken out while it runs: it may look up the published set but
    // publishes nothing.
    let hook = AFTER_WINDOW_PUBLISHED.with(|h| h.borrow_mut().take());
    if let Some(mut f) = hook {
        f(w);
        AFTER_WINDOW_PUBLISHED.with(|h| *h.borrow_mut() = Some(f));
    }
}

/// Runs `f` once, on this thread, at the end of its next `mmap_lock`
/// write section: after the section's VMA copies are made, before the
/// reverse maps are synced and the tree is published.
pub(crate) fn set_before_publish(f: impl FnOnce() + 'static) {
    BEFORE_PUBLISH.with(|h| *h.borrow_mut() = Some(Box::new(f)));
}

/// Runs the hook set on this thread, if any (the write section's end).
pub(super) fn before_publish() {
    if let Some(f) = BEFORE_PUBLISH.with(|h| h.borrow_mut().take()) {
        f();
    }
}

/// Runs `f` once, on this thread, right after its next `hugetlb_split`
/// (the unshare of a window a VMA split cuts), inside the write section.
pub(crate) fn set_after_hugetlb_split(f: impl FnOnce() + 'static) {
    AFTER_HUGETLB_SPLIT.with(|h| *h.borrow_mut() = Some(Box::new(f)));
}

/// Runs the hook set on this thread, if any (after `hugetlb_split`).
pub(crate) fn after_hugetlb_split() {
    if let Some(f) = AFTER_HUGETLB_SPLIT.with(|h| h.borrow_mut().take()) {
        f();
    }
}

/// Runs `f` once, on this thread, when its next hugetlb fault is about to
/// take the owner's page back from the children (`unmap_ref_private`),
/// with none of the fault's locks but `mmap_lock` (or the VMA's read
/// reference) held.
pub(crate) fn set_before_unmap_ref_private(f: impl FnOnce() + 'static) {
    BEFORE_UNMAP_REF_PRIVATE.with(|h| *h.borrow_mut() = Some(Box::new(f)));
}

/// Runs the hook set on this thread, if any (before `unmap_ref_private`).
pub(crate) fn before_unmap_ref_private() {
    if let Some(f) = BEFORE_UNMAP_REF_PRIVATE.with(|h| h.borrow_mut().take()) {
        f();
    }
}
