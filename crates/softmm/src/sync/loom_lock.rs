//! `loom`'s locks behind `parking_lot`'s API, so that the crate's code is the
//! same under `cfg(loom)`: no poisoning (a panic inside a model fails the
//! model anyway), `Option` from the `try_` calls, and `read_recursive`, which
//! is a plain `read` here because loom's rwlock lets a reader in while a
//! writer waits (it never starves readers, so recursion cannot deadlock).

/// `loom::sync::MutexGuard`, which already has `parking_lot`'s shape.
pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;
/// `loom::sync::RwLockReadGuard`.
pub(crate) type RwLockReadGuard<'a, T> = loom::sync::RwLockReadGuard<'a, T>;

/// A write guard of [`RwLock`]: loom's write guard plus the writers' gate,
/// which [`RwLockWriteGuard::downgrade`] keeps until it holds the read lock,
/// so that no writer gets in between (loom's rwlock has no downgrade).
pub(crate) struct RwLockWriteGuard<'a, T> {
    // Dropped in this order: the write lock, then the gate.
    guard: loom::sync::RwLockWriteGuard<'a, T>,
    _gate: loom::sync::MutexGuard<'a, ()>,
    lock: &'a loom::sync::RwLock<T>,
}

impl<T> std::ops::Deref for RwLockWriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> std::ops::DerefMut for RwLockWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

impl<'a, T> RwLockWriteGuard<'a, T> {
    /// `parking_lot`'s atomic downgrade: readers may enter at once, writers
    /// only once the returned read guard is dropped. Every writer takes the
    /// gate before the lock, and the gate is released only after the read
    /// lock is held.
    pub(crate) fn downgrade(s: Self) -> RwLockReadGuard<'a, T> {
        let RwLockWriteGuard { guard, _gate, lock } = s;
        drop(guard);
        let read = lock.read().unwrap();
        drop(_gate);
        read
    }
}

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
pub(crate) struct RwLock<T>(loom::sync::RwLock<T>, loom::sync::Mutex<()>);

impl<T> RwLock<T> {
    /// An unlocked rwlock holding `v`.
    pub(crate) fn new(v: T) -> Self {
        RwLock(loom::sync::RwLock::new(v), loom::sync::Mutex::new(()))
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

    /// [`RwLock::read_recursive`], which a loom model's scheduler never
    /// leaves parked while it could enter: the timeout is not modelled.
    pub(crate) fn try_read_recursive_for(&self, _timeout: std::time::Duration) -> Option<RwLockReadGuard<'_, T>> {
        Some(self.read_recursive())
    }

    /// Locks for reading if no writer holds it.
    pub(crate) fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
        self.0.try_read().ok()
    }

    /// Locks for writing, waiting for every holder.
    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, T> {
        let _gate = self.1.lock().unwrap();
        RwLockWriteGuard { guard: self.0.write().unwrap(), _gate, lock: &self.0 }
    }

    /// Locks for writing if nobody holds it (nor waits to write).
    pub(crate) fn try_write(&self) -> Option<RwLockWriteGuard<'_, T>> {
        let _gate = self.1.try_lock().ok()?;
        let guard = self.0.try_write().ok()?;
        Some(RwLockWriteGuard { guard, _gate, lock: &self.0 })
    }

    /// The value, through exclusive access (no locking).
    pub(crate) fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap()
    }
}
