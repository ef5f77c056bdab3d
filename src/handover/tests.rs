//! Unit and stress tests of the handover with `std` atomics and tokio (the miri target).

use std::{
    sync::{
        Arc, Barrier,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread,
    time::Duration,
};

use super::{Handover, Mailbox};

/// Counts its drops in a shared counter.
#[derive(Debug)]
struct Tracked {
    id: usize,
    drops: Arc<AtomicUsize>,
}

impl Tracked {
    fn new(id: usize, drops: &Arc<AtomicUsize>) -> Self {
        Self {
            id,
            drops: Arc::clone(drops),
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::Relaxed);
    }
}

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn send_and_sync_when_payload_is_send() {
    // The negative case (`Mailbox<Rc<()>>` is not `Sync`) is a `compile_fail` doctest on `Mailbox`.
    assert_send_sync::<Mailbox<Vec<u8>>>();
    assert_send_sync::<Mailbox<std::cell::Cell<u8>>>(); // `Send` but not `Sync` is enough
    assert_send_sync::<Handover<Vec<(u32, i64)>>>();
}

#[test]
fn take_on_empty_is_none() {
    let mailbox = Mailbox::<u32>::new();
    assert_eq!(mailbox.take(), None);
    assert_eq!(mailbox.take(), None);
}

#[test]
fn latest_wins_and_superseded_comes_back() {
    let mailbox = Mailbox::new();
    assert_eq!(mailbox.publish(1), None);
    assert_eq!(mailbox.publish(2), Some(1));
    assert_eq!(mailbox.publish(3), Some(2));
    assert_eq!(mailbox.take(), Some(3));
    assert_eq!(mailbox.take(), None);
    assert_eq!(mailbox.publish(4), None);
    assert_eq!(mailbox.take(), Some(4));
}

#[test]
fn zero_sized_payload() {
    let mailbox = Mailbox::new();
    assert_eq!(mailbox.publish(()), None);
    assert_eq!(mailbox.publish(()), Some(()));
    assert_eq!(mailbox.take(), Some(()));
    assert_eq!(mailbox.take(), None);
}

#[test]
fn drop_reclaims_what_is_left() {
    let drops = Arc::new(AtomicUsize::new(0));
    let mailbox = Mailbox::new();
    drop(mailbox.publish(Tracked::new(1, &drops)));
    drop(mailbox.publish(Tracked::new(2, &drops))); // drops the superseded 1
    assert_eq!(drops.load(Ordering::Relaxed), 1);
    drop(mailbox); // drops 2
    assert_eq!(drops.load(Ordering::Relaxed), 2);

    // An empty mailbox drops nothing.
    drop(Mailbox::<Tracked>::new());
    assert_eq!(drops.load(Ordering::Relaxed), 2);
}

#[test]
fn handover_publish_take() {
    let handover = Handover::new();
    assert_eq!(handover.take(), None);
    assert_eq!(handover.publish("a"), None);
    assert_eq!(handover.publish("b"), Some("a"));
    assert_eq!(handover.take(), Some("b"));
    assert_eq!(handover.take(), None);
}

#[test]
fn debug_shows_no_contents() {
    let mailbox = Mailbox::new();
    mailbox.publish("secret");
    assert_eq!(format!("{mailbox:?}"), "Mailbox { .. }");
    assert!(
        format!("{:?}", Handover::<u8>::new()).starts_with("Handover { mailbox: Mailbox { .. }")
    );
}

/// One thread publishes ids `0..N`, another takes concurrently. Every id must come out exactly
/// once (taken, superseded, or left at the end), the taker must see ids in increasing order, and
/// every value must be dropped exactly once.
///
/// On a loaded machine the publisher can finish before the taker is scheduled at all, so every
/// `ROUND` publishes it waits until the taker has taken something since the last round. That bounds
/// the number of takes from below without ordering the individual operations.
#[test]
fn stress_two_threads_every_value_exactly_once() {
    const N: usize = if cfg!(miri) { 1_000 } else { 200_000 };
    const ROUND: usize = if cfg!(miri) { 100 } else { 1_000 };

    let drops = Arc::new(AtomicUsize::new(0));
    let mailbox = Arc::new(Mailbox::new());
    let done = Arc::new(AtomicBool::new(false));
    let takes = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(2));

    let publisher = {
        let mailbox = Arc::clone(&mailbox);
        let (done, takes, start) = (Arc::clone(&done), Arc::clone(&takes), Arc::clone(&start));
        let drops = Arc::clone(&drops);
        thread::spawn(move || {
            start.wait();
            let mut superseded = Vec::new();
            let mut takes_seen = 0;
            for id in 0..N {
                if let Some(old) = mailbox.publish(Tracked::new(id, &drops)) {
                    superseded.push(old.id);
                }
                if id % ROUND == ROUND - 1 {
                    while takes.load(Ordering::Relaxed) == takes_seen {
                        thread::yield_now();
                    }
                    takes_seen = takes.load(Ordering::Relaxed);
                }
            }
            done.store(true, Ordering::Release);
            superseded
        })
    };
    let taker = {
        let mailbox = Arc::clone(&mailbox);
        let (done, takes, start) = (Arc::clone(&done), Arc::clone(&takes), Arc::clone(&start));
        thread::spawn(move || {
            start.wait();
            let mut taken = Vec::new();
            let mut idle = 0_u32;
            while !done.load(Ordering::Acquire) {
                if let Some(value) = mailbox.take() {
                    taken.push(value.id);
                    takes.fetch_add(1, Ordering::Relaxed);
                    idle = 0;
                } else {
                    idle += 1;
                    if idle.is_multiple_of(64) {
                        thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                }
            }
            taken
        })
    };

    let superseded = publisher.join().expect("publisher panicked");
    let taken = taker.join().expect("taker panicked");
    let left = mailbox.take().map(|value| value.id);

    assert!(taken.len() >= N / ROUND, "only {} takes", taken.len());
    assert!(
        taken.windows(2).all(|w| w[0] < w[1]),
        "a single publisher's values must be taken in order"
    );
    assert!(
        !superseded.contains(&(N - 1)),
        "the last value is never superseded"
    );

    let mut seen = vec![0_u32; N];
    for id in taken.iter().chain(&superseded).chain(&left) {
        seen[*id] += 1;
    }
    let wrong: Vec<_> = seen
        .iter()
        .enumerate()
        .filter(|(_, n)| **n != 1)
        .take(10)
        .collect();
    assert!(
        wrong.is_empty(),
        "(id, times seen) not exactly once: {wrong:?}"
    );
    assert_eq!(
        taken.len() + superseded.len() + usize::from(left.is_some()),
        N
    );

    drop(mailbox);
    assert_eq!(
        drops.load(Ordering::Relaxed),
        N,
        "every value dropped exactly once"
    );
    eprintln!(
        "stress: {N} published, {} taken, {} superseded, {} left",
        taken.len(),
        superseded.len(),
        usize::from(left.is_some())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_task_is_woken_by_publish_from_another_thread() {
    let handover = Arc::new(Handover::new());
    let started = Arc::new(tokio::sync::Notify::new());

    let waiter = {
        let handover = Arc::clone(&handover);
        let started = Arc::clone(&started);
        tokio::spawn(async move {
            let mut turns = 0_u32;
            loop {
                turns += 1;
                if let Some(value) = handover.take() {
                    return (value, turns);
                }
                let notified = handover.notified();
                tokio::pin!(notified);
                notified.as_mut().enable(); // registered: any publish from now on wakes us
                started.notify_one();
                notified.await;
            }
        })
    };

    started.notified().await;
    let publisher = {
        let handover = Arc::clone(&handover);
        thread::spawn(move || handover.publish(7_u64))
    };
    assert_eq!(publisher.join().expect("publisher panicked"), None);

    let (value, turns) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiting task was not woken")
        .expect("waiter panicked");
    assert_eq!(value, 7);
    assert_eq!(turns, 2, "woken once, then took the value");
}

#[tokio::test]
async fn publish_before_wait_is_not_lost() {
    let handover = Handover::new();
    // The loop took (nothing) at the top of its turn; the publish lands before it waits.
    assert_eq!(handover.take(), None);
    handover.publish(1_u8);
    // The stored permit completes the wait at once.
    tokio::time::timeout(Duration::from_secs(10), handover.notified())
        .await
        .expect("the stored wakeup was lost");
    assert_eq!(handover.take(), Some(1));
}

#[tokio::test(start_paused = true)]
async fn biased_select_loop_takes_every_turn() {
    let handover = Handover::new();
    handover.publish(1_u8);
    handover.publish(2_u8); // supersedes 1; two wakeups collapse into one permit

    let mut got = Vec::new();
    for _ in 0..3 {
        // Top of every turn.
        if let Some(value) = handover.take() {
            got.push(value);
        }
        tokio::select! {
            biased;
            () = handover.notified() => {}
            () = tokio::time::sleep(Duration::from_secs(1)) => {} // stands in for a fetch
        }
    }
    // Turn 1 takes 2; its wait consumes the stale permit; turns 2 and 3 find nothing.
    assert_eq!(got, vec![2]);
}
