//! The consumer API against a real broker: the blocking facade, pause/resume, seek, and the
//! memory budget when the application stops polling.

use std::time::{Duration, Instant};

use kafka_source::{Consumer, StartPosition, TopicPartition, blocking};
use protocol_tests::consume::{config, unique};
use protocol_tests::{Cluster, Compression, ProduceSpec};

/// The blocking facade on a thread of its own: poll with a timeout, pause, resume, seek.
#[test]
fn blocking_facade_pause_resume_seek() {
    let cluster = Cluster::shared();
    let _logs = cluster.dump_logs_on_panic();
    let topic = unique("blocking");
    cluster.create_topic(&topic, 2, 1, &[]);
    cluster.produce(&ProduceSpec {
        topic: &topic,
        partitions: 2,
        count: 2_000,
        value_size: 50,
        ..ProduceSpec::default()
    });
    let p0 = TopicPartition::new(topic.as_str(), 0);
    let p1 = TopicPartition::new(topic.as_str(), 1);
    let cfg = config(&cluster.bootstrap()).build().unwrap();
    let mut c = blocking::Consumer::new(cfg).unwrap();
    c.assign([
        (p0.clone(), StartPosition::Earliest),
        (p1.clone(), StartPosition::Earliest),
    ]);
    assert_eq!(c.position(&p0, Duration::from_secs(30)).unwrap(), 0);

    // Paused: nothing of p0 is handed out, p1 drains completely.
    c.pause(std::slice::from_ref(&p0));
    let mut p1_seen = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while p1_seen < 1_000 {
        assert!(Instant::now() < deadline, "p1 not drained");
        if let Some(b) = c.poll(Duration::from_millis(500)).unwrap() {
            assert_eq!(b.partition, p1, "a paused partition was handed out");
            p1_seen += b.records.len();
        }
    }
    assert_eq!(p1_seen, 1_000);
    assert!(c.poll(Duration::from_millis(700)).unwrap().is_none());
    assert_eq!(c.position(&p0, Duration::from_secs(5)).unwrap(), 0);

    // Resumed: p0 from where it was.
    c.resume(std::slice::from_ref(&p0));
    let b = c
        .poll(Duration::from_secs(30))
        .unwrap()
        .expect("p0 after resume");
    assert_eq!(b.partition, p0);
    assert_eq!(b.records.first().unwrap().offset, 0);

    // Seek: the next p0 batch starts exactly there, whatever was buffered.
    c.seek(&p0, StartPosition::Offset(900)).unwrap();
    assert_eq!(c.position(&p0, Duration::from_secs(5)).unwrap(), 900);
    let mut offsets = Vec::new();
    while offsets.len() < 100 {
        let b = c
            .poll(Duration::from_secs(30))
            .unwrap()
            .expect("p0 after seek");
        assert_eq!(b.partition, p0);
        offsets.extend(b.records.iter().map(|r| r.offset));
    }
    assert_eq!(offsets, (900..1000).collect::<Vec<i64>>());
    assert_eq!(c.position(&p0, Duration::from_secs(5)).unwrap(), 1000);
    c.close();
}

