//! The consumers under test, each run as a child process of the driver (`compare child KIND ..`),
//! so that peak RSS and CPU time are per client.
//!
//! A child consumes, prints one `RESULT key=value ...` line on stdout and then waits for its
//! stdin to close, so that the driver reads `/proc/<pid>` of a process that is done but still
//! there. The line ends with `cpu_s`, the process's CPU time (all threads, start-up included)
//! to nanoseconds. Every child stops by itself after [`CHILD_DEADLINE`].

use std::io::Read as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use kafka_source::{CommitMode, Consumer, ConsumerConfig, Outcome, StartPosition, TopicPartition};

use crate::raw;

/// The longest any child consumes before it gives up.
pub(crate) const CHILD_DEADLINE: Duration = Duration::from_secs(180);

/// What a throughput child reports.
#[derive(Debug, Default)]
struct Consumed {
    records: u64,
    /// Key and value bytes as the client handed them out (a sink the compiler cannot drop).
    bytes: u64,
    /// From creating the client to the first record.
    first: Option<Duration>,
    elapsed: Duration,
}

impl Consumed {
    /// Counts one record of `len` key + value bytes.
    fn record(&mut self, started: Instant, len: usize) {
        self.records(started, 1, len as u64);
    }

    /// Counts `records` records of `bytes` key + value bytes in all, handed out together.
    fn records(&mut self, started: Instant, records: u64, bytes: u64) {
        if self.first.is_none() && records > 0 {
            self.first = Some(started.elapsed());
        }
        self.bytes += bytes;
        self.records += records;
    }
}

/// Runs `compare child KIND ARGS..` and exits.
pub(crate) fn main(args: &[String]) -> ! {
    let kind = args.first().map(String::as_str).unwrap_or("");
    let rest = &args[1.min(args.len())..];
    let result = match kind {
        "ours" | "ours-nocrc" | "rdkafka-base" | "rdkafka-stream" | "rskafka" | "raw" => {
            throughput(kind, rest)
        }
        "ours-slow" => slow(rest),
        "ours-latency" => latency(rest),
        "raw-commit" => raw_commit(rest),
        "start-ups" => start_ups(rest),
        _ => Err(format!("unknown child kind {kind:?}")),
    };
    match result {
        Ok(line) => {
            let cpu = nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID)
                .map(|t| Duration::from(t).as_secs_f64());
            match cpu {
                Ok(cpu) => println!("RESULT {line} cpu_s={cpu:.6}"),
                Err(_) => println!("RESULT {line}"),
            }
            // Stay until the driver has read /proc/<pid> and closes stdin.
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            std::process::exit(0)
        }
        Err(e) => {
            eprintln!("child {kind} failed: {e}");
            std::process::exit(1)
        }
    }
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, what: &str) -> Result<T, String> {
    args.get(i)
        .ok_or_else(|| format!("missing argument {what}"))?
        .parse()
        .map_err(|_| format!("bad argument {what}: {:?}", args[i]))
}

/// Runs `work` to its end in a task spawned on a two-worker runtime, the way an application
/// runs its consumers (and an engine its operators), rather than in `block_on` on the main
/// thread: that thread is not one of the runtime's workers, so every wakeup from a client's
/// background task to it would cross threads.
fn in_task<T, F>(work: F) -> Result<T, String>
where
    F: Future<Output = Result<T, String>> + Send + 'static,
    T: Send + 'static,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    runtime.block_on(async {
        tokio::spawn(work)
            .await
            .map_err(|e| format!("the task failed: {e}"))?
    })
}

/// `BOOTSTRAP TOPIC PARTITIONS ROUNDS`: the broker warm-up's start-up requests
/// ([`raw::start_up_round_trips`]), for one topic.
fn start_ups(args: &[String]) -> Result<String, String> {
    let bootstrap: String = arg(args, 0, "BOOTSTRAP")?;
    let topic: String = arg(args, 1, "TOPIC")?;
    let partitions: i32 = arg(args, 2, "PARTITIONS")?;
    let rounds: u64 = arg(args, 3, "ROUNDS")?;
    let started = Instant::now();
    let done = raw::start_up_round_trips(
        &bootstrap,
        &[(topic, partitions)],
        "cmp-warm-up",
        rounds,
        CHILD_DEADLINE,
    )?;
    Ok(format!(
        "rounds={done} elapsed_s={:.6}",
        started.elapsed().as_secs_f64()
    ))
}

