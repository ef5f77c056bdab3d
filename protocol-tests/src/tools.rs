//! Kafka command-line tools and the Java producer, run against a [`Cluster`].
//!
//! Each call starts a JVM (`java -cp '<libs>/*' <class> ...`, WARN-level logging to stderr) and
//! parses its stdout; a failing tool panics with its stderr. A JVM start costs a second or two, so
//! prefer the Rust client for hot paths and use these for setup and cross-checks.

use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use crate::cluster::Cluster;
use crate::java::{JavaRun, programs_jar};
use crate::probe::{Metadata, metadata};
use crate::records::{expected_key, expected_value, record_checksum};

const TOPIC_COMMAND: &str = "org.apache.kafka.tools.TopicCommand";
const GET_OFFSET_SHELL: &str = "org.apache.kafka.tools.GetOffsetShell";
const CONSUMER_GROUP_COMMAND: &str = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand";

/// One partition as shown by `TopicCommand --describe`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionInfo {
    /// Partition index.
    pub partition: i32,
    /// Leader broker id, `None` when the partition has no leader.
    pub leader: Option<i32>,
    /// Replica broker ids.
    pub replicas: Vec<i32>,
    /// In-sync replica broker ids.
    pub isr: Vec<i32>,
}

/// Compression codec for the Java producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// No compression.
    #[default]
    None,
    /// gzip.
    Gzip,
    /// Snappy (xerial framing).
    Snappy,
    /// LZ4 frame.
    Lz4,
    /// Zstandard.
    Zstd,
}

impl Compression {
    /// The `compression.type` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Snappy => "snappy",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }

    /// All codecs, for tests that loop over them.
    pub const ALL: [Compression; 5] = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];
}

/// What the Java producer (`protocol-tests/java/Produce.java`) sends.
///
/// Record `i` (from 0) goes to partition `i % partitions` with key [`expected_key`]`(i)` and value
/// [`expected_value`]`(i, value_size)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProduceSpec<'a> {
    /// Target topic (must exist).
    pub topic: &'a str,
    /// Number of partitions to spread records over (`i % partitions`).
    pub partitions: i32,
    /// Number of records.
    pub count: u64,
    /// Size of every value in bytes.
    pub value_size: usize,
    /// Producer compression.
    pub compression: Compression,
    /// `Some((txn_size, abort_every))`: send in transactions of `txn_size` records and abort every
    /// `abort_every`-th transaction (the `abort_every`-th, `2 * abort_every`-th, ...; 0 = none).
    pub transactional: Option<(u64, u64)>,
    /// `Some((base, step))`: record `i` gets timestamp `base + i * step` (ms); otherwise the
    /// producer's clock is used.
    pub timestamps: Option<(i64, i64)>,
}

impl Default for ProduceSpec<'_> {
    fn default() -> Self {
        ProduceSpec {
            topic: "",
            partitions: 1,
            count: 0,
            value_size: 100,
            compression: Compression::None,
            transactional: None,
            timestamps: None,
        }
    }
}

impl ProduceSpec<'_> {
    /// Whether record `i` ends up committed (false for records in aborted transactions).
    pub fn is_committed(&self, i: u64) -> bool {
        match self.transactional {
            Some((txn_size, abort_every)) if txn_size > 0 && abort_every > 0 => {
                let txn = i / txn_size + 1;
                !txn.is_multiple_of(abort_every)
            }
            _ => true,
        }
    }

    /// The checksum the producer reports: wrapping sum of [`record_checksum`] over committed
    /// records.
    pub fn expected_checksum(&self) -> u64 {
        (0..self.count)
            .filter(|&i| self.is_committed(i))
            .map(|i| record_checksum(&expected_key(i), &expected_value(i, self.value_size)))
            .fold(0u64, u64::wrapping_add)
    }

    /// Number of committed records.
    pub fn expected_committed(&self) -> u64 {
        match self.transactional {
            Some((txn_size, abort_every)) if txn_size > 0 && abort_every > 0 => {
                (0..self.count).filter(|&i| self.is_committed(i)).count() as u64
            }
            _ => self.count,
        }
    }
}

