//! The report: medians, min–max and ratios as markdown, every run as CSV, and PNG plots.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use plotters::prelude::*;

use crate::{
    COMMIT_WARMUP_CHUNK, COMMIT_WARMUP_MIN, Case, Client, JIT_QUIET_RUNS, LATENCY_CLIENTS,
    Measured, Plan, WarmUp, latency_label,
};

const MIB: f64 = (1u64 << 20) as f64;

/// kafka-source's own CPU, in cores busy over its run, from which the report says that its
/// rate was bound by its own work running on one core rather than by the machine.
const SERIAL_BUSY: f64 = 0.5;

/// The machine the run was on.
#[derive(Debug, Clone)]
pub(crate) struct Machine {
    date: String,
    cores: usize,
    cpu: String,
    ram: String,
    load_before: String,
    load_after: String,
}

impl Machine {
    pub(crate) fn read() -> Machine {
        let date = Command::new("date")
            .args(["-u", "+%Y-%m-%d %H:%M UTC"])
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .unwrap_or_default()
            .trim()
            .to_string();
        let cpu = fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("model name"))
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_string())
            })
            .unwrap_or_else(|| "unknown CPU".into());
        let ram = fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|s| {
                let kib: f64 = s
                    .lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))?
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse()
                    .ok()?;
                Some(format!("{:.1} GiB", kib / MIB))
            })
            .unwrap_or_else(|| "unknown".into());
        Machine {
            date,
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu,
            ram,
            load_before: load_average(),
            load_after: String::new(),
        }
    }

    pub(crate) fn finish(&mut self) {
        self.load_after = load_average();
    }
}

fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// One measured throughput run (`None` if it failed).
#[derive(Debug, Clone)]
pub(crate) struct ThroughputRun {
    pub(crate) case: usize,
    pub(crate) client: Client,
    /// The measured round (from 0) the run belongs to.
    pub(crate) round: usize,
    pub(crate) run: Option<Measured>,
}

/// One commit-latency run's percentiles.
#[derive(Debug, Clone)]
pub(crate) struct LatencyRun {
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) max_ms: f64,
    /// kafka-source only: acknowledgements that arrived while the parked fetch was still out.
    pub(crate) parked_at_ack: Option<i64>,
    pub(crate) commits: usize,
    pub(crate) peak_rss: u64,
}

/// One slow-application run.
#[derive(Debug, Clone)]
pub(crate) struct SlowRun {
    pub(crate) peak_rss: u64,
    pub(crate) records_per_s: f64,
}

/// Everything measured.
#[derive(Debug)]
pub(crate) struct Report {
    pub(crate) plan: Plan,
    pub(crate) machine: Machine,
    pub(crate) cases: Vec<Case>,
    pub(crate) throughput: Vec<ThroughputRun>,
    /// kafka-source and the raw fetch back to back on the uncompressed 100 B topics.
    pub(crate) pairs: Vec<ThroughputRun>,
    pub(crate) latency: Vec<(Client, Option<LatencyRun>)>,
    pub(crate) slow: Vec<Option<SlowRun>>,
    pub(crate) slow_case_label: String,
    pub(crate) slow_budget: u64,
    pub(crate) slow_micros_per_record: u64,
    pub(crate) broker_properties: Vec<String>,
    pub(crate) warmup: WarmUp,
    pub(crate) took: Duration,
}

/// Median, min and max.
#[derive(Debug, Clone, Copy)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

fn spread(values: impl IntoIterator<Item = f64>) -> Option<Spread> {
    let mut v: Vec<f64> = values.into_iter().collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some(Spread {
        median,
        min: v[0],
        max: v[n - 1],
    })
}