/// `KIND BOOTSTRAP TOPIC PARTITIONS RECORDS`: consume every record of the topic from the start.
fn throughput(kind: &str, args: &[String]) -> Result<String, String> {
    let bootstrap: String = arg(args, 0, "BOOTSTRAP")?;
    let topic: String = arg(args, 1, "TOPIC")?;
    let partitions: i32 = arg(args, 2, "PARTITIONS")?;
    let want: u64 = arg(args, 3, "RECORDS")?;
    let consumed = match kind {
        "raw" => {
            let r = raw::consume(&bootstrap, &topic, partitions, want)?;
            Consumed {
                records: r.records,
                bytes: r.bytes,
                first: r.first,
                elapsed: r.elapsed,
            }
        }
        "rdkafka-base" => rdkafka_base(&bootstrap, &topic, partitions, want)?,
        _ => {
            let kind = kind.to_owned();
            in_task(async move {
                let work = async {
                    match kind.as_str() {
                        "ours" => ours(&bootstrap, &topic, partitions, want, true).await,
                        "ours-nocrc" => ours(&bootstrap, &topic, partitions, want, false).await,
                        "rdkafka-stream" => {
                            rdkafka_stream(&bootstrap, &topic, partitions, want).await
                        }
                        _ => rskafka(&bootstrap, &topic, partitions, want).await,
                    }
                };
                tokio::time::timeout(CHILD_DEADLINE, work)
                    .await
                    .map_err(|_| format!("not done within {CHILD_DEADLINE:?}"))?
            })?
        }
    };
    Ok(format!(
        "records={} bytes={} first_s={:.6} elapsed_s={:.6}",
        consumed.records,
        consumed.bytes,
        consumed.first.unwrap_or_default().as_secs_f64(),
        consumed.elapsed.as_secs_f64()
    ))
}

fn our_config(bootstrap: &str) -> kafka_source::ConsumerConfigBuilder {
    ConsumerConfig::builder()
        .bootstrap_servers(bootstrap.split(',').map(str::to_owned))
        .client_id("compare")
}

/// `check_crcs`: the `check.crcs` setting (`ours-nocrc` turns it off; the comparison runs
/// the default).
async fn ours(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    want: u64,
    check_crcs: bool,
) -> Result<Consumed, String> {
    let cfg = our_config(bootstrap)
        .commit_mode(CommitMode::Disabled)
        .check_crcs(check_crcs)
        .build()
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut consumer = Consumer::new(cfg).map_err(|e| e.to_string())?;
    consumer
        .assign((0..partitions).map(|p| (TopicPartition::new(topic, p), StartPosition::Earliest)));
    let mut c = Consumed::default();
    while c.records < want {
        let batch = consumer.poll().await.map_err(|e| e.to_string())?;
        // Every record's key and value are read; the sum stays in a register rather than
        // going through `c` in memory per record.
        let bytes: usize = batch
            .records
            .iter()
            .map(|r| r.key.map_or(0, <[u8]>::len) + r.value.map_or(0, <[u8]>::len))
            .sum();
        c.records(started, batch.records.len() as u64, bytes as u64);
    }
    c.elapsed = started.elapsed();
    Ok(c)
}

fn rdkafka_config(bootstrap: &str) -> rdkafka::ClientConfig {
    let mut cfg = rdkafka::ClientConfig::new();
    cfg.set("bootstrap.servers", bootstrap)
        .set("group.id", "compare-rdkafka")
        .set("client.id", "compare")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("auto.offset.reset", "earliest");
    cfg
}

fn rdkafka_assignment(topic: &str, partitions: i32) -> Result<rdkafka::TopicPartitionList, String> {
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, rdkafka::Offset::Beginning)
            .map_err(|e| e.to_string())?;
    }
    Ok(tpl)
}

/// An rdkafka consumer of either kind, created from [`rdkafka_config`] and assigned partitions
/// `0..partitions` of `topic` from the beginning.
fn rdkafka_consumer<C>(bootstrap: &str, topic: &str, partitions: i32) -> Result<C, String>
where
    C: rdkafka::config::FromClientConfig + rdkafka::consumer::Consumer,
{
    let consumer: C = rdkafka_config(bootstrap)
        .create()
        .map_err(|e| e.to_string())?;
    consumer
        .assign(&rdkafka_assignment(topic, partitions)?)
        .map_err(|e| e.to_string())?;
    Ok(consumer)
}

