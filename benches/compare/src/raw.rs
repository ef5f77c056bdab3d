//! The raw-fetch ceiling: blocking connections that send Fetch requests (v12, topic names, no
//! session) one after the other and discard the records. Only the record batch headers are read,
//! to count records and to move each partition's offset past the last whole batch; nothing is
//! decompressed or parsed per record. It opens as many connections as kafka-source fetches over
//! by default (`fetch.connections.per.broker` = 2, and no more than there are partitions), each
//! on its own thread with its share of the partitions (round robin), so that a broker never
//! waits on one connection's response while the other could be served. No client that hands
//! records to an application can do less work per byte over as many connections, so its rate
//! bounds what kafka-source can reach.
//!
//! Fetch settings are the Java client's defaults: `fetch.max.wait.ms` 500, `fetch.min.bytes` 1,
//! `fetch.max.bytes` 50 MiB, `max.partition.fetch.bytes` 1 MiB.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{Buf as _, Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::{
    ApiVersionsRequest, BrokerId, FetchRequest, FindCoordinatorRequest, GroupId,
    ListOffsetsRequest, MetadataRequest, OffsetCommitRequest, OffsetFetchRequest, RequestHeader,
    ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};

use crate::child::CHILD_DEADLINE;

const FETCH_VERSION: i16 = 12;

/// What [`consume`] fetched.
#[derive(Debug)]
pub(crate) struct Fetched {
    /// Records in whole batches.
    pub(crate) records: u64,
    /// Bytes of whole batches.
    pub(crate) bytes: u64,
    /// From connecting to the first records.
    pub(crate) first: Option<Duration>,
    /// From connecting to the last records.
    pub(crate) elapsed: Duration,
}

/// Data connections: kafka-source's default `fetch.connections.per.broker`.
const CONNECTIONS: i32 = 2;

/// Reads partitions `0..partitions` of `topic` from offset 0 until `want` records have been
/// fetched, over up to [`CONNECTIONS`] connections.
pub(crate) fn consume(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    want: u64,
) -> Result<Fetched, String> {
    let addr = first_address(bootstrap);
    let started = Instant::now();
    let connections = CONNECTIONS.min(partitions).max(1);
    let total = AtomicU64::new(0);
    let lanes: Vec<Result<Lane, String>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..connections)
            .map(|lane| {
                let mine: Vec<i32> = (lane..partitions).step_by(connections as usize).collect();
                let total = &total;
                scope.spawn(move || consume_lane(addr, topic, &mine, want, total, started))
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err("a fetch thread panicked".into()))
            })
            .collect()
    });
    let mut fetched = Fetched {
        records: 0,
        bytes: 0,
        first: None,
        elapsed: Duration::ZERO,
    };
    for lane in lanes {
        let lane = lane?;
        fetched.records += lane.records;
        fetched.bytes += lane.bytes;
        fetched.first = match (fetched.first, lane.first) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(done) = lane.done {
            fetched.elapsed = done;
        }
    }
    Ok(fetched)
}

/// What one connection fetched.
struct Lane {
    records: u64,
    bytes: u64,
    first: Option<Duration>,
    /// When this connection's records took the total to `want`, if they did.
    done: Option<Duration>,
}

