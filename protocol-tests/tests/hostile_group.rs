//! Consumer-group conversations with a hostile or failing coordinator (the scripted mock in
//! `protocol_tests::mock`): every error code at every group step, and garbage at the steps that
//! carry opaque bytes. Each case asserts the documented action (retry, rediscover, rejoin keeping
//! or resetting the member id, partitions lost or revoked, fatal), and every case checks that
//! no OffsetCommit names a partition the member did not own in the generation (or epoch) it
//! carries, nor a generation after the coordinator declared it dead.
//!
//! The mock plays a group of which this member is the only live one (a follower, unless a case
//! makes it the leader): JoinGroup answers MEMBER_ID_REQUIRED to an empty member id, then
//! success with a new generation; SyncGroup assigns `t-0` and `t-1`; Heartbeat, LeaveGroup,
//! OffsetFetch (offset 0) and OffsetCommit succeed. A case injects one error code at the n-th
//! request of one API.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::consumer_group_heartbeat_response::{Assignment, TopicPartitions};
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition as CpTopicPartition;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartitions, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{
    ApiKey, BrokerId, ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse,
    ConsumerProtocolAssignment, FetchRequest, FindCoordinatorResponse, HeartbeatRequest,
    HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupResponse,
    OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse,
    SyncGroupRequest, SyncGroupResponse, TopicName,
};
use kafka_protocol::protocol::{Encodable, StrBytes};
use kafka_protocol::records::Compression;
use kafka_source::{
    AssignmentStrategy, CommitMode, Consumer, Error, GroupProtocol, OffsetReset, RebalanceListener,
    Revocation, TopicPartition,
};
use protocol_tests::mock::{self, MockBroker, MockTopic, Received, Reply};

/// No conversation may take longer than this.
const BOUND: Duration = Duration::from_secs(20);

fn s(x: &str) -> StrBytes {
    StrBytes::from_string(x.to_owned())
}

fn tp(p: i32) -> TopicPartition {
    TopicPartition::new("t", p)
}

// ---------------------------------------------------------------------------------------------
// The scripted group
// ---------------------------------------------------------------------------------------------

/// One error to inject: at the first request of `api` numbered `at` or later (0-based, counting
/// every request of that API) that is `ready` (KIP-848: the member reports owned partitions,
/// and their committed offsets were looked up, so the application holds them).
#[derive(Clone, Copy, Debug)]
struct Inject {
    api: ApiKey,
    at: usize,
    code: i16,
}

/// What the scripted group did, for the assertions.
#[derive(Default, Debug)]
struct Script {
    inject: Option<Inject>,
    injected_at: Option<Instant>,
    counts: BTreeMap<i16, usize>,
    generation: i32,
    next_member: u32,
    /// Generation (or epoch) → (member id, partitions of `t` assigned in it).
    assigned: BTreeMap<i32, (String, Vec<i32>)>,
    /// Generations declared dead, and when.
    dead: Vec<(i32, Instant)>,
    /// Member ids of the JoinGroup requests, in order.
    join_member_ids: Vec<String>,
    /// KIP-848: (member id, epoch) of each heartbeat.
    cgh: Vec<(String, i32)>,
    /// OffsetCommits: (when, generation, member id, partitions of `t`).
    commits: Vec<(Instant, i32, String, Vec<i32>)>,
    /// Heartbeats answered without error after the last successful SyncGroup (or KIP-848
    /// assignment).
    stable_heartbeats: usize,
    /// SyncGroup answers replaced by these bytes (once each).
    sync_bytes: Vec<Bytes>,
    /// JoinGroup: make the member the leader, with these extra members' metadata.
    leader_with: Option<Vec<(String, Bytes)>>,
    /// KIP-848: extra topic ids in the assignment.
    extra_topic_ids: Vec<uuid::Uuid>,
    /// OffsetFetch requests answered.
    offset_fetches: usize,
}

type Shared = Arc<Mutex<Script>>;

impl Script {
    /// Counts a request of `api`; the code to answer with if this one is injected.
    fn next(&mut self, api: ApiKey, ready: bool) -> Option<i16> {
        let n = self.counts.entry(api as i16).or_insert(0);
        let i = *n;
        *n += 1;
        match self.inject {
            Some(inj) if inj.api == api && i >= inj.at && ready => {
                self.inject = None;
                self.injected_at = Some(Instant::now());
                Some(inj.code)
            }
            _ => None,
        }
    }

    fn count(&self, api: ApiKey) -> usize {
        self.counts.get(&(api as i16)).copied().unwrap_or(0)
    }
}

fn assignment_bytes(partitions: &[i32]) -> Bytes {
    let a = ConsumerProtocolAssignment::default().with_assigned_partitions(vec![
        CpTopicPartition::default()
            .with_topic(TopicName(s("t")))
            .with_partitions(partitions.to_vec()),
    ]);
    let mut buf = BytesMut::new();
    buf.put_i16(3);
    a.encode(&mut buf, 3).unwrap();
    buf.freeze()
}

fn is_dead_code(code: i16) -> bool {
    matches!(
        ResponseError::try_from_code(code),
        Some(
            ResponseError::IllegalGeneration
                | ResponseError::UnknownMemberId
                | ResponseError::FencedMemberEpoch
        )
    )
}

