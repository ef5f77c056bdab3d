//! Side-by-side comparison of kafka-source with other Kafka consumers on one local broker.
//!
//! `cargo run --release --manifest-path benches/compare/Cargo.toml -- [--quick] [--reps N] [--warmups N] [--pairs N]`
//!
//! Full mode: 1,000,000 records of 100 B and 200,000 of 1 KiB per topic, a broker warm-up
//! (20,000 rounds of the requests a consumer sends before its first Fetch, then 120 to 600 runs
//! of the raw fetch and kafka-source on the uncompressed 100 B topics, until the broker's JIT
//! compiler is quiet), one warm-up round and five measured rounds, 1,000 commits per
//! commit-latency run. `--quick`: 200,000 and 40,000 records, 2,000 rounds and 40 to 200 runs to
//! warm up the broker, one round, no warm-up round, 200 commits per commit-latency run, and a
//! 16 MiB budget for the slow application (its topic is smaller than the default 64 MiB). Both
//! send the broker 30,000 to 150,000 OffsetCommits back to back before the commit-latency
//! rounds, until its JIT compiler is quiet.
//! `--reps` and `--warmups` change the number of measured and warm-up rounds. After the rounds,
//! kafka-source and the raw fetch run back to back in 60 pairs (3 in the quick run; `--pairs`)
//! on each uncompressed 100 B topic: the ceiling target is judged by those pairs.
//!
//! The driver starts one Apache Kafka 4.1.2 broker with the test harness (`protocol-tests`),
//! fills one topic per (value size, partitions, codec) with the harness's Java producer, and
//! runs every consumer as its own child process, interleaved: kafka-source, rust-rdkafka's
//! `BaseConsumer` and `StreamConsumer`, rskafka, the Java client's `ConsumerPerformance` tool and
//! a raw-fetch ceiling. It then measures checkpoint-to-acknowledgement commit latency with a
//! parked fetch (kafka-source and a Java consumer driven like Flink's legacy consumer thread,
//! with the broker's bare OffsetCommit round trip as the floor under both) and kafka-source's
//! peak RSS with a slow application. The report (markdown, CSV and PNG plots)
//! goes to `target/compare/`.
//!
//! The driver exits with status 1, after writing the report, when any measured run failed (a
//! child that crashed, timed out or read fewer records than the topic holds).
//!
//! `compare child KIND ..` is how the driver starts the Rust consumers; see [`child`].

mod child;
mod proc;
mod raw;
mod report;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use protocol_tests::{Cluster, Compression, ProduceSpec, expected_key, kafka_libs, target_dir};

use crate::proc::ChildRun;
use crate::report::{LatencyRun, Machine, Report, SlowRun, ThroughputRun};

/// The broker setting that makes the group coordinator write offset commits without waiting for
/// more to batch (Kafka's default is 5 ms, a floor under any commit latency).
const BROKER_PROPERTIES: &[(&str, &str)] = &[("group.coordinator.append.linger.ms", "0")];

/// JVM options for the Java consumers: `kafka-run-class.sh`'s performance options and the heap
/// `kafka-consumer-perf-test.sh` gives the tool.
const JAVA_OPTS: &[&str] = &[
    "-Xmx512M",
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
];

/// kafka-source's default `buffer.max.bytes`, the budget of the full run's slow-application
/// case.
const SLOW_BUDGET: usize = 64 << 20;
/// The quick run's budget: its 1 KiB topic (40 MB) must be larger than the budget, or the case
/// cannot show that memory stops growing at the budget.
const SLOW_BUDGET_QUICK: usize = 16 << 20;
/// The slow application's cost per record.
const SLOW_MICROS_PER_RECORD: u64 = 100;

/// The commit-latency rounds: kafka-source, the Java wakeup pattern, and the broker's own
/// OffsetCommit round trip as the floor under both.
pub(crate) const LATENCY_CLIENTS: [Client; 3] = [Client::Ours, Client::Java, Client::RawCommit];

/// A consumer under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Client {
    Ours,
    /// kafka-source with `check.crcs=false` (back-to-back runs only): how much of the gap to
    /// the ceiling is the CRC check.
    OursNoCrc,
    RdkafkaBase,
    RdkafkaStream,
    Rskafka,
    Java,
    Raw,
    /// The broker's OffsetCommit round trip alone (commit latency only).
    RawCommit,
}

