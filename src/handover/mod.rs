//! Latest-value-wins handover of one value between threads: checkpoint thread → network loop.
//!
//! The consumer uses it to pass the offsets of the most recently completed checkpoint to the
//! network loop, which commits them. It is not a queue: a value published before the previous
//! one was taken replaces it. [`Mailbox::publish`] hands the replaced value back, so the caller
//! can log "commit skipped, superseded by a newer checkpoint" (as Flink's `KafkaConsumerThread`
//! does) instead of losing it silently.
//!
//! - [`Mailbox<T>`] is the slot: one `AtomicPtr<T>`, lock-free, usable from any number of
//!   threads.
//! - [`Handover<T>`] pairs a mailbox with a [`tokio::sync::Notify`], so that an async loop can
//!   sleep until something is published and be woken out of a blocked `select!`.
//!
//! This module holds the crate's only `unsafe` code.
//!
//! # Protocol
//!
//! The slot holds either null or a pointer from `Box::into_raw` that the mailbox owns. It is
//! operated **only with `swap`**:
//!
//! - `publish(value)` boxes `value` and swaps the box in. What comes back out (null, or the box of
//!   a superseded value) now belongs to the publisher, which turns it back into a `T` and returns
//!   it.
//! - `take()` swaps null in. What comes back out belongs to the taker.
//! - `Drop` takes what is left and drops it.
//!
//! So every pointer has exactly one owner at any time: the slot, or the one thread whose `swap`
//! removed it from the slot. No code loads the pointer and dereferences it while it is still in
//! the slot, so no thread can free a value another thread is reading: ABA and deferred
//! reclamation (hazard pointers, epochs) cannot arise, by construction. `Box::from_raw` appears
//! in one place, on a pointer that the calling thread has just swapped out.
//!
//! A `swap` is a read-modify-write, and a read-modify-write always reads the value just before
//! its own write in the slot's modification order. Each stored pointer is therefore swapped out
//! exactly once: every published value is either taken, returned as superseded, or dropped with
//! the mailbox, never two of these and never none.
//!
//! ## Orderings
//!
//! | op | swaps in | ordering | why |
//! |---|---|---|---|
//! | `publish` | the new box | `AcqRel` | *Release*: the writes that built the value happen before any read by the thread that later swaps this pointer out. *Acquire*: the superseded pointer we get back was stored by another `publish`'s Release; we own it now, read it and maybe drop it. |
//! | `take` | null | `Acquire` | Pairs with the Release of the `publish` that stored the pointer we get back. Storing null hands no data to anyone, so no Release is needed. |
//! | `Drop` | null (via `take`) | `Acquire` | `&mut self` already excludes every other thread. `take` is reused because loom's atomics have no `get_mut`. |
//!
//! # Wakeup: publish, then notify; take at the top of every turn
//!
//! [`Handover::publish`] publishes into the mailbox **first** and calls
//! [`Notify::notify_one`](tokio::sync::Notify::notify_one) **second**. The network loop calls
//! [`Handover::take`] **at the top of every turn**, and only then waits on
//! [`Handover::notified`], typically as the first arm of a `biased` `select!`. Between them, the
//! two rules make a lost wakeup impossible:
//!
//! - If the loop's `take` ran before the value was swapped in, the matching `notify_one` comes
//!   later still. Either the loop already waits and is woken, or nobody waits yet and `Notify`
//!   stores the permit, so the loop's next wait completes at once. The loop goes round and takes.
//! - `notify_one` happens before the wakeup it causes (tokio's `Notify` synchronises like
//!   `Thread::unpark`/`park`), so the loop's next `take` sees the published value or a newer one.
//! - The value never depends on the wakeup: it stays in the mailbox until taken. A missed wakeup
//!   could only delay a commit, never lose it.
//!
//! Notifying *before* publishing is wrong: the loop can consume the permit, `take` nothing, and go
//! back to sleep before the value lands, which then sits unseen until some unrelated event. The
//! loom model of the whole handover reports exactly this as a deadlock.
//!
//! A wakeup does not imply a value. `Notify` keeps one stale permit when the loop took a value at
//! the top of a turn before waiting, so the next wait returns at once and `take` finds nothing.
//! That costs one extra turn and nothing else.
//!
//! # Why not `Mutex<Option<T>>` or `arc_swap`
//!
//! A `Mutex<Option<T>>` works, but a checkpoint thread preempted while holding the lock stalls
//! the network loop; here each side is one wait-free `swap`. `arc_swap::ArcSwapOption` is built to
//! share an `Arc<T>` with many readers; we move each value out exactly once, so it would only add
//! an `Arc` and its reference counts. The reason is that progress guarantee, not speed:
//! `benches/commit_path.rs` finds a `parking_lot` mutex as fast as the mailbox (which pays for a
//! `Box` per publish), with or without contention, and `arc_swap` a few times slower. All of them
//! are far below the cost of the `OffsetCommit` round trip that follows.
//!
//! # Verification
//!
//! - Unit and two-thread stress tests: `cargo test --lib handover`.
//! - Loom models of publish ‖ take, publish ‖ publish ‖ take and the whole wakeup protocol:
//!   `.ci/loom.sh`, i.e. `RUSTFLAGS="--cfg kafka_source_loom" LOOM_MAX_PREEMPTIONS=2 cargo test --lib --release
//!   handover`. Their payload keeps its data in `loom::cell::UnsafeCell`, without which loom cannot
//!   see a missing Acquire or Release.
//! - Miri, where a nightly toolchain with miri is installed:
//!   `MIRIFLAGS="-Zmiri-strict-provenance" cargo +nightly miri test --lib handover`, and again
//!   with `-Zmiri-tree-borrows` added.