fn join_rule(sc: Shared) -> impl Fn(&Received) -> Reply {
    move |req| {
        let r: JoinGroupRequest = req.decode();
        let mut g = sc.lock().unwrap();
        g.join_member_ids.push(r.member_id.to_string());
        if let Some(code) = g.next(ApiKey::JoinGroup, true) {
            let mut resp = JoinGroupResponse::default()
                .with_error_code(code)
                .with_generation_id(-1);
            if code == ResponseError::MemberIdRequired.code() {
                resp = resp.with_member_id(s("given-by-the-error"));
            }
            return Reply::message(resp);
        }
        if r.member_id.is_empty() {
            g.next_member += 1;
            let id = format!("m-{}", g.next_member);
            return Reply::message(
                JoinGroupResponse::default()
                    .with_error_code(ResponseError::MemberIdRequired.code())
                    .with_generation_id(-1)
                    .with_member_id(s(&id)),
            );
        }
        g.generation += 1;
        let protocol = r.protocols.first().map(|p| p.name.clone());
        let mut resp = JoinGroupResponse::default()
            .with_generation_id(g.generation)
            .with_member_id(r.member_id.clone())
            .with_protocol_type(Some(s("consumer")))
            .with_protocol_name(protocol)
            .with_leader(s("the-leader"));
        if let Some(others) = g.leader_with.take() {
            let own = r.protocols.first().map(|p| p.metadata.clone()).unwrap();
            let mut members = vec![
                JoinGroupResponseMember::default()
                    .with_member_id(r.member_id.clone())
                    .with_metadata(own),
            ];
            for (id, bytes) in others {
                members.push(
                    JoinGroupResponseMember::default()
                        .with_member_id(s(&id))
                        .with_metadata(bytes),
                );
            }
            resp = resp.with_leader(r.member_id.clone()).with_members(members);
        }
        Reply::message(resp)
    }
}

fn sync_rule(sc: Shared) -> impl Fn(&Received) -> Reply {
    move |req| {
        let r: SyncGroupRequest = req.decode();
        let mut g = sc.lock().unwrap();
        if let Some(code) = g.next(ApiKey::SyncGroup, true) {
            return Reply::message(SyncGroupResponse::default().with_error_code(code));
        }
        let member = r.member_id.to_string();
        let (bytes, parts) =
            if let Some(b) = (!g.sync_bytes.is_empty()).then(|| g.sync_bytes.remove(0)) {
                (b, Vec::new())
            } else if let Some(a) = r.assignments.iter().find(|a| a.member_id == r.member_id) {
                // The leader's own assignment, as it computed it.
                let parts = kafka_protocol::messages::ConsumerProtocolAssignment::decode_prefixed(
                    &a.assignment,
                );
                (a.assignment.clone(), parts)
            } else {
                (assignment_bytes(&[0, 1]), vec![0, 1])
            };
        g.assigned.insert(r.generation_id, (member, parts));
        g.stable_heartbeats = 0;
        Reply::message(
            SyncGroupResponse::default()
                .with_protocol_type(Some(s("consumer")))
                .with_protocol_name(r.protocol_name.clone())
                .with_assignment(bytes),
        )
    }
}

/// Decoding a version-prefixed ConsumerProtocolAssignment (the partitions of `t`).
trait DecodePrefixed {
    fn decode_prefixed(bytes: &Bytes) -> Vec<i32>;
}

impl DecodePrefixed for ConsumerProtocolAssignment {
    fn decode_prefixed(bytes: &Bytes) -> Vec<i32> {
        use bytes::Buf;
        use kafka_protocol::protocol::Decodable;
        let mut b = bytes.clone();
        let v = b.get_i16().min(3);
        let a = ConsumerProtocolAssignment::decode(&mut b, v).unwrap();
        a.assigned_partitions
            .iter()
            .filter(|t| t.topic.as_str() == "t")
            .flat_map(|t| t.partitions.iter().copied())
            .collect()
    }
}

fn heartbeat_rule(sc: Shared) -> impl Fn(&Received) -> Reply {
    move |req| {
        let r: HeartbeatRequest = req.decode();
        let mut g = sc.lock().unwrap();
        if let Some(code) = g.next(ApiKey::Heartbeat, true) {
            if is_dead_code(code) {
                g.dead.push((r.generation_id, Instant::now()));
            }
            return Reply::message(HeartbeatResponse::default().with_error_code(code));
        }
        g.stable_heartbeats += 1;
        Reply::message(HeartbeatResponse::default())
    }
}

