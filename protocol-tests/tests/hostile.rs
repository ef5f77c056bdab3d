//! Conversations with a hostile, buggy or non-Kafka broker (the scripted mock in
//! `protocol_tests::mock`): each must end in a typed error or in recovery with the right
//! records, never in a panic, a hang, memory past the configured limits, a lost record or a
//! commit of an offset that no checkpoint holds.
//!
//! Every conversation runs under a deadline (`bounded`), with request timeouts of a few
//! seconds, and asserts how long it took where that matters.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{
    ApiKey, BrokerId, FetchRequest, FindCoordinatorResponse, GroupId, ListOffsetsRequest,
    ListOffsetsResponse, OffsetCommitRequest, OffsetCommitResponse, OffsetFetchResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::Compression;
use kafka_source::{
    ApiContext, CommitMode, Consumer, ConsumerConfigBuilder, Error, ProtocolViolation,
    StartPosition, TopicPartition,
};
use protocol_tests::mock::{self, MockBroker, MockTopic, Received, Reply};

/// The request timeout of every conversation.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// No conversation step may take longer than this.
const BOUND: Duration = Duration::from_secs(15);

async fn bounded<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: no outcome within {BOUND:?}"))
}

fn base(mock: &MockBroker) -> ConsumerConfigBuilder {
    mock.client_config("hostile")
        .request_timeout(REQUEST_TIMEOUT)
}

fn tp(p: i32) -> TopicPartition {
    TopicPartition::new("t", p)
}

fn s(x: &str) -> StrBytes {
    StrBytes::from_string(x.to_owned())
}

// ---------------------------------------------------------------------------------------------
// The committed-offsets probe: FindCoordinator + OffsetFetch, whose errors `committed()` returns
// (retriable ones are retried until the request timeout).
// ---------------------------------------------------------------------------------------------

fn coordinator(port: u16, code: i16) -> FindCoordinatorResponse {
    FindCoordinatorResponse::default()
        .with_error_code(code)
        .with_node_id(BrokerId(1))
        .with_host(s("127.0.0.1"))
        .with_port(i32::from(port))
        .with_coordinators(vec![
            Coordinator::default()
                .with_key(s("g"))
                .with_node_id(BrokerId(1))
                .with_host(s("127.0.0.1"))
                .with_port(i32::from(port))
                .with_error_code(code),
        ])
}

/// The coordinator answer in the shape of the version asked (v3 top level, v4+ batched).
fn find_coordinator_reply(port: u16, code: i16) -> impl Fn(&Received) -> Reply {
    move |req| {
        let mut r = coordinator(port, code);
        if req.version < 4 {
            r.coordinators.clear();
        } else {
            r = r
                .with_error_code(0)
                .with_node_id(BrokerId(0))
                .with_host(s(""))
                .with_port(0);
        }
        Reply::message(r)
    }
}

/// An OffsetFetch answer for `t-0` at `offset` (group error `group_code`), in the shape of
/// `version`.
fn offset_fetch(version: i16, offset: i64, group_code: i16) -> OffsetFetchResponse {
    if version >= 8 {
        OffsetFetchResponse::default().with_groups(vec![
            OffsetFetchResponseGroup::default()
                .with_group_id(GroupId(s("g")))
                .with_error_code(group_code)
                .with_topics(vec![
                    OffsetFetchResponseTopics::default()
                        .with_name(TopicName(s("t")))
                        .with_partitions(vec![
                            OffsetFetchResponsePartitions::default()
                                .with_partition_index(0)
                                .with_committed_offset(offset),
                        ]),
                ]),
        ])
    } else {
        OffsetFetchResponse::default()
            .with_error_code(group_code)
            .with_topics(vec![
                OffsetFetchResponseTopic::default()
                    .with_name(TopicName(s("t")))
                    .with_partitions(vec![
                        OffsetFetchResponsePartition::default()
                            .with_partition_index(0)
                            .with_committed_offset(offset),
                    ]),
            ])
    }
}

fn good_offset_fetch(req: &Received) -> Reply {
    Reply::message(offset_fetch(req.version, 42, 0))
}

/// A mock that answers the handshake, FindCoordinator (itself) and OffsetFetch (`t-0` at 42).
async fn committed_mock() -> MockBroker {
    let m = MockBroker::start().await;
    m.standard_handshake();
    m.always(ApiKey::FindCoordinator, find_coordinator_reply(m.port(), 0));
    m.always(ApiKey::OffsetFetch, good_offset_fetch);
    m
}

fn committed_consumer(m: &MockBroker) -> Consumer {
    Consumer::new(
        base(m)
            .group_id("g")
            .commit_mode(CommitMode::Disabled)
            .build()
            .unwrap(),
    )
    .unwrap()
}

/// `committed([t-0])` under the deadline, with how long it took.
async fn committed(m: &MockBroker) -> (kafka_source::Result<Option<i64>>, Duration) {
    let c = committed_consumer(m);
    let started = Instant::now();
    let r = bounded("committed", c.committed(&[tp(0)])).await;
    let took = started.elapsed();
    (r.map(|map| map.get(&tp(0)).copied().flatten()), took)
}

fn expect_protocol(
    r: kafka_source::Result<Option<i64>>,
) -> (Option<ApiContext>, ProtocolViolation) {
    match r {
        Err(Error::Protocol { api, violation, .. }) => (api, violation),
        other => panic!("expected a protocol violation, got {other:?}"),
    }
}

/// A frame cut in the middle, then the connection closed: an I/O error (end of file), after the
/// retries the request timeout allows.
#[tokio::test]
async fn frame_cut_and_connection_closed() {
    let m = committed_mock().await;
    m.always(ApiKey::OffsetFetch, |req| {
        good_offset_fetch(req).cut_after(9)
    });
    let (r, took) = committed(&m).await;
    match r {
        Err(Error::Io { source, .. }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::UnexpectedEof)
        }
        other => panic!("expected an I/O error, got {other:?}"),
    }
    assert!(took < REQUEST_TIMEOUT * 2, "{took:?}");
    assert!(m.requests_of(ApiKey::OffsetFetch).len() >= 2, "retried");
}

/// The same cut once: the next request goes on a new connection and succeeds.
#[tokio::test]
async fn frame_cut_once_then_recovers_on_a_new_connection() {
    let m = committed_mock().await;
    m.once(ApiKey::OffsetFetch, |req| {
        good_offset_fetch(req).cut_after(20)
    });
    let (r, _) = committed(&m).await;
    assert_eq!(r.unwrap(), Some(42));
    let fetches = m.requests_of(ApiKey::OffsetFetch);
    assert_eq!(fetches.len(), 2);
    assert_ne!(fetches[0].connection, fetches[1].connection);
}

