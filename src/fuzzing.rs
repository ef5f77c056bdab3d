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
use crate::proto::crc_scan::CrcScan;
use crate::proto::fetch::{FetchConfig, FetchEvent, FetchState, Lane};
use crate::proto::frame;
use crate::proto::group::consumer_protocol;
use crate::proto::metadata::Metadata;
use crate::proto::records::{
    AbortedTransactions, BatchIter, DecodeLimits, decode_batch, decode_batch_general,
};
use crate::proto::versions::{self, BrokerVersions, Window};
use crate::types::{Records, StartPosition, TopicPartition};

/// Arbitrary bytes as a partition's `records` field: split into batches, classified by a
/// `read_committed` filter, and each batch decoded with and without the CRC check (mutated
/// bytes rarely keep a valid CRC; without the check they reach the record readers).
///
/// The fast record reader must agree with the general one: the same entries, or the same
/// error. Every decoded record's headers must iterate to their count.
pub fn record_batch(data: &[u8]) {
    let limits = DecodeLimits::new(1 << 20);
    let mut filter = AbortedTransactions::new([(1, 0), (2, 5)]);
    let (mut out, mut general) = (Records::new(), Records::new());
    for batch in BatchIter::new(Bytes::copy_from_slice(data)) {
        let Ok(batch) = batch else { break };
        let _ = filter.classify(&batch);
        for check_crc in [true, false] {
            let limits = limits.with_check_crc(check_crc);
            let fast = decode_batch(&batch, &limits, &mut out);
            let slow = decode_batch_general(&batch, &limits, &mut general);
            match (&fast, &slow) {
                (Ok(()), Ok(())) => assert_eq!(out.entries, general.entries),
                (Err(f), Err(g)) => assert_eq!(f.to_string(), g.to_string()),
                _ => panic!("fast reader {fast:?}, general reader {slow:?}"),
            }
            for record in &out {
                assert_eq!(record.headers().count(), record.header_count());
            }
            out.clear();
            general.clear();
        }
    }
}

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
/// in pieces, with small limits. Before that the response is scanned for CRCs as the read loop
/// scans it while it arrives, in pieces whose size the other flag bits choose: every batch the
/// scan counts as checked must have a matching CRC at that position, and the decoding skips
/// the CRC only of those.
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
    // The frame as the read loop sees it: a response header (correlation id, no tagged
    // fields), then the body, scanned for CRCs in pieces of a size the flags choose.
    let mut whole = vec![0, 0, 0, 1, 0];
    whole.extend_from_slice(body);
    let whole = Bytes::from(whole);
    let step = 16 + usize::from(flags >> 1) * 509;
    let mut scan = CrcScan::fetch(version);
    let mut n = 0;
    while n < whole.len() {
        n = (n + step).min(whole.len());
        scan.advance(&whole[..n]);
    }
    let checked = scan.finish(&whole);
    for (at, crc) in checked.within(&whole) {
        // Only a batch whose CRC matches its own bytes there counts as checked.
        let at = at as usize;
        let len = i32::from_be_bytes(whole[at + 8..at + 12].try_into().expect("4 bytes"));
        let batch = &whole[at..at + 12 + usize::try_from(len).expect("a checked length")];
        assert_eq!(batch[16], 2, "magic of a checked batch");
        assert_eq!(&crc.to_be_bytes()[..], &batch[17..21], "stored CRC");
        assert_eq!(crc32c::crc32c(&batch[21..]), crc, "a batch checked at {at}");
    }
    let body = whole.slice(5..);
    let Ok(resp) = frame::decode_body::<FetchResponse>(ApiKey::Fetch, body, version, 5) else {
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
    let out = f.handle_fetch_checked(plan, Ok(resp), &checked, now);
    for event in out.events {
        let FetchEvent::Chunk(chunk) = event else {
            continue;
        };
        assert!(chunk.next_offset >= chunk.fetch_offset, "{chunk:?}");
        let mut cursor = ChunkCursor::new(chunk, isolation);
        let mut position = 0;
        let mut pieces = 0usize;
        while !cursor.is_done() {
            let piece = cursor.next_piece(&DecodeLimits::new(64 << 10), 4 << 10, 64);
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
#[derive(Clone, Copy, Debug, arbitrary::Arbitrary)]
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
#[derive(Clone, Debug, arbitrary::Arbitrary)]
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
        connections_per_broker: 1,
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

/// Reads a fuzz input as a stream of small numbers; zero once it runs out.
struct Bytes8<'a>(&'a [u8]);

impl Bytes8<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }

    fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    fn done(&self) -> bool {
        self.0.is_empty()
    }

    /// An error code: one of the group protocols' (and 0), or any value.
    fn code(&mut self) -> i16 {
        const CODES: [i16; 24] = [
            0, 0, 0, 7, 14, 15, 16, 22, 23, 24, 25, 26, 27, 30, 35, 42, 79, 81, 82, 110, 111, 112,
            113, 128,
        ];
        let b = self.u8();
        CODES
            .get(usize::from(b))
            .copied()
            .unwrap_or(i16::from(b as i8))
    }

    /// A few bytes of arbitrary length (at most 64).
    fn bytes(&mut self) -> Bytes {
        let n = usize::from(self.u8() % 65).min(self.0.len());
        let (b, rest) = self.0.split_at(n);
        self.0 = rest;
        Bytes::copy_from_slice(b)
    }
}

/// The topics the group fuzzers play with; `x` is never subscribed.
const GROUP_TOPICS: [&str; 3] = ["a", "b", "x"];

fn group_config(r: &mut Bytes8<'_>) -> crate::proto::group::GroupConfig {
    use crate::config::AssignmentStrategy;
    let strategy = match r.u8() % 3 {
        0 => AssignmentStrategy::Range,
        1 => AssignmentStrategy::CooperativeSticky,
        _ => AssignmentStrategy::RoundRobin,
    };
    crate::proto::group::GroupConfig {
        group_id: "g".into(),
        instance_id: r.bool().then(|| "i".to_owned()),
        session_timeout: Duration::from_secs(10),
        rebalance_timeout: Duration::from_secs(30),
        heartbeat_interval: Duration::from_secs(1),
        retry_backoff: Duration::from_millis(100),
        assignors: vec![crate::assignor::builtin(strategy)],
    }
}

fn group_topics(mask: u8) -> BTreeSet<String> {
    GROUP_TOPICS
        .iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(_, t)| (*t).to_owned())
        .collect()
}

/// Partitions 0..4 of the three topics, chosen by a 12-bit mask.
fn group_partitions(mask: u16) -> Vec<TopicPartition> {
    (0..12)
        .filter(|i| mask & (1 << i) != 0)
        .map(|i| TopicPartition::new(GROUP_TOPICS[i / 4], (i % 4) as i32))
        .collect()
}

fn transport_error() -> Error {
    Error::timeout("a fuzzed request", Duration::from_secs(1))
}

/// What both group fuzzers check after every step, from the events the machine emitted.
#[derive(Default)]
struct GroupModel {
    /// Partitions lost, or revoked and given up, and not assigned again since.
    gone: BTreeSet<TopicPartition>,
    /// The revocation the application has not finished.
    revoking: Option<BTreeSet<TopicPartition>>,
    /// Set by an assignment, cleared when partitions are lost.
    member: bool,
    /// The coordinator the last lookup answered.
    found: Option<i32>,
    /// Closed: nothing is owned, assigned or sent from now on.
    closed: bool,
}