fn cgh_rule(sc: Shared, topic: MockTopic) -> impl Fn(&Received) -> Reply {
    move |req| {
        let r: ConsumerGroupHeartbeatRequest = req.decode();
        let mut g = sc.lock().unwrap();
        g.cgh.push((r.member_id.to_string(), r.member_epoch));
        let owns = r.topic_partitions.as_ref().is_some_and(|t| !t.is_empty());
        // The member acknowledges an assignment at once, while the committed offsets of its
        // partitions are still being looked up; only once they were is the application sure to
        // hold the partitions that an injected fence takes away.
        let ready = owns && g.offset_fetches > 0;
        if let Some(code) = g.next(ApiKey::ConsumerGroupHeartbeat, ready) {
            if is_dead_code(code) {
                let epoch = r.member_epoch;
                g.dead.push((epoch, Instant::now()));
            }
            return Reply::message(
                ConsumerGroupHeartbeatResponse::default()
                    .with_error_code(code)
                    .with_error_message(Some(s("injected")))
                    .with_member_epoch(-1),
            );
        }
        if r.member_epoch < 0 {
            return Reply::message(
                ConsumerGroupHeartbeatResponse::default()
                    .with_member_id(Some(r.member_id.clone()))
                    .with_member_epoch(r.member_epoch),
            );
        }
        let mut resp = ConsumerGroupHeartbeatResponse::default()
            .with_member_id(Some(r.member_id.clone()))
            .with_heartbeat_interval_ms(100);
        if r.member_epoch == 0 {
            g.generation += 1;
            let epoch = g.generation;
            g.assigned
                .insert(epoch, (r.member_id.to_string(), vec![0, 1]));
            g.stable_heartbeats = 0;
            let mut tps = vec![
                TopicPartitions::default()
                    .with_topic_id(topic.id)
                    .with_partitions(vec![0, 1]),
            ];
            for id in &g.extra_topic_ids {
                tps.push(
                    TopicPartitions::default()
                        .with_topic_id(*id)
                        .with_partitions(vec![0, 7]),
                );
            }
            resp = resp
                .with_member_epoch(epoch)
                .with_assignment(Some(Assignment::default().with_topic_partitions(tps)));
        } else {
            if owns {
                g.stable_heartbeats += 1;
            }
            resp = resp.with_member_epoch(g.generation);
        }
        Reply::message(resp)
    }
}

fn commit_rule(sc: Shared) -> impl Fn(&Received) -> Reply {
    move |req| {
        let r: OffsetCommitRequest = req.decode();
        let mut g = sc.lock().unwrap();
        let parts: Vec<i32> = r
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| p.partition_index))
            .collect();
        g.commits.push((
            Instant::now(),
            r.generation_id_or_member_epoch,
            r.member_id.to_string(),
            parts,
        ));
        let code = g.next(ApiKey::OffsetCommit, true).unwrap_or(0);
        if is_dead_code(code) {
            g.dead
                .push((r.generation_id_or_member_epoch, Instant::now()));
        }
        Reply::message(
            OffsetCommitResponse::default().with_topics(
                r.topics
                    .iter()
                    .map(|t| {
                        OffsetCommitResponseTopic::default()
                            .with_name(t.name.clone())
                            .with_topic_id(t.topic_id)
                            .with_partitions(
                                t.partitions
                                    .iter()
                                    .map(|p| {
                                        OffsetCommitResponsePartition::default()
                                            .with_partition_index(p.partition_index)
                                            .with_error_code(code)
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            ),
        )
    }
}

fn offset_fetch_rule(req: &Received) -> Reply {
    let r: OffsetFetchRequest = req.decode();
    let groups = r
        .groups
        .iter()
        .map(|g| {
            OffsetFetchResponseGroup::default()
                .with_group_id(g.group_id.clone())
                .with_topics(
                    g.topics
                        .iter()
                        .flatten()
                        .map(|t| {
                            OffsetFetchResponseTopics::default()
                                .with_name(t.name.clone())
                                .with_topic_id(t.topic_id)
                                .with_partitions(
                                    t.partition_indexes
                                        .iter()
                                        .map(|p| {
                                            OffsetFetchResponsePartitions::default()
                                                .with_partition_index(*p)
                                                .with_committed_offset(0)
                                        })
                                        .collect(),
                                )
                        })
                        .collect(),
                )
        })
        .collect();
    Reply::message(OffsetFetchResponse::default().with_groups(groups))
}

fn find_coordinator_rule(port: u16) -> impl Fn(&Received) -> Reply {
    move |req| {
        let mut r = FindCoordinatorResponse::default();
        if req.version < 4 {
            r = r
                .with_node_id(BrokerId(1))
                .with_host(s("127.0.0.1"))
                .with_port(i32::from(port));
        } else {
            r = r.with_coordinators(vec![
                Coordinator::default()
                    .with_key(s("g"))
                    .with_node_id(BrokerId(1))
                    .with_host(s("127.0.0.1"))
                    .with_port(i32::from(port)),
            ]);
        }
        Reply::message(r)
    }
}

/// Five records at offsets 0..5 for every partition asked from offset < 5; then empty answers.
fn fetch_rule(topic: MockTopic) -> impl Fn(&Received) -> Reply {
    move |req| {
        let f: FetchRequest = req.decode();
        let asked: Vec<(i32, i64)> = f
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| (p.partition, p.fetch_offset)))
            .collect();
        let mut resp = mock::fetch_response(req.version, &topic, 0, 0, 5, Some(Bytes::new()));
        resp.responses[0].partitions.clear();
        let mut any = false;
        for (p, offset) in asked {
            let records = if offset < 5 {
                any = true;
                let v: Vec<Vec<u8>> = (0..5).map(|i| format!("v{i}").into_bytes()).collect();
                let refs: Vec<&[u8]> = v.iter().map(|x| x.as_slice()).collect();
                mock::batch(0, &refs, Compression::None)
            } else {
                Bytes::new()
            };
            let one = mock::fetch_response(req.version, &topic, p, 0, 5, Some(records));
            resp.responses[0]
                .partitions
                .extend(one.responses[0].partitions.iter().cloned());
        }
        let reply = Reply::message(resp);
        if any {
            reply
        } else {
            reply.delay(Duration::from_millis(50))
        }
    }
}

/// A mock playing the group.
async fn group_mock(inject: Option<Inject>) -> (MockBroker, Shared) {
    let m = MockBroker::start().await;
    m.topic("t", 2);
    m.standard_handshake();
    let topic = m.topic_named("t");
    let sc: Shared = Arc::new(Mutex::new(Script {
        inject,
        ..Script::default()
    }));
    m.always(ApiKey::FindCoordinator, find_coordinator_rule(m.port()));
    m.always(ApiKey::JoinGroup, join_rule(Arc::clone(&sc)));
    m.always(ApiKey::SyncGroup, sync_rule(Arc::clone(&sc)));
    m.always(ApiKey::Heartbeat, heartbeat_rule(Arc::clone(&sc)));
    m.always(ApiKey::LeaveGroup, |_| {
        Reply::message(LeaveGroupResponse::default())
    });
    m.always(
        ApiKey::ConsumerGroupHeartbeat,
        cgh_rule(Arc::clone(&sc), topic.clone()),
    );
    m.always(ApiKey::OffsetCommit, commit_rule(Arc::clone(&sc)));
    let fetches = Arc::clone(&sc);
    m.always(ApiKey::OffsetFetch, move |req| {
        fetches.lock().unwrap().offset_fetches += 1;
        offset_fetch_rule(req)
    });
    m.always(ApiKey::Fetch, fetch_rule(topic));
    (m, sc)
}

// ---------------------------------------------------------------------------------------------
// The member
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Eq)]
enum Call {
    Assigned(Vec<TopicPartition>),
    Revoked(Vec<TopicPartition>),
    Lost(Vec<TopicPartition>),
}

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Call>>>);

