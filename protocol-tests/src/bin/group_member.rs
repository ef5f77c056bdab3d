//! A group member on kafka-source in a process of its own, for the interoperability tests in
//! `tests/live_interop.rs` (which SIGKILL it). It mirrors `java/GroupConsumer.java`: same
//! arguments, same output.
//!
//! `group_member BOOTSTRAP GROUP TOPIC MEMBER_NAME classic:STRATEGY|consumer [SESSION_TIMEOUT_MS]`
//!
//! It subscribes to the topic with a rebalance listener and prints one line per event to
//! stdout, with wall-clock milliseconds since the Unix epoch:
//!
//! ```text
//! STARTED <ms>
//! ASSIGNED <ms> <topic:partition,...|->
//! REVOKED <ms> <topic:partition,...|->   (after asking for the revoked positions' commit)
//! LOST <ms> <topic:partition,...|->
//! RECORDS <topic:partition> <offset> <offset> ...
//! CLOSED <ms>
//! ```
//!
//! Offsets are committed every 500 ms, on revocation and on close. It closes the consumer
//! (leaving the group) when stdin has a `STOP` line or is closed; it exits 2 on bad arguments.

use std::process::ExitCode;
use std::time::Duration;

use kafka_source::{
    AssignmentStrategy, CommitMode, Consumer, GroupProtocol, OffsetReset, RebalanceListener,
    Revocation, TopicPartition,
};
use protocol_tests::consume::config;
use protocol_tests::group::now_ms;
use tokio::io::{AsyncBufReadExt, BufReader};

fn tps(parts: &[TopicPartition]) -> String {
    if parts.is_empty() {
        return "-".into();
    }
    parts
        .iter()
        .map(|tp| format!("{}:{}", tp.topic, tp.partition))
        .collect::<Vec<_>>()
        .join(",")
}

struct Printer;

impl RebalanceListener for Printer {
    fn on_partitions_revoked(&mut self, revocation: &mut Revocation<'_>) {
        revocation.commit_positions();
        println!("REVOKED {} {}", now_ms(), tps(revocation.partitions()));
    }

    fn on_partitions_assigned(&mut self, assigned: &[TopicPartition]) {
        println!("ASSIGNED {} {}", now_ms(), tps(assigned));
    }

    fn on_partitions_lost(&mut self, lost: &[TopicPartition]) {
        println!("LOST {} {}", now_ms(), tps(lost));
    }
}

fn usage(why: &str) -> ExitCode {
    eprintln!("group_member: {why}");
    eprintln!(
        "usage: group_member BOOTSTRAP GROUP TOPIC MEMBER_NAME classic:STRATEGY|consumer \
         [SESSION_TIMEOUT_MS]"
    );
    ExitCode::from(2)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 5 || args.len() > 6 {
        return usage(&format!("expected 5 or 6 arguments, got {}", args.len()));
    }
    let (bootstrap, group, topic, name, mode) = (&args[0], &args[1], &args[2], &args[3], &args[4]);
    let mut b = config(bootstrap)
        .client_id(name.as_str())
        .group_id(group.as_str())
        .commit_mode(CommitMode::Periodic(Duration::from_millis(500)))
        .auto_offset_reset(OffsetReset::Earliest);
    if mode == "consumer" {
        b = b.group_protocol(GroupProtocol::Consumer);
    } else if let Some(strategy) = mode.strip_prefix("classic:") {
        let strategy = match strategy {
            "range" => AssignmentStrategy::Range,
            "roundrobin" => AssignmentStrategy::RoundRobin,
            "cooperative-sticky" => AssignmentStrategy::CooperativeSticky,
            other => return usage(&format!("unknown strategy {other:?}")),
        };
        let session_ms: u64 = match args.get(5).map(|s| s.parse()) {
            None => 10_000,
            Some(Ok(ms)) => ms,
            Some(Err(e)) => return usage(&format!("SESSION_TIMEOUT_MS: {e}")),
        };
        b = b
            .group_protocol(GroupProtocol::Classic)
            .partition_assignment_strategy([strategy])
            .session_timeout(Duration::from_millis(session_ms))
            .heartbeat_interval(Duration::from_secs(1));
    } else {
        return usage(&format!("unknown mode {mode:?}"));
    }
    let cfg = match b.build() {
        Ok(c) => c,
        Err(e) => return usage(&format!("config: {e}")),
    };
    let mut consumer = match Consumer::new(cfg) {
        Ok(c) => c,
        Err(e) => return usage(&format!("consumer: {e}")),
    };
    consumer.set_rebalance_listener(Printer);
    if let Err(e) = consumer.subscribe([topic.as_str()]) {
        return usage(&format!("subscribe: {e}"));
    }
    println!("STARTED {}", now_ms());
    // Stop on a STOP line or at the end of stdin.
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if line.trim() == "STOP" {
                break;
            }
        }
        let _ = stop_tx.send(());
    });
    loop {
        tokio::select! {
            r = consumer.poll() => match r {
                Ok(batch) if !batch.records.is_empty() => {
                    let mut line = format!(
                        "RECORDS {}:{}",
                        batch.partition.topic,
                        batch.partition.partition
                    );
                    for r in &batch.records {
                        line.push(' ');
                        line.push_str(&r.offset.to_string());
                    }
                    println!("{line}");
                }
                Ok(_) => {}
                Err(e) => eprintln!("{name}: poll error: {e}"),
            },
            _ = &mut stop_rx => break,
        }
    }
    let stats = consumer.close().await;
    eprintln!("{name}: closed, commits: {stats:?}");
    println!("CLOSED {}", now_ms());
    ExitCode::SUCCESS
}