/// Fetches `partitions` of `topic` over one connection until all connections together have
/// fetched `want` records (`total`).
fn consume_lane(
    addr: &str,
    topic: &str,
    partitions: &[i32],
    want: u64,
    total: &AtomicU64,
    started: Instant,
) -> Result<Lane, String> {
    let mut stream = connect(addr)?;
    let mut offsets: Vec<(i32, i64)> = partitions.iter().map(|&p| (p, 0)).collect();
    let mut lane = Lane {
        records: 0,
        bytes: 0,
        first: None,
        done: None,
    };
    let mut correlation_id = 0;
    while total.load(Ordering::Acquire) < want {
        if started.elapsed() > CHILD_DEADLINE {
            return Err(format!(
                "only {} of {want} records",
                total.load(Ordering::Acquire)
            ));
        }
        let request = fetch_request(topic, &offsets);
        let response = round_trip(&mut stream, &mut correlation_id, &request, FETCH_VERSION)?;
        if response.error_code != 0 {
            return Err(format!("fetch error code {}", response.error_code));
        }
        for t in &response.responses {
            for p in &t.partitions {
                if p.error_code != 0 {
                    return Err(format!(
                        "partition {}: error code {}",
                        p.partition_index, p.error_code
                    ));
                }
                let Some(data) = &p.records else { continue };
                let slot = offsets
                    .iter_mut()
                    .find(|(partition, _)| *partition == p.partition_index)
                    .ok_or("a partition that was not asked for")?;
                let (n, next, used) = walk_batches(data);
                lane.records += n;
                lane.bytes += used as u64;
                if n > 0 && lane.first.is_none() {
                    lane.first = Some(started.elapsed());
                }
                let before = total.fetch_add(n, Ordering::AcqRel);
                if before < want && before + n >= want {
                    lane.done = Some(started.elapsed());
                }
                if let Some(next) = next {
                    slot.1 = next;
                }
            }
        }
    }
    Ok(lane)
}

/// A Fetch request for every (partition, offset).
fn fetch_request(topic: &str, offsets: &[(i32, i64)]) -> FetchRequest {
    let partitions = offsets
        .iter()
        .map(|&(p, offset)| {
            FetchPartition::default()
                .with_partition(p)
                .with_current_leader_epoch(-1)
                .with_fetch_offset(offset)
                .with_last_fetched_epoch(-1)
                .with_log_start_offset(-1)
                .with_partition_max_bytes(1 << 20)
        })
        .collect();
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(500)
        .with_min_bytes(1)
        .with_max_bytes(50 << 20)
        .with_isolation_level(0)
        .with_session_id(0)
        .with_session_epoch(-1)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_string(topic.to_owned())))
                .with_partitions(partitions),
        ])
}

/// Walks the record batch headers of one partition's records: (records in whole batches, the
/// offset after the last whole batch, bytes of whole batches). A trailing partial batch (the
/// broker cuts at `partition_max_bytes`) is left for the next fetch.
fn walk_batches(data: &Bytes) -> (u64, Option<i64>, usize) {
    // baseOffset i64, batchLength i32, partitionLeaderEpoch i32, magic i8, crc u32,
    // attributes i16, lastOffsetDelta i32, baseTimestamp i64, maxTimestamp i64, producerId i64,
    // producerEpoch i16, baseSequence i32, recordCount i32.
    const HEADER: usize = 61;
    let (mut records, mut next, mut used) = (0u64, None, 0usize);
    let mut rest = &data[..];
    while rest.len() >= HEADER {
        let mut h = &rest[..HEADER];
        let base_offset = h.get_i64();
        let batch_length = h.get_i32();
        let total = 12 + batch_length.max(0) as usize;
        if batch_length < 49 || rest.len() < total {
            break;
        }
        let mut h = &rest[23..HEADER];
        let last_offset_delta = h.get_i32();
        let count = rest[57..61]
            .iter()
            .fold(0u32, |n, &b| (n << 8) | u32::from(b));
        records += u64::from(count);
        next = Some(base_offset + i64::from(last_offset_delta) + 1);
        used += total;
        rest = &rest[total..];
    }
    (records, next, used)
}