impl Recorder {
    fn calls(&self) -> Vec<Call> {
        self.0.lock().unwrap().clone()
    }
}

impl RebalanceListener for Recorder {
    fn on_partitions_revoked(&mut self, revocation: &mut Revocation<'_>) {
        let mut p = revocation.partitions().to_vec();
        p.sort();
        self.0.lock().unwrap().push(Call::Revoked(p));
    }

    fn on_partitions_assigned(&mut self, assigned: &[TopicPartition]) {
        let mut p = assigned.to_vec();
        p.sort();
        self.0.lock().unwrap().push(Call::Assigned(p));
    }

    fn on_partitions_lost(&mut self, lost: &[TopicPartition]) {
        let mut p = lost.to_vec();
        p.sort();
        self.0.lock().unwrap().push(Call::Lost(p));
    }
}

fn member(m: &MockBroker, protocol: GroupProtocol, rec: &Recorder) -> Consumer {
    let mut b = m.client_config("hostile-group");
    if protocol == GroupProtocol::Classic {
        b = b
            .partition_assignment_strategy([AssignmentStrategy::Range])
            .session_timeout(Duration::from_secs(6))
            .heartbeat_interval(Duration::from_millis(100));
    }
    let config = b
        .group_id("g")
        .group_protocol(protocol)
        .max_poll_interval(Duration::from_secs(1))
        .auto_offset_reset(OffsetReset::Earliest)
        .commit_mode(CommitMode::Periodic(Duration::from_millis(100)))
        .build()
        .unwrap();
    let mut c = Consumer::new(config).unwrap();
    c.set_rebalance_listener(rec.clone());
    c.subscribe(["t"]).unwrap();
    c
}

/// Polls until `until` holds (checked every 50 ms); returns the errors `poll` gave meanwhile.
async fn drive(
    c: &mut Consumer,
    sc: &Shared,
    rec: &Recorder,
    what: &str,
    until: impl Fn(&Script, &[Call], &[Error]) -> bool,
) -> Vec<Error> {
    let started = Instant::now();
    let mut errors = Vec::new();
    loop {
        if until(&sc.lock().unwrap(), &rec.calls(), &errors) {
            return errors;
        }
        assert!(
            started.elapsed() < BOUND,
            "{what}: not reached within {BOUND:?}; calls {:?}, errors {errors:?}, script {:#?}",
            rec.calls(),
            sc.lock().unwrap()
        );
        if let Ok(Err(e)) = tokio::time::timeout(Duration::from_millis(50), c.poll()).await {
            errors.push(e);
        }
    }
}

/// Stable: assigned, at least three heartbeats answered since, and a commit seen.
fn stable(g: &Script, calls: &[Call], _: &[Error]) -> bool {
    g.stable_heartbeats >= 3
        && calls
            .iter()
            .any(|c| matches!(c, Call::Assigned(p) if !p.is_empty()))
        && !g.commits.is_empty()
}

/// Every OffsetCommit names the member and partitions of the generation it carries, and none
/// carries a generation after it was declared dead (beyond one already on its way).
fn check_commits(g: &Script) {
    for (when, generation, member, parts) in &g.commits {
        let Some((owner, assigned)) = g.assigned.get(generation) else {
            panic!("a commit with generation {generation}, which was never assigned: {g:#?}");
        };
        assert_eq!(member, owner, "commit of generation {generation}: {g:#?}");
        for p in parts {
            assert!(
                assigned.contains(p),
                "commit of t-{p}, not owned in generation {generation}: {g:#?}"
            );
        }
        for (dead, at) in &g.dead {
            assert!(
                !(generation == dead && *when > *at + Duration::from_millis(100)),
                "a commit with generation {generation} after it was declared dead: {g:#?}"
            );
        }
    }
}

/// The group requests sent so far.
fn group_requests(m: &MockBroker) -> usize {
    [
        ApiKey::JoinGroup,
        ApiKey::SyncGroup,
        ApiKey::Heartbeat,
        ApiKey::ConsumerGroupHeartbeat,
        ApiKey::OffsetCommit,
    ]
    .iter()
    .map(|a| m.requests_of(*a).len())
    .sum()
}

