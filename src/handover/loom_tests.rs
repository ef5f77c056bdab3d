//! Loom models of the handover. Run them with `.ci/loom.sh`.
//!
//! Loom checks only memory it can see. The payload therefore keeps its data in a
//! `loom::cell::UnsafeCell` and counts its drops with a loom atomic: with a plain field, the models
//! pass even with every ordering weakened to `Relaxed`.

use loom::{
    cell::UnsafeCell,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    thread,
};

use super::{Handover, Mailbox};

/// A value whose every read and write loom tracks.
#[derive(Debug)]
struct Payload {
    /// Written when built and when dropped; read by whoever receives the value. Without a
    /// happens-before edge from the publisher, loom reports "Causality violation".
    id: UnsafeCell<usize>,
    drops: Arc<AtomicUsize>,
}

impl Payload {
    fn new(id: usize, drops: &Arc<AtomicUsize>) -> Self {
        Self {
            id: UnsafeCell::new(id),
            drops: Arc::clone(drops),
        }
    }

    fn id(&self) -> usize {
        self.id.with(|id| {
            // SAFETY: the cell is written only on creation and in `drop` (through `&mut self`), so
            // no write overlaps this read; loom checks that the creation happens before it.
            unsafe { *id }
        })
    }
}

impl Drop for Payload {
    fn drop(&mut self) {
        // A write, so loom also checks that dropping a value (for instance a superseded one) is
        // ordered after the thread that built it.
        self.id.with_mut(|id| {
            // SAFETY: `&mut self` excludes every other access to the cell.
            unsafe { *id = usize::MAX };
        });
        self.drops.fetch_add(1, Ordering::Relaxed);
    }
}

/// Sorted ids, asserting each of `1..=n` appears exactly once.
fn assert_each_once(ids: impl IntoIterator<Item = usize>, n: usize) {
    let mut ids: Vec<_> = ids.into_iter().collect();
    ids.sort_unstable();
    assert_eq!(ids, (1..=n).collect::<Vec<_>>(), "each value exactly once");
}

/// One publish races one take; the value ends up taken or dropped with the mailbox, once.
#[test]
fn publish_races_take() {
    loom::model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let mailbox = Arc::new(Mailbox::new());

        let publisher = {
            let mailbox = Arc::clone(&mailbox);
            let drops = Arc::clone(&drops);
            thread::spawn(move || mailbox.publish(Payload::new(1, &drops)).map(|old| old.id()))
        };
        let taken = mailbox.take().map(|value| value.id());
        assert_eq!(publisher.join().expect("publisher panicked"), None);
        assert!(matches!(taken, None | Some(1)), "taken {taken:?}");

        // Whatever was not taken is dropped with the mailbox.
        drop(mailbox);
        assert_eq!(drops.load(Ordering::Relaxed), 1);
    });
}

/// Two publishers race each other and a taker. A publisher that supersedes the other's value
/// reads and drops it: this is what needs the Acquire half of `publish`'s `AcqRel`.
#[test]
fn two_publishes_race_take() {
    loom::model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let mailbox = Arc::new(Mailbox::new());

        let publishers: Vec<_> = (1..=2)
            .map(|id| {
                let mailbox = Arc::clone(&mailbox);
                let drops = Arc::clone(&drops);
                thread::spawn(move || {
                    mailbox
                        .publish(Payload::new(id, &drops))
                        .map(|old| old.id())
                })
            })
            .collect();
        let taken = mailbox.take().map(|value| value.id());
        let superseded: Vec<_> = publishers
            .into_iter()
            .filter_map(|publisher| publisher.join().expect("publisher panicked"))
            .collect();
        let left = mailbox.take().map(|value| value.id());

        assert!(superseded.len() <= 1, "superseded {superseded:?}");
        assert_each_once(taken.into_iter().chain(superseded).chain(left), 2);
        drop(mailbox);
        assert_eq!(drops.load(Ordering::Relaxed), 2);
    });
}

/// The whole protocol: the checkpoint side publishes 1 then 2 (publish, then notify); the loop
/// takes at the top of every turn, then waits, until it has seen the last value. A lost wakeup
/// shows up as a deadlock.
#[test]
fn publish_then_notify_wakes_the_loop() {
    loom::model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let handover = Arc::new(Handover::new());

        let checkpoint = {
            let handover = Arc::clone(&handover);
            let drops = Arc::clone(&drops);
            thread::spawn(move || {
                (1..=2)
                    .filter_map(|id| {
                        handover
                            .publish(Payload::new(id, &drops))
                            .map(|old| old.id())
                    })
                    .collect::<Vec<_>>()
            })
        };

        let mut taken = Vec::new();
        loop {
            // Top of every turn.
            if let Some(value) = handover.take() {
                taken.push(value.id());
                if taken.last() == Some(&2) {
                    break;
                }
            }
            handover.wait();
        }

        let superseded = checkpoint.join().expect("checkpoint thread panicked");
        assert!(
            taken.windows(2).all(|w| w[0] < w[1]),
            "taken out of order: {taken:?}"
        );
        assert_each_once(taken.into_iter().chain(superseded), 2);
        assert_eq!(handover.take().map(|value| value.id()), None);
        drop(handover);
        assert_eq!(drops.load(Ordering::Relaxed), 2);
    });
}