impl Client {
    pub(crate) const ALL: [Client; 6] = [
        Client::Ours,
        Client::RdkafkaBase,
        Client::RdkafkaStream,
        Client::Rskafka,
        Client::Java,
        Client::Raw,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Client::Ours => "kafka-source",
            Client::OursNoCrc => "kafka-source, check.crcs=false",
            Client::RdkafkaBase => "rdkafka BaseConsumer",
            Client::RdkafkaStream => "rdkafka StreamConsumer",
            Client::Rskafka => "rskafka",
            Client::Java => "Java ConsumerPerformance",
            Client::Raw => "raw fetch (ceiling)",
            Client::RawCommit => "raw OffsetCommit (broker floor)",
        }
    }

    fn child_kind(self) -> &'static str {
        match self {
            Client::Ours => "ours",
            Client::OursNoCrc => "ours-nocrc",
            Client::RdkafkaBase => "rdkafka-base",
            Client::RdkafkaStream => "rdkafka-stream",
            Client::Rskafka => "rskafka",
            Client::Java => "java",
            Client::Raw => "raw",
            Client::RawCommit => "raw-commit",
        }
    }
}

/// One topic of the throughput matrix.
#[derive(Debug, Clone)]
pub(crate) struct Case {
    pub(crate) value_size: usize,
    pub(crate) partitions: i32,
    pub(crate) compression: Compression,
    pub(crate) topic: String,
    pub(crate) records: u64,
    /// Key + value bytes of all records.
    pub(crate) payload_bytes: u64,
}

impl Case {
    /// `secs` spent on this case's topic, per million of its records.
    fn per_million(&self, secs: f64) -> f64 {
        secs / (self.records as f64 / 1e6)
    }

    pub(crate) fn label(&self) -> String {
        let size = if self.value_size >= 1024 {
            format!("{} KiB", self.value_size / 1024)
        } else {
            format!("{} B", self.value_size)
        };
        format!(
            "{size}, {}p, {}",
            self.partitions,
            self.compression.as_str()
        )
    }
}

/// How much to run.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) quick: bool,
    pub(crate) warmups: usize,
    /// Runs of the raw fetch and kafka-source, alternating over the uncompressed 100 B topics,
    /// before the first round, so that the broker's JIT compiler has compiled its fetch path:
    /// at least this many, and more until the JIT is quiet (see [`warm_up_broker`]).
    pub(crate) broker_warmup_runs: usize,
    /// The most broker warm-up runs, quiet or not.
    pub(crate) broker_warmup_max_runs: usize,
    /// Rounds of the requests a consumer sends before its first Fetch, sent to the broker
    /// before the warm-up runs (see [`raw::start_up_round_trips`]).
    pub(crate) broker_warmup_start_ups: u64,
    pub(crate) reps: usize,
    /// Back-to-back pairs of the raw fetch and kafka-source on each uncompressed 100 B topic,
    /// after the rounds: what the ceiling target is judged by (see [`run_pairs`]).
    pub(crate) pairs: usize,
    pub(crate) records_small: u64,
    pub(crate) records_large: u64,
    pub(crate) commits: u64,
    pub(crate) commit_warmup: u64,
    /// `buffer.max.bytes` of the slow-application runs.
    pub(crate) slow_budget: usize,
    pub(crate) slow_seconds: f64,
}