/// A negative length prefix is a protocol violation naming the length.
#[tokio::test]
async fn negative_length_prefix() {
    let m = committed_mock().await;
    m.always(ApiKey::OffsetFetch, |_| {
        Reply::raw(Bytes::from_static(&[0xff, 0xff, 0xff, 0xfe, 0, 0, 0, 0]))
    });
    let (r, took) = committed(&m).await;
    let (api, v) = expect_protocol(r);
    assert_eq!(v, ProtocolViolation::NegativeLength(-2));
    assert_eq!(api.map(|a| a.api), Some(ApiKey::OffsetFetch));
    assert!(took < REQUEST_TIMEOUT * 2, "{took:?}");
}

/// A length prefix above `max.response.size` is refused before anything is allocated for it.
#[tokio::test]
async fn oversized_length_prefix() {
    let m = committed_mock().await;
    m.always(ApiKey::OffsetFetch, |_| {
        let mut b = BytesMut::new();
        b.put_i32(i32::MAX);
        b.put_slice(&[0; 64]);
        Reply::raw(b.freeze())
    });
    let (r, _) = committed(&m).await;
    let (_, v) = expect_protocol(r);
    assert_eq!(
        v,
        ProtocolViolation::FrameTooLarge {
            claimed: i32::MAX,
            max: 100 << 20
        }
    );
}

/// A response with a correlation id no request is waiting for.
#[tokio::test]
async fn unknown_correlation_id() {
    let m = committed_mock().await;
    m.always(ApiKey::OffsetFetch, |req| {
        good_offset_fetch(req).correlation_id(req.correlation_id + 1000)
    });
    let (r, _) = committed(&m).await;
    let (_, v) = expect_protocol(r);
    assert!(
        matches!(v, ProtocolViolation::UnknownCorrelationId(id) if id >= 1000),
        "{v:?}"
    );
}

/// The same response twice: the first answers the request, the second is an unknown
/// correlation id that closes the connection; the next request uses a new one.
#[tokio::test]
async fn repeated_correlation_id() {
    let m = committed_mock().await;
    m.once(ApiKey::OffsetFetch, |req| good_offset_fetch(req).copies(2));
    let c = committed_consumer(&m);
    let first = bounded("committed", c.committed(&[tp(0)])).await.unwrap();
    assert_eq!(first.get(&tp(0)), Some(&Some(42)));
    let second = bounded("committed", c.committed(&[tp(0)])).await.unwrap();
    assert_eq!(second.get(&tp(0)), Some(&Some(42)));
    let fetches = m.requests_of(ApiKey::OffsetFetch);
    assert!(fetches.len() >= 2, "{fetches:?}");
    assert_ne!(fetches[0].connection, fetches[fetches.len() - 1].connection);
    assert!(m.client_closes() >= 1);
}

/// A body in another version than asked (v1's classic shape for a v9 request): a typed
/// decode error naming the API and version asked, not garbage offsets.
#[tokio::test]
async fn response_in_another_version() {
    let m = committed_mock().await;
    m.always(ApiKey::OffsetFetch, |_| {
        Reply::message(offset_fetch(1, 42, 0)).at_version(1)
    });
    let (r, took) = committed(&m).await;
    match r {
        Err(Error::Decode { api, .. }) => {
            assert_eq!(api.api, ApiKey::OffsetFetch);
            assert_eq!(api.version, 9);
        }
        Err(Error::Protocol {
            violation: ProtocolViolation::Malformed { api, version, .. },
            ..
        }) => assert_eq!((api, version), (ApiKey::OffsetFetch, 9)),
        other => panic!("expected a decode error, got {other:?}"),
    }
    assert!(took < REQUEST_TIMEOUT * 2, "{took:?}");
}

/// A tiny OffsetFetch body claiming four billion groups (the kafka-protocol allocation that
/// used to abort the process): refused by the structural check, connection closed.
#[tokio::test]
async fn huge_array_count_in_offset_fetch() {
    let m = committed_mock().await;
    m.always(ApiKey::OffsetFetch, |_| {
        // throttle_time_ms, then `groups` as a compact array of 2^32 - 2 entries.
        Reply::body(Bytes::from_static(&[
            0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f,
        ]))
    });
    let (r, _) = committed(&m).await;
    let (api, v) = expect_protocol(r);
    assert_eq!(
        api.map(|a| (a.api, a.version)),
        Some((ApiKey::OffsetFetch, 9))
    );
    match v {
        ProtocolViolation::Malformed {
            field,
            offset,
            reason,
            ..
        } => {
            assert_eq!(field, "groups");
            assert_eq!(
                offset, 9,
                "after the correlation id, the tag byte and throttle"
            );
            assert!(reason.contains("4294967294 elements"), "{reason}");
        }
        other => panic!("expected Malformed, got {other:?}"),
    }
    assert!(m.client_closes() >= 1, "the connection was closed");
}

/// A broker that accepts the connection and never answers (not even ApiVersions): a timeout
/// after the request timeout, not a hang.
#[tokio::test]
async fn broker_accepts_and_never_answers() {
    let m = MockBroker::start().await;
    m.always(ApiKey::ApiVersions, |_| Reply::stall());
    let (r, took) = committed(&m).await;
    // The only bootstrap address failed: no broker, with its timeout as the reason.
    match r {
        Err(Error::NoBroker(why)) => {
            assert!(
                why.contains("ApiVersions v4") && why.contains("timed out after 2s"),
                "{why}"
            )
        }
        other => panic!("expected no broker (timed out), got {other:?}"),
    }
    assert!(
        took >= REQUEST_TIMEOUT && took < REQUEST_TIMEOUT * 2,
        "{took:?}"
    );
}

/// A request the broker reads and never answers (the connection stays up).
#[tokio::test]
async fn request_never_answered() {
    let m = committed_mock().await;
    m.always(ApiKey::OffsetFetch, |_| Reply::none());
    let (r, took) = committed(&m).await;
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert!(took < REQUEST_TIMEOUT * 2, "{took:?}");
}

/// A reset (RST) in the middle of a response.
#[tokio::test]
async fn reset_in_the_middle_of_a_response() {
    let m = committed_mock().await;
    m.always(ApiKey::OffsetFetch, |req| {
        good_offset_fetch(req).reset_after(12)
    });
    let (r, _) = committed(&m).await;
    match r {
        Err(Error::Io { source, .. }) => assert!(
            matches!(
                source.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::UnexpectedEof
            ),
            "{source:?}"
        ),
        other => panic!("expected an I/O error, got {other:?}"),
    }
}

