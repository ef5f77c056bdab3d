//! Entry points for the fuzz targets in `fuzz/`, compiled only with `--cfg fuzzing` (which
//! cargo-fuzz sets). Each function takes plain bytes or a list of plain operations, drives the
//! crate's internals with them, and checks invariants with `assert!`: a panic here is a finding.
//!
//! Nothing in here catches panics. In particular the response decoders are kafka-protocol's, and
//! a panic inside one of them is a finding to report upstream.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, BrokerId, ConsumerGroupHeartbeatRequest, FetchRequest,
    FetchResponse, FindCoordinatorRequest, FindCoordinatorResponse, HeartbeatRequest,
    JoinGroupRequest, LeaveGroupRequest, ListOffsetsRequest, MetadataRequest, MetadataResponse,
    OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, SyncGroupRequest, TopicName,
};
use kafka_protocol::protocol::{Message, StrBytes};
use uuid::Uuid;

use crate::checkpoint::{CommitRequest, Offsets, Outcome};
use crate::config::{IsolationLevel, OffsetReset};
use crate::error::Error;
use crate::handover::Mailbox;
use crate::proto::chunk::ChunkCursor;
use crate::proto::commit::{Action, Committer};
use crate::proto::fetch::{FetchConfig, FetchEvent, FetchState};
use crate::proto::frame;
use crate::proto::group::consumer_protocol;
use crate::proto::metadata::Metadata;
use crate::proto::versions::{self, BrokerVersions, Window};
use crate::types::{StartPosition, TopicPartition};

/// The largest frame [`frame`] accepts in its length check.
const MAX_FRAME: usize = 1 << 20;

/// The topic id of topic `t` in the metadata the harnesses use.
pub const TOPIC_ID: Uuid = Uuid::from_u128(42);

/// The response types [`frame`] decodes, selected by the input's first byte (modulo 12).
pub const FRAME_APIS: [&str; 12] = [
    "ApiVersions",
    "Metadata",
    "Fetch",
    "ListOffsets",
    "FindCoordinator",
    "OffsetCommit",
    "OffsetFetch",
    "JoinGroup",
    "SyncGroup",
    "Heartbeat",
    "LeaveGroup",
    "ConsumerGroupHeartbeat",
];