impl Plan {
    fn new(quick: bool, reps: Option<usize>, warmups: Option<usize>, pairs: Option<usize>) -> Plan {
        let mut plan = if quick {
            Plan {
                quick,
                warmups: 0,
                broker_warmup_runs: 40,
                broker_warmup_max_runs: 200,
                broker_warmup_start_ups: 2_000,
                reps: 1,
                pairs: 3,
                records_small: 200_000,
                records_large: 40_000,
                // A run's p99 is then its second-worst commit, not its worst.
                commits: 200,
                commit_warmup: 10,
                slow_budget: SLOW_BUDGET_QUICK,
                slow_seconds: 3.0,
            }
        } else {
            Plan {
                quick,
                warmups: 1,
                broker_warmup_runs: 120,
                broker_warmup_max_runs: 600,
                broker_warmup_start_ups: 20_000,
                reps: 5,
                // A pair's ratio spreads over 0.5-1.5x on a 2-core host shared with the broker:
                // resampling a full run's 20 pairs, the median of 20 moved by about +-6 % on one
                // partition, the median of 60 by about +-3 %.
                pairs: 60,
                records_small: 1_000_000,
                records_large: 200_000,
                // Enough that a run's p99 rests on ten commits, not two.
                commits: 1000,
                commit_warmup: 20,
                slow_budget: SLOW_BUDGET,
                slow_seconds: 8.0,
            }
        };
        if let Some(r) = reps {
            plan.reps = r.max(1);
        }
        if let Some(w) = warmups {
            plan.warmups = w;
        }
        if let Some(p) = pairs {
            plan.pairs = p;
        }
        plan
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("child") {
        child::main(&args[1..]);
    }
    let mut quick = false;
    let mut reps = None;
    let mut warmups = None;
    let mut pairs = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--reps" => {
                reps = Some(
                    it.next()
                        .and_then(|n| n.parse().ok())
                        .unwrap_or_else(|| usage("--reps takes a number")),
                );
            }
            "--warmups" => {
                warmups = Some(
                    it.next()
                        .and_then(|n| n.parse().ok())
                        .unwrap_or_else(|| usage("--warmups takes a number")),
                );
            }
            "--pairs" => {
                pairs = Some(
                    it.next()
                        .and_then(|n| n.parse().ok())
                        .unwrap_or_else(|| usage("--pairs takes a number")),
                );
            }
            "-h" | "--help" => usage(""),
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    let plan = Plan::new(quick, reps, warmups, pairs);
    let started = Instant::now();
    let out = target_dir().join("compare");
    fs::create_dir_all(&out).unwrap_or_else(|e| panic!("cannot create {}: {e}", out.display()));
    let log = out.join("children.log");
    let _ = fs::remove_file(&log);
    let mut machine = Machine::read();

    eprintln!("[compare] starting Apache Kafka (harness), {BROKER_PROPERTIES:?}");
    let cluster = Cluster::single_with_properties(BROKER_PROPERTIES);
    let bootstrap = cluster.bootstrap();
    let broker_pid = cluster.node_ids().first().and_then(|&id| cluster.pid(id));
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);

    let cases = make_cases(&cluster, &plan, nanos);
    let java_dir = compile_java(&out);

    let mut warmup = warm_up_broker(&plan, &cases, &bootstrap, broker_pid, &log);

    // Throughput: rounds over all cases; within a case the clients' order rotates every round.
    let mut throughput = Vec::new();
    let rounds = plan.warmups + plan.reps;
    for round in 0..rounds {
        for (ci, case) in cases.iter().enumerate() {
            let mut order = Client::ALL.to_vec();
            order.rotate_left((round + ci) % Client::ALL.len());
            for client in order {
                let run = run_throughput(client, case, &bootstrap, broker_pid, &log);
                let warm = round < plan.warmups;
                eprintln!(
                    "[compare] round {}/{rounds}{} {:<16} {:<26} {}",
                    round + 1,
                    if warm { " (warm-up)" } else { "" },
                    case.label(),
                    client.label(),
                    run.as_ref().map_or("FAILED".to_string(), |r| format!(
                        "{:>10.0} records/s {:>7.1} MB/s  cpu {:.2} s  rss {:.0} MiB",
                        r.records_per_s,
                        r.mb_per_s,
                        r.cpu_secs,
                        r.peak_rss as f64 / f64::from(1 << 20)
                    ))
                );
                if !warm {
                    throughput.push(ThroughputRun {
                        case: ci,
                        client,
                        round: round - plan.warmups,
                        run,
                    });
                }
            }
        }
    }

    let pairs = run_pairs(&plan, &cases, &bootstrap, broker_pid, &log);

    // Commit latency with a parked fetch.
    let latency_topic = format!("cmp-latency-{nanos}");
    cluster.create_topic(&latency_topic, 1, 1, &[]);
    warm_up_commits(&mut warmup, &bootstrap, &latency_topic, broker_pid);
    let mut latency = Vec::new();
    for round in 0..rounds {
        let mut order = LATENCY_CLIENTS;
        order.rotate_left(round % LATENCY_CLIENTS.len());
        for client in order {
            let group = format!("cmp-latency-{nanos}-{round}-{}", client.child_kind());
            let run = run_latency(
                client,
                &bootstrap,
                &latency_topic,
                &group,
                &plan,
                &java_dir,
                &log,
            );
            let warm = round < plan.warmups;
            eprintln!(
                "[compare] latency round {}/{rounds}{} {:<26} {}",
                round + 1,
                if warm { " (warm-up)" } else { "" },
                latency_label(client),
                run.as_ref().map_or("FAILED".to_string(), |r| format!(
                    "p50 {:.3} ms p99 {:.3} ms max {:.3} ms",
                    r.p50_ms, r.p99_ms, r.max_ms
                ))
            );
            if !warm {
                latency.push((client, run));
            }
        }
    }

    // Peak RSS of kafka-source with a slow application.
    let slow_case = cases
        .iter()
        .find(|c| c.value_size == 1024 && c.partitions == 8 && c.compression == Compression::None)
        .expect("the 1 KiB, 8-partition, uncompressed case")
        .clone();
    let mut slow = Vec::new();
    for round in 0..rounds {
        let run = run_slow(&slow_case, &bootstrap, &plan, &log);
        let warm = round < plan.warmups;
        eprintln!(
            "[compare] slow application round {}/{rounds}{}: {}",
            round + 1,
            if warm { " (warm-up)" } else { "" },
            run.as_ref().map_or("FAILED".to_string(), |r| format!(
                "peak RSS {:.1} MiB, {:.0} records/s",
                r.peak_rss as f64 / f64::from(1 << 20),
                r.records_per_s
            ))
        );
        if !warm {
            slow.push(run);
        }
    }

    machine.finish();
    let report = Report {
        plan: plan.clone(),
        machine,
        cases,
        throughput,
        pairs,
        latency,
        slow,
        slow_case_label: slow_case.label(),
        slow_budget: plan.slow_budget as u64,
        slow_micros_per_record: SLOW_MICROS_PER_RECORD,
        broker_properties: BROKER_PROPERTIES
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect(),
        warmup,
        took: started.elapsed(),
    };
    let markdown = report.write(&out).unwrap_or_else(|e| {
        eprintln!("[compare] {e}");
        std::process::exit(1)
    });
    println!("{markdown}");
    eprintln!(
        "[compare] done in {:.0} s; report in {}",
        started.elapsed().as_secs_f64(),
        out.join("report.md").display()
    );
    let failed = report.failed_runs();
    if failed > 0 {
        eprintln!(
            "[compare] {failed} measured run(s) failed; the children's output is in {}",
            log.display()
        );
        std::process::exit(1);
    }
}

