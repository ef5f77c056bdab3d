//! Interoperability with the Java client: kafka-source members and Java `KafkaConsumer`
//! members in one group, each in a process of its own, join, leave gracefully and are
//! SIGKILLed; the group converges each time, no partition is ever owned by two live members,
//! and no record is lost. The Java consumer-groups tool describes our members and offsets.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_source::{AssignmentStrategy, TopicPartition};
use parking_lot::Mutex;
use protocol_tests::consume::unique;
use protocol_tests::group::{GroupLog, assert_committed_at_end, converged, wait_for};
use protocol_tests::interop::{ChildMember, GroupSpec, Mode};
use protocol_tests::{Cluster, ProduceSpec};

const PARTITIONS: i32 = 6;
const CONVERGE: Duration = Duration::from_secs(60);
const STOP: Duration = Duration::from_secs(30);

/// Who owns which partition, by the members' own reports.
type Owners = BTreeMap<TopicPartition, BTreeSet<String>>;

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_group_member"))
}

/// Produces `count` records spread over the six partitions.
fn produce(cluster: &Cluster, topic: &str, count: u64) {
    cluster.produce(&ProduceSpec {
        topic,
        partitions: PARTITIONS,
        count,
        value_size: 20,
        ..ProduceSpec::default()
    });
}

async fn wait_converged(log: &Arc<Mutex<GroupLog>>, topic: &str, members: &[&str]) {
    let what = format!("{members:?} share the topic");
    wait_for(log, CONVERGE, &what, |l| {
        converged(l, topic, PARTITIONS, members)
    })
    .await;
}

async fn wait_records(log: &Arc<Mutex<GroupLog>>, total: u64) {
    wait_for(log, CONVERGE, &format!("{total} distinct records"), |l| {
        l.distinct() == total
    })
    .await;
}

