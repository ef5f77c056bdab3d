//! A minimal checkpointing application for the exactly-once test in `tests/live_checkpoint.rs`.
//!
//! It reads every partition of a topic and keeps what it read ("the output") in memory. Every
//! 200 ms it takes a checkpoint: it snapshots the consumer's state, writes the state together
//! with the whole output to `<state_dir>/checkpoint.json` atomically (temporary file, fsync,
//! rename, fsync of the folder), and only then reports the checkpoint complete, which commits
//! the offsets. On start it restores from that file if it exists, so records read after the
//! last checkpoint of a killed run are read again and nothing is lost or repeated.
//!
//! It exits 0 once the output holds `total_records` entries, the final checkpoint is written
//! and the consumer is closed (which flushes the last commit); it exits 2 if it ever reads more
//! than `total_records` records.
//!
//! `eo_child BOOTSTRAP TOPIC PARTITIONS GROUP TOTAL_RECORDS STATE_DIR [RECORDS_PER_SEC]`
//!
//! `RECORDS_PER_SEC` (default 0: unlimited) slows reading down, so that a run killed after a
//! random time stops somewhere in the middle of the topic.
//!
//! The file holds `{"state": <SourceState>, "output": [[partition, offset, checksum], ...]}`,
//! where `checksum` is [`record_checksum`] of the record's key and value.

use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use kafka_source::{CommitMode, Consumer, SourceState, StartPosition, TopicPartition};
use protocol_tests::consume::config;
use protocol_tests::record_checksum;
use serde_json::{Value, json};

const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(200);

struct Args {
    bootstrap: String,
    topic: String,
    partitions: i32,
    group: String,
    total: usize,
    state_dir: PathBuf,
    rate: u64,
}

fn parse_args() -> Result<Args, String> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    if a.len() < 6 || a.len() > 7 {
        return Err(
            "usage: eo_child BOOTSTRAP TOPIC PARTITIONS GROUP TOTAL_RECORDS STATE_DIR [RECORDS_PER_SEC]"
                .into(),
        );
    }
    let num = |i: usize, what: &str| -> Result<u64, String> {
        a[i].parse().map_err(|e| format!("{what} {:?}: {e}", a[i]))
    };
    Ok(Args {
        bootstrap: a[0].clone(),
        topic: a[1].clone(),
        partitions: i32::try_from(num(2, "PARTITIONS")?).map_err(|e| e.to_string())?,
        group: a[3].clone(),
        total: usize::try_from(num(4, "TOTAL_RECORDS")?).map_err(|e| e.to_string())?,
        state_dir: PathBuf::from(&a[5]),
        rate: if a.len() == 7 {
            num(6, "RECORDS_PER_SEC")?
        } else {
            0
        },
    })
}

/// The checkpoint file's path.
fn checkpoint_path(dir: &Path) -> PathBuf {
    dir.join("checkpoint.json")
}

/// Reads the last checkpoint: the state and the output entries.
fn read_checkpoint(dir: &Path) -> Result<Option<(SourceState, Vec<Value>)>, String> {
    let path = checkpoint_path(dir);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    };
    let mut doc: Value =
        serde_json::from_str(&text).map_err(|e| format!("parsing {}: {e}", path.display()))?;
    let state: SourceState = serde_json::from_value(doc["state"].take())
        .map_err(|e| format!("{}: bad state: {e}", path.display()))?;
    let output = match doc["output"].take() {
        Value::Array(v) => v,
        other => {
            return Err(format!(
                "{}: output is not an array: {other}",
                path.display()
            ));
        }
    };
    Ok(Some((state, output)))
}