/// What the Java producer reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProduceResult {
    /// Committed records (all of them without transactions).
    pub produced: u64,
    /// Records sent in aborted transactions.
    pub aborted: u64,
    /// Wrapping sum of [`record_checksum`] over committed records.
    pub checksum: u64,
}

impl Cluster {
    /// Runs any Kafka tool class with `--bootstrap-server <bootstrap>` prepended to `args` and
    /// returns its stdout.
    ///
    /// # Panics
    ///
    /// If the tool exits non-zero or runs longer than 120 s.
    pub fn run_tool(&self, class: &str, args: &[&str]) -> String {
        self.tool(class, args).run_ok()
    }

    fn tool(&self, class: &str, args: &[&str]) -> JavaRun {
        let mut all = vec!["--bootstrap-server".to_string(), self.bootstrap()];
        all.extend(args.iter().map(|a| a.to_string()));
        JavaRun::new(class, all)
    }

    /// Grows a topic to `partitions` partitions (`kafka-topics --alter`).
    ///
    /// # Panics
    ///
    /// If the tool fails.
    pub fn add_partitions(&self, name: &str, partitions: i32) {
        let n = partitions.to_string();
        self.run_tool(
            TOPIC_COMMAND,
            &["--alter", "--topic", name, "--partitions", &n],
        );
    }