fn usage(why: &str) -> ! {
    if !why.is_empty() {
        eprintln!("{why}");
    }
    eprintln!(
        "usage: cargo run --release --manifest-path benches/compare/Cargo.toml -- [--quick] [--reps N] [--warmups N] [--pairs N]"
    );
    std::process::exit(2)
}

pub(crate) fn latency_label(client: Client) -> &'static str {
    match client {
        Client::Java => "Java consumer, wakeup + commitAsync",
        _ => client.label(),
    }
}

/// Creates and fills the topics: value sizes 100 B and 1 KiB, 1 and 8 partitions, uncompressed
/// and lz4.
fn make_cases(cluster: &Cluster, plan: &Plan, nanos: u128) -> Vec<Case> {
    let mut cases = Vec::new();
    for value_size in [100usize, 1024] {
        for partitions in [1, 8] {
            for compression in [Compression::None, Compression::Lz4] {
                let records = if value_size < 1024 {
                    plan.records_small
                } else {
                    plan.records_large
                };
                let topic = format!(
                    "cmp-{value_size}b-{partitions}p-{}-{nanos}",
                    compression.as_str()
                );
                cluster.create_topic(&topic, partitions, 1, &[]);
                let t = Instant::now();
                let produced = cluster.produce(&ProduceSpec {
                    topic: &topic,
                    partitions,
                    count: records,
                    value_size,
                    compression,
                    ..ProduceSpec::default()
                });
                assert_eq!(
                    produced.produced, records,
                    "the producer wrote {produced:?}"
                );
                let keys: u64 = (0..records).map(|i| expected_key(i).len() as u64).sum();
                let case = Case {
                    value_size,
                    partitions,
                    compression,
                    topic,
                    records,
                    payload_bytes: keys + records * value_size as u64,
                };
                eprintln!(
                    "[compare] produced {records} records for {} in {:.1} s",
                    case.label(),
                    t.elapsed().as_secs_f64()
                );
                cases.push(case);
            }
        }
    }
    cases
}

/// A number no earlier call returned.
fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn self_command() -> Command {
    Command::new(std::env::current_exe().expect("the path of this program"))
}

fn java_command(extra_classpath: Option<&Path>) -> Command {
    let mut cmd = Command::new("java");
    cmd.args(JAVA_OPTS);
    let libs = format!("{}/*", kafka_libs().display());
    let classpath = match extra_classpath {
        Some(dir) => format!("{}:{libs}", dir.display()),
        None => libs,
    };
    cmd.arg("-cp").arg(classpath);
    cmd
}