impl GroupModel {
    fn events(&mut self, events: Vec<crate::proto::group::GroupEvent>) {
        use crate::proto::group::GroupEvent;
        for e in events {
            match e {
                GroupEvent::Revoke(tps) => {
                    assert!(
                        self.revoking.is_none(),
                        "a second Revoke before the first was done"
                    );
                    self.revoking = Some(tps.into_iter().collect());
                }
                GroupEvent::Lost(tps) => {
                    // A revocation under way is void: the partitions are gone already, and
                    // may be assigned again before the application answers it.
                    self.member = false;
                    self.gone.extend(tps);
                    self.revoking = None;
                }
                GroupEvent::Assign { added, .. } => {
                    assert!(!self.closed, "{added:?} assigned after close");
                    if let Some(r) = &self.revoking {
                        for tp in &added {
                            assert!(!r.contains(tp), "{tp} assigned again while being revoked");
                        }
                    }
                    self.member = true;
                    for tp in added {
                        self.gone.remove(&tp);
                    }
                }
            }
        }
    }

    /// Closing gives everything up, a revocation under way included.
    fn close(&mut self, m: &crate::proto::group::Membership) {
        self.gone.extend(m.owned().iter().cloned());
        if let Some(r) = self.revoking.take() {
            self.gone.extend(r);
        }
        self.member = false;
        self.closed = true;
    }

    fn revocation_done(&mut self) {
        if let Some(r) = self.revoking.take() {
            self.gone.extend(r);
        }
    }

    fn check(&self, m: &crate::proto::group::Membership) {
        if self.closed {
            assert!(m.owned().is_empty(), "a closed member owns partitions");
            assert!(m.identity().is_none(), "a closed member has an identity");
        }
        for tp in m.owned() {
            assert!(
                !self.gone.contains(tp),
                "{tp} owned after it was lost or revoked"
            );
        }
        if let Some(id) = m.identity() {
            assert!(
                id.generation_or_epoch >= 0,
                "identity with generation {id:?}"
            );
            // Classic: a generation comes with its assignment. (A KIP-848 epoch may come
            // before any assignment does.)
            if matches!(m, crate::proto::group::Membership::Classic(_)) {
                assert!(
                    self.member,
                    "identity {id:?} without an assignment since partitions were lost"
                );
            }
            assert!(!m.is_fatal(), "identity of a fatal member");
        }
        if m.is_fatal() {
            assert!(m.owned().is_empty(), "a fatal member owns partitions");
        }
    }

    /// A request for the coordinator goes to the one found last, which the machine knows.
    fn to_coordinator(&self, m: &crate::proto::group::Membership, node: i32) {
        assert_eq!(
            m.coordinator(),
            Some(node),
            "request to {node}, not the coordinator"
        );
        assert_eq!(
            self.found,
            Some(node),
            "request to {node}, which no lookup answered"
        );
    }
}

/// Drives a classic group member (`ClassicMember`) with answers built from the input: arbitrary
/// error codes, generations, member ids, leaders, member metadata and assignment bytes (valid
/// encodings or garbage), lost answers, revocations finished, poll timeouts, subscription and
/// metadata changes, refused commits, on a fake clock. Checks: at most one JoinGroup/SyncGroup
/// (or leader metadata) step and one heartbeat in flight, requests only to the coordinator
/// found, no identity without a current assignment, no partition owned after it was lost or
/// given up until assigned again, no partition of a revocation assigned again before the
/// revocation is done, and no panic.
pub fn classic_member(data: &[u8]) {
    use crate::assignor::{MemberAssignment, Subscription};
    use crate::proto::group::classic::ClassicMember;
    use crate::proto::group::{GroupAction, Membership};
    use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
    use kafka_protocol::messages::{HeartbeatResponse, JoinGroupResponse, SyncGroupResponse};

    let mut r = Bytes8(data);
    let cfg = group_config(&mut r);
    let mut m = Membership::Classic(ClassicMember::new(cfg));
    let mut model = GroupModel::default();
    let t0 = Instant::now();
    let mut now = t0;
    let mut finding: Option<u64> = None;
    // The JoinGroup, leader metadata or SyncGroup out, and the heartbeat out.
    let mut step: Option<(u64, u8)> = None;
    let mut heartbeat: Option<u64> = None;
    let mut counts: std::collections::BTreeMap<String, i32> =
        GROUP_TOPICS.iter().map(|t| ((*t).to_owned(), 4)).collect();
    let member_ids = ["", "m-1", "m-2", "i"];
    let Membership::Classic(_) = &m else {
        unreachable!()
    };
    let mut steps = 0;
    while !r.done() && steps < 2000 {
        steps += 1;
        let op = r.u8();
        let Membership::Classic(c) = &mut m else {
            unreachable!()
        };
        match op % 16 {
            0 | 1 => {
                let coordinator = c.coordinator();
                if let Some(action) = m.poll_action(now) {
                    // The coordinator changed since the step went out: that step is void.
                    let _ = coordinator;
                    match action {
                        GroupAction::FindCoordinator { seq } => {
                            assert!(finding.is_none(), "two lookups");
                            assert!(m.coordinator().is_none(), "lookup with a coordinator");
                            finding = Some(seq);
                        }
                        GroupAction::Join { seq, node, request } => {
                            model.to_coordinator(&m, node);
                            assert!(step.is_none(), "JoinGroup while {step:?} is out");
                            assert!(request.protocols.len() <= 1);
                            step = Some((seq, 0));
                        }
                        GroupAction::Heartbeat { seq, node, .. } => {
                            model.to_coordinator(&m, node);
                            assert!(heartbeat.is_none(), "two heartbeats out");
                            assert!(step.is_none(), "heartbeat while {step:?} is out");
                            heartbeat = Some(seq);
                        }
                        other => panic!("unexpected action from poll_action: {other:?}"),
                    }
                }
            }
            2 => now += Duration::from_millis(u64::from(r.u8()) * 20),
            3 => {
                if let Some(seq) = finding.take() {
                    let result = if r.bool() {
                        let node = i32::from(r.u8() % 3);
                        model.found = Some(node);
                        Ok(node)
                    } else {
                        let code = r.code();
                        Err(match ResponseError::try_from_code(code) {
                            Some(code) if code != ResponseError::UnknownServerError => {
                                Error::broker(code, "FindCoordinator", None)
                            }
                            _ => transport_error(),
                        })
                    };
                    m.handle_find_coordinator(seq, now, result);
                }
            }
            4 => {
                // A JoinGroup answer.
                let Some((seq, 0)) = step else { continue };
                let code = r.code();
                let mut resp = JoinGroupResponse::default()
                    .with_error_code(code)
                    .with_generation_id(i32::from(r.u8() as i8))
                    .with_member_id(StrBytes::from_static_str(
                        member_ids[usize::from(r.u8() % 4)],
                    ))
                    .with_protocol_type(match r.u8() % 4 {
                        0 => None,
                        1 => Some(StrBytes::from_static_str("connect")),
                        _ => Some(StrBytes::from_static_str("consumer")),
                    })
                    .with_protocol_name(match r.u8() % 4 {
                        0 => None,
                        1 => Some(StrBytes::from_static_str("nonesuch")),
                        _ => Some(StrBytes::from_string(
                            c.assignor_names().first().cloned().unwrap_or_default(),
                        )),
                    })
                    .with_skip_assignment(r.u8() % 8 == 0);
                let leader = r.u8() % 3;
                resp.leader = match leader {
                    0 => resp.member_id.clone(),
                    1 => StrBytes::from_static_str("other"),
                    _ => StrBytes::default(),
                };
                for i in 0..r.u8() % 4 {
                    let metadata = if r.bool() {
                        r.bytes()
                    } else {
                        let sub = Subscription {
                            topics: group_topics(r.u8()).into_iter().collect(),
                            owned_partitions: group_partitions(u16::from(r.u8())),
                            generation_id: i32::from(r.u8() as i8),
                            ..Subscription::default()
                        };
                        consumer_protocol::encode_subscription(&sub).unwrap_or_default()
                    };
                    resp.members.push(
                        JoinGroupResponseMember::default()
                            .with_member_id(if i == 0 {
                                resp.member_id.clone()
                            } else {
                                StrBytes::from_string(format!("o-{i}"))
                            })
                            .with_metadata(metadata),
                    );
                }
                step = None;
                heartbeat = None;
                let result = if r.u8() % 8 == 0 {
                    Err(transport_error())
                } else {
                    Ok(resp)
                };
                let Membership::Classic(c) = &mut m else {
                    unreachable!()
                };
                let action = c.handle_join(seq, now, result);
                after_step(&m, &mut model, &mut step, action);
            }
            5 => {
                // The leader's metadata.
                let Some((seq, 1)) = step else { continue };
                step = None;
                let result = if r.u8() % 8 == 0 {
                    Err(transport_error())
                } else {
                    Ok(counts.clone())
                };
                let action = c.handle_leader_metadata(seq, now, result);
                after_step(&m, &mut model, &mut step, action);
            }
            6 => {
                // A SyncGroup answer.
                let Some((seq, 2)) = step else { continue };
                step = None;
                let code = r.code();
                let assignment = if r.bool() {
                    r.bytes()
                } else {
                    let a = MemberAssignment {
                        partitions: group_partitions(u16::from(r.u8()) | (u16::from(r.u8()) << 8)),
                        user_data: None,
                    };
                    consumer_protocol::encode_assignment(&a).unwrap_or_default()
                };
                let resp = SyncGroupResponse::default()
                    .with_error_code(code)
                    .with_protocol_name(if r.u8() % 8 == 0 {
                        Some(StrBytes::from_static_str("nonesuch"))
                    } else {
                        None
                    })
                    .with_assignment(assignment);
                let result = if r.u8() % 8 == 0 {
                    Err(transport_error())
                } else {
                    Ok(resp)
                };
                c.handle_sync(seq, now, result, &counts);
            }
            7 => {
                let Some(seq) = heartbeat.take() else {
                    continue;
                };
                let result = if r.u8() % 8 == 0 {
                    Err(transport_error())
                } else {
                    Ok(HeartbeatResponse::default().with_error_code(r.code()))
                };
                c.handle_heartbeat(seq, now, result);
            }
            8 => {
                model.revocation_done();
                m.revocation_done(now, &|_| None);
            }
            9 => {
                if let Some(GroupAction::Leave { node, .. }) = m.poll_timeout() {
                    model.to_coordinator(&m, node);
                }
                step = None;
                heartbeat = None;
            }
            10 => m.resume_after_poll_timeout(),
            11 => c.subscribe(group_topics(r.u8())),
            12 => {
                let t = GROUP_TOPICS[usize::from(r.u8() % 3)];
                counts.insert(t.to_owned(), i32::from(r.u8() % 8));
                c.metadata(&counts);
            }
            13 => {
                if let Some(code) = ResponseError::try_from_code(r.code()) {
                    m.commit_refused(code, now);
                }
            }
            14 => {
                if r.u8() % 16 == 0 {
                    model.close(&m);
                    if let Some(GroupAction::Leave { node, .. }) = m.close() {
                        model.to_coordinator(&m, node);
                    }
                    step = None;
                    heartbeat = None;
                }
            }
            _ => {
                // A lost answer to whatever is out.
                if let Some((seq, kind)) = step.take() {
                    let action = match kind {
                        0 => c.handle_join(seq, now, Err(transport_error())),
                        1 => c.handle_leader_metadata(seq, now, Err(transport_error())),
                        _ => {
                            c.handle_sync(seq, now, Err(transport_error()), &counts);
                            None
                        }
                    };
                    after_step(&m, &mut model, &mut step, action);
                } else if let Some(seq) = heartbeat.take() {
                    c.handle_heartbeat(seq, now, Err(transport_error()));
                }
            }
        }
        // A step the machine gave up on (coordinator lost, rejoin) is void: its answer would be
        // ignored, so the harness forgets it too.
        let Membership::Classic(c) = &m else {
            unreachable!()
        };
        if let Some((seq, kind)) = step
            && !c.is_step_out(seq, kind)
        {
            step = None;
        }
        if let Some(seq) = heartbeat
            && !c.is_heartbeat_out(seq)
        {
            heartbeat = None;
        }
        if m.coordinator().is_none() {
            heartbeat = None;
        }
        model.events(m.take_events());
        model.check(&m);
    }
}