/// The error names the code: `poll` returned it, and no group request follows.
async fn expect_fatal(
    m: &MockBroker,
    c: &mut Consumer,
    sc: &Shared,
    rec: &Recorder,
    code: ResponseError,
    errors: &[Error],
) {
    let named = format!("{code:?} ({})", code.code());
    assert!(
        errors.iter().any(|e| e.to_string().contains(&named)),
        "{code:?}: expected an error naming it, got {errors:?}"
    );
    let before = group_requests(m);
    let until = Instant::now() + Duration::from_millis(600);
    drive(c, sc, rec, "after a fatal error", |_, _, _| {
        Instant::now() >= until
    })
    .await;
    assert_eq!(
        group_requests(m),
        before,
        "{code:?}: group requests after a fatal error"
    );
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// Retried (after finding the coordinator again if `rediscover`); the member ends up
    /// stable, keeping its member id and (for heartbeats) its partitions.
    Retry {
        rediscover: bool,
    },
    /// Joins again with the same member id; `lost`: the partitions were lost (not revoked).
    RejoinKeep {
        lost: bool,
    },
    /// Joins again with an empty member id (classic) and the partitions lost.
    RejoinReset,
    /// Joins again with the member id the error carried.
    RejoinWithGiven,
    /// Joins again after revoking (eager) the partitions.
    RejoinRevoked,
    Fatal,
}

use Expect::*;

const FATAL_CLASSIC: [ResponseError; 7] = [
    ResponseError::FencedInstanceId,
    ResponseError::InconsistentGroupProtocol,
    ResponseError::InvalidSessionTimeout,
    ResponseError::InvalidGroupId,
    ResponseError::GroupMaxSizeReached,
    ResponseError::GroupAuthorizationFailed,
    ResponseError::UnsupportedVersion,
];

async fn classic_case(api: ApiKey, at: usize, code: ResponseError, expect: Expect) {
    let inject = Inject {
        api,
        at,
        code: code.code(),
    };
    let (m, sc) = group_mock(Some(inject)).await;
    let rec = Recorder::default();
    let mut c = member(&m, GroupProtocol::Classic, &rec);
    let what = format!("{api:?} #{at} {code:?}");
    if expect == Fatal {
        let errors = drive(&mut c, &sc, &rec, &what, |_, _, e| !e.is_empty()).await;
        expect_fatal(&m, &mut c, &sc, &rec, code, &errors).await;
        check_commits(&sc.lock().unwrap());
        return;
    }
    // Past the injection, stable again.
    drive(&mut c, &sc, &rec, &what, |g, calls, _| {
        g.inject.is_none()
            && g.injected_at.is_some()
            && stable(g, calls, &[])
            && g.assigned.keys().any(|k| *k >= 1)
    })
    .await;
    {
        let g = sc.lock().unwrap();
        check_commits(&g);
        let calls = rec.calls();
        let joins = &g.join_member_ids;
        // The member id of the first JoinGroup after the injection.
        let injected_join = match api {
            ApiKey::JoinGroup => at,
            _ => {
                // The joins before the injection were the first two (MEMBER_ID_REQUIRED, success).
                1
            }
        };
        let after = joins.get(injected_join + 1).cloned();
        let finds = m.requests_of(ApiKey::FindCoordinator).len();
        let all = vec![tp(0), tp(1)];
        match expect {
            Retry { rediscover } => {
                if rediscover {
                    assert!(finds >= 2, "{what}: coordinator found again ({finds})");
                }
                if api == ApiKey::Heartbeat {
                    assert_eq!(joins.len(), 2, "{what}: no rejoin: {joins:?}");
                    assert_eq!(calls, vec![Call::Assigned(all)], "{what}");
                } else {
                    assert_eq!(after.as_deref(), Some("m-1"), "{what}: {joins:?}");
                }
            }
            RejoinKeep { lost } => {
                assert_eq!(after.as_deref(), Some("m-1"), "{what}: {joins:?}");
                if lost {
                    assert!(
                        calls.contains(&Call::Lost(all.clone())),
                        "{what}: {calls:?}"
                    );
                    assert!(
                        !calls.iter().any(|c| matches!(c, Call::Revoked(_))),
                        "{what}: {calls:?}"
                    );
                }
            }
            RejoinReset => {
                assert_eq!(after.as_deref(), Some(""), "{what}: {joins:?}");
                if api != ApiKey::JoinGroup && (api != ApiKey::SyncGroup) {
                    assert!(
                        calls.contains(&Call::Lost(all.clone())),
                        "{what}: {calls:?}"
                    );
                }
            }
            RejoinWithGiven => {
                assert_eq!(
                    after.as_deref(),
                    Some("given-by-the-error"),
                    "{what}: {joins:?}"
                );
            }
            RejoinRevoked => {
                assert_eq!(after.as_deref(), Some("m-1"), "{what}: {joins:?}");
                assert!(
                    calls.contains(&Call::Revoked(all.clone())),
                    "{what}: {calls:?}"
                );
                assert!(
                    !calls.iter().any(|c| matches!(c, Call::Lost(_))),
                    "{what}: {calls:?}"
                );
            }
            Fatal => unreachable!(),
        }
    }
    tokio::time::timeout(BOUND, c.close()).await.unwrap();
}