/// Compiles `java/WakeupCommitLatency.java` against the Kafka client jar into
/// `<out>/java`.
fn compile_java(out: &Path) -> PathBuf {
    let dir = out.join("java");
    fs::create_dir_all(&dir).expect("java output folder");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("java/WakeupCommitLatency.java");
    let status = Command::new("javac")
        .arg("-cp")
        .arg(format!("{}/*", kafka_libs().display()))
        .arg("-d")
        .arg(&dir)
        .arg(&source)
        .status()
        .expect("cannot run javac");
    assert!(status.success(), "javac failed for {}", source.display());
    dir
}

/// Serves the broker fast reads of the uncompressed 100 B topics, alternating the raw fetch and
/// kafka-source, before anything is measured: at least [`Plan::broker_warmup_runs`], then on
/// until the broker's JIT compiler threads took less than [`JIT_QUIET_SECS`] of CPU over the
/// last [`JIT_QUIET_RUNS`] runs, or [`Plan::broker_warmup_max_runs`] runs were made. Without the
/// broker's process id (an external broker) the JIT cannot be watched: the minimum is run.
///
/// The broker's fetch path runs once per Fetch request, not per record, so its JVM compiles it
/// only after tens of thousands of requests: a 1,000,000-record run of 100 B records makes
/// about 115. Until then the C2 compiler thread takes up to 0.35 s of CPU per run, in bursts
/// that land on whichever client runs at the time, on a machine whose cores the clients share
/// with the broker. The warm-up round alone, one run per client and topic, does not get there.
fn warm_up_broker(
    plan: &Plan,
    cases: &[Case],
    bootstrap: &str,
    broker: Option<u32>,
    log: &Path,
) -> WarmUp {
    let topics: Vec<&Case> = cases
        .iter()
        .filter(|c| c.value_size == 100 && c.compression == Compression::None)
        .collect();
    let mut warmup = WarmUp::default();
    if topics.is_empty() || plan.broker_warmup_runs == 0 {
        return warmup;
    }
    let started = Instant::now();
    let names: Vec<(String, i32)> = topics
        .iter()
        .map(|c| (c.topic.clone(), c.partitions))
        .collect();
    match raw::start_up_round_trips(
        bootstrap,
        &names,
        "cmp-warm-up",
        plan.broker_warmup_start_ups,
        START_UP_WARMUP_BUDGET,
    ) {
        Ok(rounds) => warmup.start_ups = rounds,
        Err(e) => eprintln!("[compare] broker warm-up: start-up requests failed: {e}"),
    }
    let start_ups_took = started.elapsed();
    let mut failed = 0;
    // JIT CPU of each run so far.
    let mut jit = Vec::new();
    while warmup.runs < plan.broker_warmup_max_runs.max(plan.broker_warmup_runs) {
        if warmup.runs >= plan.broker_warmup_runs {
            let Some(last) = last_runs_jit(&jit) else {
                break; // nothing to watch
            };
            if last < JIT_QUIET_SECS {
                break;
            }
        }
        let i = warmup.runs;
        let client = if i % 2 == 0 {
            Client::Raw
        } else {
            Client::Ours
        };
        let case = topics[(i / 2) % topics.len()];
        let (run, took) = proc::cpu_during(broker, proc::jit_cpu_secs, || {
            run_throughput_child(client, case, bootstrap, log)
        });
        if run.is_none() {
            failed += 1;
        }
        if let Some(took) = took {
            jit.push(took);
        }
        warmup.runs += 1;
    }
    warmup.jit_last = last_runs_jit(&jit);
    eprintln!(
        "[compare] broker warm-up: {} rounds of start-up requests in {:.1} s, {} runs in {:.1} s ({failed} failed); JIT CPU over the last {JIT_QUIET_RUNS}: {}",
        warmup.start_ups,
        start_ups_took.as_secs_f64(),
        warmup.runs,
        (started.elapsed() - start_ups_took).as_secs_f64(),
        warmup
            .jit_last
            .map_or("not known".to_string(), |s| format!("{:.0} ms", s * 1e3))
    );
    warmup
}