/// The broker's own commit round trip, the floor under any client's commit latency: one
/// blocking connection to the group coordinator that sends OffsetCommit requests (v8, no
/// generation and no member id, as a standalone consumer commits) one at a time, `pace` apart
/// (20 ms like the latency children; none for the broker's warm-up), and times each request's
/// round trip. Nothing else runs on it: no fetch, no checkpoint, no handover. Returns the round
/// trips after the first `warmup`.
pub(crate) fn commit_round_trips(
    bootstrap: &str,
    topic: &str,
    group: &str,
    commits: u64,
    warmup: u64,
    pace: Duration,
) -> Result<Vec<Duration>, String> {
    let mut stream = connect(first_address(bootstrap))?;
    let find = find_group_coordinator(StrBytes::from_string(group.to_owned()));
    let mut correlation_id = 0;
    // The first lookup of a group creates `__consumer_offsets`: COORDINATOR_NOT_AVAILABLE (15)
    // until it is ready.
    let deadline = Instant::now() + Duration::from_secs(30);
    let coordinator = loop {
        let answer = round_trip(&mut stream, &mut correlation_id, &find, 3)?;
        match answer.error_code {
            0 => break answer,
            15 if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            code => return Err(format!("FindCoordinator error code {code}")),
        }
    };
    let mut stream = connect(&format!(
        "{}:{}",
        coordinator.host.as_str(),
        coordinator.port
    ))?;
    let mut took = Vec::new();
    for i in 0..warmup + commits {
        if !pace.is_zero() {
            std::thread::sleep(pace);
        }
        let commit = OffsetCommitRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group.to_owned())))
            .with_generation_id_or_member_epoch(-1)
            .with_topics(vec![
                OffsetCommitRequestTopic::default()
                    .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
                    .with_partitions(vec![
                        OffsetCommitRequestPartition::default()
                            .with_partition_index(0)
                            .with_committed_offset(i as i64)
                            .with_committed_leader_epoch(-1),
                    ]),
            ]);
        let start = Instant::now();
        let response = round_trip(&mut stream, &mut correlation_id, &commit, 8)?;
        let elapsed = start.elapsed();
        for t in &response.topics {
            for p in &t.partitions {
                if p.error_code != 0 {
                    return Err(format!("OffsetCommit error code {}", p.error_code));
                }
            }
        }
        if i >= warmup {
            took.push(elapsed);
        }
    }
    Ok(took)
}

/// Warms up the broker's handling of the requests a consumer sends before its first Fetch:
/// `rounds` rounds (or until `budget` is spent) of ApiVersions, Metadata and ListOffsets (the
/// earliest offset of every partition) for each topic in turn, and FindCoordinator and
/// OffsetFetch for `group` (v3 and v7, the versions before their request layouts change), on one
/// connection; the first three at the versions kafka-source sends to a Kafka 4.1 broker. A
/// consumer sends each of them once per run, so the warm-up runs leave them to the broker's
/// interpreter while the Fetch path, sent hundreds of times per run, is compiled: every client
/// would then pay the broker's cold start-up path, which the raw fetch skips. Returns the
/// rounds done (none without topics).
pub(crate) fn start_up_round_trips(
    bootstrap: &str,
    topics: &[(String, i32)],
    group: &str,
    rounds: u64,
    budget: Duration,
) -> Result<u64, String> {
    if topics.is_empty() {
        return Ok(0);
    }
    let mut stream = connect(first_address(bootstrap))?;
    let mut correlation_id = 0;
    let started = Instant::now();
    let group = StrBytes::from_string(group.to_owned());
    let mut done = 0;
    while done < rounds && started.elapsed() < budget {
        let (topic, partitions) = &topics[(done as usize) % topics.len()];
        let name = TopicName(StrBytes::from_string(topic.clone()));
        let versions = round_trip(
            &mut stream,
            &mut correlation_id,
            &ApiVersionsRequest::default()
                .with_client_software_name(StrBytes::from_static_str("compare-raw"))
                .with_client_software_version(StrBytes::from_static_str("0")),
            4,
        )?;
        if versions.error_code != 0 {
            return Err(format!("ApiVersions error code {}", versions.error_code));
        }
        let metadata = round_trip(
            &mut stream,
            &mut correlation_id,
            &MetadataRequest::default()
                .with_topics(Some(vec![
                    MetadataRequestTopic::default().with_name(Some(name.clone())),
                ]))
                .with_allow_auto_topic_creation(false),
            13,
        )?;
        if let Some(t) = metadata.topics.iter().find(|t| t.error_code != 0) {
            return Err(format!("Metadata error code {}", t.error_code));
        }
        let offsets = round_trip(
            &mut stream,
            &mut correlation_id,
            &ListOffsetsRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_topics(vec![
                    ListOffsetsTopic::default()
                        .with_name(name.clone())
                        .with_partitions(
                            (0..*partitions)
                                .map(|p| {
                                    ListOffsetsPartition::default()
                                        .with_partition_index(p)
                                        .with_current_leader_epoch(-1)
                                        .with_timestamp(-2)
                                })
                                .collect(),
                        ),
                ]),
            10,
        )?;
        for p in offsets.topics.iter().flat_map(|t| &t.partitions) {
            if p.error_code != 0 {
                return Err(format!("ListOffsets error code {}", p.error_code));
            }
        }
        // The group requests' answers may be "not available yet" (the offsets topic is
        // created by the first lookup): the broker handled them all the same.
        round_trip(
            &mut stream,
            &mut correlation_id,
            &find_group_coordinator(group.clone()),
            3,
        )?;
        round_trip(
            &mut stream,
            &mut correlation_id,
            &OffsetFetchRequest::default()
                .with_group_id(GroupId(group.clone()))
                .with_topics(Some(vec![
                    OffsetFetchRequestTopic::default()
                        .with_name(name)
                        .with_partition_indexes((0..*partitions).collect()),
                ])),
            7,
        )?;
        done += 1;
    }
    Ok(done)
}

