//! Commit path: handing the latest checkpoint's offsets to the network loop.
//!
//! Measures one `publish` followed by one `take` on [`kafka_source::handover::Mailbox`] and on
//! three latest-value-wins alternatives:
//!
//! - `parking_lot::Mutex<Option<T>>`;
//! - `crossbeam::channel::bounded(1)`: `try_send`, and when full, drain and send again;
//! - `arc_swap::ArcSwapOption<T>`: `swap(Some(Arc::new(v)))` and `swap(None)`, unwrapping the
//!   `Arc` to get the value back.
//!
//! `uncontended` runs on the bench thread alone. In `contended`, a second thread publishes into
//! the same slot continuously (recycling the values it gets back) while the bench thread
//! publishes and takes; the bench thread may then take the other thread's value.
//!
//! The payload is an offsets map of 100 `(partition, offset)` pairs. It is built outside the
//! timing and reused: what one iteration takes, the next publishes. Values that come back
//! superseded are dropped outside the timing.
//!
//! `snapshot_state` measures [`kafka_source::Consumer::snapshot_state`] at 1, 100 and 10,000
//! assigned partitions: the per-checkpoint cost on the consuming side (offsets map, sorted
//! state, pending-checkpoint entry). No broker is needed: the partitions start at explicit
//! offsets, and the consumer's network loop only fails to reach its (unused) bootstrap address.
//!
//! Run: `cargo bench --bench commit_path -- --warm-up-time 1 --measurement-time 3`.

use std::{
    hint::black_box,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
};

use arc_swap::ArcSwapOption;
use criterion::{Criterion, criterion_group, criterion_main};
use crossbeam::channel::{self, Receiver, Sender, TryRecvError, TrySendError};
use kafka_source::handover::Mailbox;
use parking_lot::Mutex;

/// What the checkpoint side hands over: partition → next offset to commit.
type Offsets = Vec<(u32, i64)>;

fn offsets() -> Offsets {
    (0..100)
        .map(|p| (p, 1_000_000 + i64::from(p) * 7))
        .collect()
}

/// A latest-value-wins slot.
trait Slot: Send + Sync + 'static {
    /// Implementation name in the report.
    const NAME: &'static str;
    /// What `publish` and `take` hand back.
    type Out;

    fn new() -> Self;
    fn publish(&self, value: Offsets) -> Option<Self::Out>;
    fn take(&self) -> Option<Self::Out>;
    /// Turns a handed-back value into the plain value, as the commit path would.
    fn into_value(out: Self::Out) -> Offsets;
}

impl Slot for Mailbox<Offsets> {
    const NAME: &'static str = "mailbox";
    type Out = Offsets;

    fn new() -> Self {
        Self::new()
    }
    fn publish(&self, value: Offsets) -> Option<Offsets> {
        Self::publish(self, value)
    }
    fn take(&self) -> Option<Offsets> {
        Self::take(self)
    }
    fn into_value(out: Offsets) -> Offsets {
        out
    }
}

impl Slot for Mutex<Option<Offsets>> {
    const NAME: &'static str = "parking_lot_mutex";
    type Out = Offsets;

    fn new() -> Self {
        Self::new(None)
    }
    fn publish(&self, value: Offsets) -> Option<Offsets> {
        self.lock().replace(value)
    }
    fn take(&self) -> Option<Offsets> {
        self.lock().take()
    }
    fn into_value(out: Offsets) -> Offsets {
        out
    }
}

/// `bounded(1)` used as a latest-value-wins slot.
struct Bounded {
    tx: Sender<Offsets>,
    rx: Receiver<Offsets>,
}

impl Slot for Bounded {
    const NAME: &'static str = "crossbeam_bounded1";
    type Out = Offsets;

    fn new() -> Self {
        let (tx, rx) = channel::bounded(1);
        Self { tx, rx }
    }
    fn publish(&self, mut value: Offsets) -> Option<Offsets> {
        let mut superseded = None;
        loop {
            match self.tx.try_send(value) {
                Ok(()) => return superseded,
                Err(TrySendError::Full(back)) => {
                    value = back;
                    match self.rx.try_recv() {
                        Ok(old) => superseded = Some(old),
                        Err(TryRecvError::Empty) => {} // someone else drained it: retry
                        Err(TryRecvError::Disconnected) => unreachable!("we hold both ends"),
                    }
                }
                Err(TrySendError::Disconnected(_)) => unreachable!("we hold both ends"),
            }
        }
    }
    fn take(&self) -> Option<Offsets> {
        self.rx.try_recv().ok()
    }
    fn into_value(out: Offsets) -> Offsets {
        out
    }
}