/// After a JoinGroup or leader-metadata answer: the follow-up request, if any.
fn after_step(
    m: &crate::proto::group::Membership,
    model: &mut GroupModel,
    step: &mut Option<(u64, u8)>,
    action: Option<crate::proto::group::GroupAction>,
) {
    use crate::proto::group::GroupAction;
    match action {
        None => {}
        Some(GroupAction::LeaderMetadata { seq, topics }) => {
            assert!(topics.len() <= GROUP_TOPICS.len() + 1);
            *step = Some((seq, 1));
        }
        Some(GroupAction::Sync { seq, node, .. }) => {
            model.to_coordinator(m, node);
            *step = Some((seq, 2));
        }
        Some(other) => panic!("unexpected follow-up {other:?}"),
    }
}

/// Drives a KIP-848 member (`ConsumerMember`) with ConsumerGroupHeartbeat answers built from
/// the input (arbitrary error codes, epochs, member ids, assignments by topic id, some ids
/// unknown to metadata until a later step), lost answers, revocations finished, poll timeouts,
/// subscription changes and refused commits, on a fake clock. Checks: at most one heartbeat
/// in flight, sent only to the coordinator found, no identity without a current assignment,
/// no partition owned after it was lost or given up until assigned again, and no panic.
pub fn consumer_member(data: &[u8]) {
    use crate::proto::group::kip848::ConsumerMember;
    use crate::proto::group::{GroupAction, Membership};
    use kafka_protocol::messages::ConsumerGroupHeartbeatResponse;
    use kafka_protocol::messages::consumer_group_heartbeat_response::{
        Assignment, TopicPartitions,
    };

    let mut r = Bytes8(data);
    let cfg = group_config(&mut r);
    let mut m = Membership::Consumer(ConsumerMember::new(cfg));
    let mut model = GroupModel::default();
    let mut now = Instant::now();
    let mut finding: Option<u64> = None;
    let mut heartbeat: Option<u64> = None;
    // Topic ids 1..=3 name `a`, `b`, `x`; 4 is never known. `known` says which metadata knows.
    let mut known: u8 = 0b011;
    let ids = [
        Uuid::from_u128(1),
        Uuid::from_u128(2),
        Uuid::from_u128(3),
        Uuid::from_u128(4),
    ];
    let mut steps = 0;
    while !r.done() && steps < 2000 {
        steps += 1;
        let op = r.u8();
        let names = move |id: &Uuid| -> Option<String> {
            let i = ids.iter().position(|x| x == id)?;
            (i < 3 && known & (1 << i) != 0).then(|| GROUP_TOPICS[i].to_owned())
        };
        let Membership::Consumer(c) = &mut m else {
            unreachable!()
        };
        match op % 12 {
            0 | 1 => {
                if let Some(action) = m.poll_action(now) {
                    match action {
                        GroupAction::FindCoordinator { seq } => {
                            assert!(finding.is_none(), "two lookups");
                            finding = Some(seq);
                        }
                        GroupAction::ConsumerHeartbeat { seq, node, request } => {
                            model.to_coordinator(&m, node);
                            assert!(heartbeat.is_none(), "two heartbeats out");
                            assert!(request.member_epoch >= 0, "{request:?}");
                            heartbeat = Some(seq);
                        }
                        other => panic!("unexpected action from poll_action: {other:?}"),
                    }
                }
            }
            2 => now += Duration::from_millis(u64::from(r.u8()) * 20),
            3 => {
                if let Some(seq) = finding.take() {
                    let result = if r.bool() {
                        let node = i32::from(r.u8() % 3);
                        model.found = Some(node);
                        Ok(node)
                    } else {
                        Err(transport_error())
                    };
                    m.handle_find_coordinator(seq, now, result);
                }
            }
            4 | 5 => {
                let Some(seq) = heartbeat.take() else {
                    continue;
                };
                let code = r.code();
                let mut resp = ConsumerGroupHeartbeatResponse::default()
                    .with_error_code(code)
                    .with_member_id(match r.u8() % 4 {
                        0 => None,
                        1 => Some(StrBytes::from_static_str("other")),
                        _ => Some(StrBytes::from_string(c.member_id().to_owned())),
                    })
                    .with_member_epoch(i32::from(r.u8() as i8))
                    .with_heartbeat_interval_ms(i32::from(r.u8() as i8) * 100);
                if r.bool() {
                    let mut tps = Vec::new();
                    for _ in 0..r.u8() % 5 {
                        let id = ids[usize::from(r.u8() % 4)];
                        let parts =
                            (0..8).filter(|i| r.0.first().is_some_and(|b| b & (1 << i) != 0));
                        let parts: Vec<i32> = parts.collect();
                        r.u8();
                        tps.push(
                            TopicPartitions::default()
                                .with_topic_id(id)
                                .with_partitions(parts),
                        );
                    }
                    resp.assignment = Some(Assignment::default().with_topic_partitions(tps));
                }
                let result = if r.u8() % 8 == 0 {
                    Err(transport_error())
                } else {
                    Ok(resp)
                };
                c.handle_heartbeat(seq, now, result, &names);
            }
            6 => {
                model.revocation_done();
                m.revocation_done(now, &names);
            }
            7 => {
                match m.poll_timeout() {
                    Some(GroupAction::ConsumerLeave { node, .. }) => model.to_coordinator(&m, node),
                    None => {}
                    Some(other) => panic!("unexpected action from poll_timeout: {other:?}"),
                }
                heartbeat = None;
            }
            8 => m.resume_after_poll_timeout(),
            9 => {
                let b = r.u8();
                if b & 0x80 != 0 {
                    c.subscribe_pattern(
                        ["a|b", "x", ".*", "("][usize::from(b & 3)].to_owned(),
                        now,
                    );
                } else {
                    c.subscribe(group_topics(b), now);
                }
            }
            10 => {
                // Metadata learns (or forgets) topic ids.
                known = r.u8();
                c.reconcile(now, &names);
            }
            _ => match r.u8() % 4 {
                0 => {
                    if let Some(code) = ResponseError::try_from_code(r.code()) {
                        m.commit_refused(code, now);
                    }
                }
                1 => {
                    if let Some(seq) = heartbeat.take() {
                        c.handle_heartbeat(seq, now, Err(transport_error()), &names);
                    }
                }
                2 if r.u8() % 8 == 0 => {
                    model.close(&m);
                    if let Some(GroupAction::ConsumerLeave { node, .. }) = m.close() {
                        model.to_coordinator(&m, node);
                    }
                    heartbeat = None;
                }
                _ => {}
            },
        }
        let Membership::Consumer(c) = &m else {
            unreachable!()
        };
        if let Some(seq) = heartbeat
            && !c.is_heartbeat_out(seq)
        {
            heartbeat = None;
        }
        model.events(m.take_events());
        model.check(&m);
    }
}

