//! Captures real broker responses as fuzz seeds.
//!
//! Starts the harness's single-node Apache Kafka (or uses `KAFKA_BOOTSTRAP`), produces small
//! topics with every codec and a transactional topic with aborted transactions, then consumes
//! them through a recording proxy: metadata, ListOffsets (earliest, latest, by time), fetches
//! (`read_uncommitted` and `read_committed`), an out-of-range fetch, an unknown topic,
//! FindCoordinator, OffsetCommit after a checkpoint, and OffsetFetch; then consumer groups: two
//! classic members (JoinGroup with the MEMBER_ID_REQUIRED round trip, SyncGroup, Heartbeat,
//! LeaveGroup) and a KIP-848 member (ConsumerGroupHeartbeat). The responses are written in each
//! fuzz target's input format (see `fuzz/README.md`):
//!
//! - `frame/`: `[api selector, version selector]` + the whole response frame;
//! - `consumer_protocol/`: the ConsumerProtocol subscriptions and assignments that JoinGroup and
//!   SyncGroup answers carry;
//! - `fetch_response/`: `[version selector, flags]` + the FetchResponse body, its topic renamed
//!   to the harness's `t` (id 42) and partitions folded onto 0 and 1;
//! - `record_batch/`: each partition's `records` bytes.
//!
//! ```sh
//! cargo run --release -p protocol-tests --bin capture_corpus -- fuzz/corpus
//! ```

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, FetchResponse, JoinGroupResponse, ResponseHeader, SyncGroupResponse, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_source::{
    AssignmentStrategy, CommitMode, Consumer, GroupProtocol, IsolationLevel, OffsetReset,
    StartPosition, TopicPartition,
};
use protocol_tests::consume::{config, drain, partitions, unique};
use protocol_tests::proxy::{Recorded, RecordingProxy};
use protocol_tests::{Cluster, Compression, ProduceSpec};

/// The `frame` target's API order and our version windows' lower ends.
const FRAME_APIS: [(ApiKey, i16, i16); 12] = [
    (ApiKey::ApiVersions, 0, 4),
    (ApiKey::Metadata, 10, 13),
    (ApiKey::Fetch, 12, 18),
    (ApiKey::ListOffsets, 6, 10),
    (ApiKey::FindCoordinator, 3, 6),
    (ApiKey::OffsetCommit, 7, 9),
    (ApiKey::OffsetFetch, 7, 9),
    (ApiKey::JoinGroup, 5, 9),
    (ApiKey::SyncGroup, 5, 5),
    (ApiKey::Heartbeat, 4, 4),
    (ApiKey::LeaveGroup, 3, 5),
    (ApiKey::ConsumerGroupHeartbeat, 0, 1),
];

/// Seeds larger than this are not kept.
const MAX_SEED: usize = 128 << 10;
/// At most this many seeds per target, API and version; Fetch responses with records (six
/// topics: five codecs and transactions) may have more.
const PER_KIND: usize = 8;
const PER_KIND_WITH_RECORDS: usize = 48;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let out = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "fuzz/corpus".into()),
    );
    let cluster = Cluster::shared();
    let mut topics = Vec::new();
    for codec in Compression::ALL {
        let topic = unique(&format!("seed-{}", codec.as_str()));
        cluster.create_topic(&topic, 2, 1, &[]);
        let spec = ProduceSpec {
            topic: &topic,
            partitions: 2,
            count: 300,
            value_size: 60,
            compression: codec,
            ..ProduceSpec::default()
        };
        cluster.produce(&spec);
        let count = spec.expected_committed();
        topics.push((topic, count, IsolationLevel::ReadUncommitted));
    }
    let txn = unique("seed-txn");
    cluster.create_topic(&txn, 2, 1, &[]);
    let spec = ProduceSpec {
        topic: &txn,
        partitions: 2,
        count: 300,
        value_size: 60,
        transactional: Some((10, 3)),
        ..ProduceSpec::default()
    };
    cluster.produce(&spec);
    topics.push((
        txn.clone(),
        spec.expected_committed(),
        IsolationLevel::ReadCommitted,
    ));

    let proxy = RecordingProxy::start(&cluster.bootstrap()).await;
    for (topic, count, isolation) in &topics {
        consume(&proxy.addr(), topic, *count, *isolation).await;
    }
    edge_cases(&proxy.addr(), &topics[0].0).await;
    groups(&proxy.addr(), &topics[0].0).await;

    let recorded = proxy.recorded();
    let written = write_corpus(&out, &recorded);
    println!(
        "{} responses recorded; seeds written: {written:?} (into {})",
        recorded.len(),
        out.display()
    );
}