/// A response frame as the network layer sees it, preceded by two selector bytes:
/// `[api, version, length prefix (4 bytes), correlation id, rest of header, body]`.
///
/// `api % 12` indexes [`FRAME_APIS`]; `version` is taken modulo the size of our version window
/// for that API. The length prefix goes through the size check, the rest through
/// `correlation_id` and the response decoder, and what decodes is applied to the state it feeds
/// (version negotiation, metadata, a ListOffsets plan, the commit machine).
pub fn frame(data: &[u8]) {
    let [api, version, rest @ ..] = data else {
        return;
    };
    if let Some(prefix) = rest.first_chunk::<4>() {
        let _ = frame::check_length(i32::from_be_bytes(*prefix), MAX_FRAME);
    }
    let raw = Bytes::copy_from_slice(rest.get(frame::LENGTH_PREFIX..).unwrap_or_default());
    let _ = frame::correlation_id(&raw);
    let apiv = (0, <ApiVersionsRequest as Message>::VERSIONS.max);
    let pick = |(min, max): (i16, i16)| min + i16::from(*version) % (max - min + 1);
    let w = |w: Window| (w.min, w.max);
    match api % 12 {
        0 => api_versions(raw, pick(apiv)),
        1 => {
            if let Ok(r) =
                frame::decode_response::<MetadataRequest>(raw, pick(w(versions::METADATA)))
            {
                let mut m = Metadata::default();
                let _ = m.handle_response(&r);
                let _ = m.leader("t", 0);
            }
        }
        2 => {
            let _ = frame::decode_response::<FetchRequest>(raw, pick(w(versions::FETCH)));
        }
        3 => {
            let v = pick(w(versions::LIST_OFFSETS));
            if let Ok(r) = frame::decode_response::<ListOffsetsRequest>(raw, v) {
                let now = Instant::now();
                let mut f = fetch_state(IsolationLevel::ReadUncommitted);
                f.assign(
                    vec![
                        (tp(0), StartPosition::Earliest, 1),
                        (tp(1), StartPosition::Timestamp(5), 1),
                    ],
                    false,
                );
                for plan in f.plan_list_offsets(now, &metadata()) {
                    let _ = f.handle_list_offsets(plan, Ok(r.clone()), now);
                }
            }
        }
        4 => {
            let v = pick(w(versions::FIND_COORDINATOR));
            if let Ok(r) = frame::decode_response::<FindCoordinatorRequest>(raw, v) {
                let now = Instant::now();
                let mut c = committer();
                c.offer(commit_request(0b11, 1, now));
                if let Some(Action::FindCoordinator(seq)) = c.poll_action(now) {
                    let _ = c.handle_find_coordinator(seq, now, Ok(r));
                }
            }
        }
        5 => {
            let v = pick(w(versions::OFFSET_COMMIT));
            if let Ok(r) = frame::decode_response::<OffsetCommitRequest>(raw, v) {
                let now = Instant::now();
                let mut c = committer();
                c.offer(commit_request(0b111, 1, now));
                if let Some(Action::FindCoordinator(seq)) = c.poll_action(now) {
                    let _ = c.handle_find_coordinator(seq, now, Ok(found(1, 0, 9092, true)));
                }
                if let Some(Action::Commit { seq, .. }) = c.poll_action(now) {
                    let _ = c.handle_commit(seq, now, Ok(r));
                }
            }
        }
        6 => {
            let v = pick(w(versions::OFFSET_FETCH));
            let _ = frame::decode_response::<OffsetFetchRequest>(raw, v);
        }
        7 => {
            let _ = frame::decode_response::<JoinGroupRequest>(raw, pick(w(versions::JOIN_GROUP)));
        }
        8 => {
            let _ = frame::decode_response::<SyncGroupRequest>(raw, pick(w(versions::SYNC_GROUP)));
        }
        9 => {
            let _ = frame::decode_response::<HeartbeatRequest>(raw, pick(w(versions::HEARTBEAT)));
        }
        10 => {
            let v = pick(w(versions::LEAVE_GROUP));
            let _ = frame::decode_response::<LeaveGroupRequest>(raw, v);
        }
        _ => {
            let v = pick(w(versions::CONSUMER_GROUP_HEARTBEAT));
            let _ = frame::decode_response::<ConsumerGroupHeartbeatRequest>(raw, v);
        }
    }
}

/// ApiVersions as the connection negotiates it, including the KIP-511 fallback: an
/// UNSUPPORTED_VERSION answer is a v0 body whatever version was asked.
fn api_versions(raw: Bytes, version: i16) {
    if frame::peek_error_code_after_v0_header(&raw) == Some(35) && version > 0 {
        let _ = frame::decode_api_versions_fallback(&raw);
        return;
    }
    if let Ok(r) = frame::decode_response::<ApiVersionsRequest>(raw, version) {
        let b = BrokerVersions::from_response(&r);
        for w in [
            versions::METADATA,
            versions::FETCH,
            versions::LIST_OFFSETS,
            versions::FIND_COORDINATOR,
            versions::OFFSET_COMMIT,
            versions::OFFSET_FETCH,
        ] {
            if let Ok(v) = b.choose(w) {
                assert!((w.min..=w.max).contains(&v), "{w:?} chose v{v}");
            }
        }
    }
}

