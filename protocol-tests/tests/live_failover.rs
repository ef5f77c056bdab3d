//! Leader failover on a 3-node cluster: consumption continues on the new leader with no record
//! missed or repeated.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kafka_source::{Consumer, StartPosition, TopicPartition};
use protocol_tests::consume::{config, drain};
use protocol_tests::{Cluster, Compression, ProduceSpec};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_sigkill_during_consumption() {
    if Cluster::skip_when_external("leader_sigkill_during_consumption") {
        return;
    }
    let cluster = Cluster::three_nodes();
    let _logs = cluster.dump_logs_on_panic();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let topic = format!("failover-{nanos}");
    cluster.create_topic(&topic, 3, 3, &[("min.insync.replicas", "2")]);
    let first = ProduceSpec {
        topic: &topic,
        partitions: 3,
        count: 300_000,
        value_size: 100,
        compression: Compression::Lz4,
        ..ProduceSpec::default()
    };
    let p1 = cluster.produce(&first);

    // A small buffer, so the consumer stops fetching while the test does not poll.
    let cfg = config(&cluster.bootstrap())
        .buffer_max_bytes(2 << 20)
        .max_partition_fetch_bytes(256 << 10)
        .fetch_max_bytes(1 << 20)
        .build()
        .unwrap();
    let mut consumer = Consumer::new(cfg).unwrap();
    let tps: Vec<TopicPartition> = (0..3)
        .map(|p| TopicPartition::new(topic.as_str(), p))
        .collect();
    consumer.assign(tps.iter().map(|tp| (tp.clone(), StartPosition::Earliest)));
    let part1 = drain(&mut consumer, 100_000, Duration::from_secs(120)).await;

    // Kill the leader of partition 0 while it is being consumed.
    let victim = cluster.leader_of(&topic, 0);
    cluster.kill(victim);
    let deadline = Instant::now() + Duration::from_secs(60);
    while cluster.leader_of(&topic, 0) == victim {
        assert!(Instant::now() < deadline, "no new leader for partition 0");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // More records, written to the new leaders only.
    let second = ProduceSpec {
        count: 60_000,
        ..first.clone()
    };
    let p2 = cluster.produce(&second);
    let want = p1.produced + p2.produced - part1.count;
    let part2 = drain(&mut consumer, want, Duration::from_secs(180)).await;

    assert_eq!(part1.count + part2.count, 360_000);
    assert_eq!(
        part1.checksum.wrapping_add(part2.checksum),
        p1.checksum.wrapping_add(p2.checksum)
    );
    // Offsets contiguous across the failover, from 0, with no repeats.
    let mut all: BTreeMap<TopicPartition, Vec<i64>> = part1.offsets.clone();
    for (tp, offs) in &part2.offsets {
        all.entry(tp.clone()).or_default().extend(offs);
    }
    for (tp, offs) in &all {
        for (i, o) in offs.iter().enumerate() {
            assert_eq!(*o, i as i64, "{tp}: offset #{i} is {o}");
        }
    }
    assert_eq!(all.values().map(Vec::len).sum::<usize>(), 360_000);
    let extra = tokio::time::timeout(Duration::from_millis(1500), consumer.poll()).await;
    assert!(extra.is_err(), "unexpected extra data: {extra:?}");
    consumer.close().await;
    cluster.restart(victim);
}