/// Key + value bytes of an rdkafka message.
fn rdkafka_len(m: &impl rdkafka::Message) -> usize {
    m.key().map_or(0, <[u8]>::len) + m.payload().map_or(0, <[u8]>::len)
}

fn rdkafka_base(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    want: u64,
) -> Result<Consumed, String> {
    let started = Instant::now();
    let consumer: rdkafka::consumer::BaseConsumer = rdkafka_consumer(bootstrap, topic, partitions)?;
    let mut c = Consumed::default();
    while c.records < want {
        if started.elapsed() > CHILD_DEADLINE {
            return Err(format!("only {} of {want} records", c.records));
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => c.record(started, rdkafka_len(&m)),
            Some(Err(e)) => return Err(e.to_string()),
            None => {}
        }
    }
    c.elapsed = started.elapsed();
    Ok(c)
}

async fn rdkafka_stream(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    want: u64,
) -> Result<Consumed, String> {
    let started = Instant::now();
    let consumer: rdkafka::consumer::StreamConsumer =
        rdkafka_consumer(bootstrap, topic, partitions)?;
    let mut c = Consumed::default();
    while c.records < want {
        let m = consumer.recv().await.map_err(|e| e.to_string())?;
        c.record(started, rdkafka_len(&m));
    }
    c.elapsed = started.elapsed();
    Ok(c)
}

async fn rskafka(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    want: u64,
) -> Result<Consumed, String> {
    use rskafka::client::ClientBuilder;
    use rskafka::client::consumer::{StartOffset, StreamConsumerBuilder};
    use rskafka::client::partition::UnknownTopicHandling;
    let brokers = bootstrap.split(',').map(str::to_owned).collect();
    let started = Instant::now();
    let client = ClientBuilder::new(brokers)
        .client_id("compare")
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let mut streams = Vec::new();
    for p in 0..partitions {
        let pc = client
            .partition_client(topic, p, UnknownTopicHandling::Retry)
            .await
            .map_err(|e| e.to_string())?;
        streams.push(StreamConsumerBuilder::new(Arc::new(pc), StartOffset::Earliest).build());
    }
    let mut all = futures::stream::select_all(streams);
    let mut c = Consumed::default();
    while c.records < want {
        let (r, _high_watermark) = all
            .next()
            .await
            .ok_or("the rskafka streams ended")?
            .map_err(|e| e.to_string())?;
        c.record(
            started,
            r.record.key.as_deref().map_or(0, <[u8]>::len)
                + r.record.value.as_deref().map_or(0, <[u8]>::len),
        );
    }
    c.elapsed = started.elapsed();
    Ok(c)
}

/// `BOOTSTRAP TOPIC PARTITIONS BUDGET_BYTES SECONDS MICROS_PER_RECORD`: kafka-source with a slow
/// application (it sleeps `MICROS_PER_RECORD` for every record handed out) for `SECONDS`, with
/// `buffer.max.bytes` = `BUDGET_BYTES`.
fn slow(args: &[String]) -> Result<String, String> {
    let bootstrap: String = arg(args, 0, "BOOTSTRAP")?;
    let topic: String = arg(args, 1, "TOPIC")?;
    let partitions: i32 = arg(args, 2, "PARTITIONS")?;
    let budget: usize = arg(args, 3, "BUDGET_BYTES")?;
    let seconds: f64 = arg(args, 4, "SECONDS")?;
    let micros: u64 = arg(args, 5, "MICROS_PER_RECORD")?;
    in_task(async move {
        let cfg = our_config(&bootstrap)
            .commit_mode(CommitMode::Disabled)
            .buffer_max_bytes(budget)
            .build()
            .map_err(|e| e.to_string())?;
        let mut consumer = Consumer::new(cfg).map_err(|e| e.to_string())?;
        consumer.assign((0..partitions).map(|p| {
            (
                TopicPartition::new(topic.as_str(), p),
                StartPosition::Earliest,
            )
        }));
        let run_for = Duration::from_secs_f64(seconds);
        let started = Instant::now();
        let (mut records, mut bytes) = (0u64, 0u64);
        while started.elapsed() < run_for {
            let left = run_for.saturating_sub(started.elapsed());
            let Ok(batch) = tokio::time::timeout(left, consumer.poll()).await else {
                break;
            };
            let batch = batch.map_err(|e| e.to_string())?;
            for r in &batch.records {
                bytes += r.value.map_or(0, <[u8]>::len) as u64;
            }
            records += batch.records.len() as u64;
            tokio::time::sleep(Duration::from_micros(micros * batch.records.len() as u64)).await;
        }
        Ok(format!(
            "records={records} bytes={bytes} elapsed_s={:.6}",
            started.elapsed().as_secs_f64()
        ))
    })
}