/// A Fetch response body, preceded by two bytes: `[version, flags, body]`.
///
/// `version` modulo the size of our Fetch window selects v12..=v18. Flag bit 0 selects `read_committed`. The consumer assigns
/// partitions 0 and 1 of topic `t` (id [`TOPIC_ID`], both led by node 1) at offset 0, plans one
/// fetch, and feeds it the decoded response; every chunk handed out is then decoded to its end
/// in pieces, with small limits.
pub fn fetch_response(data: &[u8]) {
    let [version, flags, body @ ..] = data else {
        return;
    };
    let (min, max) = (versions::FETCH.min, versions::FETCH.max);
    let version = min + i16::from(*version) % (max - min + 1);
    let isolation = if flags & 1 == 1 {
        IsolationLevel::ReadCommitted
    } else {
        IsolationLevel::ReadUncommitted
    };
    let body = Bytes::copy_from_slice(body);
    let Ok(resp) = frame::decode_body::<FetchResponse>(ApiKey::Fetch, body, version, 0) else {
        return;
    };
    let now = Instant::now();
    let meta = metadata();
    let mut f = fetch_state(isolation);
    f.assign(
        vec![
            (tp(0), StartPosition::Offset(0), 1),
            (tp(1), StartPosition::Offset(0), 1),
        ],
        false,
    );
    let mut plans = f.plan_fetches(now, &meta, &HashSet::new(), 1 << 20);
    assert_eq!(plans.len(), 1, "both partitions are led by node 1");
    let Some(plan) = plans.pop() else { return };
    let out = f.handle_fetch(plan, Ok(resp), now);
    for event in out.events {
        let FetchEvent::Chunk(chunk) = event else {
            continue;
        };
        assert!(chunk.next_offset >= chunk.fetch_offset, "{chunk:?}");
        let mut cursor = ChunkCursor::new(chunk, isolation);
        let mut position = 0;
        let mut pieces = 0usize;
        while !cursor.is_done() {
            let piece = cursor.next_piece(64 << 10, 4 << 10);
            assert!(piece.next_offset >= position, "the position went back");
            position = piece.next_offset;
            pieces += 1;
            assert!(pieces <= MAX_FRAME, "a chunk that never ends");
            for r in &piece.records {
                r.headers().for_each(|h| {
                    std::hint::black_box(h);
                });
            }
        }
    }
    // Whatever happened, planning again must work.
    let _ = f.plan_fetches(now, &meta, &HashSet::new(), 1 << 20);
    let _ = f.plan_list_offsets(now, &meta);
}

/// One step of [`commit_machine`].
#[derive(Clone, Copy, Debug)]
pub enum CommitOp {
    /// Offer a commit of the partitions in this bit mask (bits 0..3: `t-0`, `t-1`, `u-0`).
    Offer(u8),
    /// Advance the clock by this many milliseconds, then take every action due.
    Poll(u16),
    /// Answer the FindCoordinator lookup.
    FindAnswer {
        /// Answer with an old request id instead of the outstanding one.
        stale: bool,
        /// The request failed on the wire.
        transport_error: bool,
        /// Answer in the v4+ shape (`coordinators`) rather than v3's top-level fields.
        batched: bool,
        /// Index into a table of interesting error codes (beyond it: the byte itself).
        code: u8,
        /// The coordinator's node id.
        node: i8,
        /// The coordinator's port.
        port: u16,
    },
    /// Answer the OffsetCommit in flight.
    CommitAnswer {
        /// Answer with an old request id instead of the outstanding one.
        stale: bool,
        /// The request failed on the wire.
        transport_error: bool,
        /// Per partition (as in [`CommitOp::Offer`]), an index into the code table.
        codes: [u8; 3],
        /// Partitions left out of the answer (bit mask).
        missing: u8,
    },
    /// Advance the clock by this many milliseconds, then check the deadline.
    Timeout(u16),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Pending,
    Superseded,
    Finished,
}