/// `1,234,567`.
fn grouped(x: f64) -> String {
    let s = format!("{:.0}", x.max(0.0));
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn with_range(s: Spread, fmt: impl Fn(f64) -> String) -> String {
    if s.min == s.max {
        fmt(s.median)
    } else {
        format!("{} ({}–{})", fmt(s.median), fmt(s.min), fmt(s.max))
    }
}

/// The measured runs of `client` on `case` among `set`.
fn runs_in(set: &[ThroughputRun], case: usize, client: Client) -> Vec<Measured> {
    set.iter()
        .filter(|r| r.case == case && r.client == client)
        .filter_map(|r| r.run)
        .collect()
}

/// Records per second of `client` on `case` among `set`.
fn rate_in(set: &[ThroughputRun], case: usize, client: Client) -> Option<Spread> {
    spread(runs_in(set, case, client).iter().map(|m| m.records_per_s))
}

/// kafka-source's rate divided by `peer`'s, run against run of the same round (or pair) among
/// `set`; rounds where either run failed are left out.
fn paired_in(set: &[ThroughputRun], case: usize, peer: Client) -> Option<Spread> {
    paired_of(set, case, Client::Ours, peer)
}

/// `client`'s rate divided by `peer`'s, as [`paired_in`].
fn paired_of(set: &[ThroughputRun], case: usize, client: Client, peer: Client) -> Option<Spread> {
    let rate = |client: Client, round: usize| {
        set.iter()
            .find(|r| r.case == case && r.client == client && r.round == round)
            .and_then(|r| r.run)
            .map(|m| m.records_per_s)
    };
    let rounds = set.iter().map(|r| r.round).max()?;
    spread((0..=rounds).filter_map(|round| Some(rate(client, round)? / rate(peer, round)?)))
}

/// `fraction` (0.07 for 7 %) as the report's prose gives a shortfall or a margin: in whole
/// percents, but with one decimal below 1 %, so that a shortfall of 0.4 % does not read as
/// "0 %", and "under 0.1 %" below that.
fn percent(fraction: f64) -> String {
    let p = fraction * 100.0;
    if p.abs() < 0.05 {
        "under 0.1 %".to_owned()
    } else if p.abs() < 1.0 {
        format!("{p:.1} %")
    } else {
        format!("{p:.0} %")
    }
}

/// A throughput target's verdict: met only if both the ratio of the medians and the median of
/// the paired ratios reach `want`.
fn verdict(ours: Spread, peer: Spread, by_pair: Spread, want: f64, pairs: &str) -> String {
    let ratio = ours.median / peer.median;
    let shown = format!(
        "{ratio:.2}× (medians), {} {pairs}",
        with_range(by_pair, |x| format!("{x:.2}×"))
    );
    let worst = ratio.min(by_pair.median);
    if worst >= want {
        format!("{shown}: met")
    } else {
        format!(
            "{shown}: missed by {} (kafka-source needs {:.2}× its rate)",
            percent((want - worst) / want),
            want / worst
        )
    }
}

impl Report {
    fn runs(&self, case: usize, client: Client) -> Vec<Measured> {
        runs_in(&self.throughput, case, client)
    }

    fn failed(&self, case: usize, client: Client) -> usize {
        self.throughput
            .iter()
            .filter(|r| r.case == case && r.client == client && r.run.is_none())
            .count()
    }

    /// Measured runs of any kind (throughput, back-to-back pairs, commit latency, slow
    /// application) that failed.
    pub(crate) fn failed_runs(&self) -> usize {
        self.throughput.iter().filter(|r| r.run.is_none()).count()
            + self.pairs.iter().filter(|r| r.run.is_none()).count()
            + self.latency.iter().filter(|(_, r)| r.is_none()).count()
            + self.slow.iter().filter(|r| r.is_none()).count()
    }

    /// How much CPU the broker's JIT compiler threads took during the measured throughput runs,
    /// and in which run the most; `None` if they could not be watched.
    fn jit_line(&self) -> Option<String> {
        let watched: Vec<(&ThroughputRun, f64)> = self
            .throughput
            .iter()
            .filter_map(|r| Some((r, r.run?.broker_jit_secs?)))
            .collect();
        let (worst, most) = watched
            .iter()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|&(r, secs)| (r, secs))?;
        let total: f64 = watched.iter().map(|(_, secs)| secs).sum();
        Some(format!(
            "The broker's JIT compiler threads took {:.0} ms of CPU during these {} runs, at most \
             {:.0} ms in one ({}, {}).",
            total * 1e3,
            watched.len(),
            most * 1e3,
            self.cases[worst.case].label(),
            worst.client.label()
        ))
    }

    fn rate(&self, case: usize, client: Client) -> Option<Spread> {
        rate_in(&self.throughput, case, client)
    }

    /// kafka-source's rate divided by `peer`'s, round by round: each ratio compares two runs of
    /// the same round, so a burst of broker or host load that lands on some rounds moves these
    /// ratios less than it moves either median.
    fn paired(&self, case: usize, peer: Client) -> Option<Spread> {
        paired_in(&self.throughput, case, peer)
    }

    /// The back-to-back pairs' section: one row per topic that has pairs.
    fn pairs_section(&self) -> String {
        let mut s = String::new();
        let cases: Vec<usize> = (0..self.cases.len())
            .filter(|&ci| self.pairs.iter().any(|r| r.case == ci))
            .collect();
        if cases.is_empty() {
            return s;
        }
        let _ = writeln!(
            s,
            "\n## kafka-source against the raw-fetch ceiling, back to back\n"
        );
        let _ = writeln!(
            s,
            "After the rounds, kafka-source and the raw fetch read each uncompressed 100 B topic \
             in {} pairs of consecutive runs, the order swapped from pair to pair. A run there \
             lasts a fraction of a second, so in the rounds above, where other clients' runs of \
             seconds come between the two, one burst of host or broker load decides a round; the \
             ceiling target is judged by these pairs. \"pair by pair\" is the median (min–max) \
             of each pair's ratio. CPU and broker CPU as above (medians).\n",
            self.plan.pairs
        );
        let _ = writeln!(
            s,
            "| topic | kafka-source records/s | raw fetch records/s | ratio of medians | pair by pair | CPU s / M: kafka-source, raw | broker CPU s / M serving kafka-source, raw |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|");
        for &ci in &cases {
            let (Some(ours), Some(raw), Some(by_pair)) = (
                rate_in(&self.pairs, ci, Client::Ours),
                rate_in(&self.pairs, ci, Client::Raw),
                paired_in(&self.pairs, ci, Client::Raw),
            ) else {
                let _ = writeln!(s, "| {} | failed | | | | | |", self.cases[ci].label());
                continue;
            };
            let cpu = |client: Client, f: &dyn Fn(&Measured) -> Option<f64>| {
                spread(runs_in(&self.pairs, ci, client).iter().filter_map(f))
                    .map_or("n/a".to_string(), |x| format!("{:.3}", x.median))
            };
            let own = |m: &Measured| Some(m.cpu_per_million);
            let broker = |m: &Measured| m.broker_cpu_per_million;
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.2}× | {} | {}, {} | {}, {} |",
                self.cases[ci].label(),
                with_range(ours, grouped),
                with_range(raw, grouped),
                ours.median / raw.median,
                with_range(by_pair, |x| format!("{x:.2}×")),
                cpu(Client::Ours, &own),
                cpu(Client::Raw, &own),
                cpu(Client::Ours, &broker),
                cpu(Client::Raw, &broker),
            );
        }
        s.push_str(&self.no_crc_section(&cases));
        s
    }

    /// kafka-source without the CRC check, from the same back-to-back runs: how much of the
    /// gap to the ceiling the check accounts for.
    fn no_crc_section(&self, cases: &[usize]) -> String {
        let mut s = String::new();
        if !self.pairs.iter().any(|r| r.client == Client::OursNoCrc) {
            return s;
        }
        let _ = writeln!(
            s,
            "\nEach pair also ran kafka-source with `check.crcs=false` next to the two runs \
             (the order rotating), to show how much of the gap to the ceiling is the CRC-32C \
             check; it judges no target. Ratios are pair by pair, median (min–max).\n"
        );
        let _ = writeln!(
            s,
            "| topic | check.crcs=false records/s | against the raw fetch | against kafka-source with CRCs | CPU s / M, check.crcs=false |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|");
        for &ci in cases {
            let (Some(rate), Some(to_raw), Some(to_ours)) = (
                rate_in(&self.pairs, ci, Client::OursNoCrc),
                paired_of(&self.pairs, ci, Client::OursNoCrc, Client::Raw),
                paired_of(&self.pairs, ci, Client::OursNoCrc, Client::Ours),
            ) else {
                let _ = writeln!(s, "| {} | failed | | | |", self.cases[ci].label());
                continue;
            };
            let cpu = spread(
                runs_in(&self.pairs, ci, Client::OursNoCrc)
                    .iter()
                    .map(|m| m.cpu_per_million),
            )
            .map_or("n/a".to_string(), |x| format!("{:.3}", x.median));
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {cpu} |",
                self.cases[ci].label(),
                with_range(rate, grouped),
                with_range(to_raw, |x| format!("{x:.2}×")),
                with_range(to_ours, |x| format!("{x:.2}×")),
            );
        }
        s
    }

    fn latency_of(&self, client: Client) -> Vec<&LatencyRun> {
        self.latency
            .iter()
            .filter(|(c, _)| *c == client)
            .filter_map(|(_, r)| r.as_ref())
            .collect()
    }

    /// Writes `report.md`, `runs.csv` and the plots into `out`; returns the markdown, or what
    /// could not be written.
    pub(crate) fn write(&self, out: &Path) -> Result<String, String> {
        let md = self.markdown();
        for (name, text) in [("report.md", md.as_str()), ("runs.csv", &self.csv())] {
            let path = out.join(name);
            fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
        self.plots(out)
            .map_err(|e| format!("plots not drawn: {e}"))?;
        Ok(md)
    }

    fn markdown(&self) -> String {
        let m = &self.machine;
        let p = &self.plan;
        let mut s = String::new();
        let _ = writeln!(s, "# kafka-source compared with other Kafka consumers\n");
        let _ = writeln!(
            s,
            "Run {} ({} mode, {:.1} min): {} cores ({}), {} RAM; load average {} before and {} after \
             (1, 5, 15 min). One Apache Kafka 4.1.2 broker started by the test harness on loopback, \
             with {}. Broker and consumer share the cores.\n",
            m.date,
            if p.quick { "quick" } else { "full" },
            self.took.as_secs_f64() / 60.0,
            m.cores,
            m.cpu,
            m.ram,
            m.load_before,
            m.load_after,
            self.broker_properties.join(", ")
        );
        let _ = writeln!(
            s,
            "Command: `cargo run --release --manifest-path benches/compare/Cargo.toml --{} --reps {} --warmups {}`\n",
            if p.quick { " --quick" } else { "" },
            p.reps,
            p.warmups
        );

        // Throughput.
        let _ = writeln!(s, "## Consume throughput\n");
        let _ = writeln!(
            s,
            "Each client consumes the whole topic from offset 0 in its own process ({} records of \
             100 B, {} of 1 KiB; keys are the record numbers in decimal). Median (min–max) over {} \
             run(s) after {} warm-up round(s), which came after {} rounds of the requests a \
             consumer sends before its first Fetch (ApiVersions, Metadata, ListOffsets, \
             FindCoordinator, OffsetFetch; each client sends them once per run, so without these \
             the broker would still interpret them while it runs the Fetch path compiled) and {} \
             runs of the raw fetch and kafka-source on the uncompressed 100 B topics, which warm \
             up the broker's JIT ({}); rounds \
             go over all topics, and the clients' order rotates from round to round. records/s and \
             MB/s run from creating the client to the last record (for the Java tool, its own \
             `fetch.time.ms`, which leaves out its group join but includes its first fetch). \
             \"first record\" is the time from creating the client to the first record; \"after \
             the first\" divides all records by the time from the first record to the last, which \
             leaves out start-up but flatters a client that fetches much before handing out its \
             first record (rskafka asks for up to 50 MiB per partition). MB/s are of key + value \
             bytes. CPU is user + system time of the client's process (all threads, start-up \
             included) per million records; broker CPU is the broker's (all its threads) from \
             starting the client to its exit, per million records (n/a for an external broker). \
             Peak RSS is the client's `VmHWM`. Columns after the ratio are medians. Each client \
             runs with its defaults and commits nothing.\n",
            grouped(p.records_small as f64),
            grouped(p.records_large as f64),
            p.reps,
            p.warmups,
            grouped(self.warmup.start_ups as f64),
            self.warmup.runs,
            self.warmup.jit_last.map_or_else(
                || "its compiler threads could not be watched".to_string(),
                |secs| format!(
                    "its compiler threads took {:.0} ms of CPU over the last {JIT_QUIET_RUNS} of them",
                    secs * 1e3
                )
            ),
        );
        let _ = writeln!(
            s,
            "| topic | client | records/s | MB/s | kafka-source ÷ client | first record ms | records/s after the first | CPU s / M records | broker CPU s / M records | peak RSS MiB |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
        for (ci, case) in self.cases.iter().enumerate() {
            let ours = self.rate(ci, Client::Ours);
            for client in Client::ALL {
                let runs = self.runs(ci, client);
                let failed = self.failed(ci, client);
                let failed_note = if failed > 0 {
                    format!(" ({failed} failed)")
                } else {
                    String::new()
                };
                let Some(rate) = spread(runs.iter().map(|r| r.records_per_s)) else {
                    let _ = writeln!(
                        s,
                        "| {} | {} | failed{failed_note} | | | | | | | |",
                        case.label(),
                        client.label()
                    );
                    continue;
                };
                let median = |f: &dyn Fn(&Measured) -> f64| {
                    spread(runs.iter().map(f)).map_or(f64::NAN, |x| x.median)
                };
                let first = spread(runs.iter().filter_map(|r| r.first_ms))
                    .map_or("n/a".to_string(), |x| format!("{:.0}", x.median));
                let broker = spread(runs.iter().filter_map(|r| r.broker_cpu_per_million))
                    .map_or("n/a".to_string(), |x| format!("{:.2}", x.median));
                let ratio = match (client, ours) {
                    (Client::Ours, _) => "1".to_string(),
                    (_, Some(o)) => format!("{:.2}", o.median / rate.median),
                    _ => String::new(),
                };
                let _ = writeln!(
                    s,
                    "| {} | {} | {}{failed_note} | {:.1} | {ratio} | {first} | {} | {:.2} | {broker} | {:.0} |",
                    case.label(),
                    client.label(),
                    with_range(rate, grouped),
                    median(&|r| r.mb_per_s),
                    spread(runs.iter().filter_map(|r| r.after_first_per_s))
                        .map_or("n/a".to_string(), |x| grouped(x.median)),
                    median(&|r| r.cpu_per_million),
                    median(&|r| r.peak_rss as f64 / MIB),
                );
            }
        }
        if let Some(jit) = self.jit_line() {
            let _ = writeln!(s, "\n{jit}");
        }
        let _ = writeln!(
            s,
            "\nThe raw-fetch ceiling reads only batch headers: on lz4 topics it decompresses \
             nothing, so there it bounds the transfer, not the decoding. Its MB/s are computed \
             from the same key + value bytes as the others'."
        );
        s.push_str(&self.pairs_section());

        // Commit latency.
        let _ = writeln!(s, "\n## Commit latency with a parked fetch\n");
        let _ = writeln!(
            s,
            "From checkpoint completion to the broker's acknowledgement of the commit, while the \
             only partition's fetch waits on the broker (empty topic, `fetch.max.wait.ms` = 5 s); \
             one commit every 20 ms or so, {} per run after {} warm-up commits, {} run(s) per \
             client after {} warm-up round(s), interleaved. kafka-source: \
             `notify_checkpoint_complete` to the `commit_outcomes()` entry. Java: the offsets are \
             put in an atomic reference and `wakeup()` is called; the consumer thread, thrown out \
             of `poll(100 ms)`, calls `commitAsync`, and the time is taken when its callback runs \
             (the pattern of Flink's legacy `KafkaConsumerThread`). Raw OffsetCommit: the \
             broker's round trip alone, one blocking connection to the coordinator sending \
             OffsetCommit v8 every 20 ms, no fetch and no client machinery: the floor under any \
             client's figure. Median (min–max) over runs of each run's percentile. Before these \
             rounds the broker handled {} OffsetCommits back to back in {:.1} s (at least {}, \
             and more until its JIT compiler is quiet): {}.\n",
            p.commits,
            p.commit_warmup,
            p.reps,
            p.warmups,
            grouped(self.warmup.commits as f64),
            self.warmup.commits_secs,
            grouped(COMMIT_WARMUP_MIN as f64),
            self.warmup.commits_jit_last.map_or_else(
                || "its compiler threads could not be watched".to_string(),
                |secs| format!(
                    "its compiler threads took {:.0} ms of CPU during the last {}",
                    secs * 1e3,
                    grouped(COMMIT_WARMUP_CHUNK as f64)
                )
            ),
        );
        let _ = writeln!(
            s,
            "| client | p50 ms | p99 ms | max ms | peak RSS MiB | fetch still parked at ack |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|");
        for client in LATENCY_CLIENTS {
            let runs = self.latency_of(client);
            let (Some(p50), Some(p99), Some(max), Some(rss)) = (
                spread(runs.iter().map(|r| r.p50_ms)),
                spread(runs.iter().map(|r| r.p99_ms)),
                spread(runs.iter().map(|r| r.max_ms)),
                spread(runs.iter().map(|r| r.peak_rss as f64 / MIB)),
            ) else {
                let _ = writeln!(s, "| {} | failed | | | | |", latency_label(client));
                continue;
            };
            let parked: Vec<i64> = runs.iter().filter_map(|r| r.parked_at_ack).collect();
            let parked = if client == Client::RawCommit {
                "no fetch".to_string()
            } else if parked.is_empty() || parked.iter().any(|&x| x < 0) {
                "not observable".to_string()
            } else {
                let commits: usize = runs.iter().map(|r| r.commits).sum();
                format!("{} of {commits}", parked.iter().sum::<i64>())
            };
            let ms = |x: f64| format!("{x:.2}");
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {parked} |",
                latency_label(client),
                with_range(p50, ms),
                with_range(p99, ms),
                with_range(max, ms),
                with_range(rss, |x| format!("{x:.0}")),
            );
        }

        // Slow application.
        let _ = writeln!(s, "\n## kafka-source's memory with a slow application\n");
        let slow: Vec<&SlowRun> = self.slow.iter().flatten().collect();
        let _ = writeln!(
            s,
            "kafka-source reads the {} topic with `buffer.max.bytes` = {} MiB while the \
             application sleeps {} µs per record, so fetched data piles up to the budget; \
             {} run(s) of {:.0} s after {} warm-up run(s).\n",
            self.slow_case_label,
            self.slow_budget as f64 / MIB,
            self.slow_micros_per_record,
            self.plan.reps,
            self.plan.slow_seconds,
            self.plan.warmups
        );
        let rss = spread(slow.iter().map(|r| r.peak_rss as f64 / MIB));
        let rate = spread(slow.iter().map(|r| r.records_per_s));
        let _ = writeln!(
            s,
            "| budget MiB | peak RSS MiB | target (budget + 32 MiB) | records/s consumed |"
        );
        let _ = writeln!(s, "|---|---|---|---|");
        match (rss, rate) {
            (Some(rss), Some(rate)) => {
                let _ = writeln!(
                    s,
                    "| {:.0} | {} | {:.0} | {} |",
                    self.slow_budget as f64 / MIB,
                    with_range(rss, |x| format!("{x:.1}")),
                    self.slow_budget as f64 / MIB + 32.0,
                    with_range(rate, grouped)
                );
            }
            _ => {
                let _ = writeln!(s, "| {} | failed | | |", self.slow_budget as f64 / MIB);
            }
        }

        let _ = writeln!(s, "\n## Targets (reported, not asserted)\n");
        let _ = writeln!(
            s,
            "A throughput target is met only if both the ratio of the medians and the median of \
             the paired ratios reach it: for the raw-fetch ceiling, kafka-source's run against \
             the ceiling's run of the same back-to-back pair (where there are pairs); for the \
             others, against the peer's run of the same round.\n"
        );
        s.push_str(&self.targets());
        let _ = writeln!(
            s,
            "\nPlots: `target/compare/throughput.png`, `cpu.png`, `rss.png`, `latency.png`; every \
             run: `target/compare/runs.csv`."
        );
        s
    }

    fn targets(&self) -> String {
        let mut s = String::new();
        for (ci, case) in self.cases.iter().enumerate() {
            if case.value_size != 100 || case.compression != protocol_tests::Compression::None {
                continue;
            }
            for (peer, want, what) in [
                (Client::RdkafkaBase, 1.25, "≥ 1.25× rdkafka BaseConsumer"),
                (Client::Raw, 0.90, "≥ 90 % of the raw-fetch ceiling"),
            ] {
                // The ceiling is judged by the back-to-back pairs where there are any.
                let by_pairs = peer == Client::Raw && self.pairs.iter().any(|r| r.case == ci);
                let (set, how) = if by_pairs {
                    (&self.pairs, "pair by pair, back to back")
                } else {
                    (&self.throughput, "round by round")
                };
                let line = match (
                    rate_in(set, ci, Client::Ours),
                    rate_in(set, ci, peer),
                    paired_in(set, ci, peer),
                ) {
                    (Some(o), Some(p), Some(by_pair)) => verdict(o, p, by_pair, want, how),
                    _ => "not measured (a run failed)".to_string(),
                };
                let _ = writeln!(s, "- throughput, {}: {what}: {line}", case.label());
                if peer == Client::Raw {
                    if let (true, Some(o), Some(p), Some(by_round)) = (
                        by_pairs,
                        self.rate(ci, Client::Ours),
                        self.rate(ci, peer),
                        self.paired(ci, peer),
                    ) {
                        let _ = writeln!(
                            s,
                            "  - in the rounds: {:.2}× (medians), {} round by round",
                            o.median / p.median,
                            with_range(by_round, |x| format!("{x:.2}×"))
                        );
                    }
                    if let Some(budget) = self.cpu_budget(set, ci, want) {
                        let _ = writeln!(s, "  - {budget}");
                    }
                }
            }
        }
        let ours = spread(self.latency_of(Client::Ours).iter().map(|r| r.p99_ms));
        let java = spread(self.latency_of(Client::Java).iter().map(|r| r.p99_ms));
        match ours {
            Some(o) if o.median <= 2.0 => {
                let _ = writeln!(s, "- commit latency p99 ≤ 2 ms: {:.2} ms: met", o.median);
            }
            Some(o) => {
                let floor = spread(self.latency_of(Client::RawCommit).iter().map(|r| r.p99_ms))
                    .map_or("not measured".to_string(), |f| {
                        format!("{:.2} ms", f.median)
                    });
                let _ = writeln!(
                    s,
                    "- commit latency p99 ≤ 2 ms: {:.2} ms: missed by {:.2} ms (the broker's own \
                     OffsetCommit round trip, p99: {floor})",
                    o.median,
                    o.median - 2.0
                );
            }
            None => {
                let _ = writeln!(s, "- commit latency p99 ≤ 2 ms: not measured");
            }
        }
        if let (Some(o), Some(j)) = (ours, java) {
            let verdict = if o.median < j.median {
                "met".to_string()
            } else {
                format!("missed by {:.2} ms", o.median - j.median)
            };
            let _ = writeln!(
                s,
                "- commit latency p99 below the Java wakeup pattern's: {:.2} ms vs {:.2} ms: {verdict}",
                o.median, j.median
            );
        }
        let limit = self.slow_budget as f64 / MIB + 32.0;
        match spread(self.slow.iter().flatten().map(|r| r.peak_rss as f64 / MIB)) {
            Some(r) if r.max <= limit => {
                let _ = writeln!(
                    s,
                    "- peak RSS with a slow application ≤ budget + 32 MiB ({limit:.0} MiB): {:.1} MiB at most: met",
                    r.max
                );
            }
            Some(r) => {
                let _ = writeln!(
                    s,
                    "- peak RSS with a slow application ≤ budget + 32 MiB ({limit:.0} MiB): {:.1} MiB at most: missed by {:.1} MiB",
                    r.max,
                    r.max - limit
                );
            }
            None => {
                let _ = writeln!(s, "- peak RSS with a slow application: not measured");
            }
        }
        s
    }

    /// What kafka-source and the broker together would need of the machine's cores to read
    /// `case` at `share` of the raw-fetch ceiling's rate, from the medians (among `set`) of the CPU
    /// both used per record; `None` without broker CPU figures. Where that is more than the
    /// machine has, no overlap of the two can meet the target at that CPU cost, and the line
    /// says how much CPU per record kafka-source would have to shed. Where the machine had room
    /// but kafka-source alone kept most of one core busy, it says so and how much it would
    /// have to shed at that share of a core.
    fn cpu_budget(&self, set: &[ThroughputRun], case: usize, share: f64) -> Option<String> {
        // The broker's JIT compiler is left out: it compiles once, not per record.
        let cpu = |client: Client| -> Option<(f64, f64)> {
            let runs = runs_in(set, case, client);
            let own = spread(runs.iter().map(|r| r.cpu_per_million))?.median;
            let broker = spread(runs.iter().filter_map(|r| {
                let jit = self.cases[case].per_million(r.broker_jit_secs.unwrap_or(0.0));
                Some(r.broker_cpu_per_million? - jit)
            }))?
            .median;
            Some((own, broker))
        };
        let (ours, ours_broker) = cpu(Client::Ours)?;
        let (raw, raw_broker) = cpu(Client::Raw)?;
        let ceiling = rate_in(set, case, Client::Raw)?.median;
        let target = share * ceiling;
        let ours_rate = rate_in(set, case, Client::Ours)?.median;
        let cores = self.machine.cores as f64;
        let at_target = (ours + ours_broker) * target / 1e6;
        let at_ours = (ours + ours_broker) * ours_rate / 1e6;
        let raw_busy = (raw + raw_broker) * ceiling / 1e6;
        let mut line = format!(
            "CPU per million records: kafka-source {ours:.3} s and the broker {ours_broker:.3} s \
             while serving it; the raw client {raw:.3} s and the broker {raw_broker:.3} s (the \
             broker's without its JIT compiler threads). At {:.0} % \
             of the ceiling's rate kafka-source and the broker would keep {at_target:.2} cores \
             busy (the raw client and the broker keep {raw_busy:.2} busy at its full rate); at \
             kafka-source's own rate they keep {at_ours:.2} busy. The machine has {}",
            share * 100.0,
            self.machine.cores
        );
        if cores > 0.0 && at_target > cores && raw_busy > cores {
            // The ceiling itself cannot have used more than the machine: per-record CPU that
            // says so counts work outside the timed runs (start-up, exit), and rules nothing out.
            line.push_str(
                ", and the raw client and the broker would need more than that at the ceiling's \
                 own rate: these figures count work outside the timed runs (start-up, exit), so \
                 they cannot rule the target out.",
            );
        } else if cores > 0.0 && at_target > cores {
            // Two cores give `cores` CPU-seconds per second: at the target rate that is
            // `cores / target` per record for both together.
            let allowed = cores / target * 1e6 - ours_broker;
            if allowed > 0.0 {
                let _ = write!(
                    line,
                    ": at this CPU cost the target cannot be met however the work overlaps; \
                     kafka-source would have to use at most {allowed:.3} s per million records \
                     ({} less).",
                    percent(1.0 - allowed / ours)
                );
            } else {
                line.push_str(
                    ": at that rate the broker alone would need more than the machine has, so \
                     these figures cannot tell what kafka-source would have to shed.",
                );
            }
        } else if (SERIAL_BUSY..=1.0).contains(&(ours * ours_rate / 1e6)) {
            // The machine had room, but kafka-source's own work was nearly a core's worth: its
            // steps ran one after another, so its CPU per record set its rate.
            let own_busy = ours * ours_rate / 1e6;
            let allowed = own_busy / target * 1e6;
            let _ = write!(
                line,
                ", and kafka-source alone kept {own_busy:.2} of a core busy: the runtime runs \
                 the reading of a response and the decoding of the one before on one worker, \
                 one after the other, so its own CPU per record sets its rate."
            );
            let _ = if allowed < ours {
                write!(
                    line,
                    " At that share of a core it would have to use at most {allowed:.3} s per \
                     million records ({} less).",
                    percent(1.0 - allowed / ours)
                )
            } else {
                write!(
                    line,
                    " At that share of a core the target allows up to {allowed:.3} s per million \
                     records, {} more than it used.",
                    percent(allowed / ours - 1.0)
                )
            };
        } else {
            line.push('.');
        }
        Some(line)
    }

    fn csv(&self) -> String {
        let mut s = String::from(
            "kind,topic,client,records_per_s,mb_per_s,cpu_s,cpu_s_per_million,broker_cpu_s_per_million,broker_jit_s,peak_rss_bytes,p50_ms,p99_ms,max_ms,round\n",
        );
        let throughput = self.throughput.iter().map(|r| ("throughput", r));
        let pairs = self.pairs.iter().map(|r| ("ceiling_pair", r));
        for (kind, r) in throughput.chain(pairs) {
            let case = &self.cases[r.case];
            match &r.run {
                Some(m) => {
                    let _ = writeln!(
                        s,
                        "{kind},{},{},{:.0},{:.2},{:.3},{:.3},{},{},{},,,,{}",
                        case.label().replace(',', ""),
                        r.client.label(),
                        m.records_per_s,
                        m.mb_per_s,
                        m.cpu_secs,
                        m.cpu_per_million,
                        m.broker_cpu_per_million
                            .map_or(String::new(), |c| format!("{c:.3}")),
                        m.broker_jit_secs
                            .map_or(String::new(), |c| format!("{c:.3}")),
                        m.peak_rss,
                        r.round
                    );
                }
                None => {
                    let _ = writeln!(
                        s,
                        "{kind},{},{},failed,,,,,,,,,,{}",
                        case.label().replace(',', ""),
                        r.client.label(),
                        r.round
                    );
                }
            }
        }
        for (client, r) in &self.latency {
            match r {
                Some(r) => {
                    let _ = writeln!(
                        s,
                        "commit_latency,,{},,,,,,,{},{:.3},{:.3},{:.3},",
                        latency_label(*client),
                        r.peak_rss,
                        r.p50_ms,
                        r.p99_ms,
                        r.max_ms
                    );
                }
                None => {
                    let _ = writeln!(
                        s,
                        "commit_latency,,{},failed,,,,,,,,,,",
                        latency_label(*client)
                    );
                }
            }
        }
        for r in self.slow.iter().flatten() {
            let _ = writeln!(
                s,
                "slow_application,{},kafka-source,{:.0},,,,,,{},,,,",
                self.slow_case_label.replace(',', ""),
                r.records_per_s,
                r.peak_rss
            );
        }
        s
    }

    fn plots(&self, out: &Path) -> Result<(), String> {
        register_font()?;
        let groups: Vec<String> = self.cases.iter().map(Case::label).collect();
        let per_client = |f: &dyn Fn(&Measured) -> f64| -> Vec<(String, Vec<Option<Spread>>)> {
            Client::ALL
                .iter()
                .map(|&c| {
                    let values = (0..self.cases.len())
                        .map(|ci| spread(self.runs(ci, c).iter().map(f)))
                        .collect();
                    (c.label().to_string(), values)
                })
                .collect()
        };
        grouped_bars(
            &out.join("throughput.png"),
            "Consume throughput (median, bars min–max; log scale)",
            "records/s",
            &groups,
            &per_client(&|m| m.records_per_s),
            Scale::Log,
        )?;
        grouped_bars(
            &out.join("cpu.png"),
            "CPU seconds per million records (client process)",
            "CPU s / M records",
            &groups,
            &per_client(&|m| m.cpu_per_million),
            Scale::Linear,
        )?;
        grouped_bars(
            &out.join("rss.png"),
            "Peak RSS of the client process",
            "MiB",
            &groups,
            &per_client(&|m| m.peak_rss as f64 / MIB),
            Scale::Linear,
        )?;
        let latency_groups = vec!["p50".to_string(), "p99".to_string(), "max".to_string()];
        let latency_series: Vec<(String, Vec<Option<Spread>>)> = LATENCY_CLIENTS
            .iter()
            .map(|&c| {
                let runs = self.latency_of(c);
                (
                    latency_label(c).to_string(),
                    vec![
                        spread(runs.iter().map(|r| r.p50_ms)),
                        spread(runs.iter().map(|r| r.p99_ms)),
                        spread(runs.iter().map(|r| r.max_ms)),
                    ],
                )
            })
            .collect();
        grouped_bars(
            &out.join("latency.png"),
            "Checkpoint completion to commit acknowledgement, fetch parked",
            "ms",
            &latency_groups,
            &latency_series,
            Scale::Linear,
        )
    }
}