/// `BOOTSTRAP TOPIC GROUP COMMITS WARMUP`: the broker's OffsetCommit round trip alone (see
/// [`raw::commit_round_trips`]), in microseconds, in the latency children's format.
fn raw_commit(args: &[String]) -> Result<String, String> {
    let bootstrap: String = arg(args, 0, "BOOTSTRAP")?;
    let topic: String = arg(args, 1, "TOPIC")?;
    let group: String = arg(args, 2, "GROUP")?;
    let commits: u64 = arg(args, 3, "COMMITS")?;
    let warmup: u64 = arg(args, 4, "WARMUP")?;
    let took = raw::commit_round_trips(
        &bootstrap,
        &topic,
        &group,
        commits,
        warmup,
        Duration::from_millis(20),
    )?;
    let micros: Vec<String> = took.iter().map(|d| d.as_micros().to_string()).collect();
    Ok(format!("parked_at_ack=-1 lat_us={}", micros.join(",")))
}

/// `BOOTSTRAP TOPIC GROUP COMMITS WARMUP`: checkpoint completion to broker acknowledgement, with
/// the only partition's fetch parked on the broker (`fetch.max.wait.ms` = 5 s, empty topic).
/// Reports the latencies of the commits after the first `WARMUP`, in microseconds.
fn latency(args: &[String]) -> Result<String, String> {
    let bootstrap: String = arg(args, 0, "BOOTSTRAP")?;
    let topic: String = arg(args, 1, "TOPIC")?;
    let group: String = arg(args, 2, "GROUP")?;
    let commits: u64 = arg(args, 3, "COMMITS")?;
    let warmup: u64 = arg(args, 4, "WARMUP")?;
    in_task(async move {
        let cfg = our_config(&bootstrap)
            .group_id(group)
            .commit_mode(CommitMode::OnCheckpoints)
            .fetch_max_wait(Duration::from_millis(5000))
            .build()
            .map_err(|e| e.to_string())?;
        let mut consumer = Consumer::new(cfg).map_err(|e| e.to_string())?;
        consumer.assign([(
            TopicPartition::new(topic.as_str(), 0),
            StartPosition::Earliest,
        )]);
        let handle = consumer.checkpoints();
        let mut outcomes = consumer
            .commit_outcomes()
            .ok_or("commit_outcomes was taken")?;
        let mut latencies = Vec::new();
        let mut parked_at_ack = 0u64;
        for id in 0..warmup + commits {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let waiting = Instant::now();
            loop {
                let s = consumer.fetch_stats();
                if s.requests > s.responses {
                    break;
                }
                if waiting.elapsed() > Duration::from_secs(30) {
                    return Err("no fetch in flight".into());
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let responses = consumer.fetch_stats().responses;
            consumer
                .snapshot_state(id)
                .await
                .map_err(|e| e.to_string())?;
            let start = Instant::now();
            handle.notify_checkpoint_complete(id);
            let o = tokio::time::timeout(Duration::from_secs(30), outcomes.recv())
                .await
                .map_err(|_| format!("no outcome for checkpoint {id}"))?
                .ok_or("outcome stream closed")?;
            let took = start.elapsed();
            if !matches!(o.outcome, Outcome::Acked) {
                return Err(format!("checkpoint {id}: {}", o.outcome));
            }
            if id >= warmup {
                latencies.push(took.as_micros().to_string());
                if consumer.fetch_stats().responses == responses {
                    parked_at_ack += 1;
                }
            }
        }
        consumer.close().await;
        Ok(format!(
            "parked_at_ack={parked_at_ack} lat_us={}",
            latencies.join(",")
        ))
    })
}