/// Drives the commit state machine with a fake clock and checks that at most one commit is in
/// flight, that a commit is only sent to a coordinator that was found, and that every offered
/// commit ends exactly once: superseded, finished, or still pending at the end.
pub fn commit_machine(ops: &[CommitOp]) {
    let t0 = Instant::now();
    let mut now = t0;
    let mut c = committer();
    let mut fates: Vec<Fate> = Vec::new();
    let mut finding: Option<u64> = None;
    let mut in_flight: Option<u64> = None;
    let mut last_seq = 0u64;
    let mut last_sent = -1i64;
    let mut found_nodes: BTreeSet<i32> = BTreeSet::new();
    let id = |r: &CommitRequest| r.checkpoint_id.map_or(usize::MAX, |i| i as usize);
    let end = |fates: &mut Vec<Fate>, r: &CommitRequest, fate: Fate| {
        let f = &mut fates[id(r)];
        assert_eq!(*f, Fate::Pending, "commit {} ended twice", id(r));
        *f = fate;
    };
    for op in ops {
        match *op {
            CommitOp::Offer(mask) => {
                let n = fates.len() as u64;
                fates.push(Fate::Pending);
                c.offer(commit_request(mask, n, now));
                for old in c.take_superseded() {
                    end(&mut fates, &old, Fate::Superseded);
                }
            }
            CommitOp::Poll(ms) => {
                now += Duration::from_millis(u64::from(ms));
                while let Some(action) = c.poll_action(now) {
                    for old in c.take_superseded() {
                        end(&mut fates, &old, Fate::Superseded);
                    }
                    match action {
                        Action::FindCoordinator(seq) => {
                            assert!(finding.is_none() && in_flight.is_none(), "two lookups");
                            assert!(seq > last_seq, "request ids go up");
                            last_seq = seq;
                            finding = Some(seq);
                        }
                        Action::Commit { seq, node, request } => {
                            // Commits go out in checkpoint order: every offset of a request
                            // is its number (see `commit_request`), which never goes down.
                            // (A request with no partitions carries no number.)
                            let sent = request
                                .topics
                                .iter()
                                .flat_map(|t| t.partitions.iter())
                                .map(|p| p.committed_offset)
                                .max();
                            if let Some(sent) = sent {
                                assert!(sent >= last_sent, "commit {sent} sent after {last_sent}");
                                last_sent = sent;
                            }
                            assert!(in_flight.is_none(), "two commits in flight");
                            assert!(finding.is_none(), "a commit during a lookup");
                            assert_eq!(c.coordinator(), Some(node));
                            assert!(found_nodes.contains(&node), "node {node} was never found");
                            assert!(seq > last_seq, "request ids go up");
                            last_seq = seq;
                            in_flight = Some(seq);
                        }
                    }
                }
                for old in c.take_superseded() {
                    end(&mut fates, &old, Fate::Superseded);
                }
            }
            CommitOp::FindAnswer {
                stale,
                transport_error,
                batched,
                code,
                node,
                port,
            } => {
                let seq = match finding {
                    Some(seq) if !stale => {
                        finding = None;
                        seq
                    }
                    _ => last_seq.saturating_sub(1),
                };
                let result = if transport_error {
                    Err(Error::Closed)
                } else {
                    Ok(found(
                        i32::from(node),
                        code_of(code),
                        i32::from(port),
                        batched,
                    ))
                };
                match c.handle_find_coordinator(seq, now, result) {
                    Ok(Some((node, _))) => {
                        assert!(node >= 0);
                        found_nodes.insert(node);
                    }
                    Ok(None) => {}
                    Err(done) => end(&mut fates, &done.request, Fate::Finished),
                }
            }
            CommitOp::CommitAnswer {
                stale,
                transport_error,
                codes,
                missing,
            } => {
                let seq = match in_flight {
                    Some(seq) if !stale => {
                        in_flight = None;
                        seq
                    }
                    _ => last_seq.saturating_sub(1),
                };
                let result = if transport_error {
                    Err(Error::Closed)
                } else {
                    Ok(commit_answer(codes, missing))
                };
                if let Some(done) = c.handle_commit(seq, now, result) {
                    if matches!(done.outcome, Outcome::Acked) {
                        assert_eq!(done.stored.len(), done.request.offsets.len());
                    }
                    end(&mut fates, &done.request, Fate::Finished);
                }
            }
            CommitOp::Timeout(ms) => {
                now += Duration::from_millis(u64::from(ms));
                if let Some(done) = c.handle_timeout(now) {
                    assert!(now >= done.request.created + TIMEOUT, "timed out early");
                    finding = None;
                    in_flight = None;
                    end(&mut fates, &done.request, Fate::Finished);
                }
            }
        }
        if c.is_idle() {
            assert!(
                finding.is_none() && in_flight.is_none(),
                "idle with a request out"
            );
        }
    }
    for old in c.take_superseded() {
        end(&mut fates, &old, Fate::Superseded);
    }
    let pending = c.take_all();
    for r in &pending {
        assert_eq!(
            fates[id(r)],
            Fate::Pending,
            "commit {} ended and is pending",
            id(r)
        );
    }
    let count = |f: Fate| fates.iter().filter(|x| **x == f).count();
    assert_eq!(
        count(Fate::Pending),
        pending.len(),
        "a commit was lost: {fates:?}"
    );
    assert_eq!(
        count(Fate::Superseded) + count(Fate::Finished) + pending.len(),
        fates.len()
    );
    assert!(c.is_idle());
}

