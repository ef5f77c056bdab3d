//! Checkpoint-aligned commits against real Apache Kafka brokers: what is committed, when, and
//! what the broker stores, checked with the consumer's own OffsetFetch and with Kafka's
//! `ConsumerGroupCommand`.
//!
//! The tests stop brokers, kill processes and time commits against fetches parked on the broker;
//! on a small machine they disturb each other's timing, so they run one at a time (see
//! [`serial`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kafka_source::{
    CheckpointHandle, CommitMode, CommitOutcome, CommitOutcomes, CommitStats, Consumer,
    ConsumerConfigBuilder, IsolationLevel, Outcome, SourceState, StartPosition, TopicPartition,
};
use protocol_tests::consume::{config, drain, partitions, unique};
use protocol_tests::{Cluster, ProduceSpec, test_root};
use tokio::sync::{Mutex, MutexGuard};

/// One test at a time in this binary. Each test has its own runtime; tokio's mutex works
/// across them, and a test that panics releases it while unwinding.
async fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::const_new(());
    LOCK.lock().await
}

fn earliest(topic: &str, n: i32) -> Vec<(TopicPartition, StartPosition)> {
    partitions(topic, n)
        .into_iter()
        .map(|tp| (tp, StartPosition::Earliest))
        .collect()
}

/// A config with checkpoint commits for `group`, and small fetches: each fetch brings about one
/// producer batch, so draining a few thousand records moves the positions in steps.
fn group_config(cluster: &Cluster, group: &str) -> ConsumerConfigBuilder {
    config(&cluster.bootstrap())
        .group_id(group)
        .commit_mode(CommitMode::OnCheckpoints)
        .max_partition_fetch_bytes(64 << 10)
        .fetch_max_bytes(256 << 10)
}

/// Offsets of a commit outcome without the leader epochs.
fn outcome_offsets(o: &CommitOutcome) -> BTreeMap<TopicPartition, i64> {
    o.offsets
        .iter()
        .map(|(tp, (off, _))| (tp.clone(), *off))
        .collect()
}

/// A state's offsets with leader epochs, in the shape of [`CommitOutcome::offsets`].
fn state_offsets_with_epochs(s: &SourceState) -> BTreeMap<TopicPartition, (i64, i32)> {
    s.partitions
        .iter()
        .map(|p| {
            (
                TopicPartition::new(p.topic.as_str(), p.partition),
                (p.next_offset, p.leader_epoch),
            )
        })
        .collect()
}

/// A state's offsets as `committed` returns them.
fn as_committed(s: &SourceState) -> BTreeMap<TopicPartition, Option<i64>> {
    s.offsets()
        .into_iter()
        .map(|(tp, o)| (tp, Some(o)))
        .collect()
}

/// A state's offsets as `Cluster::committed_offsets` returns them.
fn as_java(s: &SourceState) -> BTreeMap<(String, i32), Option<i64>> {
    s.offsets()
        .into_iter()
        .map(|(tp, o)| ((tp.topic.to_string(), tp.partition), Some(o)))
        .collect()
}

/// The offset after the last record of each partition in `drained` (all drains from Earliest).
fn next_offsets(drains: &[&protocol_tests::consume::Drained]) -> BTreeMap<TopicPartition, i64> {
    let mut out = BTreeMap::new();
    for d in drains {
        for (tp, offs) in &d.offsets {
            if let Some(last) = offs.last() {
                out.insert(tp.clone(), last + 1);
            }
        }
    }
    out
}

async fn snapshot(consumer: &mut Consumer, id: u64) -> SourceState {
    match tokio::time::timeout(Duration::from_secs(30), consumer.snapshot_state(id)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => panic!("snapshot_state({id}) failed: {e}"),
        Err(_) => panic!("snapshot_state({id}) did not finish within 30 s"),
    }
}

/// The group's committed offsets (OffsetFetch through the consumer, which retries retriable
/// errors such as `COORDINATOR_LOAD_IN_PROGRESS` itself).
async fn committed(
    consumer: &Consumer,
    tps: &[TopicPartition],
) -> BTreeMap<TopicPartition, Option<i64>> {
    match tokio::time::timeout(Duration::from_secs(40), consumer.committed(tps)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => panic!("committed() failed: {e}"),
        Err(_) => panic!("committed() did not answer within 40 s"),
    }
}

/// The next commit outcome; panics with the counters if none arrives in time.
async fn next_outcome(
    outcomes: &mut CommitOutcomes,
    handle: &CheckpointHandle,
    within: Duration,
) -> CommitOutcome {
    match tokio::time::timeout(within, outcomes.recv()).await {
        Ok(Some(o)) => o,
        Ok(None) => panic!("the outcome stream ended; stats: {:?}", handle.stats()),
        Err(_) => panic!(
            "no commit outcome within {within:?}; stats: {:?}, pending: {}",
            handle.stats(),
            handle.pending()
        ),
    }
}

fn describe(o: &CommitOutcome) -> String {
    format!(
        "checkpoint {:?}: {} after {:?}, offsets {:?}",
        o.checkpoint_id, o.outcome, o.latency, o.offsets
    )
}

#[track_caller]
fn assert_acked(o: &CommitOutcome, id: u64, state: &SourceState) {
    assert!(
        matches!(o.outcome, Outcome::Acked) && o.checkpoint_id == Some(id),
        "expected checkpoint {id} acked, got {}",
        describe(o)
    );
    assert_eq!(
        *o.offsets,
        state_offsets_with_epochs(state),
        "checkpoint {id}: committed offsets differ from the snapshot"
    );
}

