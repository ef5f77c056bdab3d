//! Consumer groups against a real broker: subscribed members share a topic's partitions, hand
//! them over without overlap, and lose no record.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use kafka_source::{AssignmentStrategy, CommitMode, ConsumerConfig, GroupProtocol, OffsetReset};
use parking_lot::Mutex;
use protocol_tests::consume::{config, unique};
use protocol_tests::group::{
    GroupLog, Member, assert_committed_at_end, converged, wait_for, wait_for_reached,
};
use protocol_tests::{Cluster, ProduceSpec};

fn member_config(
    bootstrap: &str,
    group: &str,
    protocol: GroupProtocol,
    strategy: Option<AssignmentStrategy>,
) -> ConsumerConfig {
    let mut b = config(bootstrap)
        .group_id(group)
        .group_protocol(protocol)
        .commit_mode(CommitMode::Periodic(Duration::from_millis(500)))
        .auto_offset_reset(OffsetReset::Earliest);
    if protocol == GroupProtocol::Classic {
        b = b
            .session_timeout(Duration::from_secs(10))
            .heartbeat_interval(Duration::from_secs(1));
        if let Some(s) = strategy {
            b = b.partition_assignment_strategy([s]);
        }
    }
    b.build().expect("config")
}

async fn share_a_topic(protocol: GroupProtocol, strategy: Option<AssignmentStrategy>) {
    let cluster = Cluster::shared();
    let _logs = cluster.dump_logs_on_panic();
    let topic = unique("group");
    let group = unique("g");
    cluster.create_topic(&topic, 6, 1, &[]);
    cluster.produce(&ProduceSpec {
        topic: &topic,
        partitions: 6,
        count: 6_000,
        value_size: 20,
        ..ProduceSpec::default()
    });
    let log = Arc::new(Mutex::new(GroupLog::default()));
    let cfg = || member_config(&cluster.bootstrap(), &group, protocol, strategy);
    let a = Member::start("a", cfg(), &[&topic], &log);
    wait_for(&log, Duration::from_secs(60), "a owns everything", |l| {
        converged(l, &topic, 6, &["a"])
    })
    .await;
    let b = Member::start("b", cfg(), &[&topic], &log);
    let c = Member::start("c", cfg(), &[&topic], &log);
    wait_for(&log, Duration::from_secs(90), "a, b, c share", |l| {
        converged(l, &topic, 6, &["a", "b", "c"])
    })
    .await;
    wait_for(&log, Duration::from_secs(60), "every record", |l| {
        l.distinct() == 6_000
    })
    .await;
    // A member leaves gracefully: the others take over its partitions.
    b.close().await;
    wait_for(&log, Duration::from_secs(60), "a, c share", |l| {
        converged(l, &topic, 6, &["a", "c"])
    })
    .await;
    let end = cluster.end_offsets(&topic);
    log.lock().assert_no_overlap(&BTreeSet::new());
    log.lock().assert_complete(&topic, &end);
    a.close().await;
    c.close().await;
    assert_committed_at_end(cluster, &group, &topic, &end);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn classic_range_members_share_a_topic() {
    share_a_topic(GroupProtocol::Classic, Some(AssignmentStrategy::Range)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kip848_members_share_a_topic() {
    share_a_topic(GroupProtocol::Consumer, None).await;
}

/// Heartbeats run on the network loop: an application that stalls past the session timeout
/// but within `max.poll.interval.ms` keeps its partitions; one that stalls past
/// `max.poll.interval.ms` loses them, and rejoins cleanly when it polls again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stalls_keep_or_lose_the_membership_by_max_poll_interval() {
    let cluster = Cluster::shared();
    let _logs = cluster.dump_logs_on_panic();
    let topic = unique("stall");
    let group = unique("g");
    cluster.create_topic(&topic, 4, 1, &[]);
    let log = Arc::new(Mutex::new(GroupLog::default()));
    let cfg = || {
        config(&cluster.bootstrap())
            .group_id(group.as_str())
            .commit_mode(CommitMode::Periodic(Duration::from_millis(500)))
            .auto_offset_reset(OffsetReset::Earliest)
            .session_timeout(Duration::from_secs(6))
            .heartbeat_interval(Duration::from_millis(500))
            .max_poll_interval(Duration::from_secs(15))
            .partition_assignment_strategy([AssignmentStrategy::Range])
            .build()
            .expect("config")
    };
    let a = Member::start("a", cfg(), &[&topic], &log);
    let b = Member::start("b", cfg(), &[&topic], &log);
    wait_for(&log, Duration::from_secs(60), "a, b share", |l| {
        converged(l, &topic, 4, &["a", "b"])
    })
    .await;
    let before = log.lock().changes.len();
    // 10 s: past the 6 s session timeout, within the 15 s poll interval.
    a.stall(Duration::from_secs(10));
    tokio::time::sleep(Duration::from_secs(11)).await;
    let changes = log.lock().changes.clone();
    assert_eq!(
        changes.len(),
        before,
        "a stall shorter than max.poll.interval.ms changed the assignment: {changes:#?}"
    );
    // 25 s: past the poll interval. `a` loses its partitions to `b`, then rejoins: `b` owns
    // everything from `a`'s loss until the rebalance that `a`'s return starts.
    a.stall(Duration::from_secs(25));
    wait_for_reached(&log, Duration::from_secs(40), "b owns everything", |l| {
        converged(l, &topic, 4, &["b"])
    })
    .await;
    wait_for(&log, Duration::from_secs(60), "a is back", |l| {
        converged(l, &topic, 4, &["a", "b"])
    })
    .await;
    log.lock().assert_no_overlap(&BTreeSet::new());
    a.close().await;
    b.close().await;
}

/// A static member (`group.instance.id`) that restarts within the session timeout gets its
/// partitions back without a rebalance: the other member's assignment never changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn static_member_restart_keeps_the_assignment() {
    let cluster = Cluster::shared();
    let _logs = cluster.dump_logs_on_panic();
    let topic = unique("static");
    let group = unique("g");
    cluster.create_topic(&topic, 4, 1, &[]);
    let log = Arc::new(Mutex::new(GroupLog::default()));
    let cfg = |id: &str| {
        config(&cluster.bootstrap())
            .group_id(group.as_str())
            .group_instance_id(id)
            .commit_mode(CommitMode::Periodic(Duration::from_millis(500)))
            .auto_offset_reset(OffsetReset::Earliest)
            .session_timeout(Duration::from_secs(30))
            .heartbeat_interval(Duration::from_secs(1))
            .partition_assignment_strategy([AssignmentStrategy::Range])
            .build()
            .expect("config")
    };
    let a = Member::start("a", cfg("instance-a"), &[&topic], &log);
    let b = Member::start("b", cfg("instance-b"), &[&topic], &log);
    wait_for(&log, Duration::from_secs(60), "a, b share", |l| {
        converged(l, &topic, 4, &["a", "b"])
    })
    .await;
    let owned_by_a: Vec<_> = log
        .lock()
        .owners()
        .into_iter()
        .filter(|(_, o)| o.contains("a"))
        .map(|(tp, _)| tp)
        .collect();
    let b_changes = |l: &GroupLog| {
        l.changes
            .iter()
            .filter(|(_, c)| match c {
                protocol_tests::group::Change::Assigned(m, _)
                | protocol_tests::group::Change::Revoked(m, _)
                | protocol_tests::group::Change::Lost(m, _) => m == "b",
            })
            .count()
    };
    let b_before = b_changes(&log.lock());
    // Closing a static member sends no LeaveGroup; its restart takes its place again.
    a.close().await;
    let a2 = Member::start("a2", cfg("instance-a"), &[&topic], &log);
    wait_for(
        &log,
        Duration::from_secs(30),
        "a2 owns a's partitions",
        |l| {
            let owners = l.owners();
            owned_by_a
                .iter()
                .all(|tp| owners.get(tp).is_some_and(|o| o.contains("a2")))
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = b_changes(&log.lock());
    let changes = log.lock().changes.clone();
    assert_eq!(after, b_before, "b saw a rebalance: {changes:#?}");
    a2.close().await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn classic_cooperative_sticky_members_share_a_topic() {
    share_a_topic(
        GroupProtocol::Classic,
        Some(AssignmentStrategy::CooperativeSticky),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn classic_roundrobin_members_share_a_topic() {
    share_a_topic(GroupProtocol::Classic, Some(AssignmentStrategy::RoundRobin)).await;
}

/// Checkpoint mode across a cooperative rebalance: a checkpoint taken while this member owned
/// every partition, completed after half of them were revoked, commits only the partitions
/// still owned; the revoked ones are never committed by this member.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn checkpoint_completed_after_revocation_commits_only_owned_partitions() {
    use kafka_source::{Consumer, TopicPartition};
    let cluster = Cluster::shared();
    let _logs = cluster.dump_logs_on_panic();
    let topic = unique("ckpt-group");
    let group = unique("g");
    cluster.create_topic(&topic, 4, 1, &[]);
    cluster.produce(&ProduceSpec {
        topic: &topic,
        partitions: 4,
        count: 400,
        value_size: 10,
        ..ProduceSpec::default()
    });
    let cfg = |mode: CommitMode| {
        config(&cluster.bootstrap())
            .group_id(group.as_str())
            .commit_mode(mode)
            .auto_offset_reset(OffsetReset::Earliest)
            .session_timeout(Duration::from_secs(10))
            .heartbeat_interval(Duration::from_millis(500))
            .partition_assignment_strategy([AssignmentStrategy::CooperativeSticky])
            .build()
            .expect("config")
    };
    let mut a = Consumer::new(cfg(CommitMode::OnCheckpoints)).expect("consumer");
    a.subscribe([topic.as_str()]).expect("subscribe");
    // Read everything while `a` owns all four partitions, then snapshot checkpoint 1.
    let mut seen = 0;
    while seen < 400 {
        let b = tokio::time::timeout(Duration::from_secs(60), a.poll())
            .await
            .expect("records in time")
            .expect("poll");
        seen += b.records.len();
    }
    assert_eq!(a.assignment().len(), 4);
    let state = a.snapshot_state(1).await.expect("snapshot");
    assert_eq!(state.partitions.len(), 4);
    // `b` joins; `a` gives up two partitions during its next polls.
    let log = Arc::new(Mutex::new(GroupLog::default()));
    let b = Member::start("b", cfg(CommitMode::Disabled), &[&topic], &log);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while a.assignment().len() != 2 {
        assert!(std::time::Instant::now() < deadline, "no rebalance");
        let _ = tokio::time::timeout(Duration::from_millis(200), a.poll()).await;
    }
    let owned: Vec<TopicPartition> = a.assignment();
    // Checkpoint 1 completes now: only a's two partitions may be committed.
    let mut outcomes = a.commit_outcomes().expect("outcomes");
    a.checkpoints().notify_checkpoint_complete(1);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let outcome = loop {
        let _ = tokio::time::timeout(Duration::from_millis(100), a.poll()).await;
        if let Some(o) = outcomes.try_recv() {
            break o;
        }
        assert!(std::time::Instant::now() < deadline, "no commit outcome");
    };
    assert_eq!(outcome.checkpoint_id, Some(1));
    assert!(
        matches!(outcome.outcome, kafka_source::Outcome::Acked),
        "{}",
        outcome.outcome
    );
    let acked: Vec<TopicPartition> = a.commit_stats().last_acked.keys().cloned().collect();
    assert_eq!(
        acked, owned,
        "committed partitions this member no longer owns"
    );
    let committed = cluster.committed_offsets(&group);
    for p in 0..4 {
        let tp = TopicPartition::new(topic.as_str(), p);
        let c = committed.get(&(topic.clone(), p)).copied().flatten();
        if owned.contains(&tp) {
            assert_eq!(c, Some(100), "{tp}");
        } else {
            assert_eq!(c, None, "{tp} was committed by a member that gave it up");
        }
    }
    b.close().await;
    a.close().await;
}

/// A subscribed topic that grows: the members notice the new partition count in metadata,
/// rejoin, and the new partitions are assigned and read; a pattern subscription picks up a
/// topic created after it joined.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn growth_and_new_topics_trigger_a_rebalance() {
    let cluster = Cluster::shared();
    let _logs = cluster.dump_logs_on_panic();
    let prefix = unique("grow");
    let topic = format!("{prefix}-a");
    let group = unique("g");
    cluster.create_topic(&topic, 2, 1, &[]);
    let log = Arc::new(Mutex::new(GroupLog::default()));
    let cfg = config(&cluster.bootstrap())
        .group_id(group.as_str())
        .commit_mode(CommitMode::Periodic(Duration::from_millis(500)))
        .auto_offset_reset(OffsetReset::Earliest)
        .metadata_max_age(Duration::from_secs(1))
        .session_timeout(Duration::from_secs(10))
        .heartbeat_interval(Duration::from_millis(500))
        .partition_assignment_strategy([AssignmentStrategy::CooperativeSticky])
        .build()
        .expect("config");
    let a = Member::start_pattern("a", cfg, &format!("{prefix}-.*"), &log);
    wait_for(&log, Duration::from_secs(60), "a owns 2 partitions", |l| {
        converged(l, &topic, 2, &["a"])
    })
    .await;
    cluster.add_partitions(&topic, 4);
    wait_for(&log, Duration::from_secs(60), "a owns 4 partitions", |l| {
        converged(l, &topic, 4, &["a"])
    })
    .await;
    let second = format!("{prefix}-b");
    cluster.create_topic(&second, 3, 1, &[]);
    cluster.produce(&ProduceSpec {
        topic: &second,
        partitions: 3,
        count: 300,
        value_size: 10,
        ..ProduceSpec::default()
    });
    wait_for(
        &log,
        Duration::from_secs(60),
        "the new topic is read",
        |l| converged(l, &second, 3, &["a"]) && l.distinct() == 300,
    )
    .await;
    log.lock().assert_no_overlap(&BTreeSet::new());
    a.close().await;
}

/// An assignor this crate does not ship: our members offer it, the leader runs it, and the
/// broker picks it as the group's protocol.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_user_written_assignor_runs_on_the_leader() {
    use kafka_source::TopicPartition;
    use kafka_source::assignor::{Assignor, AssignorError, GroupMember, MemberAssignment};
    use std::collections::BTreeMap;

    /// Every partition to the member with the smallest id.
    #[derive(Debug)]
    struct AllToFirst;
    impl Assignor for AllToFirst {
        fn name(&self) -> &str {
            "all-to-first"
        }
        fn assign(
            &self,
            partitions_per_topic: &BTreeMap<String, i32>,
            members: &[GroupMember],
        ) -> Result<BTreeMap<String, MemberAssignment>, AssignorError> {
            let mut ids: Vec<&str> = members.iter().map(|m| m.member_id.as_str()).collect();
            ids.sort_unstable();
            let mut out: BTreeMap<String, MemberAssignment> = ids
                .iter()
                .map(|id| ((*id).to_owned(), MemberAssignment::default()))
                .collect();
            let all = partitions_per_topic
                .iter()
                .flat_map(|(t, n)| (0..*n).map(|p| TopicPartition::new(t.as_str(), p)))
                .collect();
            out.insert(ids[0].to_owned(), MemberAssignment::new(all));
            Ok(out)
        }
    }

    let cluster = Cluster::shared();
    let _logs = cluster.dump_logs_on_panic();
    let topic = unique("custom");
    let group = unique("g");
    cluster.create_topic(&topic, 4, 1, &[]);
    let log = Arc::new(Mutex::new(GroupLog::default()));
    let cfg = || member_config(&cluster.bootstrap(), &group, GroupProtocol::Classic, None);
    let setup = || -> Box<dyn FnOnce(&mut kafka_source::Consumer) + Send> {
        Box::new(|c| {
            c.set_assignors(vec![Arc::new(AllToFirst)])
                .expect("assignors")
        })
    };
    let a = Member::start_with("a", cfg(), &[&topic], &log, setup());
    let b = Member::start_with("b", cfg(), &[&topic], &log, setup());
    // Both joined (each heard of an assignment), and one of them owns all four partitions.
    wait_for(&log, Duration::from_secs(60), "one member owns all", |l| {
        let assigned_to = |m: &str| {
            l.changes
                .iter()
                .any(|(_, c)| matches!(c, protocol_tests::group::Change::Assigned(n, _) if n == m))
        };
        let owners = l.owners();
        let holders: BTreeSet<&String> = owners.values().flatten().collect();
        assigned_to("a") && assigned_to("b") && owners.len() == 4 && holders.len() == 1
    })
    .await;
    let described = cluster.describe_group_raw(&group, &["--state"]);
    assert!(
        described.contains("all-to-first"),
        "the group's protocol is not the custom assignor: {described}"
    );
    a.close().await;
    b.close().await;
}

/// `FENCED_INSTANCE_ID` from the real broker: a second consumer with the same
/// `group.instance.id` replaces the first, whose next heartbeat is fenced; the first consumer's
/// `poll` returns an error that names the code and the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_duplicate_instance_id_fences_the_older_member() {
    use kafka_source::Consumer;
    let cluster = Cluster::shared();
    let _logs = cluster.dump_logs_on_panic();
    let topic = unique("fenced");
    let group = unique("g");
    cluster.create_topic(&topic, 2, 1, &[]);
    let cfg = || {
        config(&cluster.bootstrap())
            .group_id(group.as_str())
            .group_instance_id("same-instance")
            .commit_mode(CommitMode::Disabled)
            .auto_offset_reset(OffsetReset::Earliest)
            .session_timeout(Duration::from_secs(10))
            .heartbeat_interval(Duration::from_millis(300))
            .build()
            .expect("config")
    };
    let mut first = Consumer::new(cfg()).expect("consumer");
    first.subscribe([topic.as_str()]).expect("subscribe");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while first.assignment().len() != 2 {
        assert!(std::time::Instant::now() < deadline, "first never joined");
        let _ = tokio::time::timeout(Duration::from_millis(200), first.poll()).await;
    }
    let log = Arc::new(Mutex::new(GroupLog::default()));
    let second = Member::start("second", cfg(), &[&topic], &log);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let err = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "first was never fenced"
        );
        if let Ok(Err(e)) = tokio::time::timeout(Duration::from_millis(200), first.poll()).await {
            break e;
        }
    };
    let code = err.kafka_code().map(|c| format!("{c:?}"));
    assert_eq!(code.as_deref(), Some("FencedInstanceId"), "{err}");
    assert!(err.to_string().contains("group.instance.id"), "{err}");
    first.close().await;
    second.close().await;
}

