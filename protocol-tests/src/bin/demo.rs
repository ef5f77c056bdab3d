//! End-to-end demo: Apache Kafka (started here unless `KAFKA_BOOTSTRAP` is set), a topic filled
//! by the Java producer, and kafka-source reading it back with checkpoint-aligned commits.
//!
//! A separate checkpoint thread triggers a checkpoint every 500 ms, stores the state the
//! consumer snapshots, and then declares the checkpoint complete; commit outcomes and their
//! latencies are printed as they arrive. At the end the broker's committed offsets are compared
//! with the last completed checkpoint.
//!
//! `cargo run --release -p protocol-tests --bin demo [-- RECORDS]`

use std::collections::BTreeMap;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kafka_source::{CommitMode, Consumer, SourceState, StartPosition, TopicPartition};
use protocol_tests::consume::config;
use protocol_tests::{Cluster, Compression, ProduceSpec, record_checksum};

const PARTITIONS: i32 = 3;
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(500);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // The consumer is polled from a task on the runtime, not from `block_on` on the main
    // thread, which is none of the runtime's workers (see `Consumer`'s docs).
    tokio::spawn(run()).await.expect("the demo task panicked");
}

async fn run() {
    let records: u64 = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("RECORDS must be a number"))
        .unwrap_or(1_000_000);
    let started = Instant::now();
    let cluster = Cluster::single();
    if cluster.is_external() {
        println!("using the cluster at {}", cluster.bootstrap());
    } else {
        println!(
            "started Apache Kafka at {} in {:.1} s",
            cluster.bootstrap(),
            started.elapsed().as_secs_f64()
        );
    }
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let topic = format!("demo-{nanos}");
    let group = format!("demo-group-{nanos}");
    cluster.create_topic(&topic, PARTITIONS, 1, &[]);
    let spec = ProduceSpec {
        topic: &topic,
        partitions: PARTITIONS,
        count: records,
        value_size: 100,
        compression: Compression::Lz4,
        ..ProduceSpec::default()
    };
    let t = Instant::now();
    let produced = cluster.produce(&spec);
    println!(
        "the Java producer wrote {} records of 100 B (lz4) to {topic} in {:.1} s",
        produced.produced,
        t.elapsed().as_secs_f64()
    );

    let cfg = config(&cluster.bootstrap())
        .group_id(group.as_str())
        .commit_mode(CommitMode::OnCheckpoints)
        .build()
        .expect("valid config");
    let mut consumer = Consumer::new(cfg).expect("consumer");
    consumer.assign((0..PARTITIONS).map(|p| {
        (
            TopicPartition::new(topic.as_str(), p),
            StartPosition::Earliest,
        )
    }));

    // Commit outcomes, printed as they arrive.
    let mut outcomes = consumer.commit_outcomes().expect("first call");
    let printer = tokio::spawn(async move {
        while let Some(o) = outcomes.recv().await {
            let total: i64 = o.offsets.values().map(|(off, _)| off).sum();
            println!(
                "  commit of checkpoint {:>3}: {} in {:.2} ms (offsets sum {total})",
                o.checkpoint_id.map_or("-".into(), |id| id.to_string()),
                o.outcome,
                o.latency.as_secs_f64() * 1e3
            );
        }
    });

    // The checkpoint thread: triggers checkpoints, stores the snapshots, completes them.
    let handle = consumer.checkpoints();
    let (trigger_tx, trigger_rx) = std_mpsc::channel::<u64>();
    let (state_tx, state_rx) = std_mpsc::channel::<SourceState>();
    let (stop_tx, stop_rx) = std_mpsc::channel::<()>();
    let checkpointer = std::thread::spawn(move || {
        let mut last_completed: Option<SourceState> = None;
        let mut id = 0;
        loop {
            if stop_rx.recv_timeout(CHECKPOINT_INTERVAL).is_ok() {
                break;
            }
            id += 1;
            if trigger_tx.send(id).is_err() {
                break;
            }
            // The state is "stored" once the consuming side hands it over.
            let Ok(state) = state_rx.recv() else { break };
            handle.notify_checkpoint_complete(state.checkpoint_id);
            last_completed = Some(state);
        }
        last_completed
    });

    let t = Instant::now();
    let mut last = Instant::now();
    let (mut count, mut bytes, mut checksum) = (0u64, 0u64, 0u64);
    while count < produced.produced {
        // A checkpoint barrier arrives between records, on the consuming side.
        while let Ok(id) = trigger_rx.try_recv() {
            let state = consumer.snapshot_state(id).await.expect("snapshot");
            state_tx.send(state).expect("checkpoint thread alive");
        }
        let batch = match tokio::time::timeout(Duration::from_millis(100), consumer.poll()).await {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => {
                eprintln!("poll failed: {e}");
                std::process::exit(1);
            }
            Err(_) => continue,
        };
        for r in &batch.records {
            let key = r.key.unwrap_or_default();
            let value = r.value.unwrap_or_default();
            checksum = checksum.wrapping_add(record_checksum(key, value));
            bytes += (key.len() + value.len()) as u64;
            count += 1;
        }
        if last.elapsed() >= Duration::from_secs(1) {
            last = Instant::now();
            progress(count, bytes, t.elapsed());
        }
    }
    progress(count, bytes, t.elapsed());
    // One last checkpoint covering everything, then stop the checkpoint thread.
    let id = loop {
        if let Ok(id) = trigger_rx.recv_timeout(Duration::from_secs(5)) {
            break id;
        }
    };
    state_tx
        .send(consumer.snapshot_state(id).await.expect("snapshot"))
        .expect("checkpoint thread alive");
    let _ = stop_tx.send(());
    // A trigger sent meanwhile finds no consuming side: the thread stops.
    drop(state_tx);
    let last_completed = checkpointer
        .join()
        .expect("checkpoint thread")
        .expect("a checkpoint");
    while trigger_rx.try_recv().is_ok() {}
    let stats = consumer.close().await;
    let _ = printer.await;

    println!(
        "commits: {} acked, {} failed, {} superseded, {} timed out",
        stats.succeeded, stats.failed, stats.superseded, stats.timed_out
    );
    let expected: BTreeMap<(String, i32), Option<i64>> = last_completed
        .partitions
        .iter()
        .map(|p| ((p.topic.clone(), p.partition), Some(p.next_offset)))
        .collect();
    let on_broker = cluster.committed_offsets(&group);
    println!(
        "last completed checkpoint {}: {expected:?}",
        last_completed.checkpoint_id
    );
    println!("committed offsets on the broker (kafka-consumer-groups): {on_broker:?}");
    let mut ok = true;
    if count != produced.produced || checksum != produced.checksum {
        eprintln!(
            "MISMATCH: consumed {count} records (checksum {checksum:#x}), produced {} (checksum {:#x})",
            produced.produced, produced.checksum
        );
        ok = false;
    }
    if on_broker != expected {
        eprintln!(
            "MISMATCH: the broker's committed offsets differ from the last completed checkpoint"
        );
        ok = false;
    }
    if !ok {
        std::process::exit(1);
    }
    println!(
        "ok: consumed {count} records, checksum {checksum:#x} matches the producer's, and the broker holds exactly the last completed checkpoint's offsets"
    );
}

fn progress(count: u64, bytes: u64, elapsed: Duration) {
    let s = elapsed.as_secs_f64().max(1e-9);
    println!(
        "consumed {count:>9} records  {:>10.0} records/s  {:>7.1} MB/s",
        count as f64 / s,
        bytes as f64 / s / 1e6
    );
}