/// A fetch response counts against the budget whole, not partition by partition, until the
/// last of its records is handed out: one partition's records handed out free nothing while
/// another's, cut from the same response, wait; the last of them frees all of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_response_counts_whole_until_its_last_records_are_handed_out() {
    let cluster = Cluster::shared();
    let _logs = cluster.dump_logs_on_panic();
    let topic = unique("whole-response");
    cluster.create_topic(&topic, 2, 1, &[]);
    // 300 records of 1,000 bytes per partition: each partition's part of the response is
    // handed out in one batch (fewer than a piece's 512 records).
    let (per_partition, value_size) = (300u64, 1_000u64);
    cluster.produce(&ProduceSpec {
        topic: &topic,
        partitions: 2,
        count: 2 * per_partition,
        value_size: value_size as usize,
        ..ProduceSpec::default()
    });
    // One data connection: both partitions come in one response.
    let cfg = config(&cluster.bootstrap())
        .fetch_connections_per_broker(1)
        .build()
        .unwrap();
    let mut c = Consumer::new(cfg).unwrap();
    let tps = [0, 1].map(|p| TopicPartition::new(topic.as_str(), p));
    c.assign(tps.iter().map(|tp| (tp.clone(), StartPosition::Earliest)));

    let first = tokio::time::timeout(Duration::from_secs(30), c.poll())
        .await
        .expect("records in time")
        .unwrap();
    assert_eq!(
        first.records.len() as u64,
        per_partition,
        "one partition's records"
    );
    let buffered = c.fetch_stats().buffered_bytes;
    // Both partitions' values are still in the count, though one partition's were handed out.
    assert!(
        buffered >= 2 * per_partition * value_size,
        "{buffered} bytes counted with one of two partitions handed out"
    );

    let second = tokio::time::timeout(Duration::from_secs(30), c.poll())
        .await
        .expect("records in time")
        .unwrap();
    assert_ne!(second.partition, first.partition);
    assert_eq!(second.records.len() as u64, per_partition);
    // The topic holds nothing more: later responses bring no records, and count nothing.
    assert_eq!(c.fetch_stats().buffered_bytes, 0);
    c.close().await;
}

/// A paused partition's fetched records do not hold the budget for the others: a response cut
/// into both a paused partition's records and another's, as large as the whole budget, is let
/// go once the other's records are handed out (the paused partition keeps a copy of its own),
/// so the other partition is read to its end; on resume the paused one goes on where it was.
/// Paused before its records reached the application's side (they are parked as they come).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_paused_before_its_records_come_does_not_hold_the_budget() {
    paused_partition_and_budget(false).await;
}

/// The same, paused after a first batch was handed out (the rest waits, queued, already
/// taken in).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_paused_after_a_batch_does_not_hold_the_budget() {
    paused_partition_and_budget(true).await;
}