    /// Creates a topic and waits (up to 60 s) until every partition has a leader.
    ///
    /// # Panics
    ///
    /// If creation fails (for instance because the topic exists) or leaders do not appear.
    pub fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        replication: i16,
        configs: &[(&str, &str)],
    ) {
        let partitions_arg = partitions.to_string();
        let replication_arg = replication.to_string();
        let mut args = vec![
            "--create",
            "--topic",
            name,
            "--partitions",
            &partitions_arg,
            "--replication-factor",
            &replication_arg,
        ];
        let config_args: Vec<String> = configs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        for c in &config_args {
            args.push("--config");
            args.push(c);
        }
        self.run_tool(TOPIC_COMMAND, &args);
        // Wait with raw Metadata requests (milliseconds each) rather than more tool JVMs.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match self.metadata_leaders_everywhere(name) {
                Ok(leaders)
                    if leaders.len() == partitions as usize
                        && leaders.values().all(|&l| l >= 0) =>
                {
                    return;
                }
                other => {
                    if Instant::now() > deadline {
                        panic!("topic {name}: partitions without leader after 60 s: {other:?}");
                    }
                }
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Leaders of `topic` as seen by every bootstrap broker that answers; an error unless all
    /// that answer (at least one) agree on the partition count and every partition has a leader.
    fn metadata_leaders_everywhere(&self, topic: &str) -> Result<BTreeMap<i32, i32>, String> {
        let mut seen: Option<BTreeMap<i32, i32>> = None;
        for addr in self.bootstrap().split(',') {
            let Ok(meta) = metadata(addr.trim(), &[topic], Duration::from_secs(5)) else {
                continue; // a stopped node
            };
            let leaders = leaders_in(&meta, topic)?;
            if leaders.values().any(|&l| l < 0) {
                return Err(format!("{addr}: no leader yet: {leaders:?}"));
            }
            if let Some(prev) = seen.as_ref().filter(|p| p.len() != leaders.len()) {
                return Err(format!("{addr}: {leaders:?} vs {prev:?}"));
            }
            seen = Some(leaders);
        }
        seen.ok_or_else(|| "no broker answered Metadata".to_string())
    }

    /// Partition leaders of `topic` from a raw Metadata request (no JVM, milliseconds), asked of
    /// the first bootstrap broker that answers; -1 for a partition without a leader. The
    /// broker's view may lag the controller by a moment; [`Cluster::leader_of`] asks through the
    /// admin client instead.
    ///
    /// # Panics
    ///
    /// If no broker answers, or the topic does not exist.
    pub fn partition_leaders(&self, topic: &str) -> BTreeMap<i32, i32> {
        let mut errors = Vec::new();
        for addr in self.bootstrap().split(',') {
            match metadata(addr.trim(), &[topic], Duration::from_secs(5)) {
                Ok(meta) => {
                    return leaders_in(&meta, topic).unwrap_or_else(|e| panic!("{e}"));
                }
                Err(e) => errors.push(format!("{addr}: {e}")),
            }
        }
        panic!("no broker answered Metadata: {}", errors.join("; "))
    }

    /// The partitions of `topic` (`TopicCommand --describe`), sorted by partition.
    ///
    /// # Panics
    ///
    /// If the tool fails, for instance because the topic does not exist.
    pub fn describe_topic(&self, topic: &str) -> Vec<PartitionInfo> {
        self.try_describe_topic(topic)
            .unwrap_or_else(|e| panic!("describing topic {topic}: {e}"))
    }

    fn try_describe_topic(&self, topic: &str) -> Result<Vec<PartitionInfo>, String> {
        let run = self.tool(
            TOPIC_COMMAND,
            &["--describe", "--topic", &regex_quote(topic)],
        );
        let out = run.run();
        if !out.success() {
            return Err(format!(
                "{} failed ({:?}): {}",
                run.describe(),
                out.status,
                out.stderr.trim()
            ));
        }
        Ok(parse_topic_describe(&out.stdout, topic))
    }

    /// The leader of `topic`/`partition`, or -1 if it has none.
    ///
    /// # Panics
    ///
    /// If the topic or partition does not exist.
    pub fn leader_of(&self, topic: &str, partition: i32) -> i32 {
        self.describe_topic(topic)
            .into_iter()
            .find(|p| p.partition == partition)
            .unwrap_or_else(|| panic!("no partition {partition} in topic {topic}"))
            .leader
            .unwrap_or(-1)
    }

    /// The log end offset (high watermark) of every partition of `topic` (`GetOffsetShell --time -1`).
    pub fn end_offsets(&self, topic: &str) -> BTreeMap<i32, i64> {
        self.offsets(topic, "-1")
    }

    /// The log start offset of every partition of `topic` (`GetOffsetShell --time -2`).
    pub fn start_offsets(&self, topic: &str) -> BTreeMap<i32, i64> {
        self.offsets(topic, "-2")
    }

    fn offsets(&self, topic: &str, time: &str) -> BTreeMap<i32, i64> {
        let out = self.run_tool(
            GET_OFFSET_SHELL,
            &["--topic", &regex_quote(topic), "--time", time],
        );
        parse_offsets(&out, topic)
    }

    /// Committed offsets of `group` per (topic, partition), `None` where a partition is assigned
    /// but has nothing committed (`CURRENT-OFFSET` "-"). Empty if the group does not exist.
    ///
    /// # Panics
    ///
    /// If the tool fails for another reason.
    pub fn committed_offsets(&self, group: &str) -> BTreeMap<(String, i32), Option<i64>> {
        let run = self.tool(
            CONSUMER_GROUP_COMMAND,
            &["--describe", "--group", group, "--offsets"],
        );
        let out = run.run();
        let combined = format!("{}\n{}", out.stdout, out.stderr);
        // 4.1 prints "Error: ... GroupIdNotFoundException: Group g not found." and exits 0;
        // older versions said "Consumer group 'g' does not exist.".
        if combined.contains("GroupIdNotFoundException") || combined.contains("does not exist") {
            return BTreeMap::new();
        }
        if !out.success() || out.stdout.contains("Error:") {
            panic!(
                "{} failed ({:?}):\n{}\n{}",
                run.describe(),
                out.status,
                out.stdout,
                out.stderr
            );
        }
        parse_group_offsets(&out.stdout, group)
    }

    /// `ConsumerGroupCommand --describe --group <group> <extra_args>` stdout, unparsed (e.g. with
    /// `&["--members", "--verbose"]` or `&["--state"]`).
    pub fn describe_group_raw(&self, group: &str, extra_args: &[&str]) -> String {
        let mut args = vec!["--describe", "--group", group];
        args.extend_from_slice(extra_args);
        self.run_tool(CONSUMER_GROUP_COMMAND, &args)
    }

    /// Runs the deterministic Java producer (see [`ProduceSpec`]) and returns what it reported.
    ///
    /// # Panics
    ///
    /// If the producer fails or runs longer than 10 minutes.
    pub fn produce(&self, spec: &ProduceSpec<'_>) -> ProduceResult {
        let mut args = vec![
            self.bootstrap(),
            spec.topic.to_string(),
            spec.partitions.to_string(),
            spec.count.to_string(),
            spec.value_size.to_string(),
            spec.compression.as_str().to_string(),
        ];
        if let Some((txn_size, abort_every)) = spec.transactional {
            let nanos = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            args.extend([
                "--transactional-id".to_string(),
                format!("pt-{}-{}-{nanos}", spec.topic, std::process::id()),
                "--txn-size".to_string(),
                txn_size.to_string(),
                "--abort-every".to_string(),
                abort_every.to_string(),
            ]);
        }
        if let Some((base, step)) = spec.timestamps {
            args.extend([
                "--timestamp-base".to_string(),
                base.to_string(),
                "--timestamp-step".to_string(),
                step.to_string(),
            ]);
        }
        let mut run = JavaRun::new("Produce", args);
        run.jvm_opts = vec!["-Xmx512m".into(), "-Djava.awt.headless=true".into()];
        // Up to some tens of MB the run is mostly JVM start-up, which C1 alone and the serial GC
        // make about twice as fast; larger loads get the optimizing compiler.
        if spec.count.saturating_mul(spec.value_size as u64 + 16) < 64 << 20 {
            run.jvm_opts
                .extend(["-XX:TieredStopAtLevel=1".into(), "-XX:+UseSerialGC".into()]);
        }
        run.extra_classpath = Some(programs_jar());
        run.timeout = Duration::from_secs(600);
        let out = run.run_ok();
        parse_produce_output(&out)
            .unwrap_or_else(|| panic!("unexpected output of {}:\n{out}", run.describe()))
    }
}