/// The topics of [`fetch_session`], three partitions each.
const FETCH_TOPICS: [&str; 3] = ["a", "b", "c"];

/// Partition `i % 9` of [`FETCH_TOPICS`]: `a-0`, `a-1`, `a-2`, `b-0`, ...
fn fetch_tp(i: u8) -> TopicPartition {
    let i = usize::from(i % 9);
    TopicPartition::new(FETCH_TOPICS[i / 3], (i % 3) as i32)
}

fn fetch_tp_index(tp: &TopicPartition) -> usize {
    let t = FETCH_TOPICS
        .iter()
        .position(|t| **t == *tp.topic)
        .expect("a harness topic");
    t * 3 + tp.partition as usize
}

/// Topic `t`'s id in its `version`th incarnation.
fn fetch_topic_id(t: usize, version: u8) -> Uuid {
    Uuid::from_u128(((t as u128 + 1) << 8) | u128::from(version))
}

/// The cluster behind [`fetch_session`]'s metadata: brokers 0..=2; a leader is one of them, -1
/// (none), or 3 (a node the metadata does not list).
struct Cluster {
    leaders: [i32; 9],
    epochs: [i32; 9],
    /// Each topic's incarnation (a new one has a new id).
    ids: [u8; 3],
    /// Deleted: metadata answers UNKNOWN_TOPIC_OR_PARTITION.
    gone: [bool; 3],
}

impl Cluster {
    fn new() -> Self {
        Self {
            leaders: [0, 1, 2, 1, 2, 0, 2, 0, 1],
            epochs: [0; 9],
            ids: [0; 3],
            gone: [false; 3],
        }
    }

    /// A Metadata answer; topics in the `omit` mask are left out (their old entry stays).
    fn response(&self, omit: u8) -> MetadataResponse {
        let brokers = (0..3)
            .map(|id| {
                MetadataResponseBroker::default()
                    .with_node_id(BrokerId(id))
                    .with_host(StrBytes::from_static_str("127.0.0.1"))
                    .with_port(9092 + id)
            })
            .collect();
        let mut topics = Vec::new();
        for (t, name) in FETCH_TOPICS.iter().enumerate() {
            if omit & (1 << t) != 0 {
                continue;
            }
            let topic = MetadataResponseTopic::default().with_name(Some(topic_name(name)));
            if self.gone[t] {
                topics.push(topic.with_error_code(ResponseError::UnknownTopicOrPartition.code()));
                continue;
            }
            let partitions = (0..3)
                .map(|p| {
                    let i = t * 3 + p;
                    let leader = self.leaders[i];
                    MetadataResponsePartition::default()
                        .with_partition_index(p as i32)
                        .with_leader_id(BrokerId(leader))
                        .with_leader_epoch(self.epochs[i])
                        .with_error_code(if leader < 0 {
                            ResponseError::LeaderNotAvailable.code()
                        } else {
                            0
                        })
                })
                .collect();
            topics.push(
                topic
                    .with_topic_id(fetch_topic_id(t, self.ids[t]))
                    .with_partitions(partitions),
            );
        }
        MetadataResponse::default()
            .with_brokers(brokers)
            .with_topics(topics)
    }
}

/// A partition's read position as [`fetch_session`]'s model sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ModelPos {
    /// Waiting for ListOffsets, which asks with this timestamp (-2 earliest, -1 latest).
    Unresolved(i64),
    /// The next chunk of this generation starts here.
    At(i64),
}

#[derive(Clone, Debug)]
struct ModelPart {
    generation: u64,
    pos: ModelPos,
    /// Reported failed (or failed by the consumer): no chunk until a seek.
    failed: bool,
    paused: bool,
    reset: OffsetReset,
}

impl ModelPart {
    fn new(start: StartPosition, generation: u64, reset: OffsetReset) -> Self {
        let pos = match start {
            StartPosition::Offset(o) => ModelPos::At(o),
            StartPosition::Earliest => ModelPos::Unresolved(-2),
            StartPosition::Latest => ModelPos::Unresolved(-1),
            StartPosition::Timestamp(ts) => ModelPos::Unresolved(ts.max(0)),
        };
        Self {
            generation,
            pos,
            failed: false,
            paused: false,
            reset,
        }
    }
}

