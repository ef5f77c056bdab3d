//! The network loop's requests in flight.
//!
//! A `FuturesUnordered` whose `poll_next` does not wake its own task for nothing.
//! `FuturesUnordered::poll_next` treats "every future it holds was polled and none finished"
//! like a future that yielded: it wakes its task and returns `Pending`, so that a set of
//! futures that keep waking each other cannot starve the runtime. The network loop pushes one
//! new request after most completions, and when that request is the only one queued, this
//! happened on every turn: the runtime took the wake as a yield, queued the loop again behind
//! other tasks and woke a parked worker thread to steal it, which then often ran the loop on the
//! other core. That was one futex wake, one context switch and one extra turn of the loop per
//! fetch.
//!
//! A sentinel future that never finishes and is never woken after its first poll keeps the
//! number of futures polled in one call below the set's length, so the set wakes its task only
//! when a future asked to yield. Request futures are IO on tokio resources, which already
//! yield under tokio's cooperative budget, so the guard still holds where it matters.

use std::future::{Future, pending};
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, Stream};

/// Futures in flight; [`poll_next`](Self::poll_next) yields their outputs in completion order.
pub(crate) struct InFlight<T> {
    /// The futures, and the sentinel (never finished, never woken) pushed first.
    set: FuturesUnordered<BoxFuture<'static, T>>,
}

impl<T: Send + 'static> InFlight<T> {
    pub(crate) fn new() -> Self {
        let set = FuturesUnordered::new();
        set.push(Box::pin(pending()) as BoxFuture<'static, T>);
        Self { set }
    }

    pub(crate) fn push(&self, future: BoxFuture<'static, T>) {
        self.set.push(future);
    }

    /// True when no future is in flight (the sentinel does not count).
    pub(crate) fn is_empty(&self) -> bool {
        self.set.len() <= 1
    }

    /// The next output; `Pending` while none is ready, also when the set is empty.
    pub(crate) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<T> {
        match Pin::new(&mut self.set).poll_next(cx) {
            Poll::Ready(Some(out)) => Poll::Ready(out),
            // The sentinel never finishes, so the set never runs dry.
            Poll::Ready(None) | Poll::Pending => Poll::Pending,
        }
    }

    /// The next output, in completion order.
    pub(crate) fn next(&mut self) -> impl Future<Output = T> + '_ {
        std::future::poll_fn(|cx| self.poll_next(cx))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};

    use futures::StreamExt;
    use tokio::sync::oneshot;

    use super::*;

    #[derive(Default)]
    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counting() -> (Arc<CountingWaker>, Waker) {
        let count = Arc::new(CountingWaker::default());
        let waker = Waker::from(Arc::clone(&count));
        (count, waker)
    }

    fn wakes(count: &CountingWaker) -> usize {
        count.0.load(Ordering::SeqCst)
    }

    /// What `InFlight` works around: the plain set wakes its task when it polled its only
    /// future and that future is pending.
    #[test]
    fn futures_unordered_wakes_itself_after_polling_every_future() {
        let (count, waker) = counting();
        let mut cx = Context::from_waker(&waker);
        let (_tx, rx) = oneshot::channel::<u32>();
        let mut set = FuturesUnordered::new();
        set.push(rx);
        assert!(set.poll_next_unpin(&mut cx).is_pending());
        assert_eq!(wakes(&count), 1);
    }

    #[test]
    fn a_pending_request_does_not_wake_the_loop() {
        let (count, waker) = counting();
        let mut cx = Context::from_waker(&waker);
        let mut inflight = InFlight::new();
        assert!(inflight.is_empty());
        assert!(inflight.poll_next(&mut cx).is_pending());
        let before = wakes(&count);

        for round in 0..3u32 {
            let (tx, rx) = oneshot::channel::<u32>();
            inflight.push(Box::pin(async move { rx.await.unwrap_or(u32::MAX) }));
            assert!(!inflight.is_empty());
            assert!(inflight.poll_next(&mut cx).is_pending());
            assert_eq!(
                wakes(&count),
                before + round as usize,
                "woken while pending"
            );

            tx.send(round).expect("receiver alive");
            assert_eq!(
                wakes(&count),
                before + round as usize + 1,
                "the answer wakes the loop"
            );
            assert_eq!(inflight.poll_next(&mut cx), Poll::Ready(round));
            assert!(inflight.is_empty());
        }
    }

    #[test]
    fn outputs_come_in_completion_order() {
        let (_count, waker) = counting();
        let mut cx = Context::from_waker(&waker);
        let mut inflight = InFlight::new();
        let (tx1, rx1) = oneshot::channel::<u32>();
        let (tx2, rx2) = oneshot::channel::<u32>();
        inflight.push(Box::pin(async move { rx1.await.unwrap_or(0) }));
        inflight.push(Box::pin(async move { rx2.await.unwrap_or(0) }));
        assert!(inflight.poll_next(&mut cx).is_pending());
        tx2.send(2).expect("receiver alive");
        assert_eq!(inflight.poll_next(&mut cx), Poll::Ready(2));
        assert!(!inflight.is_empty());
        tx1.send(1).expect("receiver alive");
        assert_eq!(inflight.poll_next(&mut cx), Poll::Ready(1));
        assert!(inflight.is_empty());
        assert!(inflight.poll_next(&mut cx).is_pending());
    }
}