/// The first address of a comma-separated bootstrap list.
fn first_address(bootstrap: &str) -> &str {
    bootstrap.split(',').next().unwrap_or(bootstrap)
}

/// A FindCoordinator request for a consumer group, in the single-key layout (up to v3).
fn find_group_coordinator(group: StrBytes) -> FindCoordinatorRequest {
    FindCoordinatorRequest::default()
        .with_key(group)
        .with_key_type(0)
}

fn connect(addr: &str) -> Result<TcpStream, String> {
    let stream = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    Ok(stream)
}

/// Sends `request` as API version `version` and reads its response.
fn round_trip<Req: Request>(
    stream: &mut TcpStream,
    correlation_id: &mut i32,
    request: &Req,
    version: i16,
) -> Result<Req::Response, String> {
    *correlation_id += 1;
    let header = RequestHeader::default()
        .with_request_api_key(Req::KEY)
        .with_request_api_version(version)
        .with_correlation_id(*correlation_id)
        .with_client_id(Some(StrBytes::from_static_str("compare-raw")));
    let mut frame = BytesMut::new();
    frame.extend_from_slice(&[0; 4]);
    header
        .encode(&mut frame, Req::header_version(version))
        .map_err(|e| format!("encode header: {e}"))?;
    request
        .encode(&mut frame, version)
        .map_err(|e| format!("encode request: {e}"))?;
    let size = (frame.len() - 4) as i32;
    frame[..4].copy_from_slice(&size.to_be_bytes());
    stream.write_all(&frame).map_err(|e| format!("send: {e}"))?;
    let mut size = [0u8; 4];
    stream
        .read_exact(&mut size)
        .map_err(|e| format!("receive: {e}"))?;
    let size = i32::from_be_bytes(size);
    if !(0..=(200 << 20)).contains(&size) {
        return Err(format!("response size {size}"));
    }
    // Read into spare capacity: a zeroed buffer (`vec![0; size]`) costs a pass over every
    // response byte before the kernel writes them, which no client needs to pay.
    let size = size as usize;
    let mut body = Vec::with_capacity(size);
    (&mut *stream)
        .take(size as u64)
        .read_to_end(&mut body)
        .map_err(|e| format!("receive: {e}"))?;
    if body.len() != size {
        return Err(format!(
            "receive: the connection closed {} bytes into a {size}-byte response",
            body.len()
        ));
    }
    let mut body = Bytes::from(body);
    let header = ResponseHeader::decode(&mut body, Req::Response::header_version(version))
        .map_err(|e| format!("decode header: {e}"))?;
    if header.correlation_id != *correlation_id {
        return Err(format!(
            "correlation id {} for request {correlation_id}",
            header.correlation_id
        ));
    }
    Req::Response::decode(&mut body, version).map_err(|e| format!("decode response: {e}"))
}
