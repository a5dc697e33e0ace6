//! The loom models' harness: a model's threads end as a program's do.
//!
//! A thread that exits hands its own RCU callbacks over to the collector
//! (`rcu::hand_over_own`, from its locals' destructor, under
//! [`WriterPolicy::ShortOwnRcu`](crate::WriterPolicy::ShortOwnRcu), the
//! default). loom drops a model thread's locals in no fixed order, and the
//! first thread's only after the model's lazy statics (crossbeam's
//! collector among them), so a destructor that pins cannot be replayed:
//! the threads this harness runs call the same hand-over where their work
//! ends instead. A model thread run otherwise that exits with callbacks
//! queued panics with a message naming this module. (Most models start
//! from `MmConfig::model_default`, under `short`, and meet the own lists
//! only where they model them.)

/// [`loom::model::Builder`], whose [`Builder::check`] ends each execution's
/// first thread with the hand-over.
pub(crate) struct Builder(loom::model::Builder);

impl Builder {
    /// loom's builder, as `loom::model::Builder::new` (which reads the
    /// `LOOM_*` environment variables).
    pub(crate) fn new() -> Builder {
        Builder(loom::model::Builder::new())
    }

    /// Runs every execution of `f`, as `loom::model::Builder::check`,
    /// each from the first CPU slot (`percpu::restart_slots`: a model's
    /// replays must give its threads the same slots, hence the same
    /// atomics), then hands the first thread's own callbacks over.
    pub(crate) fn check<F>(&self, f: F)
    where
        F: Fn() + Sync + Send + 'static,
    {
        self.0.check(move || {
            super::percpu::restart_slots();
            f();
            super::rcu::hand_over_own();
        });
    }
}

impl std::ops::Deref for Builder {
    type Target = loom::model::Builder;
    fn deref(&self) -> &loom::model::Builder {
        &self.0
    }
}

impl std::ops::DerefMut for Builder {
    fn deref_mut(&mut self) -> &mut loom::model::Builder {
        &mut self.0
    }
}

/// Spawns a model thread, as `loom::thread::spawn`, that hands its own
/// callbacks over once `f` returns.
pub(crate) fn spawn<F, T>(f: F) -> loom::thread::JoinHandle<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    loom::thread::spawn(move || {
        let r = f();
        super::rcu::hand_over_own();
        r
    })
}

/// As [`spawn`], from a `loom::thread::Builder` (a larger stack).
pub(crate) fn spawn_with<F, T>(b: loom::thread::Builder, f: F) -> loom::thread::JoinHandle<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    b.spawn(move || {
        let r = f();
        super::rcu::hand_over_own();
        r
    })
    .expect("a loom thread")
}