/// One step of [`mailbox`].
#[derive(Clone, Debug)]
pub enum MailboxOp {
    /// Publish this value.
    Publish(Vec<u8>),
    /// Take what is there.
    Take,
    /// Drop the mailbox (with whatever it holds) and start a new one.
    Renew,
}

/// Publishes and takes on one thread, against a model `Option`: the latest value wins, a
/// replaced value comes back from `publish`, and every value published is taken, replaced or
/// dropped with its mailbox exactly once.
pub fn mailbox(ops: &[MailboxOp]) {
    let mut mb: Mailbox<Vec<u8>> = Mailbox::new();
    let mut model: Option<Vec<u8>> = None;
    let (mut published, mut taken, mut superseded, mut dropped) = (0usize, 0, 0, 0);
    for (i, op) in ops.iter().enumerate() {
        match op {
            MailboxOp::Publish(v) => {
                // The index makes every value distinct, so a mix-up cannot go unseen.
                let mut v = v.clone();
                v.extend_from_slice(&i.to_le_bytes());
                published += 1;
                let old = mb.publish(v.clone());
                assert_eq!(old, model.replace(v), "publish returned the wrong value");
                superseded += usize::from(old.is_some());
            }
            MailboxOp::Take => {
                let got = mb.take();
                assert_eq!(got, model.take(), "take returned the wrong value");
                taken += usize::from(got.is_some());
            }
            MailboxOp::Renew => {
                dropped += usize::from(model.take().is_some());
                mb = Mailbox::new();
            }
        }
    }
    let left = mb.take();
    assert_eq!(left, model);
    assert_eq!(
        published,
        taken + superseded + dropped + usize::from(left.is_some())
    );
    assert_eq!(mb.take(), None);
}

/// Arbitrary bytes as a ConsumerProtocol subscription and as an assignment (the JoinGroup member
/// metadata and the SyncGroup assignment).
///
/// Whatever decodes is encoded again and decoded again: the second decode must give the same
/// message (up to the order the encoder imposes: sorted topics and owned partitions, assigned
/// partitions grouped by topic), and encoding that must give the same bytes.
pub fn consumer_protocol(data: &[u8]) {
    let data = Bytes::copy_from_slice(data);
    if let Ok(s) = consumer_protocol::decode_subscription(&data) {
        let bytes = consumer_protocol::encode_subscription(&s).expect("decoded values fit");
        let again = consumer_protocol::decode_subscription(&bytes).expect("own encoding decodes");
        let mut want = s;
        want.topics.sort();
        want.owned_partitions.sort();
        assert_eq!(again, want);
        assert_eq!(
            consumer_protocol::encode_subscription(&again).ok(),
            Some(bytes)
        );
    }
    if let Ok(a) = consumer_protocol::decode_assignment(&data) {
        let bytes = consumer_protocol::encode_assignment(&a).expect("decoded values fit");
        let again = consumer_protocol::decode_assignment(&bytes).expect("own encoding decodes");
        assert_eq!(again.user_data, a.user_data);
        let (mut x, mut y) = (a.partitions, again.partitions.clone());
        x.sort();
        y.sort();
        assert_eq!(x, y);
        assert_eq!(
            consumer_protocol::encode_assignment(&again).ok(),
            Some(bytes)
        );
    }
}

fn tp(p: i32) -> TopicPartition {
    TopicPartition::new("t", p)
}

fn topic_name(t: &str) -> TopicName {
    TopicName(StrBytes::from_string(t.to_owned()))
}