/// Completions must add up: every commit ended exactly once.
#[track_caller]
fn assert_accounted(stats: &CommitStats, completions: u64) {
    assert_eq!(
        stats.succeeded + stats.superseded + stats.failed + stats.timed_out,
        completions,
        "outcomes do not add up to {completions} completions: {stats:?}"
    );
}

/// 30,000 records; snapshots 1 and 2 in the middle, more consumed after 2, then 2 completes:
/// exactly 2's offsets are committed, as both OffsetFetch and the Java tool report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_checkpoint_offsets_are_committed_exactly() {
    let _serial = serial().await;
    let started = Instant::now();
    let cluster = Cluster::shared();
    let _logs = cluster.dump_logs_on_panic();
    let topic = unique("ckpt-exact");
    let group = unique("ckpt-exact-group");
    cluster.create_topic(&topic, 3, 1, &[]);
    let spec = ProduceSpec {
        topic: &topic,
        partitions: 3,
        count: 30_000,
        value_size: 100,
        ..ProduceSpec::default()
    };
    let produced = cluster.produce(&spec);
    assert_eq!(produced.produced, 30_000);
    let tps = partitions(&topic, 3);

    let mut consumer = Consumer::new(group_config(cluster, &group).build().unwrap()).unwrap();
    let handle = consumer.checkpoints();
    let mut outcomes = consumer.commit_outcomes().unwrap();
    consumer.assign(earliest(&topic, 3));

    let t = Duration::from_secs(60);
    let a = drain(&mut consumer, 15_000, t).await;
    let s1 = snapshot(&mut consumer, 1).await;
    assert_eq!(
        s1.offsets(),
        next_offsets(&[&a]),
        "snapshot 1 is not what was handed out"
    );
    let b = drain(&mut consumer, 5_000, t).await;
    let s2 = snapshot(&mut consumer, 2).await;
    assert_eq!(
        s2.offsets(),
        next_offsets(&[&a, &b]),
        "snapshot 2 is not what was handed out"
    );
    assert_ne!(s1.offsets(), s2.offsets());
    // Keep consuming: the consumer's position (and its fetch position) moves past snapshot 2.
    let c = drain(&mut consumer, 5_000, t).await;
    let later = next_offsets(&[&a, &b, &c]);
    let mut positions = BTreeMap::new();
    for tp in &tps {
        let p = tokio::time::timeout(t, consumer.position(tp))
            .await
            .expect("position timed out")
            .expect("position failed");
        positions.insert(tp.clone(), p);
    }
    assert_eq!(
        positions, later,
        "positions are not after the last records handed out"
    );
    for tp in &tps {
        assert!(
            positions[tp] >= s2.offsets()[tp],
            "{tp}: position went backwards"
        );
    }
    assert_ne!(
        positions,
        s2.offsets(),
        "the position must have moved past snapshot 2"
    );
    assert!(
        positions.values().sum::<i64>() >= s2.offsets().values().sum::<i64>() + 5_000,
        "positions {positions:?} vs snapshot 2 {:?}",
        s2.offsets()
    );
    assert_eq!(handle.pending(), 2);

    handle.notify_checkpoint_complete(2);
    let o = next_outcome(&mut outcomes, &handle, Duration::from_secs(30)).await;
    assert_acked(&o, 2, &s2);
    println!("{}", describe(&o));
    let stats = handle.stats();
    assert_eq!(stats.succeeded, 1, "{stats:?}");
    assert_eq!(stats.unknown_checkpoint, 0, "{stats:?}");
    assert_eq!(stats.last_acked, s2.offsets(), "{stats:?}");
    assert_accounted(&stats, 1);
    assert_eq!(handle.pending(), 0, "completing 2 must drop 1 with it");

    assert_eq!(
        committed(&consumer, &tps).await,
        as_committed(&s2),
        "OffsetFetch"
    );
    let java = cluster.committed_offsets(&group);
    assert_eq!(java, as_java(&s2), "ConsumerGroupCommand");
    let later_java: BTreeMap<(String, i32), Option<i64>> = positions
        .iter()
        .map(|(tp, o)| ((tp.topic.to_string(), tp.partition), Some(*o)))
        .collect();
    assert_ne!(
        java, later_java,
        "the later positions must not be what was committed"
    );

    // Nothing else was committed.
    assert!(outcomes.try_recv().is_none());
    let closed = tokio::time::timeout(Duration::from_secs(20), consumer.close())
        .await
        .expect("close timed out");
    assert_eq!(
        closed.succeeded, 1,
        "close must not commit the later positions: {closed:?}"
    );
    assert_eq!(
        cluster.committed_offsets(&group),
        as_java(&s2),
        "after close"
    );
    println!(
        "completed_checkpoint_offsets_are_committed_exactly: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Of snapshots 1, 2, 3, completing 3 commits 3 once; a late completion of 1 and a completion
/// of the aborted 4 commit nothing and are counted as unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_completed_checkpoint_is_committed_and_late_completions_are_ignored() {
    let _serial = serial().await;
    let started = Instant::now();
    let cluster = Cluster::shared();
    let _logs = cluster.dump_logs_on_panic();
    let topic = unique("ckpt-late");
    let group = unique("ckpt-late-group");
    cluster.create_topic(&topic, 3, 1, &[]);
    let spec = ProduceSpec {
        topic: &topic,
        partitions: 3,
        count: 12_000,
        value_size: 100,
        ..ProduceSpec::default()
    };
    cluster.produce(&spec);
    let tps = partitions(&topic, 3);

    let mut consumer = Consumer::new(group_config(cluster, &group).build().unwrap()).unwrap();
    let handle = consumer.checkpoints();
    let mut outcomes = consumer.commit_outcomes().unwrap();
    consumer.assign(earliest(&topic, 3));

    let t = Duration::from_secs(60);
    let mut states = Vec::new();
    for id in 1..=3 {
        drain(&mut consumer, 2_000, t).await;
        states.push(snapshot(&mut consumer, id).await);
    }
    let offsets: BTreeSet<BTreeMap<TopicPartition, i64>> =
        states.iter().map(SourceState::offsets).collect();
    assert_eq!(offsets.len(), 3, "snapshots must differ: {states:?}");
    let s3 = states[2].clone();
    assert_eq!(handle.pending(), 3);

    handle.notify_checkpoint_complete(3);
    let o = next_outcome(&mut outcomes, &handle, Duration::from_secs(30)).await;
    assert_acked(&o, 3, &s3);
    let stats = handle.stats();
    assert_eq!(
        (
            stats.succeeded,
            stats.superseded,
            stats.failed,
            stats.timed_out
        ),
        (1, 0, 0, 0),
        "{stats:?}"
    );
    assert_eq!(handle.pending(), 0);
    assert_eq!(committed(&consumer, &tps).await, as_committed(&s3));

    // A late completion of 1: subsumed by 3, nothing committed.
    handle.notify_checkpoint_complete(1);
    let stats = handle.stats();
    assert_eq!(stats.unknown_checkpoint, 1, "{stats:?}");
    assert_eq!(stats.succeeded, 1, "{stats:?}");
    // Give a commit (which must not happen) time to show up before looking.
    tokio::time::sleep(Duration::from_millis(500)).await;
    if let Some(o) = outcomes.try_recv() {
        panic!(
            "completing the subsumed checkpoint 1 committed: {}",
            describe(&o)
        );
    }
    assert_eq!(handle.stats().succeeded, 1);
    assert_eq!(
        committed(&consumer, &tps).await,
        as_committed(&s3),
        "after the late completion"
    );

    // An aborted checkpoint commits nothing when completed afterwards.
    drain(&mut consumer, 2_000, t).await;
    let s4 = snapshot(&mut consumer, 4).await;
    assert_ne!(s4.offsets(), s3.offsets());
    assert_eq!(handle.pending(), 1);
    handle.notify_checkpoint_aborted(4);
    assert_eq!(handle.pending(), 0);
    handle.notify_checkpoint_complete(4);
    tokio::time::sleep(Duration::from_millis(500)).await;
    if let Some(o) = outcomes.try_recv() {
        panic!(
            "completing the aborted checkpoint 4 committed: {}",
            describe(&o)
        );
    }
    let stats = handle.stats();
    assert_eq!(stats.unknown_checkpoint, 2, "{stats:?}");
    assert_eq!(
        (
            stats.succeeded,
            stats.superseded,
            stats.failed,
            stats.timed_out
        ),
        (1, 0, 0, 0),
        "{stats:?}"
    );
    assert_eq!(stats.last_acked, s3.offsets());
    assert_eq!(
        committed(&consumer, &tps).await,
        as_committed(&s3),
        "after the abort"
    );
    assert_eq!(
        cluster.committed_offsets(&group),
        as_java(&s3),
        "ConsumerGroupCommand"
    );
    let closed = tokio::time::timeout(Duration::from_secs(20), consumer.close())
        .await
        .expect("close timed out");
    assert_eq!(closed.succeeded, 1, "{closed:?}");
    println!(
        "only_the_completed_checkpoint_is_committed_and_late_completions_are_ignored: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// With the broker frozen (SIGSTOP), checkpoint 1's commit is stuck on the wire; 2 and 3
/// complete behind it: 2 is reported superseded at once, while the broker is still stopped.
/// Once the broker runs again, 1 and then 3 are acknowledged, and 3's offsets are committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supersession_while_broker_is_stopped() {
    let _serial = serial().await;
    let started = Instant::now();
    let cluster = Cluster::single();
    if cluster.skip_without_node_control("supersession_while_broker_is_stopped") {
        return;
    }
    let _logs = cluster.dump_logs_on_panic();
    let node = cluster.node_ids()[0];
    let topic = unique("ckpt-stopped");
    let group = unique("ckpt-stopped-group");
    cluster.create_topic(&topic, 3, 1, &[]);
    cluster.produce(&ProduceSpec {
        topic: &topic,
        partitions: 3,
        count: 12_000,
        value_size: 100,
        ..ProduceSpec::default()
    });
    let tps = partitions(&topic, 3);

    let cfg = group_config(&cluster, &group)
        .commit_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let mut consumer = Consumer::new(cfg).unwrap();
    let handle = consumer.checkpoints();
    let mut outcomes = consumer.commit_outcomes().unwrap();
    consumer.assign(earliest(&topic, 3));
    let t = Duration::from_secs(60);

    // Warm-up: a first commit finds the coordinator and opens its connection.
    drain(&mut consumer, 1_000, t).await;
    let s0 = snapshot(&mut consumer, 0).await;
    handle.notify_checkpoint_complete(0);
    let o = next_outcome(&mut outcomes, &handle, Duration::from_secs(30)).await;
    assert_acked(&o, 0, &s0);
    let coordinator = consumer.fetch_stats().coordinator;
    assert_eq!(coordinator, node, "the only node must be the coordinator");

    let mut states = BTreeMap::new();
    for id in 1..=3 {
        drain(&mut consumer, 1_500, t).await;
        states.insert(id, snapshot(&mut consumer, id).await);
    }
    let distinct: BTreeSet<_> = states.values().map(SourceState::offsets).collect();
    assert_eq!(distinct.len(), 3, "snapshots must differ");

    cluster.pause(node);
    let paused = Instant::now();
    handle.notify_checkpoint_complete(1);
    // Pacing: let the network loop take 1 and send it (the broker will not answer).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        outcomes.try_recv().is_none(),
        "an outcome while the broker is stopped"
    );
    handle.notify_checkpoint_complete(2);
    handle.notify_checkpoint_complete(3);
    let o = next_outcome(&mut outcomes, &handle, Duration::from_secs(5)).await;
    let superseded_after = paused.elapsed();
    let stopped_outcome = describe(&o);
    let early = outcomes.try_recv().map(|o| describe(&o));
    let stats_stopped = handle.stats();
    cluster.resume(node);
    println!(
        "while stopped ({superseded_after:?} after SIGSTOP): {stopped_outcome}; stats {stats_stopped:?}"
    );
    assert!(
        matches!(o.outcome, Outcome::Superseded) && o.checkpoint_id == Some(2),
        "expected checkpoint 2 superseded while the broker is stopped, got {stopped_outcome}"
    );
    assert_eq!(*o.offsets, state_offsets_with_epochs(&states[&2]));
    assert!(
        early.is_none(),
        "a second outcome while the broker is stopped: {early:?}"
    );
    assert_eq!(
        (stats_stopped.succeeded, stats_stopped.superseded),
        (1, 1),
        "{stats_stopped:?}"
    );

    let first = next_outcome(&mut outcomes, &handle, Duration::from_secs(70)).await;
    println!("after SIGCONT: {}", describe(&first));
    let second = next_outcome(&mut outcomes, &handle, Duration::from_secs(70)).await;
    println!("after SIGCONT: {}", describe(&second));
    assert_acked(&first, 1, &states[&1]);
    assert_acked(&second, 3, &states[&3]);

    let s3 = &states[&3];
    assert_eq!(
        committed(&consumer, &tps).await,
        as_committed(s3),
        "OffsetFetch"
    );
    assert_eq!(
        cluster.committed_offsets(&group),
        as_java(s3),
        "ConsumerGroupCommand"
    );
    let stats = handle.stats();
    // Four completions: the warm-up 0, then 1, 2, 3.
    assert_accounted(&stats, 4);
    assert_eq!(stats.superseded, 1, "{stats:?}");
    assert_eq!(stats.succeeded, 3, "{stats:?}");
    assert_eq!(stats.last_acked, s3.offsets());
    assert!(outcomes.try_recv().is_none());
    tokio::time::timeout(Duration::from_secs(20), consumer.close())
        .await
        .expect("close timed out");
    println!(
        "supersession_while_broker_is_stopped: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Makes sure `__consumer_offsets` exists and is loaded: one commit of a throwaway group, by a
/// consumer with the default (short) `fetch.max.wait`.
async fn load_offsets_topic(cluster: &Cluster, topic: &str) {
    let mut c = Consumer::new(
        group_config(cluster, &unique("ckpt-offsets-topic"))
            .build()
            .unwrap(),
    )
    .unwrap();
    let handle = c.checkpoints();
    let mut outcomes = c.commit_outcomes().unwrap();
    c.assign([(TopicPartition::new(topic, 0), StartPosition::Earliest)]);
    let s = snapshot(&mut c, 1).await;
    handle.notify_checkpoint_complete(1);
    let o = next_outcome(&mut outcomes, &handle, Duration::from_secs(30)).await;
    assert_acked(&o, 1, &s);
    c.close().await;
}

/// A commit goes out while a fetch is parked on the broker (long poll, 5 s): it is
/// acknowledged long before the fetch returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_wakes_a_parked_fetch() {
    let _serial = serial().await;
    let started = Instant::now();
    let cluster = Cluster::shared();
    let _logs = cluster.dump_logs_on_panic();
    let topic = unique("ckpt-parked");
    let group = unique("ckpt-parked-group");
    cluster.create_topic(&topic, 1, 1, &[]);
    let tps = partitions(&topic, 1);

    let max_wait = Duration::from_millis(5000);
    let cfg = group_config(cluster, &group)
        .fetch_max_wait(max_wait)
        .build()
        .unwrap();
    // Its first commit (the warm-up below) may have to wait for __consumer_offsets otherwise.
    load_offsets_topic(cluster, &topic).await;
    let mut consumer = Consumer::new(cfg).unwrap();
    let handle = consumer.checkpoints();
    let mut outcomes = consumer.commit_outcomes().unwrap();
    consumer.assign(earliest(&topic, 1));

    // Warm-up: the coordinator is known and its connection open.
    let s1 = snapshot(&mut consumer, 1).await;
    assert_eq!(s1.offsets()[&tps[0]], 0);
    handle.notify_checkpoint_complete(1);
    let o = next_outcome(&mut outcomes, &handle, Duration::from_secs(30)).await;
    assert_acked(&o, 1, &s1);
    println!("warm-up (with FindCoordinator): {}", describe(&o));

    // Wait for a fetch that was just sent (the previous one returned a moment ago), so nearly
    // all of its 5 s on the broker are left.
    let fresh = fresh_parked_fetch(&consumer).await;
    let parked_seen = Instant::now();
    let r = fresh.responses;
    assert_eq!(fresh.requests, r + 1, "exactly one fetch parked: {fresh:?}");

    let s2 = snapshot(&mut consumer, 2).await;
    handle.notify_checkpoint_complete(2);
    let o = next_outcome(&mut outcomes, &handle, Duration::from_secs(10)).await;
    let at_outcome = consumer.fetch_stats();
    let since_parked = parked_seen.elapsed();
    println!(
        "{} ({since_parked:?} after the fetch was seen parked); fetch stats {at_outcome:?}",
        describe(&o)
    );
    assert_acked(&o, 2, &s2);
    assert_eq!(
        at_outcome.responses, r,
        "the parked fetch returned before the commit was acknowledged ({since_parked:?} after it was seen parked)"
    );
    assert!(
        o.latency < Duration::from_secs(1),
        "commit latency {:?} with a fetch parked for up to {max_wait:?}",
        o.latency
    );
    let asked = Instant::now();
    let stored = committed(&consumer, &tps).await;
    println!("committed() answered in {:?}", asked.elapsed());
    assert_eq!(stored, as_committed(&s2));
    tokio::time::timeout(Duration::from_secs(20), consumer.close())
        .await
        .expect("close timed out");
    println!(
        "commit_wakes_a_parked_fetch: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Waits until `consumer` has a fetch parked on the broker that was sent a moment ago (the one
/// before it just returned); returns the fetch counters then.
async fn fresh_parked_fetch(consumer: &Consumer) -> kafka_source::FetchStats {
    let base = consumer.fetch_stats();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = consumer.fetch_stats();
        if now.responses > base.responses && now.requests > now.responses {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "no new fetch within 20 s: {base:?} -> {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// One consumer of [`coordinator_lookup_is_not_queued_behind_a_parked_fetch`]: its first
/// commit's latency and how long `committed()` took, with a fetch parked all along.
async fn first_commit_and_lookup(
    cluster: &Cluster,
    topic: String,
    i: usize,
) -> (Duration, Duration) {
    let tps = partitions(&topic, 1);
    let cfg = group_config(cluster, &unique(&format!("ckpt-lookup-{i}")))
        .fetch_max_wait(Duration::from_millis(5000))
        .build()
        .unwrap();
    let mut consumer = Consumer::new(cfg).unwrap();
    let handle = consumer.checkpoints();
    let mut outcomes = consumer.commit_outcomes().unwrap();
    consumer.assign(earliest(&topic, 1));
    // Resolves the start offset; the first fetch (nothing to read: parked) goes out right after.
    let s = snapshot(&mut consumer, 1).await;
    handle.notify_checkpoint_complete(1);
    let o = next_outcome(&mut outcomes, &handle, Duration::from_secs(30)).await;
    assert_acked(&o, 1, &s);
    let asked = Instant::now();
    let stored = committed(&consumer, &tps).await;
    let lookup = asked.elapsed();
    assert_eq!(stored, as_committed(&s));
    consumer.close().await;
    (o.latency, lookup)
}

/// A consumer's first commit has to find the group coordinator, and `committed()` always does.
/// Neither may wait behind a fetch parked on the broker for `fetch.max.wait` (5 s here): a
/// broker answers the requests of one connection in order. Six consumers at once, so that the
/// result does not depend on which connection one of them happens to use for the lookup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_lookup_is_not_queued_behind_a_parked_fetch() {
    let _serial = serial().await;
    let started = Instant::now();
    let cluster = Cluster::shared();
    let _logs = cluster.dump_logs_on_panic();
    let topic = unique("ckpt-lookup");
    cluster.create_topic(&topic, 1, 1, &[]);

    // __consumer_offsets exists and is loaded, so its creation is not measured.
    load_offsets_topic(cluster, &topic).await;

    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..6 {
        let topic = topic.clone();
        tasks.spawn(async move { (i, first_commit_and_lookup(cluster, topic, i).await) });
    }
    let mut results = BTreeMap::new();
    while let Some(r) = tasks.join_next().await {
        let (i, latencies) = r.expect("consumer task panicked");
        results.insert(i, latencies);
    }
    let report: Vec<String> = results
        .iter()
        .map(|(i, (commit, lookup))| {
            format!(
                "consumer {i}: first commit acked after {commit:?}, committed() took {lookup:?}"
            )
        })
        .collect();
    let report = report.join("\n");
    println!("{report}");
    let slow = results
        .values()
        .filter(|(c, l)| *c >= Duration::from_secs(1) || *l >= Duration::from_secs(1))
        .count();
    assert_eq!(
        slow, 0,
        "coordinator lookups waited behind a parked fetch (fetch.max.wait 5 s):\n{report}"
    );
    println!(
        "coordinator_lookup_is_not_queued_behind_a_parked_fetch: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// xorshift64*, seeded from the clock.
struct Rng(u64);

impl Rng {
    fn from_time() -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        Rng(nanos | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// The child's output entries: partition, offset, checksum of key and value.
type Output = Vec<(i32, i64, u64)>;

/// The child's checkpoint file: its state and its output.
fn read_child_checkpoint(dir: &Path) -> Option<(SourceState, Output)> {
    let text = match fs::read_to_string(dir.join("checkpoint.json")) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => panic!("reading the checkpoint: {e}"),
    };
    let mut doc: serde_json::Value = serde_json::from_str(&text).expect("checkpoint is not JSON");
    let state: SourceState = serde_json::from_value(doc["state"].take()).expect("checkpoint state");
    let output = doc["output"]
        .as_array()
        .expect("output array")
        .iter()
        .map(|e| {
            let e = e.as_array().expect("output entry");
            (
                e[0].as_i64().expect("partition") as i32,
                e[1].as_i64().expect("offset"),
                e[2].as_u64().expect("checksum"),
            )
        })
        .collect();
    Some((state, output))
}

/// Every partition's output offsets are exactly `0..next_offset` of the state, each once.
#[track_caller]
fn assert_output_matches_state(state: &SourceState, output: &[(i32, i64, u64)], when: &str) {
    let mut by_partition: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for (p, o, _) in output {
        by_partition.entry(*p).or_default().push(*o);
    }
    for p in &state.partitions {
        let mut got = by_partition.remove(&p.partition).unwrap_or_default();
        got.sort_unstable();
        let n = got.len();
        got.dedup();
        assert_eq!(
            got.len(),
            n,
            "{when}: partition {} has duplicates",
            p.partition
        );
        let want: Vec<i64> = (0..p.next_offset).collect();
        assert!(
            got == want,
            "{when}: partition {} output has {} offsets (first {:?}, last {:?}), state says 0..{}",
            p.partition,
            got.len(),
            got.first(),
            got.last(),
            p.next_offset
        );
    }
    assert!(
        by_partition.is_empty(),
        "{when}: output for unknown partitions"
    );
}

fn spawn_child(args: &[String], log: &Path) -> Child {
    let log = File::create(log).expect("child log");
    Command::new(env!("CARGO_BIN_EXE_eo_child"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("cannot start eo_child")
}

/// A checkpointing child is SIGKILLed 20 times at random moments and restarted from its last
/// checkpoint, then runs to the end: its output holds every record exactly once, and the
/// committed offsets never run ahead of its checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_through_crash_and_restore() {
    let _serial = serial().await;
    let started = Instant::now();
    let cluster = Cluster::shared();
    let _logs = cluster.dump_logs_on_panic();
    let topic = unique("ckpt-eo");
    let group = unique("ckpt-eo-group");
    const PARTITIONS: i32 = 3;
    const TOTAL: u64 = 20_000;
    cluster.create_topic(&topic, PARTITIONS, 1, &[]);
    let spec = ProduceSpec {
        topic: &topic,
        partitions: PARTITIONS,
        count: TOTAL,
        // About 250 records per producer batch: batches are what a checkpoint can split.
        value_size: 1_000,
        ..ProduceSpec::default()
    };
    let produced = cluster.produce(&spec);
    assert_eq!(produced.produced, TOTAL);
    let ends = cluster.end_offsets(&topic);
    let tps = partitions(&topic, PARTITIONS);

    let dir: PathBuf = test_root().join(unique("eo-state"));
    fs::create_dir_all(&dir).unwrap();
    // Slowed down so that 20 short runs stop all over the topic.
    let rate = 800;
    let args: Vec<String> = vec![
        cluster.bootstrap(),
        topic.clone(),
        PARTITIONS.to_string(),
        group.clone(),
        TOTAL.to_string(),
        dir.display().to_string(),
        rate.to_string(),
    ];
    // Reads the group's committed offsets; never commits itself.
    let checker = Consumer::new(
        config(&cluster.bootstrap())
            .client_id("eo-checker")
            .group_id(group.as_str())
            .commit_mode(CommitMode::OnCheckpoints)
            .build()
            .unwrap(),
    )
    .unwrap();

    let mut rng = Rng::from_time();
    let mut progress = Vec::new();
    for run in 0..20 {
        let log = dir.join(format!("run-{run}.log"));
        let mut child = spawn_child(&args, &log);
        let ms = rng.between(100, 1500);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "run {run} ended by itself after less than {ms} ms: {status}\n{}",
                fs::read_to_string(&log).unwrap_or_default()
            );
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let committed_now = committed(&checker, &tps).await;
        let Some((state, output)) = read_child_checkpoint(&dir) else {
            assert!(
                committed_now.values().all(Option::is_none),
                "run {run}: offsets committed without a checkpoint: {committed_now:?}"
            );
            progress.push((ms, 0));
            continue;
        };
        assert_output_matches_state(&state, &output, &format!("after run {run}"));
        let ckpt = state.offsets();
        for tp in &tps {
            if let Some(c) = committed_now[tp] {
                assert!(
                    c <= ckpt[tp],
                    "run {run}: {tp} committed {c} is beyond the checkpoint's {} (checkpoint {})",
                    ckpt[tp],
                    state.checkpoint_id
                );
            }
        }
        progress.push((ms, output.len()));
    }
    println!("kill runs (ms alive, records checkpointed): {progress:?}");
    let before_final = progress.last().map_or(0, |p| p.1);
    assert!(
        before_final < TOTAL as usize,
        "the killed runs already read everything; the final run restores nothing"
    );

    let log = dir.join("run-final.log");
    let mut child = spawn_child(&args, &log);
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!(
                "the final run did not finish within 120 s\n{}",
                fs::read_to_string(&log).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let final_log = fs::read_to_string(&log).unwrap_or_default();
    assert!(
        status.success(),
        "the final run failed: {status}\n{final_log}"
    );
    let summary: Vec<&str> = final_log
        .lines()
        .filter(|l| !l.contains("ms: checkpoint"))
        .collect();
    println!("final run:\n{}", summary.join("\n"));

    let (state, output) = read_child_checkpoint(&dir).expect("no final checkpoint");
    assert_output_matches_state(&state, &output, "at the end");
    assert_eq!(output.len() as u64, TOTAL);
    let positions: BTreeSet<(i32, i64)> = output.iter().map(|(p, o, _)| (*p, *o)).collect();
    assert_eq!(positions.len() as u64, TOTAL, "a record appears twice");
    for (p, end) in &ends {
        for o in 0..*end {
            assert!(
                positions.contains(&(*p, o)),
                "partition {p} offset {o} is missing"
            );
        }
    }
    let checksum = output
        .iter()
        .fold(0u64, |acc, (_, _, c)| acc.wrapping_add(*c));
    assert_eq!(
        checksum, produced.checksum,
        "content differs from what was produced"
    );
    let ckpt: BTreeMap<i32, i64> = state
        .partitions
        .iter()
        .map(|p| (p.partition, p.next_offset))
        .collect();
    assert_eq!(ckpt, ends, "the final checkpoint is not at the log end");
    // The child closed its consumer, which flushed the last commit.
    assert_eq!(
        committed(&checker, &tps).await,
        as_committed(&state),
        "OffsetFetch"
    );
    assert_eq!(
        cluster.committed_offsets(&group),
        as_java(&state),
        "ConsumerGroupCommand"
    );
    tokio::time::timeout(Duration::from_secs(20), checker.close())
        .await
        .expect("close timed out");
    let _ = fs::remove_dir_all(&dir);
    println!(
        "exactly_once_through_crash_and_restore: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Reads up to `n` records (fewer if none arrive for `quiet`), never panicking on a timeout.
async fn read_some(consumer: &mut Consumer, n: usize, quiet: Duration) -> usize {
    let mut got = 0;
    while got < n {
        match tokio::time::timeout(quiet, consumer.poll()).await {
            Ok(Ok(b)) => got += b.records.len(),
            Ok(Err(e)) => {
                println!("poll error (ignored while a node is down): {e}");
            }
            Err(_) => break,
        }
    }
    got
}

/// The node id in `COORDINATOR (ID)` of `ConsumerGroupCommand --describe --state`.
fn coordinator_from_tool(out: &str) -> Option<i32> {
    out.lines()
        .skip_while(|l| !l.contains("COORDINATOR"))
        .nth(1)
        .and_then(|l| {
            let open = l.find('(')?;
            let close = l[open..].find(')')? + open;
            l[open + 1..close].trim().parse().ok()
        })
}

/// The group coordinator is SIGKILLed: commits find the new coordinator, and a later checkpoint
/// is acknowledged and committed there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_failover_three_nodes() {
    if Cluster::skip_when_external("coordinator_failover_three_nodes") {
        return;
    }
    let _serial = serial().await;
    let started = Instant::now();
    let cluster = Cluster::three_nodes();
    let _logs = cluster.dump_logs_on_panic();
    let topic = unique("ckpt-failover");
    let group = unique("ckpt-failover-group");
    cluster.create_topic(&topic, 3, 3, &[("min.insync.replicas", "2")]);
    cluster.produce(&ProduceSpec {
        topic: &topic,
        partitions: 3,
        count: 9_000,
        value_size: 100,
        ..ProduceSpec::default()
    });
    let tps = partitions(&topic, 3);

    let commit_timeout = Duration::from_secs(15);
    let cfg = group_config(&cluster, &group)
        .commit_timeout(commit_timeout)
        .build()
        .unwrap();
    let mut consumer = Consumer::new(cfg).unwrap();
    let handle = consumer.checkpoints();
    let mut outcomes = consumer.commit_outcomes().unwrap();
    consumer.assign(earliest(&topic, 3));

    drain(&mut consumer, 1_000, Duration::from_secs(60)).await;
    let s1 = snapshot(&mut consumer, 1).await;
    handle.notify_checkpoint_complete(1);
    let o = next_outcome(&mut outcomes, &handle, Duration::from_secs(30)).await;
    assert_acked(&o, 1, &s1);
    let old = consumer.fetch_stats().coordinator;
    assert!(old > 0, "no coordinator known after an acked commit");
    let tool = cluster.describe_group_raw(&group, &["--state"]);
    match coordinator_from_tool(&tool) {
        Some(id) => assert_eq!(id, old, "the tool names another coordinator:\n{tool}"),
        None => println!("could not read the coordinator from:\n{tool}"),
    }

    cluster.kill(old);
    let killed = Instant::now();
    let mut completions = 1u64;
    let mut seen = Vec::new();
    let mut id = 1;
    let acked_state = loop {
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "no commit acknowledged within 60 s after killing coordinator {old}: {seen:#?}; stats {:?}",
            handle.stats()
        );
        read_some(&mut consumer, 300, Duration::from_secs(2)).await;
        id += 1;
        let s = snapshot(&mut consumer, id).await;
        handle.notify_checkpoint_complete(id);
        completions += 1;
        let o = next_outcome(
            &mut outcomes,
            &handle,
            commit_timeout + Duration::from_secs(10),
        )
        .await;
        seen.push(format!(
            "{:.1} s after the kill: {}",
            killed.elapsed().as_secs_f64(),
            describe(&o)
        ));
        if matches!(o.outcome, Outcome::Acked) {
            assert_acked(&o, id, &s);
            break s;
        }
    };
    println!("after killing coordinator {old}:\n{}", seen.join("\n"));
    let stats = handle.stats();
    assert_accounted(&stats, completions);
    assert_eq!(stats.succeeded, 2, "{stats:?}");
    assert_ne!(
        acked_state.offsets(),
        s1.offsets(),
        "the later checkpoint must commit new offsets"
    );
    let new = consumer.fetch_stats().coordinator;
    assert!(new > 0 && new != old, "coordinator still {new} (was {old})");
    assert_eq!(
        committed(&consumer, &tps).await,
        as_committed(&acked_state),
        "OffsetFetch"
    );
    assert_eq!(
        cluster.committed_offsets(&group),
        as_java(&acked_state),
        "ConsumerGroupCommand"
    );
    tokio::time::timeout(Duration::from_secs(20), consumer.close())
        .await
        .expect("close timed out");
    cluster.restart(old);
    println!(
        "coordinator_failover_three_nodes: {:.1} s (coordinator {old} -> {new})",
        started.elapsed().as_secs_f64()
    );
}

/// A transactional topic read with `read_committed`: only committed records are handed out,
/// and the committed offsets reach the log end (past the trailing transaction markers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_topic_has_no_false_lag() {
    let _serial = serial().await;
    let started = Instant::now();
    let cluster = Cluster::shared();
    let _logs = cluster.dump_logs_on_panic();
    let topic = unique("ckpt-txn");
    let group = unique("ckpt-txn-group");
    cluster.create_topic(&topic, 3, 1, &[]);
    let spec = ProduceSpec {
        topic: &topic,
        partitions: 3,
        count: 2_000,
        value_size: 100,
        transactional: Some((100, 3)),
        ..ProduceSpec::default()
    };
    let produced = cluster.produce(&spec);
    let want = spec.expected_committed();
    assert_eq!(produced.produced, want);
    assert!(produced.aborted > 0);
    assert_eq!(produced.checksum, spec.expected_checksum());
    let tps = partitions(&topic, 3);

    let cfg = group_config(cluster, &group)
        .isolation_level(IsolationLevel::ReadCommitted)
        .build()
        .unwrap();
    let mut consumer = Consumer::new(cfg).unwrap();
    let handle = consumer.checkpoints();
    let mut outcomes = consumer.commit_outcomes().unwrap();
    consumer.assign(earliest(&topic, 3));

    let mut count = 0u64;
    let mut checksum = 0u64;
    let mut seen = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while count < want {
        let left = deadline.saturating_duration_since(Instant::now());
        let batch = match tokio::time::timeout(left, consumer.poll()).await {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => panic!("poll failed after {count} of {want} records: {e}"),
            Err(_) => panic!("only {count} of {want} committed records within 60 s"),
        };
        for r in &batch.records {
            let key = r.key.unwrap_or_default();
            let value = r.value.unwrap_or_default();
            let i: u64 = std::str::from_utf8(key)
                .ok()
                .and_then(|k| k.parse().ok())
                .unwrap_or_else(|| panic!("unexpected key {key:?}"));
            assert!(
                spec.is_committed(i),
                "record {i} of an aborted transaction was handed out"
            );
            assert_eq!(
                batch.partition.partition as u64,
                i % 3,
                "record {i} in the wrong partition"
            );
            assert!(seen.insert(i), "record {i} handed out twice");
            checksum = checksum.wrapping_add(protocol_tests::record_checksum(key, value));
            count += 1;
        }
    }
    assert_eq!(count, want);
    assert_eq!(checksum, spec.expected_checksum(), "content differs");
    // Nothing more (batches that only move the position over markers may still come).
    let quiet_until = Instant::now() + Duration::from_millis(1500);
    while let Ok(r) = tokio::time::timeout_at(quiet_until.into(), consumer.poll()).await {
        let b = r.expect("poll failed");
        assert!(
            b.records.is_empty(),
            "extra records after all committed ones: {b:?}"
        );
    }

    let ends = cluster.end_offsets(&topic);
    let ends: BTreeMap<TopicPartition, i64> = ends
        .into_iter()
        .map(|(p, o)| (TopicPartition::new(topic.as_str(), p), o))
        .collect();
    assert_eq!(ends.len(), 3);
    // The trailing markers are fetched data without records; a snapshot must move past them.
    // Bounded wait for the last fetch to arrive (pacing only; the comparison is the assertion).
    let mut id = 0;
    let wait_until = Instant::now() + Duration::from_secs(10);
    let state = loop {
        id += 1;
        let s = snapshot(&mut consumer, id).await;
        if s.offsets() == ends || Instant::now() > wait_until {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        state.offsets(),
        ends,
        "false lag: the snapshot stops short of the log end (after {id} snapshots)"
    );
    println!("snapshot {id} is at the log end {ends:?}");
    handle.notify_checkpoint_complete(id);
    let o = next_outcome(&mut outcomes, &handle, Duration::from_secs(30)).await;
    assert_acked(&o, id, &state);
    assert_eq!(outcome_offsets(&o), ends);
    let want_committed: BTreeMap<TopicPartition, Option<i64>> =
        ends.iter().map(|(tp, o)| (tp.clone(), Some(*o))).collect();
    assert_eq!(
        committed(&consumer, &tps).await,
        want_committed,
        "OffsetFetch"
    );
    assert_eq!(
        cluster.committed_offsets(&group),
        as_java(&state),
        "ConsumerGroupCommand"
    );
    tokio::time::timeout(Duration::from_secs(20), consumer.close())
        .await
        .expect("close timed out");
    println!(
        "transactional_topic_has_no_false_lag: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