use std::{fmt, marker::PhantomData, ptr, sync::atomic::Ordering};

use crate::sync::{AtomicPtr, Notify};

/// A lock-free slot holding at most one value, in which the latest published value wins.
///
/// Any number of threads may [`publish`](Self::publish) and [`take`](Self::take) concurrently.
/// Each value published is handed out exactly once: by `take`, as the superseded value returned
/// from a later `publish`, or dropped when the mailbox is dropped. Both operations are a single
/// atomic `swap` on a pointer, so neither waits for the other side; `publish` also allocates a
/// `Box` for the value. See the [module docs](self) for the protocol and its memory orderings.
///
/// ```
/// use kafka_source::handover::Mailbox;
///
/// let mailbox = Mailbox::new();
/// assert_eq!(mailbox.publish(vec![(0_u32, 41_i64)]), None);
/// // Not taken yet: the newer value replaces it, and we get the older one back.
/// assert_eq!(mailbox.publish(vec![(0, 42)]), Some(vec![(0, 41)]));
/// assert_eq!(mailbox.take(), Some(vec![(0, 42)]));
/// assert_eq!(mailbox.take(), None);
/// ```
///
/// `Mailbox<T>` is [`Send`] and [`Sync`] exactly when `T` is `Send`, like `Mutex<T>`: values move
/// between threads whole, and no `&T` is ever shared. A mailbox of a non-`Send` type cannot be
/// shared:
///
/// ```compile_fail,E0277
/// fn assert_sync<T: Sync>() {}
/// assert_sync::<kafka_source::handover::Mailbox<std::rc::Rc<()>>>();
/// ```
pub struct Mailbox<T> {
    /// Null, or a pointer from `Box::into_raw` that this mailbox owns.
    slot: AtomicPtr<T>,
    /// Tells dropck that we own (and drop) a `T`, and gives the auto traits other than `Send` and
    /// `Sync` (`Unpin`, `UnwindSafe`, …) the bounds of `Box<T>`. `Send` and `Sync` are implemented
    /// by hand below.
    _owns: PhantomData<Box<T>>,
}

impl<T> Mailbox<T> {
    /// An empty mailbox.
    pub fn new() -> Self {
        Self {
            slot: AtomicPtr::new(ptr::null_mut()),
            _owns: PhantomData,
        }
    }

    /// Puts `value` in the mailbox, replacing what is there.
    ///
    /// Returns the superseded value, if one was published and not yet taken.
    pub fn publish(&self, value: T) -> Option<T> {
        let new = Box::into_raw(Box::new(value));
        // AcqRel: Release hands the value's contents to whoever swaps `new` out; Acquire takes the
        // contents of the superseded value from its publisher (see the ordering table).
        let old = self.slot.swap(new, Ordering::AcqRel);
        // SAFETY:
        // - `old` is null or came from `Box::into_raw` in an earlier `publish`;
        // - our swap removed it from the slot, so no other thread can obtain it, and we drop the
        //   raw pointer here;
        // - our swap has Acquire ordering.
        unsafe { Self::reclaim(old) }
    }

    /// Removes and returns the value in the mailbox, if any.
    pub fn take(&self) -> Option<T> {
        // Acquire: pairs with the Release of the `publish` that stored the pointer.
        let old = self.slot.swap(ptr::null_mut(), Ordering::Acquire);
        // SAFETY:
        // - `old` is null or came from `Box::into_raw` in `publish`;
        // - our swap removed it from the slot, so no other thread can obtain it, and we drop the
        //   raw pointer here;
        // - our swap has Acquire ordering.
        unsafe { Self::reclaim(old) }
    }

    /// Turns a pointer just swapped out of the slot back into the value it owns.
    ///
    /// # Safety
    ///
    /// - `ptr` is null, or was returned by `Box::into_raw` in [`publish`](Self::publish);
    /// - the caller removed `ptr` from the slot with a `swap`, so no other thread holds it, and
    ///   does not use `ptr` again;
    /// - that `swap` had Acquire ordering, so the writes of the thread that published `ptr` are
    ///   visible to the caller.
    unsafe fn reclaim(ptr: *mut T) -> Option<T> {
        if ptr.is_null() {
            return None;
        }
        // SAFETY: by the caller's contract, `ptr` came from `Box::into_raw`, its pointee is
        // visible to us, and we are its only owner, so rebuilding the `Box` frees it exactly once.
        let boxed = unsafe { Box::from_raw(ptr) };
        Some(*boxed)
    }
}

