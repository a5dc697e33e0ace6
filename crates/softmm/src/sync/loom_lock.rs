//! `loom`'s locks behind `parking_lot`'s API, so that the crate's code is the
//! same under `cfg(loom)`: no poisoning (a panic inside a model fails the
//! model anyway), `Option` from the `try_` calls, and `read_recursive`, which
//! is a plain `read` here because loom's rwlock lets a reader in while a
//! writer waits (it never starves readers, so recursion cannot deadlock).

/// `loom::sync::MutexGuard`, which already has `parking_lot`'s shape.
pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;
/// `loom::sync::RwLockReadGuard`.
pub(crate) type RwLockReadGuard<'a, T> = loom::sync::RwLockReadGuard<'a, T>;
/// `loom::sync::RwLockWriteGuard`.
pub(crate) type RwLockWriteGuard<'a, T> = loom::sync::RwLockWriteGuard<'a, T>;

/// A mutex with `parking_lot::Mutex`'s API over `loom::sync::Mutex`.
#[derive(Default)]
pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

impl<T> Mutex<T> {
    /// An unlocked mutex holding `v`.
    pub(crate) fn new(v: T) -> Self {
        Mutex(loom::sync::Mutex::new(v))
    }

    /// Locks, waiting for the holder (a modelled block).
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap()
    }

    /// Locks if nobody holds it.
    #[allow(dead_code)]
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        self.0.try_lock().ok()
    }

    /// The value, through exclusive access (no locking).
    pub(crate) fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap()
    }
}

/// A reader-writer lock with `parking_lot::RwLock`'s API over `loom::sync::RwLock`.
#[derive(Default)]
pub(crate) struct RwLock<T>(loom::sync::RwLock<T>);

impl<T> RwLock<T> {
    /// An unlocked rwlock holding `v`.
    pub(crate) fn new(v: T) -> Self {
        RwLock(loom::sync::RwLock::new(v))
    }

    /// Locks for reading, waiting for a writer.
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, T> {
        self.0.read().unwrap()
    }

    /// Locks for reading even while a writer waits: a plain `read` (see the
    /// module doc).
    pub(crate) fn read_recursive(&self) -> RwLockReadGuard<'_, T> {
        self.read()
    }

    /// Locks for reading if no writer holds it.
    pub(crate) fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
        self.0.try_read().ok()
    }

    /// Locks for writing, waiting for every holder.
    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.0.write().unwrap()
    }

    /// The value, through exclusive access (no locking).
    pub(crate) fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap()
    }
}