/// Reads `topic` from the start, checkpoints, commits, and reads the committed offsets back.
async fn consume(bootstrap: &str, topic: &str, count: u64, isolation: IsolationLevel) {
    let group = unique("seed-group");
    let mut c = Consumer::new(
        config(bootstrap)
            .group_id(group)
            .commit_mode(CommitMode::OnCheckpoints)
            .isolation_level(isolation)
            .max_partition_fetch_bytes(16 << 10)
            .build()
            .expect("config"),
    )
    .expect("consumer");
    let tps = partitions(topic, 2);
    c.assign(tps.iter().map(|tp| (tp.clone(), StartPosition::Earliest)));
    let got = drain(&mut c, count, Duration::from_secs(60)).await;
    assert_eq!(got.count, count, "{topic}");
    let mut outcomes = c.commit_outcomes().expect("outcomes");
    c.snapshot_state(1).await.expect("snapshot");
    c.checkpoints().notify_checkpoint_complete(1);
    let _ = tokio::time::timeout(Duration::from_secs(10), outcomes.recv()).await;
    let _ = c.committed(&tps).await.expect("committed");
    // Latest and by-time start positions: ListOffsets with other timestamps.
    c.seek(&tps[0], StartPosition::Latest).expect("seek");
    c.seek(&tps[1], StartPosition::Timestamp(1)).expect("seek");
    let _ = c.position(&tps[0]).await;
    let _ = c.position(&tps[1]).await;
    let _ = tokio::time::timeout(Duration::from_millis(800), c.poll()).await;
    c.close().await;
}

/// An out-of-range fetch (reset to earliest) and a topic that does not exist.
async fn edge_cases(bootstrap: &str, topic: &str) {
    let mut c = Consumer::new(
        config(bootstrap)
            .auto_offset_reset(OffsetReset::Earliest)
            .build()
            .expect("config"),
    )
    .expect("consumer");
    c.assign([(
        TopicPartition::new(topic, 0),
        StartPosition::Offset(1_000_000),
    )]);
    let _ = tokio::time::timeout(Duration::from_secs(3), c.poll()).await;
    c.assign([(
        TopicPartition::new(unique("seed-missing").as_str(), 0),
        StartPosition::Earliest,
    )]);
    let _ = tokio::time::timeout(Duration::from_secs(3), c.poll()).await;
    c.close().await;
}

/// Group traffic: two classic members (cooperative-sticky) join one after the other, heartbeat
/// and leave; then a KIP-848 member joins, is assigned, heartbeats and leaves.
async fn groups(bootstrap: &str, topic: &str) {
    let member = |protocol: GroupProtocol, group: &str| {
        let mut cfg = config(bootstrap).group_id(group).group_protocol(protocol);
        if protocol == GroupProtocol::Classic {
            cfg = cfg
                .partition_assignment_strategy([AssignmentStrategy::CooperativeSticky])
                .heartbeat_interval(Duration::from_millis(300));
        }
        let mut c = Consumer::new(cfg.build().expect("config")).expect("consumer");
        c.subscribe([topic]).expect("subscribe");
        c
    };
    let classic = unique("seed-classic");
    let mut a = member(GroupProtocol::Classic, &classic);
    poll_for(&mut a, Duration::from_secs(3)).await;
    let mut b = member(GroupProtocol::Classic, &classic);
    tokio::join!(
        poll_for(&mut a, Duration::from_secs(5)),
        poll_for(&mut b, Duration::from_secs(5))
    );
    b.close().await;
    poll_for(&mut a, Duration::from_secs(2)).await;
    a.close().await;
    let mut c = member(GroupProtocol::Consumer, &unique("seed-consumer"));
    poll_for(&mut c, Duration::from_secs(4)).await;
    c.close().await;
}

/// Polls (so that group events are handled) for `d`.
async fn poll_for(c: &mut Consumer, d: Duration) {
    let end = tokio::time::Instant::now() + d;
    while tokio::time::timeout_at(end, c.poll()).await.is_ok() {}
}