/// A Fetch sent and not answered yet, with what the model knew of each partition then.
struct FetchOut {
    plan: crate::proto::fetch::FetchPlan,
    /// `(partition, topic id, generation, fetch offset)` in request order.
    entries: Vec<(TopicPartition, Uuid, u64, i64)>,
}

/// A ListOffsets sent and not answered yet.
struct ListOut {
    plan: crate::proto::fetch::ListPlan,
    /// `(partition, generation)`.
    entries: Vec<(TopicPartition, u64)>,
}

/// Error codes the fetch path treats differently, then any byte as a code.
fn fetch_code(b: u8) -> i16 {
    const CODES: [i16; 20] = [
        0, 0, 0, 0, 0, 0, 1, 1, 6, 74, 100, 3, 75, 78, 29, 2, 7, 56, 103, -1,
    ];
    CODES
        .get(usize::from(b))
        .copied()
        .unwrap_or(i16::from(b as i8))
}

fn start_position(r: &mut Bytes8<'_>) -> StartPosition {
    match r.u8() % 6 {
        0 => StartPosition::Earliest,
        1 => StartPosition::Latest,
        2 => StartPosition::Timestamp(i64::from(r.u8() as i8) * 1000),
        _ => StartPosition::Offset(i64::from(r.u8())),
    }
}

/// Partitions chosen by a 9-bit mask read from two bytes.
fn fetch_partitions(r: &mut Bytes8<'_>) -> Vec<TopicPartition> {
    let mask = u16::from(r.u8()) | (u16::from(r.u8() & 1) << 8);
    (0..9u8)
        .filter(|i| mask & (1 << i) != 0)
        .map(fetch_tp)
        .collect()
}

/// A partition's `records` field: absent, empty, garbage, or record batches built with
/// kafka-protocol's encoder from about `at` on (below, at or above it; plain, transactional or
/// control batches, gaps between them), the last one possibly cut short or a byte corrupted.
fn fetch_records(r: &mut Bytes8<'_>, at: i64) -> Option<Bytes> {
    use kafka_protocol::records::{
        Compression, Record as KpRecord, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };
    match r.u8() % 8 {
        0 => return None,
        1 => return Some(Bytes::new()),
        2 => return Some(r.bytes()),
        _ => {}
    }
    let mut base = match r.u8() % 8 {
        0 => at - i64::from(r.u8() % 8),
        1 => at + i64::from(r.u8() % 8),
        _ => at,
    };
    let mut buf = bytes::BytesMut::new();
    for _ in 0..1 + r.u8() % 3 {
        let flags = r.u8();
        let count = 1 + i64::from(flags % 3);
        let control = flags & 0x10 != 0;
        let transactional = control || flags & 0x20 != 0;
        let producer_id = if transactional {
            i64::from(flags >> 6)
        } else {
            -1
        };
        let records: Vec<KpRecord> = (0..count)
            .map(|k| KpRecord {
                transactional,
                control,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id,
                producer_epoch: if transactional { 0 } else { -1 },
                timestamp_type: TimestampType::Creation,
                offset: base + k,
                sequence: k as i32,
                timestamp: 1_700_000_000_000 + base + k,
                // A control record's key: version 0, type abort (0) or commit (1).
                key: control.then(|| Bytes::copy_from_slice(&[0, 0, 0, flags >> 7])),
                value: Some(if control {
                    Bytes::from_static(&[0, 0, 0, 0, 0, 0])
                } else {
                    Bytes::from_static(b"v")
                }),
                headers: Default::default(),
            })
            .collect();
        let options = RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        };
        if RecordBatchEncoder::encode(&mut buf, records.iter(), &options).is_err() {
            return Some(Bytes::new());
        }
        // Compaction leaves gaps.
        base += count + i64::from((flags >> 2) & 3);
    }
    let damage = r.u8();
    match damage % 8 {
        0 => {
            let cut = 1 + usize::from(damage / 8);
            buf.truncate(buf.len().saturating_sub(cut));
        }
        1 if !buf.is_empty() => {
            let i = usize::from(r.u8()) * 3 % buf.len();
            buf[i] ^= 1 + (damage >> 3);
        }
        _ => {}
    }
    Some(buf.freeze())
}

/// An answer to a ListOffsets for `entries`: a transport error, or any offset and error code
/// for each partition, some left out, maybe one not asked for.
fn list_offsets_answer(
    r: &mut Bytes8<'_>,
    entries: &[(TopicPartition, u64)],
) -> Result<kafka_protocol::messages::ListOffsetsResponse, Error> {
    use kafka_protocol::messages::ListOffsetsResponse;
    use kafka_protocol::messages::list_offsets_response::{
        ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
    };
    if r.u8() % 8 == 0 {
        return Err(transport_error());
    }
    let mut asked: Vec<TopicPartition> = entries.iter().map(|e| e.0.clone()).collect();
    if r.u8() % 4 == 0 {
        asked.push(fetch_tp(r.u8()));
    }
    let mut topics: Vec<ListOffsetsTopicResponse> = Vec::new();
    for tp in asked {
        if r.u8() % 8 == 0 {
            continue;
        }
        let offset = match r.u8() % 4 {
            0 => i64::from(r.u8() as i8),
            _ => i64::from(r.u8()),
        };
        let p = ListOffsetsPartitionResponse::default()
            .with_partition_index(tp.partition)
            .with_error_code(fetch_code(r.u8()))
            .with_offset(offset);
        match topics.iter_mut().find(|t| t.name.0.as_str() == &*tp.topic) {
            Some(t) => t.partitions.push(p),
            None => topics.push(
                ListOffsetsTopicResponse::default()
                    .with_name(topic_name(&tp.topic))
                    .with_partitions(vec![p]),
            ),
        }
    }
    Ok(ListOffsetsResponse::default().with_topics(topics))
}

/// What a ListOffsets answer does to each partition of `entries` still waiting for it and
/// `taken` from it, found the way the machine finds it (the first matching entry): an offset
/// without an error resolves it (a negative one sends it to the end).
fn list_offsets_model(
    model: &mut std::collections::BTreeMap<TopicPartition, ModelPart>,
    entries: &[(TopicPartition, u64)],
    result: &Result<kafka_protocol::messages::ListOffsetsResponse, Error>,
    taken: impl Fn(&TopicPartition) -> bool,
) {
    let Ok(resp) = result else { return };
    for (tp, generation) in entries {
        let Some(m) = model.get_mut(tp) else { continue };
        if m.generation != *generation || m.failed || !taken(tp) {
            continue;
        }
        let ModelPos::Unresolved(_) = m.pos else {
            continue;
        };
        let found = resp
            .topics
            .iter()
            .filter(|t| t.name.0.as_str() == &*tp.topic)
            .flat_map(|t| t.partitions.iter())
            .find(|p| p.partition_index == tp.partition);
        if let Some(p) = found
            && p.error_code == 0
        {
            m.pos = if p.offset < 0 {
                ModelPos::Unresolved(-1)
            } else {
                ModelPos::At(p.offset)
            };
        }
    }
}

