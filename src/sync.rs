//! Concurrency primitives that `loom` can model, swapped in for loom test builds.
//!
//! Normal builds (including `cargo test` without `--cfg kafka_source_loom`) get `std`'s atomics and tokio's
//! [`Notify`]. Test builds with `RUSTFLAGS="--cfg kafka_source_loom"` get loom's mocks instead, so the same
//! source of [`crate::handover`] runs inside `loom::model` (tokio's `crate::loom` pattern). Only
//! the handover goes through this shim; the rest of the crate uses `std` and tokio directly.
//!
//! Loom's `Notify` is blocking, not async, so the loom variant exposes `wait()` in place of
//! tokio's `notified().await`. Both store a single permit: a notification sent while nobody
//! waits is kept for the next waiter, and two notifications before a wait collapse into one.

#[cfg(not(all(test, kafka_source_loom)))]
pub(crate) use std::sync::atomic::AtomicPtr;
#[cfg(not(all(test, kafka_source_loom)))]
pub(crate) use tokio::sync::Notify;

#[cfg(all(test, kafka_source_loom))]
pub(crate) use self::mocked::Notify;
#[cfg(all(test, kafka_source_loom))]
pub(crate) use loom::sync::atomic::AtomicPtr;

#[cfg(all(test, kafka_source_loom))]
mod mocked {
    /// Loom's `Notify`, with tokio's name for the sending side.
    #[derive(Debug, Default)]
    pub(crate) struct Notify(loom::sync::Notify);

    impl Notify {
        /// A `Notify` without a stored permit.
        pub(crate) fn new() -> Self {
            Self(loom::sync::Notify::new())
        }

        /// Wakes the waiter, or stores the permit if nobody waits (tokio's `notify_one`).
        pub(crate) fn notify_one(&self) {
            self.0.notify();
        }

        /// Blocks until a permit is available and consumes it. May return spuriously.
        pub(crate) fn wait(&self) {
            self.0.wait();
        }
    }
}