/// A response dribbled in small pieces, within the timeout: reassembled and decoded.
#[tokio::test]
async fn response_in_pieces_with_delays() {
    let m = committed_mock().await;
    m.always(ApiKey::OffsetFetch, |req| {
        good_offset_fetch(req).in_pieces(7, Duration::from_millis(60))
    });
    let (r, took) = committed(&m).await;
    assert_eq!(r.unwrap(), Some(42));
    assert!(took >= Duration::from_millis(300), "{took:?}");
}

/// A response dribbled slower than the request timeout: a timeout, not a wait for the rest.
#[tokio::test]
async fn response_in_pieces_slower_than_the_timeout() {
    let m = committed_mock().await;
    m.always(ApiKey::OffsetFetch, |req| {
        good_offset_fetch(req).in_pieces(4, REQUEST_TIMEOUT)
    });
    let (r, took) = committed(&m).await;
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert!(took < REQUEST_TIMEOUT * 2, "{took:?}");
}

/// A broker whose OffsetFetch versions are all below our window.
#[tokio::test]
async fn versions_outside_our_window() {
    let m = committed_mock().await;
    let mut ranges = mock::KAFKA_4_1_VERSIONS.to_vec();
    for r in &mut ranges {
        if r.0 == ApiKey::OffsetFetch {
            *r = (ApiKey::OffsetFetch, 1, 6);
        }
    }
    m.always(ApiKey::ApiVersions, move |_| {
        Reply::message(mock::api_versions(&ranges))
    });
    let (r, _) = committed(&m).await;
    match r {
        Err(Error::UnsupportedVersion {
            api,
            broker_max,
            our_min,
            ..
        }) => {
            assert_eq!(api, ApiKey::OffsetFetch);
            assert_eq!((broker_max, our_min), (6, 7));
        }
        other => panic!("expected UnsupportedVersion, got {other:?}"),
    }
}

/// ApiVersions claiming two billion API keys, in the very first response on a connection.
#[tokio::test]
async fn huge_count_in_api_versions() {
    let m = committed_mock().await;
    m.always(ApiKey::ApiVersions, |_| {
        // error_code 0, api_keys as a compact array of 2^31 entries, throttle.
        Reply::body(Bytes::from_static(&[
            0, 0, 0x81, 0x80, 0x80, 0x80, 0x08, 0, 0, 0, 0,
        ]))
    });
    let (r, _) = committed(&m).await;
    // The handshake of the only bootstrap address failed: no broker, with the violation.
    match r {
        Err(Error::NoBroker(why)) => assert!(
            why.contains("in ApiVersions v4: ApiVersions v4 response, field `api_keys` at byte 6: 2147483648 elements"),
            "{why}"
        ),
        other => panic!("expected no broker (malformed ApiVersions), got {other:?}"),
    }
}

/// The KIP-511 fallback (UNSUPPORTED_VERSION in a v0 body) with an impossible v0 body.
#[tokio::test]
async fn malformed_api_versions_fallback() {
    let m = committed_mock().await;
    m.always(ApiKey::ApiVersions, |req| {
        let mut b = BytesMut::new();
        b.put_i32(10);
        b.put_i32(req.correlation_id);
        b.put_i16(35); // UNSUPPORTED_VERSION
        b.put_i32(i32::MAX); // api_keys
        Reply::raw(b.freeze())
    });
    let (r, _) = committed(&m).await;
    match r {
        Err(Error::NoBroker(why)) => assert!(
            why.contains(
                "ApiVersions v0 response, field `api_keys` at byte 6: 2147483647 elements"
            ),
            "{why}"
        ),
        other => panic!("expected no broker (malformed ApiVersions v0), got {other:?}"),
    }
}

/// An absurd throttle time is not obeyed as a sleep: the answer is used at once.
#[tokio::test]
async fn absurd_throttle_time() {
    let m = committed_mock().await;
    m.always(ApiKey::OffsetFetch, |req| {
        Reply::message(offset_fetch(req.version, 42, 0).with_throttle_time_ms(i32::MAX))
    });
    let (r, took) = committed(&m).await;
    assert_eq!(r.unwrap(), Some(42));
    assert!(took < Duration::from_secs(1), "{took:?}");
}

/// OffsetFetch error codes: a fatal group error is returned as such; a retriable one is
/// retried until it clears.
#[tokio::test]
async fn offset_fetch_error_codes() {
    let m = committed_mock().await;
    m.always(ApiKey::OffsetFetch, |req| {
        Reply::message(offset_fetch(
            req.version,
            -1,
            ResponseError::GroupAuthorizationFailed.code(),
        ))
    });
    let (r, _) = committed(&m).await;
    assert_eq!(
        r.unwrap_err().kafka_code(),
        Some(ResponseError::GroupAuthorizationFailed)
    );

    let m = committed_mock().await;
    for _ in 0..2 {
        m.once(ApiKey::OffsetFetch, |req| {
            Reply::message(offset_fetch(
                req.version,
                -1,
                ResponseError::CoordinatorLoadInProgress.code(),
            ))
        });
    }
    let (r, _) = committed(&m).await;
    assert_eq!(r.unwrap(), Some(42));
    assert_eq!(m.requests_of(ApiKey::OffsetFetch).len(), 3);
}

/// FindCoordinator error codes: fatal at once, retriable until the request timeout.
#[tokio::test]
async fn find_coordinator_error_codes() {
    let m = committed_mock().await;
    m.always(
        ApiKey::FindCoordinator,
        find_coordinator_reply(m.port(), ResponseError::GroupAuthorizationFailed.code()),
    );
    let (r, took) = committed(&m).await;
    assert_eq!(
        r.unwrap_err().kafka_code(),
        Some(ResponseError::GroupAuthorizationFailed)
    );
    assert!(took < REQUEST_TIMEOUT, "{took:?}");
    assert!(m.requests_of(ApiKey::OffsetFetch).is_empty());

    let m = committed_mock().await;
    m.always(
        ApiKey::FindCoordinator,
        find_coordinator_reply(m.port(), ResponseError::CoordinatorNotAvailable.code()),
    );
    let (r, took) = committed(&m).await;
    assert_eq!(
        r.unwrap_err().kafka_code(),
        Some(ResponseError::CoordinatorNotAvailable)
    );
    assert!(took < REQUEST_TIMEOUT * 2, "{took:?}");
    assert!(m.requests_of(ApiKey::FindCoordinator).len() >= 2, "retried");
}