/// Writes the seeds; returns how many per target.
fn write_corpus(out: &Path, recorded: &[Recorded]) -> BTreeMap<&'static str, usize> {
    let mut seen = HashSet::new();
    let mut per_kind: BTreeMap<(&'static str, i16, i16, bool), usize> = BTreeMap::new();
    let mut written = BTreeMap::new();
    let mut put = |target: &'static str, r: &Recorded, data: Vec<u8>| {
        if data.len() > MAX_SEED {
            return;
        }
        let records = r.api == ApiKey::Fetch && has_records(r);
        let n = per_kind
            .entry((target, r.api as i16, r.version, records))
            .or_default();
        if *n
            >= if records {
                PER_KIND_WITH_RECORDS
            } else {
                PER_KIND
            }
        {
            return;
        }
        let mut h = DefaultHasher::new();
        data.hash(&mut h);
        let name = format!("real-{:?}-v{}-{:016x}", r.api, r.version, h.finish());
        if !seen.insert((target, name.clone())) {
            return;
        }
        *n += 1;
        let dir = out.join(target);
        std::fs::create_dir_all(&dir).expect("corpus folder");
        std::fs::write(dir.join(name), data).expect("write seed");
        *written.entry(target).or_default() += 1;
    };
    for r in recorded {
        let Some(sel) = FRAME_APIS.iter().position(|(a, _, _)| *a == r.api) else {
            continue;
        };
        let (_, min, max) = FRAME_APIS[sel];
        if r.version < min || r.version > max {
            continue;
        }
        let mut frame = vec![sel as u8, (r.version - min) as u8];
        frame.extend_from_slice(&r.frame);
        put("frame", r, frame);
        for bytes in consumer_protocol_seeds(r) {
            put("consumer_protocol", r, bytes.to_vec());
        }
        if r.api != ApiKey::Fetch {
            continue;
        }
        let Some((body, batches)) = fetch_seed(r) else {
            continue;
        };
        let mut seed = vec![(r.version - min) as u8, u8::from(r.read_committed)];
        seed.extend_from_slice(&body);
        put("fetch_response", r, seed);
        for b in batches {
            put("record_batch", r, b.to_vec());
        }
    }
    written
}

/// The ConsumerProtocol bytes in a JoinGroup answer (every member's subscription, on the
/// leader) or a SyncGroup answer (this member's assignment).
fn consumer_protocol_seeds(r: &Recorded) -> Vec<Bytes> {
    let mut body = r.frame.slice(4..);
    let header_version = r.api.response_header_version(r.version);
    if ResponseHeader::decode(&mut body, header_version).is_err() {
        return Vec::new();
    }
    match r.api {
        ApiKey::JoinGroup => JoinGroupResponse::decode(&mut body, r.version)
            .map(|j| j.members.into_iter().map(|m| m.metadata).collect())
            .unwrap_or_default(),
        ApiKey::SyncGroup => SyncGroupResponse::decode(&mut body, r.version)
            .map(|s| vec![s.assignment])
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// Whether a recorded Fetch response carries any records.
fn has_records(r: &Recorded) -> bool {
    fetch_seed(r).is_some_and(|(_, batches)| !batches.is_empty())
}

/// The Fetch body renamed for the `fetch_response` harness, and the records fields.
fn fetch_seed(r: &Recorded) -> Option<(Bytes, Vec<Bytes>)> {
    let mut b = r.frame.slice(4..);
    ResponseHeader::decode(&mut b, ApiKey::Fetch.response_header_version(r.version)).ok()?;
    let mut resp = FetchResponse::decode(&mut b, r.version).ok()?;
    let mut batches = Vec::new();
    for t in &mut resp.responses {
        if r.version >= 13 {
            t.topic_id = uuid::Uuid::from_u128(42);
        } else {
            t.topic = TopicName(StrBytes::from_static_str("t"));
        }
        for p in &mut t.partitions {
            p.partition_index %= 2;
            if let Some(records) = &p.records
                && !records.is_empty()
            {
                batches.push(records.clone());
            }
        }
    }
    let mut out = BytesMut::new();
    resp.encode(&mut out, r.version).ok()?;
    Some((out.freeze(), batches))
}