/// Warms up the broker's OffsetCommit path before the commit-latency rounds: OffsetCommit
/// requests back to back on one connection (see [`raw::commit_round_trips`]), in chunks of
/// [`COMMIT_WARMUP_CHUNK`], at least [`COMMIT_WARMUP_MIN`] and more until the broker's JIT
/// compiler took less than [`JIT_QUIET_SECS`] of CPU during the last chunk, at most
/// [`COMMIT_WARMUP_MAX`] or [`COMMIT_WARMUP_BUDGET`]. The throughput runs commit nothing, so
/// without it the first few thousand commits of the rounds run in the broker's interpreter: on
/// a freshly started broker, the bare round trip at one commit per 20 ms had a median of 1.5 ms
/// over the first 150 commits, 0.85 ms after 12,000 and 0.58 ms after 32,000, where it stayed
/// through 100,000 more.
fn warm_up_commits(warmup: &mut WarmUp, bootstrap: &str, topic: &str, broker: Option<u32>) {
    let started = Instant::now();
    while warmup.commits < COMMIT_WARMUP_MAX && started.elapsed() < COMMIT_WARMUP_BUDGET {
        if warmup.commits >= COMMIT_WARMUP_MIN {
            match warmup.commits_jit_last {
                Some(jit) if jit < JIT_QUIET_SECS => break,
                None => break, // nothing to watch
                Some(_) => {}
            }
        }
        let (sent, took) = proc::cpu_during(broker, proc::jit_cpu_secs, || {
            raw::commit_round_trips(
                bootstrap,
                topic,
                "cmp-commit-warm-up",
                COMMIT_WARMUP_CHUNK,
                0,
                Duration::ZERO,
            )
        });
        if let Err(e) = sent {
            eprintln!("[compare] broker warm-up: OffsetCommit failed: {e}");
            break;
        }
        warmup.commits += COMMIT_WARMUP_CHUNK;
        warmup.commits_jit_last = took;
    }
    warmup.commits_secs = started.elapsed().as_secs_f64();
    eprintln!(
        "[compare] broker warm-up: {} OffsetCommits back to back in {:.1} s; JIT CPU over the last {COMMIT_WARMUP_CHUNK}: {}",
        warmup.commits,
        warmup.commits_secs,
        warmup
            .commits_jit_last
            .map_or("not known".to_string(), |s| format!("{:.0} ms", s * 1e3))
    );
}

/// OffsetCommits per chunk of the commit warm-up, the unit its JIT watch is taken over.
pub(crate) const COMMIT_WARMUP_CHUNK: u64 = 5_000;
/// The fewest OffsetCommits of the commit warm-up.
pub(crate) const COMMIT_WARMUP_MIN: u64 = 30_000;
/// The most OffsetCommits of the commit warm-up, quiet or not.
const COMMIT_WARMUP_MAX: u64 = 150_000;
/// The most time the commit warm-up may take.
const COMMIT_WARMUP_BUDGET: Duration = Duration::from_secs(90);

/// The most time the start-up requests of the broker's warm-up may take.
const START_UP_WARMUP_BUDGET: Duration = Duration::from_secs(60);

/// The broker's JIT counts as quiet once its compiler threads took less than this much CPU over
/// the last [`JIT_QUIET_RUNS`] warm-up runs.
const JIT_QUIET_SECS: f64 = 0.05;
pub(crate) const JIT_QUIET_RUNS: usize = 10;

/// JIT CPU over the last [`JIT_QUIET_RUNS`] runs, if that many were watched.
fn last_runs_jit(jit: &[f64]) -> Option<f64> {
    jit.len()
        .checked_sub(JIT_QUIET_RUNS)
        .map(|from| jit[from..].iter().sum())
}

/// What the broker's warm-up did.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WarmUp {
    /// Rounds of the requests a consumer sends before its first Fetch.
    pub(crate) start_ups: u64,
    pub(crate) runs: usize,
    /// The broker's JIT compiler CPU over the last [`JIT_QUIET_RUNS`] runs, in seconds (`None`
    /// if it could not be watched).
    pub(crate) jit_last: Option<f64>,
    /// OffsetCommits sent back to back before the commit-latency rounds.
    pub(crate) commits: u64,
    /// How long they took, in seconds.
    pub(crate) commits_secs: f64,
    /// The broker's JIT compiler CPU during the last [`COMMIT_WARMUP_CHUNK`] of them, in seconds
    /// (`None` if it could not be watched).
    pub(crate) commits_jit_last: Option<f64>,
}