/// JoinGroup (the member's second, carrying `m-1`): every code of the table.
#[tokio::test]
async fn classic_join_group_error_codes() {
    use ResponseError as E;
    let cases = [
        (E::CoordinatorNotAvailable, Retry { rediscover: true }),
        (E::NotCoordinator, Retry { rediscover: true }),
        (E::CoordinatorLoadInProgress, Retry { rediscover: false }),
        (E::RebalanceInProgress, Retry { rediscover: false }),
        (E::IllegalGeneration, Retry { rediscover: false }),
        (E::MemberIdRequired, RejoinWithGiven),
        (E::UnknownMemberId, RejoinReset),
    ];
    for (code, expect) in cases {
        classic_case(ApiKey::JoinGroup, 1, code, expect).await;
    }
    for code in FATAL_CLASSIC {
        classic_case(ApiKey::JoinGroup, 1, code, Fatal).await;
    }
}

/// SyncGroup (the first): every code of the table.
#[tokio::test]
async fn classic_sync_group_error_codes() {
    use ResponseError as E;
    let cases = [
        (E::CoordinatorNotAvailable, RejoinKeep { lost: false }),
        (E::NotCoordinator, RejoinKeep { lost: false }),
        (E::RebalanceInProgress, RejoinKeep { lost: false }),
        (E::IllegalGeneration, RejoinKeep { lost: false }),
        (E::UnknownMemberId, RejoinReset),
    ];
    for (code, expect) in cases {
        classic_case(ApiKey::SyncGroup, 0, code, expect).await;
    }
    for code in FATAL_CLASSIC {
        classic_case(ApiKey::SyncGroup, 0, code, Fatal).await;
    }
}

/// Heartbeat (the first, while the member owns `t-0` and `t-1`): every code of the table.
#[tokio::test]
async fn classic_heartbeat_error_codes() {
    use ResponseError as E;
    let cases = [
        (E::CoordinatorNotAvailable, Retry { rediscover: true }),
        (E::NotCoordinator, Retry { rediscover: true }),
        (E::CoordinatorLoadInProgress, Retry { rediscover: false }),
        (E::RebalanceInProgress, RejoinRevoked),
        (E::IllegalGeneration, RejoinKeep { lost: true }),
        (E::FencedMemberEpoch, RejoinKeep { lost: true }),
        (E::UnknownMemberId, RejoinReset),
    ];
    for (code, expect) in cases {
        classic_case(ApiKey::Heartbeat, 0, code, expect).await;
    }
    for code in FATAL_CLASSIC {
        classic_case(ApiKey::Heartbeat, 0, code, Fatal).await;
    }
}

/// OffsetCommit in a classic group (the first commit, generation 1).
#[tokio::test]
async fn classic_offset_commit_error_codes() {
    use ResponseError as E;
    let cases = [
        (E::CoordinatorNotAvailable, Retry { rediscover: true }),
        (E::NotCoordinator, Retry { rediscover: true }),
        (E::CoordinatorLoadInProgress, Retry { rediscover: false }),
        (E::RebalanceInProgress, RejoinRevoked),
        (E::IllegalGeneration, RejoinKeep { lost: true }),
        (E::UnknownMemberId, RejoinReset),
    ];
    for (code, expect) in cases {
        let expect = match expect {
            // A commit error does not end heartbeats; the join count is what tells.
            Retry { .. } => Retry { rediscover: false },
            e => e,
        };
        commit_case(code, expect).await;
    }
    classic_case(ApiKey::OffsetCommit, 0, E::FencedInstanceId, Fatal).await;
}