fn fetch_state(isolation: IsolationLevel) -> FetchState {
    FetchState::new(FetchConfig {
        max_wait_ms: 500,
        min_bytes: 1,
        max_bytes: 1 << 20,
        partition_max_bytes: 1 << 16,
        isolation,
        reset: OffsetReset::Earliest,
        restore_reset: OffsetReset::Error,
        retry_backoff: Duration::from_millis(100),
    })
}

/// Topic `t` (id [`TOPIC_ID`]) with partitions 0 and 1, both led by node 1 at epoch 3.
fn metadata() -> Metadata {
    let part = |p: i32| {
        MetadataResponsePartition::default()
            .with_partition_index(p)
            .with_leader_id(BrokerId(1))
            .with_leader_epoch(3)
    };
    let mut m = Metadata::default();
    let _ = m.handle_response(
        &MetadataResponse::default()
            .with_brokers(vec![
                MetadataResponseBroker::default()
                    .with_node_id(BrokerId(1))
                    .with_host(StrBytes::from_static_str("127.0.0.1"))
                    .with_port(9092),
            ])
            .with_topics(vec![
                MetadataResponseTopic::default()
                    .with_name(Some(topic_name("t")))
                    .with_topic_id(TOPIC_ID)
                    .with_partitions(vec![part(0), part(1)]),
            ]),
    );
    m
}

/// The commit timeout of [`commit_machine`].
const TIMEOUT: Duration = Duration::from_secs(1);

fn committer() -> Committer {
    Committer::new("g", TIMEOUT, Duration::from_millis(100))
}

const PARTITIONS: [(&str, i32); 3] = [("t", 0), ("t", 1), ("u", 0)];

fn commit_request(mask: u8, n: u64, created: Instant) -> CommitRequest {
    let offsets: Offsets = PARTITIONS
        .iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(_, (t, p))| (TopicPartition::new(*t, *p), (n as i64, 0)))
        .collect();
    CommitRequest {
        checkpoint_id: Some(n),
        offsets: Arc::new(offsets),
        created,
    }
}

/// Error codes the commit machine treats differently, then a fatal one.
const CODES: [ResponseError; 8] = [
    ResponseError::NotCoordinator,
    ResponseError::CoordinatorNotAvailable,
    ResponseError::CoordinatorLoadInProgress,
    ResponseError::RequestTimedOut,
    ResponseError::UnknownTopicOrPartition,
    ResponseError::UnknownMemberId,
    ResponseError::GroupAuthorizationFailed,
    ResponseError::OffsetMetadataTooLarge,
];

/// 0 is success, 1..=8 the table, anything else the byte itself as a code.
fn code_of(i: u8) -> i16 {
    match i {
        0 => 0,
        1..=8 => CODES[usize::from(i - 1)].code(),
        other => i16::from(other),
    }
}

fn found(node: i32, code: i16, port: i32, batched: bool) -> FindCoordinatorResponse {
    let host = StrBytes::from_static_str("127.0.0.1");
    if batched {
        FindCoordinatorResponse::default().with_coordinators(vec![
            Coordinator::default()
                .with_node_id(BrokerId(node))
                .with_host(host)
                .with_port(port)
                .with_error_code(code),
        ])
    } else {
        FindCoordinatorResponse::default()
            .with_node_id(BrokerId(node))
            .with_host(host)
            .with_port(port)
            .with_error_code(code)
    }
}

fn commit_answer(codes: [u8; 3], missing: u8) -> OffsetCommitResponse {
    let mut topics: Vec<OffsetCommitResponseTopic> = Vec::new();
    for (i, (t, p)) in PARTITIONS.iter().enumerate() {
        if missing & (1 << i) != 0 {
            continue;
        }
        let part = OffsetCommitResponsePartition::default()
            .with_partition_index(*p)
            .with_error_code(code_of(codes[i]));
        match topics.iter_mut().find(|x| x.name.0.as_str() == *t) {
            Some(x) => x.partitions.push(part),
            None => topics.push(
                OffsetCommitResponseTopic::default()
                    .with_name(topic_name(t))
                    .with_partitions(vec![part]),
            ),
        }
    }
    OffsetCommitResponse::default().with_topics(topics)
}