/// Writes the checkpoint atomically: a temporary file, fsync, rename, fsync of the folder.
fn write_checkpoint(dir: &Path, state: &SourceState, output: &[Value]) -> std::io::Result<()> {
    let doc = json!({
        "state": serde_json::to_value(state).map_err(std::io::Error::other)?,
        "output": output,
    });
    let bytes = serde_json::to_vec(&doc).map_err(std::io::Error::other)?;
    let tmp = dir.join("checkpoint.json.tmp");
    {
        let mut f = File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, checkpoint_path(dir))?;
    File::open(dir)?.sync_all()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("eo_child: {e}");
            return ExitCode::from(64);
        }
    };
    match run(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("eo_child: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<ExitCode, String> {
    let started = Instant::now();
    fs::create_dir_all(&args.state_dir)
        .map_err(|e| format!("creating {}: {e}", args.state_dir.display()))?;
    let cfg = config(&args.bootstrap)
        .client_id("eo-child")
        .group_id(args.group.as_str())
        .commit_mode(CommitMode::OnCheckpoints)
        // Small fetches: a slowed-down run hands out one record batch at a time.
        .max_partition_fetch_bytes(16 << 10)
        .fetch_max_bytes(64 << 10)
        .build()
        .map_err(|e| format!("config: {e}"))?;
    let mut consumer = Consumer::new(cfg).map_err(|e| format!("consumer: {e}"))?;
    let checkpoints = consumer.checkpoints();

    let (mut output, mut next_id) = match read_checkpoint(&args.state_dir)? {
        Some((state, output)) => {
            consumer
                .restore(&state)
                .map_err(|e| format!("restore: {e}"))?;
            eprintln!(
                "eo_child: restored checkpoint {} with {} records: {:?}",
                state.checkpoint_id,
                output.len(),
                state.offsets()
            );
            (output, state.checkpoint_id + 1)
        }
        None => {
            consumer.assign((0..args.partitions).map(|p| {
                (
                    TopicPartition::new(args.topic.as_str(), p),
                    StartPosition::Earliest,
                )
            }));
            eprintln!("eo_child: no checkpoint; reading from the earliest offsets");
            (Vec::new(), 1)
        }
    };

    let mut read_this_run: u64 = 0;
    let mut next_checkpoint = Instant::now() + CHECKPOINT_INTERVAL;
    loop {
        let done = output.len() >= args.total;
        if done || Instant::now() >= next_checkpoint {
            let state = consumer
                .snapshot_state(next_id)
                .await
                .map_err(|e| format!("snapshot {next_id}: {e}"))?;
            write_checkpoint(&args.state_dir, &state, &output)
                .map_err(|e| format!("writing checkpoint {next_id}: {e}"))?;
            checkpoints.notify_checkpoint_complete(next_id);
            eprintln!(
                "eo_child: {:>5} ms: checkpoint {next_id} with {} records",
                started.elapsed().as_millis(),
                output.len()
            );
            next_id += 1;
            next_checkpoint = Instant::now() + CHECKPOINT_INTERVAL;
            if done {
                break;
            }
        }
        if args.rate > 0 {
            // Pace reading: this run may not be ahead of `rate` records per second. Checkpoints
            // go on while it waits.
            let due = started + Duration::from_secs_f64(read_this_run as f64 / args.rate as f64);
            let now = Instant::now();
            if due > now {
                tokio::time::sleep(due.min(next_checkpoint) - now).await;
                continue;
            }
        }
        let wait = next_checkpoint.saturating_duration_since(Instant::now());
        let batch = match tokio::time::timeout(wait, consumer.poll()).await {
            Err(_) => continue,
            Ok(Err(e)) => return Err(format!("poll: {e}")),
            Ok(Ok(b)) => b,
        };
        for r in &batch.records {
            let key = r.key.unwrap_or_default();
            let value = r.value.unwrap_or_default();
            output.push(json!([
                batch.partition.partition,
                r.offset,
                record_checksum(key, value)
            ]));
        }
        read_this_run += batch.records.len() as u64;
        if output.len() > args.total {
            eprintln!(
                "eo_child: read {} records, more than the {} in the topic",
                output.len(),
                args.total
            );
            return Ok(ExitCode::from(2));
        }
    }
    let stats = consumer.close().await;
    eprintln!(
        "eo_child: done with {} records, last checkpoint {}; commits {stats:?}",
        output.len(),
        next_id - 1
    );
    Ok(ExitCode::SUCCESS)
}