async fn commit_case(code: ResponseError, expect: Expect) {
    let inject = Inject {
        api: ApiKey::OffsetCommit,
        at: 0,
        code: code.code(),
    };
    let (m, sc) = group_mock(Some(inject)).await;
    let rec = Recorder::default();
    let mut c = member(&m, GroupProtocol::Classic, &rec);
    let what = format!("OffsetCommit {code:?}");
    drive(&mut c, &sc, &rec, &what, |g, calls, _| {
        g.injected_at.is_some() && g.commits.len() >= 3 && stable(g, calls, &[])
    })
    .await;
    {
        let g = sc.lock().unwrap();
        check_commits(&g);
        let calls = rec.calls();
        let all = vec![tp(0), tp(1)];
        let after = g.join_member_ids.get(2).cloned();
        match expect {
            Retry { .. } => {
                assert_eq!(
                    g.join_member_ids.len(),
                    2,
                    "{what}: {:?}",
                    g.join_member_ids
                );
                assert_eq!(calls, vec![Call::Assigned(all)], "{what}");
                // The commit is sent again with the same generation.
                assert!(g.commits.iter().skip(1).any(|c| c.1 == 1), "{what}: {g:#?}");
            }
            RejoinKeep { .. } => {
                assert_eq!(after.as_deref(), Some("m-1"), "{what}");
                assert!(calls.contains(&Call::Lost(all)), "{what}: {calls:?}");
            }
            RejoinReset => {
                assert_eq!(after.as_deref(), Some(""), "{what}");
                assert!(calls.contains(&Call::Lost(all)), "{what}: {calls:?}");
            }
            RejoinRevoked => {
                assert_eq!(after.as_deref(), Some("m-1"), "{what}");
                assert!(calls.contains(&Call::Revoked(all)), "{what}: {calls:?}");
            }
            _ => unreachable!(),
        }
    }
    tokio::time::timeout(BOUND, c.close()).await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// KIP-848
// ---------------------------------------------------------------------------------------------

async fn kip848_case(api: ApiKey, code: ResponseError, expect: Expect) {
    let inject = Inject {
        api,
        at: 0,
        code: code.code(),
    };
    let (m, sc) = group_mock(Some(inject)).await;
    let rec = Recorder::default();
    let mut c = member(&m, GroupProtocol::Consumer, &rec);
    let what = format!("{api:?} {code:?} (KIP-848)");
    if expect == Fatal {
        let errors = drive(&mut c, &sc, &rec, &what, |_, _, e| !e.is_empty()).await;
        expect_fatal(&m, &mut c, &sc, &rec, code, &errors).await;
        check_commits(&sc.lock().unwrap());
        return;
    }
    drive(&mut c, &sc, &rec, &what, |g, calls, _| {
        g.injected_at.is_some() && stable(g, calls, &[]) && g.commits.len() >= 2
    })
    .await;
    {
        let g = sc.lock().unwrap();
        check_commits(&g);
        let calls = rec.calls();
        let all = vec![tp(0), tp(1)];
        let member_id = &g.cgh[0].0;
        assert!(!member_id.is_empty(), "a client-chosen member id");
        assert!(
            g.cgh.iter().all(|(id, _)| id == member_id),
            "{what}: one member id throughout: {:?}",
            g.cgh
        );
        let joins = g.cgh.iter().filter(|(_, e)| *e == 0).count();
        match expect {
            Retry { rediscover } => {
                if rediscover {
                    let finds = m.requests_of(ApiKey::FindCoordinator).len();
                    assert!(finds >= 2, "{what}: coordinator found again ({finds})");
                }
                assert_eq!(joins, 1, "{what}: no rejoin: {:?}", g.cgh);
                assert_eq!(calls, vec![Call::Assigned(all)], "{what}");
            }
            RejoinKeep { lost: true } => {
                assert_eq!(joins, 2, "{what}: joined again at epoch 0: {:?}", g.cgh);
                assert!(calls.contains(&Call::Lost(all)), "{what}: {calls:?}");
                assert!(
                    !calls.iter().any(|c| matches!(c, Call::Revoked(_))),
                    "{what}: {calls:?}"
                );
            }
            e => panic!("{e:?}"),
        }
    }
    tokio::time::timeout(BOUND, c.close()).await.unwrap();
}

/// ConsumerGroupHeartbeat (the first that reports owned partitions): every code of the table.
#[tokio::test]
async fn kip848_heartbeat_error_codes() {
    use ResponseError as E;
    let cases = [
        (E::FencedMemberEpoch, RejoinKeep { lost: true }),
        (E::UnknownMemberId, RejoinKeep { lost: true }),
        (E::NotCoordinator, Retry { rediscover: true }),
        (E::CoordinatorNotAvailable, Retry { rediscover: true }),
        (E::CoordinatorLoadInProgress, Retry { rediscover: false }),
        (E::GroupAuthorizationFailed, Fatal),
        (E::InvalidRequest, Fatal),
        (E::GroupMaxSizeReached, Fatal),
        (E::UnsupportedAssignor, Fatal),
        (E::UnreleasedInstanceId, Fatal),
        (E::FencedInstanceId, Fatal),
        (E::UnsupportedVersion, Fatal),
        (E::InvalidRegularExpression, Fatal),
    ];
    for (code, expect) in cases {
        kip848_case(ApiKey::ConsumerGroupHeartbeat, code, expect).await;
    }
}

/// OffsetCommit in a KIP-848 group.
#[tokio::test]
async fn kip848_offset_commit_error_codes() {
    use ResponseError as E;
    let cases = [
        (E::StaleMemberEpoch, Retry { rediscover: false }),
        (E::CoordinatorLoadInProgress, Retry { rediscover: false }),
        (E::FencedMemberEpoch, RejoinKeep { lost: true }),
        (E::UnknownMemberId, RejoinKeep { lost: true }),
    ];
    for (code, expect) in cases {
        kip848_case(ApiKey::OffsetCommit, code, expect).await;
    }
    kip848_case(ApiKey::OffsetCommit, E::FencedInstanceId, Fatal).await;
}

// ---------------------------------------------------------------------------------------------
// Hostile bytes at group steps
// ---------------------------------------------------------------------------------------------

/// The member is the leader and another member's metadata is garbage: the member still
/// assigns (the unreadable member gets nothing) and syncs.
#[tokio::test]
async fn leader_with_garbage_member_metadata() {
    let (m, sc) = group_mock(None).await;
    sc.lock().unwrap().leader_with = Some(vec![
        (
            "garbage".into(),
            Bytes::from_static(b"\x00\x03\xff\xff\xff\xff\x00"),
        ),
        ("empty".into(), Bytes::new()),
    ]);
    let rec = Recorder::default();
    let mut c = member(&m, GroupProtocol::Classic, &rec);
    drive(&mut c, &sc, &rec, "leader", stable).await;
    let syncs = m.requests_of(ApiKey::SyncGroup);
    let first: SyncGroupRequest = syncs[0].decode();
    assert_eq!(first.assignments.len(), 3, "one assignment per member");
    {
        let g = sc.lock().unwrap();
        assert_eq!(
            g.assigned[&1].1,
            vec![0, 1],
            "the leader took both partitions"
        );
        check_commits(&g);
        assert_eq!(rec.calls(), vec![Call::Assigned(vec![tp(0), tp(1)])]);
    }
    tokio::time::timeout(BOUND, c.close()).await.unwrap();
}

/// SyncGroup assignments that are garbage: not applied; the member joins again and ends up
/// stable with the next, readable one.
#[tokio::test]
async fn sync_group_garbage_assignment() {
    let garbage = [
        Bytes::from_static(b"\x00"),
        Bytes::from_static(b"\x00\x03\x7f\xff\xff\xff"),
        Bytes::from_static(b"\x00\x00\x00\x00\x00\x01\x7f\xff"),
    ];
    for bytes in garbage {
        let (m, sc) = group_mock(None).await;
        sc.lock().unwrap().sync_bytes = vec![bytes.clone()];
        let rec = Recorder::default();
        let mut c = member(&m, GroupProtocol::Classic, &rec);
        drive(&mut c, &sc, &rec, "garbage assignment", stable).await;
        {
            let g = sc.lock().unwrap();
            assert!(
                g.join_member_ids.len() >= 3,
                "joined again: {:?}",
                g.join_member_ids
            );
            assert_eq!(g.join_member_ids[2], "m-1");
            check_commits(&g);
            assert_eq!(
                rec.calls(),
                vec![Call::Assigned(vec![tp(0), tp(1)])],
                "{bytes:?}"
            );
        }
        tokio::time::timeout(BOUND, c.close()).await.unwrap();
    }
}

/// A SyncGroup assignment naming a topic this member does not subscribe to: nothing of it is
/// consumed; the member joins again and ends up with the subscribed partitions only.
#[tokio::test]
async fn sync_group_assignment_of_unsubscribed_topics() {
    let (m, sc) = group_mock(None).await;
    let foreign = ConsumerProtocolAssignment::default().with_assigned_partitions(vec![
        CpTopicPartition::default()
            .with_topic(TopicName(s("other")))
            .with_partitions(vec![0, 1]),
    ]);
    let mut buf = BytesMut::new();
    buf.put_i16(1);
    foreign.encode(&mut buf, 1).unwrap();
    sc.lock().unwrap().sync_bytes = vec![buf.freeze()];
    let rec = Recorder::default();
    let mut c = member(&m, GroupProtocol::Classic, &rec);
    drive(&mut c, &sc, &rec, "foreign assignment", stable).await;
    let calls = rec.calls();
    assert!(
        calls
            .iter()
            .all(|c| !matches!(c, Call::Assigned(p) if p.iter().any(|tp| &*tp.topic != "t"))),
        "an unsubscribed topic was assigned: {calls:?}"
    );
    for f in m.requests_of(ApiKey::Fetch) {
        let f: FetchRequest = f.decode();
        for t in &f.topics {
            assert!(
                t.topic.is_empty() || t.topic.as_str() == "t",
                "fetched {:?}",
                t.topic
            );
        }
    }
    check_commits(&sc.lock().unwrap());
    tokio::time::timeout(BOUND, c.close()).await.unwrap();
}

/// A JoinGroup the coordinator never answers: given up after the rebalance timeout
/// (`max.poll.interval.ms`, 1 s here) plus 5 s, then the member joins again and is stable.
#[tokio::test]
async fn join_group_never_answered() {
    let (m, sc) = group_mock(None).await;
    // The first JoinGroup (member id empty) goes unanswered.
    m.once(ApiKey::JoinGroup, |_| Reply::none());
    let rec = Recorder::default();
    let mut c = member(&m, GroupProtocol::Classic, &rec);
    let started = Instant::now();
    drive(&mut c, &sc, &rec, "unanswered join", stable).await;
    let joins = m.requests_of(ApiKey::JoinGroup);
    assert!(joins.len() >= 2, "joined again");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(5),
        "waited for the join: {took:?}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    check_commits(&sc.lock().unwrap());
    tokio::time::timeout(BOUND, c.close()).await.unwrap();
}

/// A KIP-848 assignment naming topic ids no metadata knows: the known partitions are consumed,
/// the unknown ones never reach the application, and the membership goes on.
#[tokio::test]
async fn kip848_assignment_with_unknown_topic_ids() {
    let (m, sc) = group_mock(None).await;
    sc.lock().unwrap().extra_topic_ids =
        vec![uuid::Uuid::from_u128(0xdead_beef), uuid::Uuid::nil()];
    let rec = Recorder::default();
    let mut c = member(&m, GroupProtocol::Consumer, &rec);
    drive(&mut c, &sc, &rec, "unknown topic ids", stable).await;
    let calls = rec.calls();
    assert!(
        calls
            .iter()
            .all(|c| !matches!(c, Call::Assigned(p) if p.iter().any(|tp| &*tp.topic != "t"))),
        "{calls:?}"
    );
    assert!(
        calls.contains(&Call::Assigned(vec![tp(0), tp(1)])),
        "{calls:?}"
    );
    {
        let g = sc.lock().unwrap();
        check_commits(&g);
        assert!(
            !g.cgh.iter().skip(1).any(|(_, e)| *e == 0),
            "no rejoin: {:?}",
            g.cgh
        );
    }
    tokio::time::timeout(BOUND, c.close()).await.unwrap();
}

/// The script counts requests per API and injects its error once, at the first ready one.
#[test]
fn script_counts_requests() {
    let mut g = Script {
        inject: Some(Inject {
            api: ApiKey::Heartbeat,
            at: 1,
            code: 27,
        }),
        ..Script::default()
    };
    assert_eq!(g.next(ApiKey::Heartbeat, true), None);
    assert_eq!(g.next(ApiKey::Heartbeat, false), None);
    assert_eq!(g.next(ApiKey::Heartbeat, true), Some(27));
    assert_eq!(g.count(ApiKey::Heartbeat), 3);
}