impl<T> Default for Mailbox<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for Mailbox<T> {
    /// Shows no contents: looking at them would need a load of the slot, and the protocol allows
    /// only `swap`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mailbox").finish_non_exhaustive()
    }
}

impl<T> Drop for Mailbox<T> {
    fn drop(&mut self) {
        // `take` rather than `get_mut`: loom's atomics have no `get_mut`.
        drop(self.take());
    }
}

// SAFETY: a `Mailbox<T>` owns at most one boxed `T`, so sending the mailbox sends that `T`, which
// `T: Send` allows.
unsafe impl<T: Send> Send for Mailbox<T> {}

// SAFETY: through `&Mailbox<T>`, threads can only move whole `T`s in (`publish`) and out (`take`),
// each handed over by an atomic swap with Release/Acquire ordering. No `&T` is ever shared, so,
// as for `Mutex<T>`, `T: Send` suffices and `T: Sync` is not needed.
unsafe impl<T: Send> Sync for Mailbox<T> {}

/// A [`Mailbox`] plus a wakeup for the async loop that takes from it.
///
/// One side [`publish`](Self::publish)es, from any thread, without blocking. The network loop
/// [`take`](Self::take)s at the top of every turn and then waits on
/// [`notified`](Self::notified) together with its other events. See
/// [the module docs](self#wakeup-publish-then-notify-take-at-the-top-of-every-turn) for why this
/// order never loses a wakeup.
///
/// The wakeup side is meant for **one** waiting task: [`publish`](Self::publish) wakes at most
/// one. Any number of threads may publish.
///
/// ```
/// use std::{sync::Arc, time::Duration};
///
/// use kafka_source::handover::Handover;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let handover = Arc::new(Handover::new());
///
/// // The checkpoint side, on its own thread.
/// let checkpoint = Arc::clone(&handover);
/// std::thread::spawn(move || checkpoint.publish(vec![(0_u32, 42_i64)]));
///
/// // The network loop.
/// let offsets = loop {
///     // Top of every turn.
///     if let Some(offsets) = handover.take() {
///         break offsets;
///     }
///     tokio::select! {
///         biased;
///         () = handover.notified() => {} // go round and take it
///         () = tokio::time::sleep(Duration::from_millis(500)) => {} // e.g. a fetch response
///     }
/// };
/// assert_eq!(offsets, vec![(0, 42)]);
/// # }
/// ```
pub struct Handover<T> {
    /// The latest value, waiting to be taken.
    mailbox: Mailbox<T>,
    /// Wakes the loop after each publish; stores one permit if the loop is not waiting.
    notify: Notify,
}

impl<T> Handover<T> {
    /// An empty handover, without a stored wakeup.
    pub fn new() -> Self {
        Self {
            mailbox: Mailbox::new(),
            notify: Notify::new(),
        }
    }

    /// Puts `value` in the mailbox, then wakes the waiting task (or stores the wakeup for it).
    ///
    /// Returns the superseded value, if one was published and not yet taken. Never blocks.
    pub fn publish(&self, value: T) -> Option<T> {
        // Publish first, notify second: the other order can lose the wakeup (module docs).
        let superseded = self.mailbox.publish(value);
        self.notify.notify_one();
        superseded
    }

    /// Removes and returns the value in the mailbox, if any.
    ///
    /// Call it at the top of every turn of the loop, before waiting on
    /// [`notified`](Self::notified).
    pub fn take(&self) -> Option<T> {
        self.mailbox.take()
    }

    /// A future that completes after the next [`publish`](Self::publish), or at once if a publish
    /// happened since the last completed wait.
    ///
    /// A completed wait does not imply a value: always [`take`](Self::take) afterwards, and expect
    /// `None` now and then. The returned [`Notified`](tokio::sync::futures::Notified) can be pinned
    /// and [`enable`](tokio::sync::futures::Notified::enable)d, or used directly as a `select!`
    /// arm.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. Values live in the mailbox, not in the future, so dropping the future loses
    /// none. If it is dropped after receiving a wakeup, tokio's `Notify` passes the wakeup on or
    /// stores it as the permit.
    #[cfg(not(all(test, kafka_source_loom)))]
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// The loom counterpart of [`notified`](Self::notified)`.await`: blocks the model thread until
    /// a wakeup is available, and may return spuriously.
    #[cfg(all(test, kafka_source_loom))]
    pub(crate) fn wait(&self) {
        self.notify.wait();
    }

    /// Loom test builds model the handover with blocking waits (see [`wait`](Self::wait)); the
    /// network loop, which is not modelled there, gets a wakeup that never fires.
    #[cfg(all(test, kafka_source_loom))]
    pub fn notified(&self) -> std::future::Pending<()> {
        std::future::pending()
    }
}

impl<T> Default for Handover<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for Handover<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handover")
            .field("mailbox", &self.mailbox)
            .field("notify", &self.notify)
            .finish()
    }
}

#[cfg(all(test, kafka_source_loom))]
mod loom_tests;
#[cfg(all(test, not(kafka_source_loom)))]
mod tests;