// ---------------------------------------------------------------------------------------------
// The fetch path: a consumer assigned `t-0` (and `t-1`) reading from the mock.
// ---------------------------------------------------------------------------------------------

/// A partition's log on the mock: batches, each with its base and next offset.
#[derive(Clone, Default)]
struct Log {
    batches: Vec<(i64, i64, Bytes)>,
}

impl Log {
    fn push(&mut self, batch: Bytes) -> &mut Self {
        let base = i64::from_be_bytes(batch[0..8].try_into().unwrap());
        let delta = i32::from_be_bytes(batch[23..27].try_into().unwrap());
        self.batches
            .push((base, base + i64::from(delta) + 1, batch));
        self
    }

    fn end(&self) -> i64 {
        self.batches.last().map_or(0, |b| b.1)
    }

    /// The batches from `offset` on.
    fn read(&self, offset: i64) -> Bytes {
        let mut out = BytesMut::new();
        for (_, next, b) in &self.batches {
            if *next > offset {
                out.put_slice(b);
            }
        }
        out.freeze()
    }
}

fn values(n: usize, base: i64) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!("value-{}", base + i as i64).into_bytes())
        .collect()
}

fn plain_batch(base: i64, n: usize) -> Bytes {
    let v = values(n, base);
    let refs: Vec<&[u8]> = v.iter().map(|x| x.as_slice()).collect();
    mock::batch(base, &refs, Compression::None)
}

/// The fetch offset the request asks for `partition` of the first topic.
fn fetch_offset(req: &Received, partition: i32) -> Option<i64> {
    let f: FetchRequest = req.decode();
    f.topics
        .iter()
        .flat_map(|t| t.partitions.iter())
        .find(|p| p.partition == partition)
        .map(|p| p.fetch_offset)
}

