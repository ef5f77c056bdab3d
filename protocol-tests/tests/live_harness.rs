//! Smoke tests of the live-broker harness itself: a shared single node with the Java producer and
//! the offset tools, and a three-node cluster with a leader killed and restarted.

use std::thread;
use std::time::{Duration, Instant};

use protocol_tests::{Cluster, Compression, ProduceSpec};

#[test]
fn single_node_produce_and_offsets() {
    let cluster = Cluster::shared();
    let _logs = cluster.dump_logs_on_panic();
    let topic = format!("harness-smoke-{}", std::process::id());
    cluster.create_topic(&topic, 3, 1, &[]);

    let spec = ProduceSpec {
        topic: &topic,
        partitions: 3,
        count: 10_000,
        value_size: 64,
        compression: Compression::Lz4,
        ..ProduceSpec::default()
    };
    let started = Instant::now();
    let result = cluster.produce(&spec);
    println!(
        "produced {} records in {:.1} s",
        result.produced,
        started.elapsed().as_secs_f64()
    );
    assert_eq!(result.produced, 10_000);
    assert_eq!(result.aborted, 0);
    assert_eq!(
        result.checksum,
        spec.expected_checksum(),
        "Java and Rust disagree on the checksum"
    );

    let ends = cluster.end_offsets(&topic);
    assert_eq!(ends.len(), 3, "{ends:?}");
    assert_eq!(ends.values().sum::<i64>(), 10_000, "{ends:?}");
    // i % 3 spreads 10 000 records as 3334 / 3333 / 3333.
    assert_eq!(ends.get(&0), Some(&3334), "{ends:?}");
    let starts = cluster.start_offsets(&topic);
    assert!(starts.values().all(|&o| o == 0), "{starts:?}");

    let committed = cluster.committed_offsets("harness-no-such-group");
    assert!(committed.is_empty(), "{committed:?}");
}

#[test]
fn three_nodes_leader_moves_when_killed() {
    if Cluster::skip_when_external("three_nodes_leader_moves_when_killed") {
        return;
    }
    let cluster = Cluster::three_nodes();
    assert_eq!(cluster.node_ids(), vec![1, 2, 3]);
    assert_eq!(cluster.brokers().len(), 3);
    let topic = "harness-failover";
    cluster.create_topic(topic, 1, 3, &[]);
    let parts = cluster.describe_topic(topic);
    assert_eq!(parts[0].replicas.len(), 3, "{parts:?}");

    let leader = cluster.leader_of(topic, 0);
    assert!(cluster.node_ids().contains(&leader), "leader {leader}");
    println!(
        "leader of {topic}-0 is node {leader} at {}",
        cluster.node_addr(leader)
    );

    let killed_at = Instant::now();
    cluster.kill(leader);
    assert!(!cluster.is_running(leader));
    let deadline = killed_at + Duration::from_secs(60);
    let new_leader = loop {
        let now = cluster.leader_of(topic, 0);
        if now != leader && now != -1 {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "leadership did not move off killed node {leader} within 60 s (still {now})"
        );
        thread::sleep(Duration::from_millis(250));
    };
    println!(
        "leadership moved from {leader} to {new_leader} in {:.1} s",
        killed_at.elapsed().as_secs_f64()
    );

    // Data still flows with two of three replicas (min.insync.replicas=2).
    let sent = cluster.produce(&ProduceSpec {
        topic,
        count: 100,
        ..ProduceSpec::default()
    });
    assert_eq!(sent.produced, 100);

    let restarted_at = Instant::now();
    cluster.restart(leader);
    assert!(cluster.is_running(leader));
    assert!(cluster.brokers().contains_key(&leader));
    println!(
        "node {leader} restarted in {:.1} s",
        restarted_at.elapsed().as_secs_f64()
    );
    assert_eq!(cluster.end_offsets(topic).get(&0), Some(&100));
}