/// Newly assigned partitions start at the group's committed offsets; a partition with none
/// starts at `auto.offset.reset`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn assigned_partitions_start_at_committed_offsets() {
    use kafka_source::{Consumer, StartPosition, TopicPartition};
    let cluster = Cluster::shared();
    let _logs = cluster.dump_logs_on_panic();
    let topic = unique("start");
    let group = unique("g");
    cluster.create_topic(&topic, 3, 1, &[]);
    cluster.produce(&ProduceSpec {
        topic: &topic,
        partitions: 3,
        count: 300,
        value_size: 10,
        ..ProduceSpec::default()
    });
    // Commit 40 for partition 0 and 70 for partition 1 while the group is empty.
    let committer_cfg = config(&cluster.bootstrap())
        .group_id(group.as_str())
        .commit_mode(CommitMode::OnCheckpoints)
        .build()
        .expect("config");
    let mut c = Consumer::new(committer_cfg).expect("consumer");
    c.assign([
        (
            TopicPartition::new(topic.as_str(), 0),
            StartPosition::Offset(40),
        ),
        (
            TopicPartition::new(topic.as_str(), 1),
            StartPosition::Offset(70),
        ),
    ]);
    c.snapshot_state(1).await.expect("snapshot");
    c.checkpoints().notify_checkpoint_complete(1);
    let stats = c.close().await;
    assert_eq!(stats.succeeded, 1, "{stats:?}");
    // A member of that group: 40, 70, and the reset policy (earliest) for partition 2.
    let log = Arc::new(Mutex::new(GroupLog::default()));
    let cfg = member_config(
        &cluster.bootstrap(),
        &group,
        GroupProtocol::Classic,
        Some(AssignmentStrategy::Range),
    );
    let m = Member::start("m", cfg, &[&topic], &log);
    wait_for(&log, Duration::from_secs(60), "every partition read", |l| {
        l.distinct() == 60 + 30 + 100
    })
    .await;
    let first: Vec<i64> = (0..3)
        .map(|p| {
            let tp = TopicPartition::new(topic.as_str(), p);
            *log.lock().records[&tp].keys().next().expect("records")
        })
        .collect();
    assert_eq!(first, vec![40, 70, 0]);
    m.close().await;
}