/// Answers ListOffsets (earliest 0, latest the log end) for every partition asked.
fn list_offsets_reply(end: i64) -> impl Fn(&Received) -> Reply {
    move |req| {
        let r: ListOffsetsRequest = req.decode();
        Reply::message(
            ListOffsetsResponse::default().with_topics(
                r.topics
                    .iter()
                    .map(|t| {
                        ListOffsetsTopicResponse::default()
                            .with_name(t.name.clone())
                            .with_partitions(
                                t.partitions
                                    .iter()
                                    .map(|p| {
                                        ListOffsetsPartitionResponse::default()
                                            .with_partition_index(p.partition_index)
                                            .with_timestamp(-1)
                                            .with_offset(if p.timestamp == -1 { end } else { 0 })
                                            .with_leader_epoch(1)
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            ),
        )
    }
}

/// Serves `log` for `t-0`: the batches from the fetch offset on, or an empty answer after a
/// short wait when there is nothing new.
fn serve(topic: MockTopic, log: Log) -> impl Fn(&Received) -> Reply {
    move |req| {
        let offset = fetch_offset(req, 0).unwrap_or(0);
        let records = log.read(offset);
        let empty = records.is_empty();
        let reply = Reply::message(mock::fetch_response(
            req.version,
            &topic,
            0,
            0,
            log.end(),
            Some(records),
        ));
        if empty {
            reply.delay(Duration::from_millis(50))
        } else {
            reply
        }
    }
}

/// A mock with topic `t` (`partitions` partitions), the handshake, ListOffsets, and `log`
/// served for `t-0`.
async fn fetch_mock(partitions: i32, log: Log) -> (MockBroker, MockTopic) {
    let m = MockBroker::start().await;
    m.topic("t", partitions);
    m.standard_handshake();
    let topic = m.topic_named("t");
    m.always(ApiKey::ListOffsets, list_offsets_reply(log.end()));
    m.always(ApiKey::Fetch, serve(topic.clone(), log));
    (m, topic)
}

fn fetch_consumer(
    m: &MockBroker,
    b: impl FnOnce(ConsumerConfigBuilder) -> ConsumerConfigBuilder,
) -> Consumer {
    let mut c = Consumer::new(
        b(base(m).commit_mode(CommitMode::Disabled))
            .build()
            .unwrap(),
    )
    .unwrap();
    c.assign([(tp(0), StartPosition::Earliest)]);
    c
}

/// Polls until `n` records arrived; checks they are offsets `0..n` in order, once each.
async fn expect_records(c: &mut Consumer, n: i64) {
    let mut next = 0;
    while next < n {
        let batch = bounded("poll", c.poll()).await.unwrap();
        for r in &batch.records {
            assert_eq!(r.offset, next, "records in order, none lost or repeated");
            assert_eq!(r.value, Some(format!("value-{next}").as_bytes()));
            next += 1;
        }
    }
}

/// Polls until an error arrives (records before it are allowed).
async fn expect_error(c: &mut Consumer) -> Error {
    loop {
        match bounded("poll", c.poll()).await {
            Ok(_) => continue,
            Err(e) => return e,
        }
    }
}

/// The normal case the hostile ones are measured against.
#[tokio::test]
async fn baseline_fetch_delivers_every_record() {
    let mut log = Log::default();
    log.push(plain_batch(0, 5)).push(plain_batch(5, 5));
    let (m, _) = fetch_mock(1, log).await;
    let mut c = fetch_consumer(&m, |b| b);
    expect_records(&mut c, 10).await;
    bounded("close", c.close()).await;
}

/// A batch whose CRC does not match: a typed corrupt-records error for that partition.
#[tokio::test]
async fn batch_with_a_bad_crc() {
    let mut bad = plain_batch(0, 5).to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 0x55;
    let mut log = Log::default();
    log.push(Bytes::from(bad));
    let (m, _) = fetch_mock(1, log).await;
    let mut c = fetch_consumer(&m, |b| b);
    match expect_error(&mut c).await {
        Error::CorruptRecords {
            partition,
            violation: ProtocolViolation::Crc { base_offset, .. },
        } => {
            assert_eq!(partition, tp(0));
            assert_eq!(base_offset, 0);
        }
        other => panic!("expected a CRC error, got {other:?}"),
    }
}

/// A response of many batches (larger than one read, so its CRCs are checked as it arrives)
/// with one bad CRC in the middle: every record before that batch is delivered, in order, then
/// the typed error for that batch; nothing after it.
#[tokio::test]
async fn bad_crc_deep_in_a_large_response() {
    let mut log = Log::default();
    for b in 0..20 {
        let batch = plain_batch(b * 50, 50);
        if b == 10 {
            let mut bad = batch.to_vec();
            let last = bad.len() - 1;
            bad[last] ^= 0x55;
            log.push(Bytes::from(bad));
        } else {
            log.push(batch);
        }
    }
    let (m, _) = fetch_mock(1, log).await;
    let mut c = fetch_consumer(&m, |b| b);
    let mut next = 0;
    let err = loop {
        match bounded("poll", c.poll()).await {
            Ok(batch) => {
                for r in &batch.records {
                    assert_eq!(r.offset, next, "records in order, none lost or repeated");
                    assert_eq!(r.value, Some(format!("value-{next}").as_bytes()));
                    next += 1;
                }
            }
            Err(e) => break e,
        }
    };
    assert_eq!(next, 500, "every record before the bad batch, none after");
    match err {
        Error::CorruptRecords {
            partition,
            violation: ProtocolViolation::Crc { base_offset, .. },
        } => {
            assert_eq!(partition, tp(0));
            assert_eq!(base_offset, 500);
        }
        other => panic!("expected a CRC error, got {other:?}"),
    }
}

/// The same large response with every CRC intact: all of it is delivered.
#[tokio::test]
async fn large_response_of_good_batches_delivers_every_record() {
    let mut log = Log::default();
    for b in 0..20 {
        log.push(plain_batch(b * 50, 50));
    }
    let (m, _) = fetch_mock(1, log).await;
    let mut c = fetch_consumer(&m, |b| b);
    expect_records(&mut c, 1_000).await;
    bounded("close", c.close()).await;
}

/// With `check.crcs=false` a batch whose stored CRC is wrong (its records intact) is decoded
/// and delivered whole; the default rejects it (`batch_with_a_bad_crc`).
#[tokio::test]
async fn bad_crc_is_not_checked_when_check_crcs_is_off() {
    let mut bad = plain_batch(0, 5).to_vec();
    bad[17] ^= 0x55; // the CRC field itself
    let mut log = Log::default();
    log.push(Bytes::from(bad)).push(plain_batch(5, 5));
    let (m, _) = fetch_mock(1, log).await;
    let mut c = fetch_consumer(&m, |b| b.check_crcs(false));
    expect_records(&mut c, 10).await;
    bounded("close", c.close()).await;
}

/// A batch whose length runs past the end of the records field, first in the response: it
/// can never fit, a typed error (not an endless refetch or a large allocation).
#[tokio::test]
async fn batch_length_past_the_end_of_the_buffer() {
    let mut b = plain_batch(0, 5).to_vec();
    b[8..12].copy_from_slice(&(64i32 << 20).to_be_bytes());
    let mut log = Log::default();
    log.push(Bytes::from(b));
    let (m, _) = fetch_mock(1, log).await;
    let mut c = fetch_consumer(&m, |b| b);
    match expect_error(&mut c).await {
        Error::CorruptRecords {
            violation: ProtocolViolation::Batch { reason, .. },
            ..
        } => assert!(reason.contains("does not fit"), "{reason}"),
        other => panic!("expected a batch error, got {other:?}"),
    }
    assert!(c.fetch_stats().buffered_bytes <= 1 << 20);
}

/// Rewrites a batch's record count and recomputes its CRC, so only the count is wrong.
fn with_record_count(batch: &Bytes, count: i32) -> Bytes {
    let mut b = batch.to_vec();
    b[57..61].copy_from_slice(&count.to_be_bytes());
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    Bytes::from(b)
}

/// A batch with a negative record count.
#[tokio::test]
async fn negative_record_count() {
    let mut log = Log::default();
    log.push(with_record_count(&plain_batch(0, 5), -3));
    let (m, _) = fetch_mock(1, log).await;
    let mut c = fetch_consumer(&m, |b| b);
    match expect_error(&mut c).await {
        Error::CorruptRecords {
            violation: ProtocolViolation::Batch { .. },
            partition,
        } => assert_eq!(partition, tp(0)),
        other => panic!("expected a batch error, got {other:?}"),
    }
}

/// A small batch claiming two billion records: refused without reserving room for them.
#[tokio::test]
async fn huge_record_count() {
    let mut log = Log::default();
    log.push(with_record_count(&plain_batch(0, 5), i32::MAX));
    let (m, _) = fetch_mock(1, log).await;
    let mut c = fetch_consumer(&m, |b| b);
    match expect_error(&mut c).await {
        Error::CorruptRecords {
            violation: ProtocolViolation::Batch { .. },
            ..
        } => {}
        other => panic!("expected a batch error, got {other:?}"),
    }
}

/// A small compressed batch that inflates far past the memory budget: a typed error, and the
/// buffered bytes never exceed `buffer.max.bytes`.
async fn decompression_bomb(codec: Compression) {
    const BUDGET: usize = 1 << 20;
    let zeros = vec![0u8; 8 << 20];
    let bomb = mock::batch(0, &[&zeros], codec);
    assert!(bomb.len() < BUDGET, "{codec:?}: {} bytes", bomb.len());
    let mut log = Log::default();
    log.push(bomb);
    let (m, _) = fetch_mock(1, log).await;
    let mut c = fetch_consumer(&m, |b| {
        b.buffer_max_bytes(BUDGET)
            .max_partition_fetch_bytes(BUDGET as u32)
            .fetch_max_bytes(BUDGET as u32)
    });
    let watch = async {
        loop {
            assert!(
                c.fetch_stats().buffered_bytes <= BUDGET as u64,
                "{codec:?}: {:?}",
                c.fetch_stats()
            );
            match c.poll().await {
                Ok(_) => continue,
                Err(e) => break e,
            }
        }
    };
    match bounded("poll", watch).await {
        Error::CorruptRecords {
            violation: ProtocolViolation::DecompressionLimit { limit, .. },
            ..
        } => assert_eq!(limit, BUDGET),
        other => panic!("{codec:?}: expected a decompression limit error, got {other:?}"),
    }
    assert!(c.fetch_stats().buffered_bytes <= BUDGET as u64);
}

#[tokio::test]
async fn decompression_bomb_gzip() {
    decompression_bomb(Compression::Gzip).await;
}

#[tokio::test]
async fn decompression_bomb_snappy() {
    decompression_bomb(Compression::Snappy).await;
}

#[tokio::test]
async fn decompression_bomb_lz4() {
    decompression_bomb(Compression::Lz4).await;
}

#[tokio::test]
async fn decompression_bomb_zstd() {
    decompression_bomb(Compression::Zstd).await;
}

/// A Fetch body whose `aborted_transactions` claims 2^31 entries, once: the connection is
/// closed, the fetch retried on a new one, and every record arrives exactly once.
#[tokio::test]
async fn huge_array_count_in_a_fetch_response() {
    let mut log = Log::default();
    log.push(plain_batch(0, 5));
    let (m, topic) = fetch_mock(1, log).await;
    m.once(ApiKey::Fetch, move |req| {
        let mut b = BytesMut::new();
        b.put_i32(0); // throttle_time_ms
        b.put_i16(0); // error_code
        b.put_i32(0); // session_id
        b.put_u8(2); // one topic
        if req.version >= 13 {
            b.put_slice(topic.id.as_bytes());
        } else {
            b.put_u8(2);
            b.put_u8(b't');
        }
        b.put_u8(2); // one partition
        b.put_i32(0);
        b.put_i16(0);
        b.put_slice(&[0; 24]);
        b.put_slice(&[0x80, 0x80, 0x80, 0x80, 0x08]); // aborted_transactions: 2^31 - 1
        b.put_slice(&[0; 32]);
        Reply::body(b.freeze())
    });
    let mut c = fetch_consumer(&m, |b| b);
    expect_records(&mut c, 5).await;
    assert!(m.client_closes() >= 1, "the poisoned connection was closed");
    assert!(m.requests_of(ApiKey::Fetch).len() >= 2);
}

/// An absurd throttle time in Fetch responses does not stop the consumer.
#[tokio::test]
async fn absurd_throttle_time_in_fetch() {
    let mut log = Log::default();
    log.push(plain_batch(0, 5));
    let (m, topic) = fetch_mock(1, log).await;
    m.once(ApiKey::Fetch, move |req| {
        Reply::message(
            mock::fetch_response(req.version, &topic, 0, 0, 5, Some(plain_batch(0, 5)))
                .with_throttle_time_ms(i32::MAX),
        )
    });
    let started = Instant::now();
    let mut c = fetch_consumer(&m, |b| b);
    expect_records(&mut c, 5).await;
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// Fetch error codes: a fatal one ends the partition with that code.
#[tokio::test]
async fn fetch_error_topic_authorization_failed() {
    let (m, topic) = fetch_mock(1, Log::default()).await;
    m.always(ApiKey::Fetch, move |req| {
        Reply::message(mock::fetch_response(
            req.version,
            &topic,
            0,
            ResponseError::TopicAuthorizationFailed.code(),
            -1,
            None,
        ))
    });
    let mut c = fetch_consumer(&m, |b| b);
    let e = expect_error(&mut c).await;
    assert_eq!(
        e.kafka_code(),
        Some(ResponseError::TopicAuthorizationFailed),
        "{e}"
    );
}

/// OFFSET_OUT_OF_RANGE with no reset policy: a typed out-of-range error for the partition.
#[tokio::test]
async fn fetch_error_offset_out_of_range() {
    let mut log = Log::default();
    log.push(plain_batch(0, 5));
    let (m, topic) = fetch_mock(1, log).await;
    m.always(ApiKey::Fetch, move |req| {
        Reply::message(mock::fetch_response(
            req.version,
            &topic,
            0,
            ResponseError::OffsetOutOfRange.code(),
            5,
            None,
        ))
    });
    let mut c = Consumer::new(
        base(&m)
            .commit_mode(CommitMode::Disabled)
            .auto_offset_reset(kafka_source::OffsetReset::Error)
            .build()
            .unwrap(),
    )
    .unwrap();
    c.assign([(tp(0), StartPosition::Offset(3))]);
    match expect_error(&mut c).await {
        Error::OffsetOutOfRange {
            partition, offset, ..
        } => {
            assert_eq!(partition, tp(0));
            assert_eq!(offset, 3);
        }
        other => panic!("expected OffsetOutOfRange, got {other:?}"),
    }
}

/// NOT_LEADER_OR_FOLLOWER once: metadata is refreshed and fetching goes on, nothing lost.
#[tokio::test]
async fn fetch_error_not_leader_recovers() {
    let mut log = Log::default();
    log.push(plain_batch(0, 5)).push(plain_batch(5, 5));
    let (m, topic) = fetch_mock(1, log).await;
    m.once(ApiKey::Fetch, move |req| {
        Reply::message(mock::fetch_response(
            req.version,
            &topic,
            0,
            ResponseError::NotLeaderOrFollower.code(),
            -1,
            None,
        ))
    });
    let mut c = fetch_consumer(&m, |b| b);
    expect_records(&mut c, 10).await;
    assert!(
        m.requests_of(ApiKey::Metadata).len() >= 2,
        "metadata refreshed"
    );
}

/// A Fetch answer with data for a partition that was not asked for, and an unknown topic id:
/// ignored; the partition asked for is served.
#[tokio::test]
async fn fetch_answer_with_partitions_not_asked_for() {
    use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
    let mut log = Log::default();
    log.push(plain_batch(0, 5));
    let (m, topic) = fetch_mock(2, log.clone()).await;
    let serve_t0 = serve(topic.clone(), log);
    m.always(ApiKey::Fetch, move |req| {
        let offset = fetch_offset(req, 0).unwrap_or(0);
        let mut r = mock::fetch_response(
            req.version,
            &topic,
            0,
            0,
            5,
            Some(if offset == 0 {
                plain_batch(0, 5)
            } else {
                Bytes::new()
            }),
        );
        // Partition 7 of `t` and a topic nobody asked about.
        r.responses[0].partitions.push(
            PartitionData::default()
                .with_partition_index(7)
                .with_high_watermark(100)
                .with_records(Some(plain_batch(0, 3))),
        );
        let mut stranger = FetchableTopicResponse::default().with_partitions(vec![
            PartitionData::default()
                .with_partition_index(0)
                .with_records(Some(plain_batch(0, 2))),
        ]);
        if req.version >= 13 {
            stranger.topic_id = uuid::Uuid::from_u128(999);
        } else {
            stranger.topic = TopicName(s("stranger"));
        }
        r.responses.push(stranger);
        if offset == 0 {
            Reply::message(r)
        } else {
            serve_t0(req)
        }
    });
    let mut c = fetch_consumer(&m, |b| b);
    expect_records(&mut c, 5).await;
    let more = tokio::time::timeout(Duration::from_millis(500), c.poll()).await;
    assert!(more.is_err(), "nothing else is delivered: {more:?}");
}

/// Metadata with leader -1 (no leader) for a while: no fetch goes anywhere until a leader is
/// known, then every record arrives.
#[tokio::test]
async fn metadata_without_a_leader() {
    leaderless_then_led(-1).await;
}

/// Metadata naming a leader that is not among its brokers.
#[tokio::test]
async fn metadata_with_an_unknown_leader_node() {
    leaderless_then_led(7).await;
}

async fn leaderless_then_led(leader: i32) {
    let mut log = Log::default();
    log.push(plain_batch(0, 5));
    let (m, _) = fetch_mock(1, log).await;
    let bad = m.metadata(|_, _| leader);
    for _ in 0..3 {
        let bad = bad.clone();
        m.once(ApiKey::Metadata, move |_| Reply::message(bad.clone()));
    }
    let mut c = fetch_consumer(&m, |b| b);
    expect_records(&mut c, 5).await;
    assert!(m.requests_of(ApiKey::Metadata).len() >= 4);
    // Fetches went only to the mock (node 1), never to a made-up address: the mock saw them all
    // after the leader became known.
    let first_fetch = m
        .requests()
        .iter()
        .position(|r| r.api == ApiKey::Fetch)
        .unwrap();
    let metadata_before = m.requests()[..first_fetch]
        .iter()
        .filter(|r| r.api == ApiKey::Metadata)
        .count();
    assert!(
        metadata_before >= 4,
        "no fetch before a real leader was known"
    );
}

/// Metadata claiming a billion brokers, once: refused, the connection closed, then recovery.
#[tokio::test]
async fn huge_broker_count_in_metadata() {
    let mut log = Log::default();
    log.push(plain_batch(0, 5));
    let (m, _) = fetch_mock(1, log).await;
    m.once(ApiKey::Metadata, |_| {
        // throttle_time_ms, then `brokers` as a compact array of about 2^30 entries.
        Reply::body(Bytes::from_static(&[
            0, 0, 0, 0, 0x80, 0x80, 0x80, 0x80, 0x04, 0,
        ]))
    });
    let mut c = fetch_consumer(&m, |b| b);
    expect_records(&mut c, 5).await;
    assert!(m.requests_of(ApiKey::Metadata).len() >= 2);
    assert!(m.client_closes() >= 1);
}

/// ListOffsets error codes: a fatal code ends the partition with it; NOT_LEADER once is
/// retried after a metadata refresh.
#[tokio::test]
async fn list_offsets_error_codes() {
    let list_error = |code: ResponseError| {
        move |req: &Received| {
            let r: ListOffsetsRequest = req.decode();
            Reply::message(ListOffsetsResponse::default().with_topics(vec![
                    ListOffsetsTopicResponse::default()
                        .with_name(r.topics[0].name.clone())
                        .with_partitions(vec![
                            ListOffsetsPartitionResponse::default()
                                .with_partition_index(0)
                                .with_error_code(code.code())
                                .with_offset(-1),
                        ]),
                ]))
        }
    };
    let (m, _) = fetch_mock(1, Log::default()).await;
    m.always(
        ApiKey::ListOffsets,
        list_error(ResponseError::TopicAuthorizationFailed),
    );
    let mut c = fetch_consumer(&m, |b| b);
    let e = expect_error(&mut c).await;
    assert_eq!(
        e.kafka_code(),
        Some(ResponseError::TopicAuthorizationFailed),
        "{e}"
    );
    assert!(
        m.requests_of(ApiKey::Fetch).is_empty(),
        "no fetch without a start offset"
    );

    let mut log = Log::default();
    log.push(plain_batch(0, 5));
    let (m, _) = fetch_mock(1, log).await;
    m.once(
        ApiKey::ListOffsets,
        list_error(ResponseError::NotLeaderOrFollower),
    );
    let mut c = fetch_consumer(&m, |b| b);
    expect_records(&mut c, 5).await;
    assert!(m.requests_of(ApiKey::ListOffsets).len() >= 2);
}

/// A ListOffsets answer that leaves out the partition asked for: no start offset is made up;
/// the request is tried again and the records arrive once it is answered.
#[tokio::test]
async fn list_offsets_answer_without_the_partition() {
    let mut log = Log::default();
    log.push(plain_batch(0, 5));
    let (m, _) = fetch_mock(1, log).await;
    m.once(ApiKey::ListOffsets, |_| {
        Reply::message(ListOffsetsResponse::default())
    });
    let mut c = fetch_consumer(&m, |b| b);
    expect_records(&mut c, 5).await;
    assert!(m.requests_of(ApiKey::ListOffsets).len() >= 2);
}

// ---------------------------------------------------------------------------------------------
// Commits: only checkpointed offsets are committed, whatever the coordinator answers.
// ---------------------------------------------------------------------------------------------

/// The offsets of every OffsetCommit request the mock received, per request.
fn committed_offsets(m: &MockBroker) -> Vec<BTreeMap<(String, i32), i64>> {
    m.requests_of(ApiKey::OffsetCommit)
        .iter()
        .map(|r| {
            let req: OffsetCommitRequest = r.decode();
            req.topics
                .iter()
                .flat_map(|t| {
                    t.partitions.iter().map(move |p| {
                        (
                            (t.name.0.to_string(), p.partition_index),
                            p.committed_offset,
                        )
                    })
                })
                .collect()
        })
        .collect()
}

/// An OffsetCommit answer for `t-0` with `code`, plus `extra` partitions of `t`.
fn commit_answer(code: i16, include_t0: bool, extra: &[i32]) -> OffsetCommitResponse {
    let mut parts = Vec::new();
    if include_t0 {
        parts.push(
            OffsetCommitResponsePartition::default()
                .with_partition_index(0)
                .with_error_code(code),
        );
    }
    for p in extra {
        parts.push(OffsetCommitResponsePartition::default().with_partition_index(*p));
    }
    OffsetCommitResponse::default().with_topics(vec![
        OffsetCommitResponseTopic::default()
            .with_name(TopicName(s("t")))
            .with_partitions(parts),
    ])
}

/// A mock serving `t-0` with records 0..10 (two fetches: 0..5, then 5..10), a coordinator,
/// and OffsetCommit answered by `commit`.
async fn commit_mock(commit: impl Fn(&Received) -> Reply + Send + Sync + 'static) -> MockBroker {
    let m = MockBroker::start().await;
    m.topic("t", 1);
    m.standard_handshake();
    let topic = m.topic_named("t");
    m.always(ApiKey::ListOffsets, list_offsets_reply(10));
    m.always(ApiKey::FindCoordinator, find_coordinator_reply(m.port(), 0));
    m.always(ApiKey::OffsetFetch, good_offset_fetch);
    // One batch per fetch, so the checkpoint falls between them.
    m.always(ApiKey::Fetch, move |req| {
        let offset = fetch_offset(req, 0).unwrap_or(0);
        let records = match offset {
            0..5 => Some(plain_batch(0, 5)),
            5..10 => Some(plain_batch(5, 5)),
            _ => None,
        };
        let empty = records.is_none();
        let r = Reply::message(mock::fetch_response(
            req.version,
            &topic,
            0,
            0,
            10,
            records.or(Some(Bytes::new())),
        ));
        if empty {
            r.delay(Duration::from_millis(50))
        } else {
            r
        }
    });
    m.always(ApiKey::OffsetCommit, commit);
    m
}

/// Polls 0..5, checkpoints (offset 5), polls 5..10, completes the checkpoint: the outcome of
/// the commit, and the consumer's final stats.
async fn checkpoint_between_fetches(
    m: &MockBroker,
) -> (kafka_source::Outcome, kafka_source::CommitStats) {
    let mut c = Consumer::new(
        base(m)
            .group_id("g")
            .commit_mode(CommitMode::OnCheckpoints)
            .commit_timeout(Duration::from_secs(3))
            .build()
            .unwrap(),
    )
    .unwrap();
    c.assign([(tp(0), StartPosition::Earliest)]);
    let mut outcomes = c.commit_outcomes().unwrap();
    let first = bounded("poll", c.poll()).await.unwrap();
    assert_eq!(first.next_offset, 5);
    let state = bounded("snapshot", c.snapshot_state(1)).await.unwrap();
    assert_eq!(state.offsets().get(&tp(0)), Some(&5));
    let second = bounded("poll", c.poll()).await.unwrap();
    assert_eq!(
        second.next_offset, 10,
        "the position moved past the checkpoint"
    );
    c.checkpoints().notify_checkpoint_complete(1);
    let outcome = bounded("outcome", outcomes.recv()).await.unwrap();
    assert_eq!(outcome.checkpoint_id, Some(1));
    let stats = bounded("close", c.close()).await;
    (outcome.outcome, stats)
}

fn only_checkpointed(m: &MockBroker) {
    let sent = committed_offsets(m);
    assert!(!sent.is_empty(), "a commit was sent");
    for offsets in sent {
        assert_eq!(
            offsets,
            BTreeMap::from([(("t".to_owned(), 0), 5)]),
            "only the checkpointed offset is committed"
        );
    }
}

/// The normal commit: acknowledged, with the checkpoint's offset (not the later position).
#[tokio::test]
async fn commit_sends_only_the_checkpointed_offset() {
    let m = commit_mock(|_| Reply::message(commit_answer(0, true, &[]))).await;
    let (outcome, stats) = checkpoint_between_fetches(&m).await;
    assert!(matches!(outcome, kafka_source::Outcome::Acked), "{outcome}");
    assert_eq!(stats.last_acked.get(&tp(0)), Some(&5));
    only_checkpointed(&m);
}

/// An OffsetCommit answer that leaves out the partition: not counted as stored.
#[tokio::test]
async fn commit_answer_omits_the_partition() {
    let m = commit_mock(|_| Reply::message(commit_answer(0, false, &[]))).await;
    let (outcome, stats) = checkpoint_between_fetches(&m).await;
    match outcome {
        kafka_source::Outcome::Failed(e) => {
            assert!(e.to_string().contains("missing from the response"), "{e}")
        }
        other => panic!("expected a failed commit, got {other}"),
    }
    assert!(stats.last_acked.is_empty(), "{:?}", stats.last_acked);
    only_checkpointed(&m);
}

/// An OffsetCommit answer that adds partitions nobody committed: they are not recorded as
/// stored, and the real one is.
#[tokio::test]
async fn commit_answer_adds_partitions() {
    let m = commit_mock(|_| Reply::message(commit_answer(0, true, &[3, 9]))).await;
    let (outcome, stats) = checkpoint_between_fetches(&m).await;
    assert!(matches!(outcome, kafka_source::Outcome::Acked), "{outcome}");
    assert_eq!(stats.last_acked, BTreeMap::from([(tp(0), 5)]));
    only_checkpointed(&m);
}

/// NOT_COORDINATOR: the coordinator is looked up again and the same offsets are committed.
#[tokio::test]
async fn commit_error_not_coordinator_rediscovers() {
    let m = commit_mock(|_| Reply::message(commit_answer(0, true, &[]))).await;
    m.once(ApiKey::OffsetCommit, |_| {
        Reply::message(commit_answer(
            ResponseError::NotCoordinator.code(),
            true,
            &[],
        ))
    });
    let (outcome, _) = checkpoint_between_fetches(&m).await;
    assert!(matches!(outcome, kafka_source::Outcome::Acked), "{outcome}");
    assert_eq!(committed_offsets(&m).len(), 2);
    assert!(m.requests_of(ApiKey::FindCoordinator).len() >= 2);
    only_checkpointed(&m);
}

/// A fatal OffsetCommit code: the commit fails with it.
#[tokio::test]
async fn commit_error_fatal_code() {
    let m = commit_mock(|_| {
        Reply::message(commit_answer(
            ResponseError::OffsetMetadataTooLarge.code(),
            true,
            &[],
        ))
    })
    .await;
    let (outcome, stats) = checkpoint_between_fetches(&m).await;
    match outcome {
        kafka_source::Outcome::Failed(e) => {
            assert_eq!(e.kafka_code(), Some(ResponseError::OffsetMetadataTooLarge))
        }
        other => panic!("expected a failed commit, got {other}"),
    }
    assert_eq!(stats.failed, 1);
    only_checkpointed(&m);
}

/// FindCoordinator fails with a retriable code before the commit's coordinator is found: the
/// commit still goes out, with the checkpoint's offsets.
#[tokio::test]
async fn commit_after_find_coordinator_errors() {
    let m = commit_mock(|_| Reply::message(commit_answer(0, true, &[]))).await;
    let port = m.port();
    for _ in 0..2 {
        let reply = find_coordinator_reply(port, ResponseError::CoordinatorLoadInProgress.code());
        m.once(ApiKey::FindCoordinator, reply);
    }
    let (outcome, _) = checkpoint_between_fetches(&m).await;
    assert!(matches!(outcome, kafka_source::Outcome::Acked), "{outcome}");
    only_checkpointed(&m);
}

/// A coordinator that resets the connection in the middle of every OffsetCommit answer: the
/// commit times out or fails, and nothing but the checkpointed offset was ever sent.
#[tokio::test]
async fn commit_answer_reset_mid_response() {
    let m = commit_mock(|req| {
        let _ = req;
        Reply::message(commit_answer(0, true, &[])).reset_after(10)
    })
    .await;
    let (outcome, stats) = checkpoint_between_fetches(&m).await;
    assert!(
        matches!(
            outcome,
            kafka_source::Outcome::TimedOut | kafka_source::Outcome::Failed(_)
        ),
        "{outcome}"
    );
    assert!(stats.last_acked.is_empty());
    only_checkpointed(&m);
}