/// kafka-source and the raw fetch back to back, [`Plan::pairs`] times on each uncompressed
/// 100 B topic, the order swapped from pair to pair: the runs the raw-fetch ceiling target is
/// judged by. In the rounds, the two runs of a round are separated by the other clients' runs
/// (seconds to tens of seconds each), and each lasts a fraction of a second, so one burst of
/// host or broker load decides a round; here each pair is two consecutive runs, and there are
/// many more of them. Each pair also has a run of kafka-source with `check.crcs=false`, next to
/// the two: the share of the gap to the ceiling that is the CRC check. It is reported beside
/// the pairs and judges nothing.
fn run_pairs(
    plan: &Plan,
    cases: &[Case],
    bootstrap: &str,
    broker: Option<u32>,
    log: &Path,
) -> Vec<ThroughputRun> {
    let mut runs = Vec::new();
    for (ci, case) in cases.iter().enumerate() {
        if case.value_size != 100 || case.compression != Compression::None {
            continue;
        }
        for pair in 0..plan.pairs {
            // kafka-source and the raw fetch swap places from pair to pair; the run without
            // CRC checks comes between or after them in turn.
            let order = match pair % 4 {
                0 => [Client::Raw, Client::Ours, Client::OursNoCrc],
                1 => [Client::Ours, Client::OursNoCrc, Client::Raw],
                2 => [Client::Raw, Client::OursNoCrc, Client::Ours],
                _ => [Client::OursNoCrc, Client::Ours, Client::Raw],
            };
            for client in order {
                let run = run_throughput(client, case, bootstrap, broker, log);
                eprintln!(
                    "[compare] pair {}/{} {:<16} {:<26} {}",
                    pair + 1,
                    plan.pairs,
                    case.label(),
                    client.label(),
                    run.as_ref().map_or("FAILED".to_string(), |r| format!(
                        "{:>10.0} records/s  cpu {:.3} s",
                        r.records_per_s, r.cpu_secs
                    ))
                );
                runs.push(ThroughputRun {
                    case: ci,
                    client,
                    round: pair,
                    run,
                });
            }
        }
    }
    runs
}

/// One throughput run of `client` on `case`. With the broker's process id, the broker's CPU
/// time during the run is measured too.
fn run_throughput(
    client: Client,
    case: &Case,
    bootstrap: &str,
    broker: Option<u32>,
    log: &Path,
) -> Option<Measured> {
    let ((measured, broker_jit_secs), broker_cpu) =
        proc::cpu_during(broker, proc::threads_cpu_secs, || {
            proc::cpu_during(broker, proc::jit_cpu_secs, || {
                run_throughput_child(client, case, bootstrap, log)
            })
        });
    Some(Measured {
        broker_cpu_per_million: broker_cpu.map(|c| case.per_million(c)),
        broker_jit_secs,
        ..measured?
    })
}

fn run_throughput_child(
    client: Client,
    case: &Case,
    bootstrap: &str,
    log: &Path,
) -> Option<Measured> {
    let timeout = child::CHILD_DEADLINE + Duration::from_secs(30);
    // (run, records, first record s, records/s after the first record, elapsed s)
    type Parsed = (ChildRun, u64, Option<f64>, Option<f64>, f64);
    let (run, records, first, steady, elapsed): Parsed = if client == Client::Java {
        let mut cmd = java_command(None);
        cmd.arg("org.apache.kafka.tools.ConsumerPerformance").args([
            "--bootstrap-server",
            bootstrap,
            "--topic",
            &case.topic,
            "--messages",
            &case.records.to_string(),
            // A group of its own: a new member of a group whose last member has not left yet
            // would wait up to the session timeout to join.
            "--group",
            &format!("cmp-perf-{}-{}", std::process::id(), next_id()),
            "--timeout",
            "60000",
        ]);
        let run = proc::run(cmd, log, timeout);
        // start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec,
        // rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec
        let fields: Option<Vec<String>> = run
            .stdout
            .lines()
            .rfind(|l| l.contains(", ") && !l.starts_with("start.time"))
            .map(|l| l.split(", ").map(|f| f.trim().to_string()).collect());
        let Some(fields) = fields.filter(|f| f.len() >= 10) else {
            eprintln!(
                "[compare] unexpected ConsumerPerformance output:\n{}",
                run.stdout
            );
            return None;
        };
        let records = fields[4].parse().ok()?;
        let fetch_ms: f64 = fields[7].parse().ok()?;
        (run, records, None, None, fetch_ms / 1e3)
    } else {
        let mut cmd = self_command();
        cmd.args(["child", client.child_kind(), bootstrap, &case.topic])
            .arg(case.partitions.to_string())
            .arg(case.records.to_string());
        let run = proc::run(cmd, log, timeout);
        let records: u64 = run.get("records")?.parse().ok()?;
        let elapsed: f64 = run.get("elapsed_s")?.parse().ok()?;
        let first = run.get("first_s").and_then(|v| v.parse().ok());
        // Without the start-up: records over the time after the first record arrived.
        let steady = first
            .filter(|&f: &f64| elapsed > f)
            .map(|f| records as f64 / (elapsed - f));
        (run, records, first, steady, elapsed)
    };
    if !run.ok || records < case.records || elapsed <= 0.0 {
        eprintln!(
            "[compare] {} on {}: ok={} records={records} elapsed={elapsed}",
            client.label(),
            case.label(),
            run.ok
        );
        return None;
    }
    Some(Measured {
        records_per_s: case.records as f64 / elapsed,
        mb_per_s: case.payload_bytes as f64 / elapsed / 1e6,
        after_first_per_s: steady,
        first_ms: first.map(|s| s * 1e3),
        cpu_secs: run.cpu_secs,
        cpu_per_million: case.per_million(run.cpu_secs),
        broker_cpu_per_million: None,
        broker_jit_secs: None,
        peak_rss: run.peak_rss,
    })
}