impl Slot for ArcSwapOption<Offsets> {
    const NAME: &'static str = "arc_swap";
    type Out = Arc<Offsets>;

    fn new() -> Self {
        Self::empty()
    }
    fn publish(&self, value: Offsets) -> Option<Arc<Offsets>> {
        self.swap(Some(Arc::new(value)))
    }
    fn take(&self) -> Option<Arc<Offsets>> {
        self.swap(None)
    }
    fn into_value(out: Arc<Offsets>) -> Offsets {
        // Nobody else `load`s, so the swapped-out `Arc` is unique and this does not clone.
        Arc::unwrap_or_clone(out)
    }
}

/// Times one `publish` and one `take`.
///
/// The value taken is published again in the next iteration, so in the uncontended case no
/// payload is built or freed inside the timing. A superseded value is returned, so that criterion
/// drops it outside the timing; a new payload is cloned only when nothing came back.
fn bench_publish_take<S: Slot>(c: &mut Criterion, group: &str, slot: &S, payload: &Offsets) {
    let mut spare = Some(payload.clone());
    c.benchmark_group(group).bench_function(S::NAME, |b| {
        b.iter_with_large_drop(|| {
            let value = spare.take().unwrap_or_else(|| payload.clone());
            let superseded = black_box(slot).publish(value).map(S::into_value);
            spare = slot.take().map(S::into_value);
            superseded
        });
    });
}

fn uncontended_one<S: Slot>(c: &mut Criterion) {
    bench_publish_take(c, "uncontended", &S::new(), &offsets());
}

fn contended_one<S: Slot>(c: &mut Criterion) {
    let slot = Arc::new(S::new());
    let payload = offsets();
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = {
        let slot = Arc::clone(&slot);
        let stop = Arc::clone(&stop);
        let payload = payload.clone();
        thread::spawn(move || {
            let mut publishes = 0_u64;
            let mut spare = payload.clone();
            while !stop.load(Ordering::Relaxed) {
                spare = match slot.publish(spare) {
                    Some(old) => S::into_value(old),
                    None => payload.clone(),
                };
                publishes += 1;
            }
            publishes
        })
    };

    bench_publish_take(c, "contended", &*slot, &payload);

    stop.store(true, Ordering::Relaxed);
    let publishes = publisher.join().expect("background publisher panicked");
    black_box(publishes);
}

fn uncontended(c: &mut Criterion) {
    uncontended_one::<Mailbox<Offsets>>(c);
    uncontended_one::<Mutex<Option<Offsets>>>(c);
    uncontended_one::<Bounded>(c);
    uncontended_one::<ArcSwapOption<Offsets>>(c);
}

fn contended(c: &mut Criterion) {
    contended_one::<Mailbox<Offsets>>(c);
    contended_one::<Mutex<Option<Offsets>>>(c);
    contended_one::<Bounded>(c);
    contended_one::<ArcSwapOption<Offsets>>(c);
}

fn snapshot_state(c: &mut Criterion) {
    use kafka_source::{Consumer, ConsumerConfig, StartPosition, TopicPartition};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("snapshot_state");
    for partitions in [1usize, 100, 10_000] {
        let config = ConsumerConfig::builder()
            .bootstrap_servers(["127.0.0.1:9"])
            .group_id("bench")
            .build()
            .expect("config");
        let mut consumer = rt
            .block_on(async { Consumer::new(config) })
            .expect("consumer");
        consumer.assign((0..partitions).map(|p| {
            (
                TopicPartition::new(format!("topic-{}", p % 10), (p / 10) as i32),
                StartPosition::Offset(p as i64 * 1000),
            )
        }));
        let mut id = 0u64;
        group.bench_function(format!("{partitions} partitions"), |b| {
            b.iter(|| {
                id += 1;
                black_box(rt.block_on(consumer.snapshot_state(id)).expect("snapshot"))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, uncontended, contended, snapshot_state);
criterion_main!(benches);