/// Three of our members and a Java member share a six-partition topic; one of ours leaves,
/// one of ours is SIGKILLed, one of ours and a Java member join, the first Java member is
/// SIGKILLed. Records are produced before and during the changes. Afterwards: no partition
/// was ever owned by two members at once, every record was handed out, and once everyone
/// closed, the committed offsets are the end offsets. `check` runs once the first four
/// members converged and consumed everything produced so far.
async fn java_and_ours_share_a_topic<F>(mode: Mode, check: F)
where
    F: FnOnce(&Cluster, &GroupSpec, &Owners),
{
    let started = Instant::now();
    let cluster = Cluster::shared();
    let _logs = cluster.dump_logs_on_panic();
    let topic = unique("interop");
    let group = unique("interop-g");
    cluster.create_topic(&topic, PARTITIONS, 1, &[]);
    let spec = GroupSpec {
        bootstrap: cluster.bootstrap(),
        group: group.clone(),
        topic: topic.clone(),
        mode,
        session_timeout: Duration::from_secs(6),
    };
    if mode == Mode::Consumer {
        // KIP-848 session and heartbeat settings are the group's, on the broker.
        cluster.run_tool(
            "kafka.admin.ConfigCommand",
            &[
                "--alter",
                "--entity-type",
                "groups",
                "--entity-name",
                &group,
                "--add-config",
                "consumer.session.timeout.ms=6000,consumer.heartbeat.interval.ms=1000",
            ],
        );
    }
    let mut total = 3_000;
    produce(cluster, &topic, total);
    let log = Arc::new(Mutex::new(GroupLog::default()));

    let r1 = ChildMember::ours(exe(), &spec, "r1", &log);
    let r2 = ChildMember::ours(exe(), &spec, "r2", &log);
    let r3 = ChildMember::ours(exe(), &spec, "r3", &log);
    let j1 = ChildMember::java(&spec, "j1", &log);
    wait_converged(&log, &topic, &["r1", "r2", "r3", "j1"]).await;
    produce(cluster, &topic, 3_000);
    total += 3_000;
    wait_records(&log, total).await;
    let owners = log.lock().owners();
    check(cluster, &spec, &owners);
    let t_joined = started.elapsed();

    // A graceful leave while records arrive.
    r1.stop(STOP);
    produce(cluster, &topic, 1_200);
    total += 1_200;
    wait_converged(&log, &topic, &["r2", "r3", "j1"]).await;

    // One of ours dies: its partitions move after the session timeout.
    r2.kill();
    wait_converged(&log, &topic, &["r3", "j1"]).await;

    // Newcomers of both kinds, then the Java member dies while records arrive.
    let r4 = ChildMember::ours(exe(), &spec, "r4", &log);
    let j2 = ChildMember::java(&spec, "j2", &log);
    wait_converged(&log, &topic, &["r3", "j1", "r4", "j2"]).await;
    j1.kill();
    produce(cluster, &topic, 1_200);
    total += 1_200;
    wait_converged(&log, &topic, &["r3", "r4", "j2"]).await;
    wait_records(&log, total).await;

    let end = cluster.end_offsets(&topic);
    assert_eq!(
        end.values().sum::<i64>(),
        total as i64,
        "end offsets {end:?}"
    );
    {
        let l = log.lock();
        l.assert_no_overlap(&BTreeSet::new());
        l.assert_complete(&topic, &end);
    }
    r3.stop(STOP);
    r4.stop(STOP);
    j2.stop(STOP);
    assert_committed_at_end(cluster, &group, &topic, &end);
    let redelivered: u64 = log
        .lock()
        .records
        .values()
        .flat_map(|m| m.values())
        .map(|n| u64::from(*n - 1))
        .sum();
    eprintln!(
        "[interop] {}: first four converged and consumed in {:.1} s, all done in {:.1} s, \
         {redelivered} records handed out again",
        mode.arg(),
        t_joined.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interop_cooperative_sticky() {
    java_and_ours_share_a_topic(
        Mode::Classic(AssignmentStrategy::CooperativeSticky),
        tool_describes_the_group,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interop_range() {
    java_and_ours_share_a_topic(Mode::Classic(AssignmentStrategy::Range), |_, _, _| {}).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interop_roundrobin() {
    java_and_ours_share_a_topic(Mode::Classic(AssignmentStrategy::RoundRobin), |_, _, _| {}).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interop_kip848() {
    java_and_ours_share_a_topic(Mode::Consumer, tool_describes_the_group).await;
}

/// A whitespace-separated table printed by `ConsumerGroupCommand`: the rows of `group`, each
/// as column name to value.
fn table(out: &str, group: &str) -> Vec<BTreeMap<String, String>> {
    let mut header: Vec<String> = Vec::new();
    let mut rows = Vec::new();
    for line in out.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.first() == Some(&"GROUP") {
            header = cols.iter().map(|c| (*c).to_owned()).collect();
        } else if cols.first() == Some(&group) && !header.is_empty() {
            assert_eq!(cols.len(), header.len(), "row {line:?} under {header:?}");
            rows.push(
                header
                    .iter()
                    .cloned()
                    .zip(cols.iter().map(|c| (*c).to_owned()))
                    .collect(),
            );
        }
    }
    rows
}

/// The partitions of `topic` in an assignment cell: `topic:0,1` or `topic(0,1)`, `-` for none.
fn assignment(cell: &str, topic: &str) -> BTreeSet<i32> {
    let mut out = BTreeSet::new();
    let mut rest = cell;
    while let Some(i) = rest.find(topic) {
        rest = &rest[i + topic.len()..];
        let list = rest.trim_start_matches([':', '(']);
        let end = list
            .find(|c: char| !c.is_ascii_digit() && c != ',')
            .unwrap_or(list.len());
        for p in list[..end].split(',').filter(|p| !p.is_empty()) {
            out.insert(p.parse().expect("partition number"));
        }
        rest = &list[end..];
    }
    out
}

/// `ConsumerGroupCommand --describe` shows every member (ours and Java) with its client id,
/// host and the assignment the members report, and every partition's committed offset at its
/// end offset (everything produced so far was consumed and committed), owned by the client
/// the members' reports say.
fn tool_describes_the_group(cluster: &Cluster, spec: &GroupSpec, owners: &Owners) {
    let topic = &spec.topic;
    let mut by_member: BTreeMap<String, BTreeSet<i32>> = BTreeMap::new();
    for (tp, o) in owners {
        for m in o {
            by_member.entry(m.clone()).or_default().insert(tp.partition);
        }
    }
    let out = cluster.describe_group_raw(&spec.group, &["--members", "--verbose"]);
    let rows = table(&out, &spec.group);
    let mut seen: BTreeMap<String, BTreeSet<i32>> = BTreeMap::new();
    for row in &rows {
        let client = row["CLIENT-ID"].clone();
        assert!(
            row["HOST"].contains("127.0.0.1"),
            "host of {client}: {row:?}\n{out}"
        );
        let cell = row
            .get("ASSIGNMENT")
            .or_else(|| row.get("CURRENT-ASSIGNMENT"))
            .unwrap_or_else(|| panic!("no assignment column:\n{out}"));
        let parts = assignment(cell, topic);
        assert_eq!(
            row["#PARTITIONS"].parse::<usize>().ok(),
            Some(parts.len()),
            "{row:?}\n{out}"
        );
        assert!(
            seen.insert(client.clone(), parts).is_none(),
            "two members with client id {client}:\n{out}"
        );
    }
    assert_eq!(
        seen, by_member,
        "tool's view vs the members' reports:\n{out}"
    );

    let end = cluster.end_offsets(topic);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = cluster.describe_group_raw(&spec.group, &["--offsets"]);
        let rows = table(&out, &spec.group);
        let mut committed = BTreeMap::new();
        for row in &rows {
            assert_eq!(&row["TOPIC"], topic, "{out}");
            let p: i32 = row["PARTITION"].parse().expect("partition");
            let owner = owners
                .get(&TopicPartition::new(topic.as_str(), p))
                .and_then(|o| o.first())
                .unwrap_or_else(|| panic!("partition {p} has no owner in the log"));
            assert_eq!(&row["CLIENT-ID"], owner, "partition {p}:\n{out}");
            assert!(row["HOST"].contains("127.0.0.1"), "{out}");
            assert_eq!(
                row["LOG-END-OFFSET"].parse::<i64>().ok(),
                end.get(&p).copied(),
                "partition {p}:\n{out}"
            );
            committed.insert(p, row["CURRENT-OFFSET"].parse::<i64>().ok());
        }
        let want: BTreeMap<i32, Option<i64>> = end.iter().map(|(p, e)| (*p, Some(*e))).collect();
        if committed == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "committed offsets never reached the end offsets {end:?}:\n{out}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn assignment_cells_parse() {
    assert_eq!(assignment("t-1:0,3,5", "t-1"), BTreeSet::from([0, 3, 5]));
    assert_eq!(assignment("t-1(2)", "t-1"), BTreeSet::from([2]));
    assert_eq!(assignment("-", "t-1"), BTreeSet::new());
}