/// Quotes a topic name for the tools' `--topic`, which takes a regular expression.
fn regex_quote(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        if !c.is_ascii_alphanumeric() && c != '_' {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn leaders_in(meta: &Metadata, topic: &str) -> Result<BTreeMap<i32, i32>, String> {
    let t = meta
        .topics
        .iter()
        .find(|t| t.name == topic)
        .ok_or_else(|| format!("topic {topic} missing from the Metadata response"))?;
    if t.error_code != 0 {
        return Err(format!(
            "topic {topic}: Metadata error code {}",
            t.error_code
        ));
    }
    Ok(t.partitions
        .iter()
        .map(|p| (p.partition, if p.error_code == 0 { p.leader } else { -1 }))
        .collect())
}

fn parse_topic_describe(out: &str, topic: &str) -> Vec<PartitionInfo> {
    let mut parts = Vec::new();
    for line in out.lines() {
        let fields: BTreeMap<&str, &str> = line
            .split('\t')
            .filter_map(|f| f.split_once(':'))
            .map(|(k, v)| (k.trim(), v.trim()))
            .collect();
        if fields.get("Topic") != Some(&topic) {
            continue;
        }
        let Some(partition) = fields.get("Partition").and_then(|p| p.parse().ok()) else {
            continue;
        };
        let ids = |key: &str| -> Vec<i32> {
            fields
                .get(key)
                .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
                .unwrap_or_default()
        };
        parts.push(PartitionInfo {
            partition,
            leader: fields
                .get("Leader")
                .and_then(|l| l.parse().ok())
                .filter(|&l: &i32| l >= 0),
            replicas: ids("Replicas"),
            isr: ids("Isr"),
        });
    }
    parts.sort_by_key(|p| p.partition);
    parts
}

fn parse_offsets(out: &str, topic: &str) -> BTreeMap<i32, i64> {
    out.lines()
        .filter_map(|line| {
            let mut it = line.trim().rsplitn(3, ':');
            let offset = it.next()?.parse().ok()?;
            let partition = it.next()?.parse().ok()?;
            (it.next()? == topic).then_some((partition, offset))
        })
        .collect()
}

fn parse_group_offsets(out: &str, group: &str) -> BTreeMap<(String, i32), Option<i64>> {
    // GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID
    out.lines()
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() < 4 || cols[0] != group {
                return None;
            }
            let partition = cols[2].parse().ok()?;
            let current = match cols[3] {
                "-" => None,
                v => Some(v.parse().ok()?),
            };
            Some(((cols[1].to_string(), partition), current))
        })
        .collect()
}