/// A partition in a planned request: assigned, not paused or failed, at the model's `pos`, and
/// sent to its leader at the leader's epoch (`sent_to`: node and epoch). Returns its model.
fn check_planned<'a>(
    model: &'a std::collections::BTreeMap<TopicPartition, ModelPart>,
    meta: &Metadata,
    tp: &TopicPartition,
    sent_to: (i32, i32),
    pos: ModelPos,
    what: &str,
) -> &'a ModelPart {
    let m = model
        .get(tp)
        .unwrap_or_else(|| panic!("{what} for an unassigned partition {tp}"));
    assert!(!m.paused && !m.failed, "{what} for {tp}: {m:?}");
    assert_eq!(m.pos, pos, "{what} for {tp} off its position");
    let leader = meta.leader(&tp.topic, tp.partition);
    assert_eq!(
        leader.map(|l| (l.node, l.epoch)),
        Some(sent_to),
        "{what} for {tp} not to its leader"
    );
    m
}
/// Drives the fetch state machine (`FetchState`) the way the network loop does, with events read
/// from the input: assignments (replace, add, remove; start offsets, earliest, latest, by
/// timestamp; restored or not), seeks, pauses, time passing, metadata changes (leaders moving
/// between nodes 0..=2, none, an unknown node; topic ids changing; topics disappearing),
/// ListOffsets and Fetch plans and their answers in any order (any error code, any offset,
/// ListOffsets sent ahead of metadata and answered by a leader or not,
/// partitions left out or not asked for, record batches at, below or above the fetch offset,
/// cut short or corrupted, garbage, transport errors), the consumer failing a partition, and
/// the consumer decoding the chunks handed out.
///
/// Checks against a model of every partition: at most one Fetch per data connection (of
/// `fetch.connections.per.broker`, 1 to 3 here) and a partition in
/// at most one request; requests only for assigned, unpaused, resolved partitions, at the
/// model's position, to the leader and topic id the metadata names, within the memory budget;
/// a chunk only for an assigned partition of its current generation that has not failed,
/// starting exactly where the previous one of that generation ended (the position changes
/// otherwise only through ListOffsets: a start position, or `auto.offset.reset` after
/// OFFSET_OUT_OF_RANGE); records handed out within `[fetch_offset, next_offset)`; and a chunk's
/// bytes a prefix of what the response carried for that partition.
pub fn fetch_session(data: &[u8]) {
    use kafka_protocol::messages::ProducerId;
    use kafka_protocol::messages::fetch_response::{
        AbortedTransaction, FetchableTopicResponse, PartitionData,
    };
    use std::collections::{BTreeMap, HashMap, VecDeque};

    /// Bytes fetched and not yet decoded, plus bytes reserved by fetches out, at most.
    const BUDGET: usize = 10_000;

    let mut r = Bytes8(data);
    let setup = r.u8();
    let policies = [
        OffsetReset::Earliest,
        OffsetReset::Latest,
        OffsetReset::Error,
    ];
    let isolation = if setup & 0x80 != 0 {
        IsolationLevel::ReadCommitted
    } else {
        IsolationLevel::ReadUncommitted
    };
    let cfg = FetchConfig {
        max_wait_ms: 500,
        min_bytes: 1,
        max_bytes: 4096,
        partition_max_bytes: 1024,
        isolation,
        reset: policies[usize::from(setup % 3)],
        restore_reset: policies[usize::from(setup / 3 % 3)],
        retry_backoff: Duration::from_millis(100),
        connections_per_broker: 1 + setup / 9 % 3,
    };
    let mut f = FetchState::new(cfg.clone());
    let mut cluster = Cluster::new();
    let mut meta = Metadata::default();
    let _ = meta.handle_response(&cluster.response(0));
    let mut now = Instant::now();
    let mut model: BTreeMap<TopicPartition, ModelPart> = BTreeMap::new();
    let mut next_generation = 0u64;
    // The loop's bookkeeping.
    let mut busy: HashSet<Lane> = HashSet::new();
    let mut reserved = 0usize;
    let mut buffered = 0usize;
    let mut fetches: Vec<FetchOut> = Vec::new();
    let mut lists: Vec<ListOut> = Vec::new();
    // A ListOffsets sent ahead of a Metadata request's answer, answered with the metadata.
    let mut ahead: Option<(crate::proto::fetch::AheadPlan, Vec<(TopicPartition, u64)>)> = None;
    // Partitions in a request out (Fetch or ListOffsets).
    let mut out: HashSet<TopicPartition> = HashSet::new();
    // The consumer's queue: chunks handed out and not decoded to their end, with their range
    // and the position decoding reached.
    let mut queue: VecDeque<(crate::proto::chunk::ChunkCursor, i64, i64, i64)> = VecDeque::new();

    let mut steps = 0;
    while !r.done() && steps < 1000 {
        steps += 1;
        match r.u8() % 16 {
            0..=2 => {
                // The loop's turn: a Metadata request while a leader is missing, with ListOffsets
                // ahead of its answer for the partitions with no leader, then ListOffsets, then
                // one Fetch per idle data connection within the budget.
                if ahead.is_none() && f.needs_metadata(&meta) && r.bool() {
                    if let Some(plan) = f.plan_list_offsets_ahead(now, &meta) {
                        let req = f.list_offsets_request_ahead(&plan);
                        let mut entries = Vec::new();
                        for t in &req.topics {
                            for p in &t.partitions {
                                let tp = TopicPartition::new(t.name.0.as_str(), p.partition_index);
                                let m = model
                                    .get(&tp)
                                    .unwrap_or_else(|| panic!("ListOffsets ahead for {tp}"));
                                assert!(
                                    !m.paused && !m.failed,
                                    "ListOffsets ahead for {tp}: {m:?}"
                                );
                                assert_eq!(m.pos, ModelPos::Unresolved(p.timestamp), "{tp}");
                                assert_eq!(p.current_leader_epoch, -1, "{tp}");
                                assert!(
                                    meta.leader(&tp.topic, tp.partition).is_none(),
                                    "ListOffsets ahead for {tp}, whose leader is known"
                                );
                                assert!(out.insert(tp.clone()), "{tp} in two requests");
                                entries.push((tp, m.generation));
                            }
                        }
                        assert!(!entries.is_empty(), "an empty ListOffsets ahead");
                        ahead = Some((plan, entries));
                    }
                }
                // In node order, entries in partition order: the machine's come from hash maps,
                // and an input must replay the same way.
                let mut planned = f.plan_list_offsets(now, &meta);
                planned.sort_by_key(|p| p.node);
                for plan in planned {
                    let req = f.list_offsets_request(&plan);
                    let mut entries = Vec::new();
                    for t in &req.topics {
                        for p in &t.partitions {
                            let tp = TopicPartition::new(t.name.0.as_str(), p.partition_index);
                            let m = check_planned(
                                &model,
                                &meta,
                                &tp,
                                (plan.node, p.current_leader_epoch),
                                ModelPos::Unresolved(p.timestamp),
                                "ListOffsets",
                            );
                            assert!(out.insert(tp.clone()), "{tp} in two requests");
                            entries.push((tp, m.generation));
                        }
                    }
                    assert!(!entries.is_empty(), "an empty ListOffsets");
                    entries.sort();
                    lists.push(ListOut { plan, entries });
                }
                let budget = BUDGET.saturating_sub(buffered).saturating_sub(reserved);
                if budget == 0 {
                    continue;
                }
                let mut planned = 0usize;
                for plan in f.plan_fetches(now, &meta, &busy, budget) {
                    assert!(
                        plan.lane < cfg.connections_per_broker,
                        "data connection {} of {}",
                        plan.lane,
                        cfg.connections_per_broker
                    );
                    assert!(
                        busy.insert(plan.connection()),
                        "a second fetch on data connection {} of node {}",
                        plan.lane,
                        plan.node
                    );
                    let max_bytes = usize::try_from(plan.max_bytes).expect("max_bytes >= 0");
                    assert!(max_bytes > 0 && max_bytes <= cfg.max_bytes as usize);
                    planned += max_bytes;
                    reserved += max_bytes;
                    let by_name = FetchState::fetch_request(&cfg, &plan, 12);
                    let by_id = FetchState::fetch_request(&cfg, &plan, 13);
                    let names = by_name
                        .topics
                        .iter()
                        .flat_map(|t| t.partitions.iter().map(move |p| (t.topic.0.as_str(), p)));
                    let ids = by_id
                        .topics
                        .iter()
                        .flat_map(|t| t.partitions.iter().map(move |p| (t.topic_id, p)));
                    let mut entries = Vec::new();
                    for ((name, p), (id, q)) in names.zip(ids) {
                        assert_eq!((p.partition, p.fetch_offset), (q.partition, q.fetch_offset));
                        let tp = TopicPartition::new(name, p.partition);
                        let m = check_planned(
                            &model,
                            &meta,
                            &tp,
                            (plan.node, p.current_leader_epoch),
                            ModelPos::At(p.fetch_offset),
                            "Fetch",
                        );
                        assert_eq!(
                            meta.topic(&tp.topic).map(|t| t.id),
                            Some(id),
                            "a fetch for {tp} under another topic id"
                        );
                        assert!(out.insert(tp.clone()), "{tp} in two requests");
                        entries.push((tp, id, m.generation, p.fetch_offset));
                    }
                    assert!(!entries.is_empty(), "an empty fetch");
                    assert!(
                        max_bytes <= entries.len() * cfg.partition_max_bytes as usize,
                        "{max_bytes} bytes reserved for {} partitions",
                        entries.len()
                    );
                    fetches.push(FetchOut { plan, entries });
                }
                assert!(
                    planned <= budget,
                    "fetches for {planned} bytes within {budget}"
                );
            }
            3 | 4 => {
                // A ListOffsets answer (any of those out).
                if lists.is_empty() {
                    continue;
                }
                let ListOut { plan, entries } =
                    lists.swap_remove(usize::from(r.u8()) % lists.len());
                for (tp, _) in &entries {
                    out.remove(tp);
                }
                let result = list_offsets_answer(&mut r, &entries);
                list_offsets_model(&mut model, &entries, &result, |_| true);
                let outcome = f.handle_list_offsets(plan, result, now);
                for event in outcome.events {
                    match event {
                        FetchEvent::Chunk(c) => panic!("a chunk from ListOffsets: {c:?}"),
                        FetchEvent::Failed { tp, generation, .. } => {
                            let m = model
                                .get_mut(&tp)
                                .expect("a failure of an unassigned partition");
                            assert_eq!(
                                m.generation, generation,
                                "{tp} failed in an old generation"
                            );
                            m.failed = true;
                        }
                    }
                }
            }
            5..=7 => {
                // A Fetch answer (any of those out).
                if fetches.is_empty() {
                    continue;
                }
                let FetchOut { plan, entries } =
                    fetches.swap_remove(usize::from(r.u8()) % fetches.len());
                busy.remove(&plan.connection());
                reserved -= plan.max_bytes as usize;
                for e in &entries {
                    out.remove(&e.0);
                }
                let kind = r.u8();
                let mut sent: HashMap<TopicPartition, Bytes> = HashMap::new();
                let mut sent_bytes = 0usize;
                let result = if kind % 16 == 0 {
                    // The loop forgets the leaders of a request that failed on the wire.
                    for e in &entries {
                        meta.invalidate_leader(&e.0.topic, e.0.partition);
                    }
                    Err(transport_error())
                } else {
                    let by_name = kind & 0x10 != 0;
                    let mut responses = Vec::new();
                    let mut answer =
                        |tp: &TopicPartition, id: Uuid, at: i64, r: &mut Bytes8<'_>| {
                            let records = fetch_records(r, at);
                            let mut p = PartitionData::default()
                                .with_partition_index(tp.partition)
                                .with_error_code(fetch_code(r.u8()))
                                .with_high_watermark(at + i64::from(r.u8() as i8))
                                .with_last_stable_offset(at + i64::from(r.u8() as i8))
                                .with_log_start_offset(i64::from(r.u8() as i8))
                                .with_records(records.clone());
                            if r.u8() % 4 == 0 {
                                p.aborted_transactions = Some(
                                    (0..r.u8() % 3)
                                        .map(|_| {
                                            AbortedTransaction::default()
                                                .with_producer_id(ProducerId(i64::from(r.u8() % 4)))
                                                .with_first_offset(at + i64::from(r.u8() as i8 % 8))
                                        })
                                        .collect(),
                                );
                            }
                            sent_bytes += records.as_ref().map_or(0, Bytes::len);
                            sent.insert(tp.clone(), records.unwrap_or_default());
                            let topic = FetchableTopicResponse::default().with_partitions(vec![p]);
                            responses.push(if by_name {
                                topic.with_topic(topic_name(&tp.topic))
                            } else {
                                topic.with_topic_id(id)
                            });
                        };
                    for (tp, id, _, offset) in &entries {
                        if r.u8() % 8 != 0 {
                            answer(tp, *id, *offset, &mut r);
                        }
                    }
                    // A partition not asked for, under its current id or one nobody knows.
                    if r.u8() % 4 == 0 {
                        let tp = fetch_tp(r.u8());
                        if entries.iter().all(|e| e.0 != tp) {
                            let t = fetch_tp_index(&tp) / 3;
                            let id = fetch_topic_id(t, cluster.ids[t].wrapping_add(r.u8() % 2));
                            answer(&tp, id, 0, &mut r);
                        }
                    }
                    Ok(FetchResponse::default()
                        .with_error_code(if kind % 16 == 1 {
                            fetch_code(r.u8())
                        } else {
                            0
                        })
                        .with_responses(responses))
                };
                // OFFSET_OUT_OF_RANGE for a partition still at the fetched position: the
                // partition's policy applies (a reset goes through ListOffsets; `Error`
                // reports the failure, checked with the events below).
                if let Ok(resp) = &result
                    && resp.error_code == 0
                {
                    for topic in &resp.responses {
                        for p in &topic.partitions {
                            if p.error_code != ResponseError::OffsetOutOfRange.code() {
                                continue;
                            }
                            let entry = entries.iter().find(|(tp, id, _, _)| {
                                tp.partition == p.partition_index
                                    && if topic.topic_id.is_nil() {
                                        *tp.topic == *topic.topic.0.as_str()
                                    } else {
                                        *id == topic.topic_id
                                    }
                            });
                            let Some((tp, _, generation, offset)) = entry else {
                                continue;
                            };
                            let Some(m) = model.get_mut(tp) else { continue };
                            if m.generation != *generation
                                || m.failed
                                || m.pos != ModelPos::At(*offset)
                            {
                                continue;
                            }
                            match m.reset {
                                OffsetReset::Earliest => m.pos = ModelPos::Unresolved(-2),
                                OffsetReset::Latest => m.pos = ModelPos::Unresolved(-1),
                                OffsetReset::Error => {}
                            }
                        }
                    }
                }
                let outcome = f.handle_fetch(plan, result, now);
                let mut handed = 0usize;
                for event in outcome.events {
                    match event {
                        FetchEvent::Chunk(c) => {
                            let m = model
                                .get_mut(&c.tp)
                                .expect("a chunk for an unassigned partition");
                            assert_eq!(
                                m.generation, c.generation,
                                "a chunk of an old generation of {}",
                                c.tp
                            );
                            assert!(!m.failed, "a chunk for failed {}: {c:?}", c.tp);
                            assert!(
                                entries.iter().any(|e| e.0 == c.tp
                                    && e.2 == c.generation
                                    && e.3 == c.fetch_offset),
                                "a chunk this fetch did not ask for: {c:?}"
                            );
                            assert_eq!(
                                m.pos,
                                ModelPos::At(c.fetch_offset),
                                "{} skipped or went back",
                                c.tp
                            );
                            assert!(c.next_offset >= c.fetch_offset, "{c:?}");
                            let whole = sent
                                .get(&c.tp)
                                .expect("a chunk for a partition not answered");
                            assert!(
                                whole.starts_with(&c.records),
                                "a chunk's bytes are not the response's"
                            );
                            assert!(!c.records.is_empty(), "an empty chunk");
                            handed += c.records.len();
                            m.pos = ModelPos::At(c.next_offset);
                            buffered += c.records.len();
                            let (from, to) = (c.fetch_offset, c.next_offset);
                            queue.push_back((
                                crate::proto::chunk::ChunkCursor::new(c, isolation),
                                from,
                                to,
                                from,
                            ));
                        }
                        FetchEvent::Failed { tp, generation, .. } => {
                            let m = model
                                .get_mut(&tp)
                                .expect("a failure of an unassigned partition");
                            assert_eq!(
                                m.generation, generation,
                                "{tp} failed in an old generation"
                            );
                            m.failed = true;
                        }
                    }
                }
                assert!(
                    handed <= sent_bytes,
                    "{handed} bytes handed out from a response of {sent_bytes}"
                );
            }
            8 => {
                // Time passes, or the loop sleeps until the next retry.
                if r.bool() {
                    if let Some(t) = f.next_retry() {
                        now = now.max(t);
                    }
                } else {
                    now += Duration::from_millis(u64::from(r.u8()) * 10);
                }
            }
            9 => {
                // The cluster changes, and metadata (maybe) tells.
                let b = r.u8();
                match b % 4 {
                    0 | 1 => {
                        let i = usize::from(r.u8() % 9);
                        cluster.leaders[i] = [-1, 0, 1, 2, 3][usize::from(r.u8() % 5)];
                        cluster.epochs[i] += i32::from(b & 4 == 0);
                    }
                    2 => {
                        let t = usize::from(r.u8() % 3);
                        cluster.ids[t] = cluster.ids[t].wrapping_add(1);
                    }
                    _ => {
                        let t = usize::from(r.u8() % 3);
                        cluster.gone[t] = !cluster.gone[t];
                    }
                }
                if b & 8 == 0 {
                    let omit = if b & 16 == 0 { 0 } else { r.u8() };
                    let _ = meta.handle_response(&cluster.response(omit));
                    // The ListOffsets behind the Metadata request, answered by the broker at
                    // node 0..=2, or at an address no node has.
                    if let Some((plan, entries)) = ahead.take() {
                        for (tp, _) in &entries {
                            out.remove(tp);
                        }
                        let answered_by =
                            [None, Some(0), Some(1), Some(2)][usize::from(r.u8() % 4)];
                        let result = list_offsets_answer(&mut r, &entries);
                        let leads = |tp: &TopicPartition| {
                            answered_by.is_some()
                                && meta.leader(&tp.topic, tp.partition).map(|l| l.node)
                                    == answered_by
                        };
                        list_offsets_model(&mut model, &entries, &result, leads);
                        f.handle_list_offsets_ahead(plan, result, &meta, answered_by);
                    }
                }
            }
            10 => {
                // A new assignment; partitions kept may keep their generation.
                let restored = r.bool();
                let mut list = Vec::new();
                for tp in fetch_partitions(&mut r) {
                    let start = start_position(&mut r);
                    let generation = match model.get(&tp) {
                        Some(m) if r.bool() => m.generation,
                        _ => {
                            next_generation += 1;
                            next_generation
                        }
                    };
                    list.push((tp, start, generation));
                }
                f.assign(list.clone(), restored);
                let reset = if restored {
                    cfg.restore_reset
                } else {
                    cfg.reset
                };
                let mut old = std::mem::take(&mut model);
                for (tp, start, generation) in list {
                    let part = match old.remove(&tp) {
                        Some(m) if m.generation == generation => m,
                        _ => ModelPart::new(start, generation, reset),
                    };
                    model.insert(tp, part);
                }
            }
            11 => {
                // Partitions added (subscribe mode), or given up.
                if r.bool() {
                    let restored = r.bool();
                    let reset = if restored {
                        cfg.restore_reset
                    } else {
                        cfg.reset
                    };
                    let mut list = Vec::new();
                    for tp in fetch_partitions(&mut r) {
                        next_generation += 1;
                        let start = start_position(&mut r);
                        model.insert(tp.clone(), ModelPart::new(start, next_generation, reset));
                        list.push((tp, start, next_generation));
                    }
                    f.add(list, restored);
                } else {
                    let tps = fetch_partitions(&mut r);
                    f.unassign(&tps);
                    for tp in &tps {
                        model.remove(tp);
                    }
                }
            }
            12 => {
                let tp = fetch_tp(r.u8());
                let start = start_position(&mut r);
                next_generation += 1;
                let done = f.seek(&tp, start, next_generation);
                assert_eq!(done, model.contains_key(&tp), "seek of {tp}");
                if let Some(m) = model.get_mut(&tp) {
                    let paused = m.paused;
                    *m = ModelPart::new(start, next_generation, cfg.reset);
                    m.paused = paused;
                }
            }
            13 => {
                let tp = fetch_tp(r.u8());
                let paused = r.bool();
                f.set_paused(&tp, paused);
                if let Some(m) = model.get_mut(&tp) {
                    m.paused = paused;
                }
            }
            14 => {
                // The consumer fails a partition (corrupt data), in this generation or another.
                let tp = fetch_tp(r.u8());
                let b = r.u8();
                let generation = match model.get(&tp) {
                    Some(m) if b & 1 == 0 => m.generation,
                    _ => u64::from(b >> 1),
                };
                f.fail(&tp, generation);
                if let Some(m) = model.get_mut(&tp)
                    && m.generation == generation
                {
                    m.failed = true;
                }
            }
            _ => {
                // The consumer decodes the next piece of the oldest chunk, as `poll` does;
                // chunks of partitions no longer assigned in that generation are dropped.
                let Some((mut cursor, from, to, position)) = queue.pop_front() else {
                    continue;
                };
                let current = model
                    .get(&cursor.tp)
                    .is_some_and(|m| m.generation == cursor.generation);
                if !current {
                    buffered -= cursor.raw_len;
                    continue;
                }
                let piece = cursor.next_piece(&DecodeLimits::new(1 << 16), 64, 4);
                for rec in &piece.records {
                    assert!(
                        (from..to).contains(&rec.offset),
                        "record {} of {} handed out from a chunk of [{from}, {to})",
                        rec.offset,
                        cursor.tp
                    );
                }
                assert!(
                    piece.next_offset >= position && piece.next_offset <= to,
                    "piece position {} after {position} in [{from}, {to})",
                    piece.next_offset
                );
                if piece.error.is_some() {
                    // Command::Fail.
                    f.fail(&cursor.tp, cursor.generation);
                    if let Some(m) = model.get_mut(&cursor.tp) {
                        m.failed = true;
                    }
                }
                if cursor.is_done() {
                    buffered -= cursor.raw_len;
                } else {
                    let at = piece.next_offset;
                    queue.push_front((cursor, from, to, at));
                }
            }
        }
        // The machine agrees with the model on what is assigned, and asks for metadata exactly
        // while a partition it would fetch has no leader.
        for i in 0..9 {
            let tp = fetch_tp(i);
            assert_eq!(
                f.is_assigned(&tp),
                model.contains_key(&tp),
                "{tp} assigned?"
            );
        }
        let missing = model.iter().any(|(tp, m)| {
            !m.paused && !m.failed && meta.leader(&tp.topic, tp.partition).is_none()
        });
        assert_eq!(f.needs_metadata(&meta), missing, "needs_metadata");
    }
}