/// One throughput run's figures.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Measured {
    /// Records per second from creating the client to the last record (for the Java tool, its
    /// own `fetch.time.ms`).
    pub(crate) records_per_s: f64,
    pub(crate) mb_per_s: f64,
    /// Records per second from the first record to the last (not known for the Java tool).
    pub(crate) after_first_per_s: Option<f64>,
    /// From creating the client to the first record (not known for the Java tool).
    pub(crate) first_ms: Option<f64>,
    pub(crate) cpu_secs: f64,
    pub(crate) cpu_per_million: f64,
    /// The broker's CPU time (all its threads) during the run, from starting the client to its
    /// exit, per million records; `None` for an external broker.
    pub(crate) broker_cpu_per_million: Option<f64>,
    /// CPU time of the broker's JIT compiler threads during the run, in seconds; `None` for an
    /// external broker.
    pub(crate) broker_jit_secs: Option<f64>,
    pub(crate) peak_rss: u64,
}

fn run_latency(
    client: Client,
    bootstrap: &str,
    topic: &str,
    group: &str,
    plan: &Plan,
    java_dir: &Path,
    log: &Path,
) -> Option<LatencyRun> {
    let args = [
        bootstrap.to_string(),
        topic.to_string(),
        group.to_string(),
        plan.commits.to_string(),
        plan.commit_warmup.to_string(),
    ];
    let cmd = if client == Client::Java {
        let mut cmd = java_command(Some(java_dir));
        cmd.arg("WakeupCommitLatency").args(&args);
        cmd
    } else {
        let mut cmd = self_command();
        let kind = if client == Client::RawCommit {
            "raw-commit"
        } else {
            "ours-latency"
        };
        cmd.args(["child", kind]).args(&args);
        cmd
    };
    let run = proc::run(cmd, log, Duration::from_secs(300));
    let mut micros: Vec<u64> = run
        .get("lat_us")?
        .split(',')
        .filter_map(|v| v.parse().ok())
        .collect();
    if !run.ok || micros.len() as u64 != plan.commits {
        eprintln!(
            "[compare] latency run of {} failed (ok={}, {} latencies)",
            client.label(),
            run.ok,
            micros.len()
        );
        return None;
    }
    micros.sort_unstable();
    let pct = |p: f64| {
        let i = ((micros.len() as f64 * p).ceil() as usize).clamp(1, micros.len()) - 1;
        micros[i] as f64 / 1e3
    };
    Some(LatencyRun {
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        max_ms: pct(1.0),
        parked_at_ack: run.get("parked_at_ack").and_then(|v| v.parse().ok()),
        commits: micros.len(),
        peak_rss: run.peak_rss,
    })
}

fn run_slow(case: &Case, bootstrap: &str, plan: &Plan, log: &Path) -> Option<SlowRun> {
    let mut cmd = self_command();
    cmd.args(["child", "ours-slow", bootstrap, &case.topic])
        .arg(case.partitions.to_string())
        .arg(plan.slow_budget.to_string())
        .arg(plan.slow_seconds.to_string())
        .arg(SLOW_MICROS_PER_RECORD.to_string());
    let run = proc::run(cmd, log, Duration::from_secs(120));
    let records: f64 = run.get("records")?.parse().ok()?;
    let elapsed: f64 = run.get("elapsed_s")?.parse().ok()?;
    if !run.ok || elapsed <= 0.0 {
        return None;
    }
    Some(SlowRun {
        peak_rss: run.peak_rss,
        records_per_s: records / elapsed,
    })
}