async fn paused_partition_and_budget(poll_first: bool) {
    let cluster = Cluster::shared();
    let _logs = cluster.dump_logs_on_panic();
    let topic = unique("paused-budget");
    cluster.create_topic(&topic, 2, 1, &[]);
    let per_partition = 2_000i64;
    cluster.produce(&ProduceSpec {
        topic: &topic,
        partitions: 2,
        count: 2 * per_partition as u64,
        value_size: 1_000,
        ..ProduceSpec::default()
    });
    // One data connection, and a response of both partitions' 512 KiB fills the whole budget.
    let cfg = config(&cluster.bootstrap())
        .fetch_connections_per_broker(1)
        .max_partition_fetch_bytes(512 << 10)
        .fetch_max_bytes(1 << 20)
        .buffer_max_bytes(1 << 20)
        .build()
        .unwrap();
    let mut c = Consumer::new(cfg).unwrap();
    let tps = [0, 1].map(|p| TopicPartition::new(topic.as_str(), p));
    c.assign(tps.iter().map(|tp| (tp.clone(), StartPosition::Earliest)));
    let mut next = [0i64; 2];
    let take = |b: &kafka_source::Batch, next: &mut [i64; 2]| {
        let n = &mut next[b.partition.partition as usize];
        for r in &b.records {
            assert_eq!(r.offset, *n, "{}", b.partition);
            assert_eq!(r.value.map(<[u8]>::len), Some(1_000));
            *n += 1;
        }
    };
    let paused = if poll_first {
        let b = tokio::time::timeout(Duration::from_secs(30), c.poll())
            .await
            .expect("records in time")
            .unwrap();
        take(&b, &mut next);
        b.partition.partition as usize
    } else {
        let deadline = Instant::now() + Duration::from_secs(30);
        while c.fetch_stats().buffered_bytes == 0 {
            assert!(Instant::now() < deadline, "nothing fetched");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        0
    };
    let other = 1 - paused;
    c.pause(std::slice::from_ref(&tps[paused]));
    for (tp, i) in [(&tps[other], other), (&tps[paused], paused)] {
        while next[i] < per_partition {
            let b = tokio::time::timeout(Duration::from_secs(20), c.poll())
                .await
                .unwrap_or_else(|_| panic!("{tp} stalled at offset {}", next[i]))
                .unwrap();
            assert_eq!(&b.partition, tp, "a paused partition was handed out");
            take(&b, &mut next);
        }
        c.resume(std::slice::from_ref(&tps[paused]));
    }
    c.close().await;
}

/// An application that stops polling stops the fetching: the buffered bytes stay within the
/// budget (plus at most one fetch response), and no further fetch is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetching_stops_when_the_application_does_not_poll() {
    let cluster = Cluster::shared();
    let _logs = cluster.dump_logs_on_panic();
    let topic = unique("budget");
    cluster.create_topic(&topic, 1, 1, &[]);
    cluster.produce(&ProduceSpec {
        topic: &topic,
        partitions: 1,
        count: 100_000,
        value_size: 200,
        compression: Compression::Lz4,
        ..ProduceSpec::default()
    });
    let budget = 1 << 20;
    let cfg = config(&cluster.bootstrap())
        .buffer_max_bytes(budget)
        .max_partition_fetch_bytes(256 << 10)
        .fetch_max_bytes(512 << 10)
        .build()
        .unwrap();
    let mut c = Consumer::new(cfg).unwrap();
    let tp = TopicPartition::new(topic.as_str(), 0);
    c.assign([(tp.clone(), StartPosition::Earliest)]);
    // Let the loop fill the budget, then watch it sit still.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = c.fetch_stats();
        if s.buffered_bytes as usize >= budget / 2 && s.requests == s.responses {
            break;
        }
        assert!(Instant::now() < deadline, "budget never filled: {s:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = c.fetch_stats();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = c.fetch_stats();
    assert_eq!(
        before.requests, after.requests,
        "fetched while nobody polled"
    );
    assert!(
        after.buffered_bytes as usize <= budget + (512 << 10),
        "buffered {} bytes with a budget of {budget}",
        after.buffered_bytes
    );
    // Polling frees the budget and fetching resumes, to the end of the log.
    let mut seen = 0u64;
    let mut next = 0i64;
    while seen < 100_000 {
        let b = tokio::time::timeout(Duration::from_secs(30), c.poll())
            .await
            .expect("records in time")
            .unwrap();
        for r in &b.records {
            assert_eq!(r.offset, next);
            next += 1;
        }
        seen += b.records.len() as u64;
    }
    assert!(c.fetch_stats().requests > after.requests);
    c.close().await;
}

/// A restored offset that is out of range is an error by default, even with
/// `auto.offset.reset=earliest` (a restore is not a fresh start); with
/// `restore.offset.out.of.range=earliest` it resets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_out_of_range_follows_its_own_policy() {
    use kafka_source::{Error, OffsetReset, PartitionOffset, SOURCE_STATE_VERSION, SourceState};
    let cluster = Cluster::shared();
    let _logs = cluster.dump_logs_on_panic();
    let topic = unique("restore-oor");
    cluster.create_topic(&topic, 1, 1, &[]);
    cluster.produce(&ProduceSpec {
        topic: &topic,
        partitions: 1,
        count: 10,
        value_size: 10,
        ..ProduceSpec::default()
    });
    let tp = TopicPartition::new(topic.as_str(), 0);
    let state = SourceState {
        version: SOURCE_STATE_VERSION,
        checkpoint_id: 7,
        partitions: vec![PartitionOffset {
            topic: topic.clone(),
            partition: 0,
            next_offset: 5_000,
            leader_epoch: -1,
        }],
    };

    let cfg = config(&cluster.bootstrap())
        .auto_offset_reset(OffsetReset::Earliest)
        .build()
        .unwrap();
    let mut c = Consumer::new(cfg).unwrap();
    c.restore(&state).unwrap();
    assert_eq!(c.assignment(), vec![tp.clone()]);
    match tokio::time::timeout(Duration::from_secs(30), c.poll()).await {
        Ok(Err(Error::OffsetOutOfRange {
            partition, offset, ..
        })) => assert_eq!((partition, offset), (tp.clone(), 5_000)),
        other => panic!("expected OffsetOutOfRange, got {other:?}"),
    }
    c.close().await;

    let cfg = config(&cluster.bootstrap())
        .restore_out_of_range(OffsetReset::Earliest)
        .build()
        .unwrap();
    let mut c = Consumer::new(cfg).unwrap();
    c.restore(&state).unwrap();
    let b = tokio::time::timeout(Duration::from_secs(30), c.poll())
        .await
        .expect("records in time")
        .unwrap();
    assert_eq!(b.records.first().unwrap().offset, 0);
    c.close().await;

    // A state of a version this crate does not read is refused.
    let mut c = Consumer::new(config(&cluster.bootstrap()).build().unwrap()).unwrap();
    let err = c
        .restore(&SourceState {
            version: 99,
            ..state.clone()
        })
        .unwrap_err();
    assert!(err.to_string().contains("version 99"), "{err}");
    c.close().await;
}