/// plotters draws text with a font it is given: DejaVu Sans from the system's font folder.
fn register_font() -> Result<(), String> {
    const CANDIDATES: &[&str] = &[
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    ];
    let bytes = CANDIDATES
        .iter()
        .find_map(|p| fs::read(p).ok())
        .ok_or("no DejaVuSans.ttf found")?;
    plotters::style::register_font("sans-serif", FontStyle::Normal, Box::leak(bytes.into()))
        .map_err(|_| "DejaVuSans.ttf is not a usable font".to_string())
}

/// The value axis of a bar chart.
#[derive(Clone, Copy, PartialEq)]
enum Scale {
    Linear,
    /// Powers of ten: for values that span orders of magnitude (the raw ceiling on lz4 topics
    /// against the JVM tool).
    Log,
}

/// A bar chart: one group of bars per `groups` entry, one bar per series (median, with a
/// min–max whisker).
fn grouped_bars(
    path: &Path,
    title: &str,
    y_label: &str,
    groups: &[String],
    series: &[(String, Vec<Option<Spread>>)],
    scale: Scale,
) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let values = || series.iter().flat_map(|(_, v)| v.iter().flatten());
    // On the log scale bars are drawn in log10 units from a floor below the smallest minimum.
    // The top fifth is left free for the legend (upper right), which would hide the last bars.
    let (y_min, y_max) = match scale {
        Scale::Linear => (
            0.0,
            values().map(|s| s.max).fold(0.0f64, f64::max).max(1e-9) * 1.4,
        ),
        Scale::Log => {
            let lo = values()
                .map(|s| s.min)
                .filter(|v| *v > 0.0)
                .fold(f64::INFINITY, f64::min);
            let hi = values().map(|s| s.max).fold(0.0f64, f64::max);
            if lo.is_finite() && hi > 0.0 {
                let lo = lo.log10().floor();
                let hi = hi.log10();
                (lo, hi + (hi - lo) / 3.0 + 0.1)
            } else {
                (0.0, 1.0)
            }
        }
    };
    let y = |v: f64| match scale {
        Scale::Linear => v,
        Scale::Log if v > 0.0 => v.log10().max(y_min),
        Scale::Log => y_min,
    };
    let root = BitMapBackend::new(path, (1400, 700)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(15)
        .x_label_area_size(50)
        .y_label_area_size(90)
        .build_cartesian_2d(0f64..groups.len() as f64, y_min..y_max)
        .map_err(|e| err(&e))?;
    // Log-scale labels at whole powers of ten (the floor is one).
    let y_labels = match scale {
        Scale::Linear => 10,
        Scale::Log => (y_max - y_min).floor() as usize + 1,
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_labels(y_labels)
        .y_desc(y_label)
        .y_label_formatter(&|y| {
            let v = match scale {
                Scale::Linear => *y,
                Scale::Log => 10f64.powf(*y),
            };
            if v >= 1e4 {
                grouped(v.round())
            } else {
                format!("{v:.1}")
            }
        })
        .draw()
        .map_err(|e| err(&e))?;
    let n = series.len().max(1) as f64;
    let width = 0.8 / n;
    for (si, (name, values)) in series.iter().enumerate() {
        let color = Palette99::pick(si).to_rgba();
        let x0 = |gi: usize| gi as f64 + 0.1 + si as f64 * width;
        chart
            .draw_series(values.iter().enumerate().filter_map(|(gi, v)| {
                v.map(|s| {
                    Rectangle::new(
                        [(x0(gi), y_min), (x0(gi) + width * 0.9, y(s.median))],
                        color.filled(),
                    )
                })
            }))
            .map_err(|e| err(&e))?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
        chart
            .draw_series(values.iter().enumerate().filter_map(|(gi, v)| {
                let xc = x0(gi) + width * 0.45;
                v.map(|s| {
                    PathElement::new(vec![(xc, y(s.min)), (xc, y(s.max))], BLACK.stroke_width(2))
                })
            }))
            .map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 16))
        .draw()
        .map_err(|e| err(&e))?;
    for (gi, g) in groups.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(gi as f64 + 0.1, y_min));
        root.draw(&Text::new(g.clone(), (px, py + 10), ("sans-serif", 16)))
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))
}

#[cfg(test)]
mod tests {
    use super::percent;

    #[test]
    fn percents_below_one_keep_a_decimal() {
        assert_eq!(percent(0.14), "14 %");
        assert_eq!(percent(0.0149), "1 %");
        assert_eq!(percent(0.0062), "0.6 %");
        assert_eq!(percent(0.0004), "under 0.1 %");
        assert_eq!(percent(0.0), "under 0.1 %");
    }
}
