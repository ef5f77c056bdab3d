//! Commit latency with a parked fetch: from `notify_checkpoint_complete` to the broker's
//! acknowledgement, while the only partition's fetch waits on the broker for
//! `fetch.max.wait.ms` = 5 s. Prints p50, p99 and max.
//!
//! `cargo run --release -p protocol-tests --bin commit_latency [-- ITERATIONS]`
//! (starts a single-node Apache Kafka unless `KAFKA_BOOTSTRAP` is set).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kafka_source::{CommitMode, Consumer, Outcome, StartPosition, TopicPartition};
use protocol_tests::Cluster;
use protocol_tests::consume::config;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let iterations: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("ITERATIONS must be a number"))
        .unwrap_or(500);
    let cluster = Cluster::single();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let topic = format!("latency-{nanos}");
    cluster.create_topic(&topic, 1, 1, &[]);
    let cfg = config(&cluster.bootstrap())
        .group_id(format!("latency-{nanos}"))
        .commit_mode(CommitMode::OnCheckpoints)
        .fetch_max_wait(Duration::from_millis(5000))
        .build()
        .expect("config");
    let mut consumer = Consumer::new(cfg).expect("consumer");
    consumer.assign([(
        TopicPartition::new(topic.as_str(), 0),
        StartPosition::Earliest,
    )]);
    let handle = consumer.checkpoints();
    let mut outcomes = consumer.commit_outcomes().expect("first call");

    let mut latencies = Vec::with_capacity(iterations);
    let mut parked_at_ack = 0usize;
    let warmup = 20;
    for id in 0..(warmup + iterations) as u64 {
        // Wait until a fetch is parked on the broker.
        let t = Instant::now();
        loop {
            let s = consumer.fetch_stats();
            if s.requests > s.responses {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(30), "no fetch in flight");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let before = consumer.fetch_stats().responses;
        consumer.snapshot_state(id).await.expect("snapshot");
        let start = Instant::now();
        handle.notify_checkpoint_complete(id);
        let o = tokio::time::timeout(Duration::from_secs(30), outcomes.recv())
            .await
            .expect("an outcome in time")
            .expect("outcome stream open");
        let elapsed = start.elapsed();
        assert!(
            matches!(o.outcome, Outcome::Acked),
            "commit {id}: {}",
            o.outcome
        );
        if id as usize >= warmup {
            latencies.push(elapsed);
            if consumer.fetch_stats().responses == before {
                parked_at_ack += 1;
            }
        }
    }
    consumer.close().await;
    latencies.sort();
    let pct = |p: f64| {
        latencies[((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1]
    };
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "commit latency with a parked fetch, {} commits: p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms; the parked fetch was still out at {} of {} acknowledgements",
        latencies.len(),
        ms(pct(0.50)),
        ms(pct(0.99)),
        ms(*latencies.last().expect("iterations > 0")),
        parked_at_ack,
        latencies.len()
    );
}