/// Periodic mode commits the handed-out positions every `auto.commit.interval.ms`, without
/// checkpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_commit_mode_commits_handed_out_positions() {
    use kafka_source::CommitMode;
    let cluster = Cluster::shared();
    let _logs = cluster.dump_logs_on_panic();
    let topic = unique("periodic");
    let group = unique("periodic-group");
    cluster.create_topic(&topic, 1, 1, &[]);
    cluster.produce(&ProduceSpec {
        topic: &topic,
        partitions: 1,
        count: 500,
        value_size: 10,
        ..ProduceSpec::default()
    });
    let tp = TopicPartition::new(topic.as_str(), 0);
    let cfg = config(&cluster.bootstrap())
        .group_id(group.as_str())
        .commit_mode(CommitMode::Periodic(Duration::from_millis(200)))
        .build()
        .unwrap();
    let mut c = Consumer::new(cfg).unwrap();
    c.assign([(tp.clone(), StartPosition::Earliest)]);
    let mut outcomes = c.commit_outcomes().unwrap();
    let got = protocol_tests::consume::drain(&mut c, 500, Duration::from_secs(30)).await;
    assert_eq!(got.count, 500);
    // One `poll` that waits (nothing arrives) still publishes the positions once the interval
    // passes.
    let o = tokio::select! {
        r = c.poll() => panic!("nothing more to read, got {r:?}"),
        o = async {
            loop {
                let o = outcomes.recv().await.expect("an outcome");
                if o.offsets.get(&tp).map(|(off, _)| *off) == Some(500) {
                    break o;
                }
            }
        } => o,
        _ = tokio::time::sleep(Duration::from_secs(30)) => panic!("positions not committed"),
    };
    assert_eq!(o.checkpoint_id, None);
    let committed = c.committed(std::slice::from_ref(&tp)).await.unwrap();
    assert_eq!(committed[&tp], Some(500));
    c.close().await;
    assert_eq!(
        cluster.committed_offsets(&group).get(&(topic.clone(), 0)),
        Some(&Some(500))
    );

    // With an interval that never passes, close() commits the handed-out positions.
    let group = unique("periodic-close-group");
    let cfg = config(&cluster.bootstrap())
        .group_id(group.as_str())
        .commit_mode(CommitMode::Periodic(Duration::from_secs(3600)))
        .build()
        .unwrap();
    let mut c = Consumer::new(cfg).unwrap();
    c.assign([(tp.clone(), StartPosition::Offset(100))]);
    protocol_tests::consume::drain(&mut c, 400, Duration::from_secs(30)).await;
    let stats = c.close().await;
    assert_eq!(stats.succeeded, 1, "{stats:?}");
    assert_eq!(stats.last_acked.get(&tp), Some(&500));
    assert_eq!(
        cluster.committed_offsets(&group).get(&(topic.clone(), 0)),
        Some(&Some(500))
    );
}