fn parse_produce_output(out: &str) -> Option<ProduceResult> {
    let mut produced = None;
    let mut checksum = None;
    let mut aborted = 0;
    for line in out.lines() {
        for field in line.split_whitespace() {
            match field.split_once('=') {
                Some(("produced", v)) => produced = v.parse().ok(),
                Some(("checksum", v)) => checksum = v.parse().ok(),
                Some(("aborted", v)) => aborted = v.parse().ok()?,
                _ => {}
            }
        }
    }
    Some(ProduceResult {
        produced: produced?,
        aborted,
        checksum: checksum?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_topic_describe() {
        let out = "Topic: t.1\tTopicId: abc\tPartitionCount: 2\tReplicationFactor: 3\tConfigs: min.insync.replicas=2\n\
                   \tTopic: t.1\tPartition: 0\tLeader: 2\tReplicas: 2,3,1\tIsr: 2,3\tElr: \tLastKnownElr: \n\
                   \tTopic: t.1\tPartition: 1\tLeader: none\tReplicas: 3,1,2\tIsr: 3\tElr: \tLastKnownElr: \n\
                   \tTopic: tx1\tPartition: 0\tLeader: 1\tReplicas: 1\tIsr: 1\n";
        let parts = parse_topic_describe(out, "t.1");
        assert_eq!(
            parts,
            vec![
                PartitionInfo {
                    partition: 0,
                    leader: Some(2),
                    replicas: vec![2, 3, 1],
                    isr: vec![2, 3]
                },
                PartitionInfo {
                    partition: 1,
                    leader: None,
                    replicas: vec![3, 1, 2],
                    isr: vec![3]
                },
            ]
        );
    }

    #[test]
    fn parses_offsets_of_the_exact_topic() {
        let out = "a.b:0:10\na.b:2:30\na.b:1:20\naxb:0:99\n";
        let got = parse_offsets(out, "a.b");
        assert_eq!(got, BTreeMap::from([(0, 10), (1, 20), (2, 30)]));
    }

    #[test]
    fn parses_group_offsets() {
        let out = "\nGROUP           TOPIC           PARTITION  CURRENT-OFFSET  LOG-END-OFFSET  LAG             CONSUMER-ID     HOST            CLIENT-ID\n\
                   g1              t1              0          5               10              5               -               -               -\n\
                   g1              t1              1          -               10              -               c-1             /127.0.0.1      c\n";
        let got = parse_group_offsets(out, "g1");
        assert_eq!(
            got,
            BTreeMap::from([
                (("t1".to_string(), 0), Some(5)),
                (("t1".to_string(), 1), None)
            ])
        );
    }

    #[test]
    fn parses_producer_output() {
        let got = parse_produce_output("aborted=3\nproduced=7 checksum=18446744073709551615\n");
        assert_eq!(
            got,
            Some(ProduceResult {
                produced: 7,
                aborted: 3,
                checksum: u64::MAX
            })
        );
        assert_eq!(parse_produce_output("nothing"), None);
    }

    #[test]
    fn regex_quote_escapes_dots() {
        assert_eq!(regex_quote("a.b-c_d"), "a\\.b\\-c_d");
    }

    #[test]
    fn transactional_spec_counts_committed() {
        let spec = ProduceSpec {
            topic: "t",
            count: 10,
            transactional: Some((3, 2)),
            ..ProduceSpec::default()
        };
        // Transactions: [0,1,2] commit, [3,4,5] abort, [6,7,8] commit, [9] abort.
        let committed: Vec<u64> = (0..10).filter(|&i| spec.is_committed(i)).collect();
        assert_eq!(committed, vec![0, 1, 2, 6, 7, 8]);
        assert_eq!(spec.expected_committed(), 6);
    }
}
