//! An in-process mock broker for conversations a real broker would not have: torn frames,
//! wrong correlation ids, impossible lengths, stalls, resets, hostile error codes.
//!
//! The mock listens on `127.0.0.1` (an ephemeral port) and accepts any number of connections.
//! Every request frame it reads is logged ([`MockBroker::requests`]) and answered by a *rule*
//! for its API:
//!
//! - one-shot rules ([`MockBroker::once`]) are used first, in the order they were added, each
//!   for one request;
//! - otherwise the standing rule ([`MockBroker::always`]) added last for that API answers;
//! - a request no rule answers is logged and left unanswered.
//!
//! A rule is a closure from the [`Received`] request to a [`Reply`]: a kafka-protocol response
//! struct encoded at the version asked ([`Reply::message`]), a raw body or raw bytes, nothing,
//! a stall, and modifiers for the hostile parts (another correlation id, the frame sent twice,
//! in pieces with delays, cut short and closed, or reset with `SO_LINGER` 0).
//!
//! [`MockBroker::standard_handshake`] installs standing answers for ApiVersions (Kafka 4.1's
//! ranges) and Metadata (the topics registered with [`MockBroker::topic`], every partition led
//! by node 1: the mock itself), which is enough for a real `kafka_source::Consumer` to fetch
//! from it. Group APIs (JoinGroup, SyncGroup, Heartbeat, LeaveGroup, ConsumerGroupHeartbeat)
//! are answered like any other: `mock.once(ApiKey::JoinGroup, |_| Reply::message(resp))`.
//!
//! Every task the mock spawns is aborted when it is dropped.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, BrokerId, MetadataResponse, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{
    Decodable, Encodable, HeaderVersion, StrBytes, decode_request_header_from_buffer,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;
use uuid::Uuid;

/// The API version ranges the standard handshake offers (those of Apache Kafka 4.1).
pub const KAFKA_4_1_VERSIONS: [(ApiKey, i16, i16); 12] = [
    (ApiKey::Fetch, 4, 17),
    (ApiKey::ListOffsets, 1, 10),
    (ApiKey::Metadata, 0, 13),
    (ApiKey::OffsetCommit, 2, 9),
    (ApiKey::OffsetFetch, 1, 9),
    (ApiKey::FindCoordinator, 0, 6),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::ApiVersions, 0, 4),
    (ApiKey::ConsumerGroupHeartbeat, 0, 1),
];

/// One request the mock read.
#[derive(Clone, Debug)]
pub struct Received {
    /// The request's API.
    pub api: ApiKey,
    /// The version it was sent at.
    pub version: i16,
    /// Its correlation id.
    pub correlation_id: i32,
    /// Which connection it came on (1 for the first accepted).
    pub connection: usize,
    /// The request body (after the header).
    pub body: Bytes,
}

impl Received {
    /// Decodes the body as request type `T` at the version it was sent at.
    ///
    /// # Panics
    ///
    /// If the body does not decode: the client sent a malformed request.
    pub fn decode<T: Decodable>(&self) -> T {
        T::decode(&mut self.body.clone(), self.version)
            .unwrap_or_else(|e| panic!("{:?} v{} request: {e:#}", self.api, self.version))
    }
}

type Encoder = Arc<dyn Fn(i16) -> Bytes + Send + Sync>;

/// What the frame carries.
#[derive(Clone)]
enum Payload {
    /// A response header for the request's version, then this body.
    Body(Encoder),
    /// Bytes written as they are (no header, no length prefix added).
    Raw(Bytes),
}

#[derive(Clone)]
enum End {
    /// Keep serving the connection.
    Continue,
    /// Close the connection (FIN) after writing.
    Close,
    /// Reset the connection (`SO_LINGER` 0) after writing.
    Reset,
    /// Stop reading; keep the connection open and silent.
    Stall,
}

/// The mock's answer to one request. Build it with a constructor, then modifiers.
#[derive(Clone)]
pub struct Reply {
    payload: Option<Payload>,
    body_version: Option<i16>,
    correlation_id: Option<i32>,
    copies: usize,
    delay: Duration,
    pieces: Option<(usize, Duration)>,
    cut_after: Option<usize>,
    end: End,
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reply")
            .field("correlation_id", &self.correlation_id)
            .field("copies", &self.copies)
            .field("cut_after", &self.cut_after)
            .finish_non_exhaustive()
    }
}

impl Reply {
    fn new(payload: Option<Payload>) -> Self {
        Self {
            payload,
            body_version: None,
            correlation_id: None,
            copies: 1,
            delay: Duration::ZERO,
            pieces: None,
            cut_after: None,
            end: End::Continue,
        }
    }

    /// A response struct, encoded at the version of the request (see
    /// [`at_version`](Self::at_version)) with a response header of the matching version.
    pub fn message<M>(message: M) -> Self
    where
        M: Encodable + Send + Sync + 'static,
    {
        let encode: Encoder = Arc::new(move |version| {
            let mut buf = BytesMut::new();
            message
                .encode(&mut buf, version)
                .unwrap_or_else(|e| panic!("encoding a mock response at v{version}: {e:#}"));
            buf.freeze()
        });
        Self::new(Some(Payload::Body(encode)))
    }

    /// These bytes as the body, after a response header for the request's version.
    pub fn body(body: impl Into<Bytes>) -> Self {
        let body = body.into();
        Self::new(Some(Payload::Body(Arc::new(move |_| body.clone()))))
    }

    /// These bytes written as they are: no length prefix or header is added.
    pub fn raw(bytes: impl Into<Bytes>) -> Self {
        Self::new(Some(Payload::Raw(bytes.into())))
    }

    /// No answer to this request; later requests on the connection are still served.
    pub fn none() -> Self {
        Self::new(None)
    }

    /// No answer, and nothing more on this connection: it stays open and silent.
    pub fn stall() -> Self {
        let mut r = Self::new(None);
        r.end = End::Stall;
        r
    }

    /// Close the connection without answering.
    pub fn close() -> Self {
        let mut r = Self::new(None);
        r.end = End::Close;
        r
    }

    /// Encode the body at `version` instead of the version asked (the header still follows
    /// the version asked).
    pub fn at_version(mut self, version: i16) -> Self {
        self.body_version = Some(version);
        self
    }

    /// Answer with this correlation id instead of the request's.
    pub fn correlation_id(mut self, id: i32) -> Self {
        self.correlation_id = Some(id);
        self
    }

    /// Send the whole frame `n` times.
    pub fn copies(mut self, n: usize) -> Self {
        self.copies = n;
        self
    }

    /// Wait this long before writing anything.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Write the frame in `n` pieces, `pause` apart.
    pub fn in_pieces(mut self, n: usize, pause: Duration) -> Self {
        self.pieces = Some((n.max(1), pause));
        self
    }

    /// Write only the first `n` bytes of the frame, then close the connection.
    pub fn cut_after(mut self, n: usize) -> Self {
        self.cut_after = Some(n);
        self.end = End::Close;
        self
    }

    /// Write only the first `n` bytes of the frame, then reset the connection.
    pub fn reset_after(mut self, n: usize) -> Self {
        self.cut_after = Some(n);
        self.end = End::Reset;
        self
    }

    /// Close the connection after writing.
    pub fn then_close(mut self) -> Self {
        self.end = End::Close;
        self
    }

    /// Reset the connection after writing.
    pub fn then_reset(mut self) -> Self {
        self.end = End::Reset;
        self
    }

    /// Keep the connection open and silent after writing.
    pub fn then_stall(mut self) -> Self {
        self.end = End::Stall;
        self
    }

    /// The bytes to write for request `req`.
    fn frame(&self, req: &Received) -> Bytes {
        let Some(payload) = &self.payload else {
            return Bytes::new();
        };
        let one = match payload {
            Payload::Raw(b) => b.clone(),
            Payload::Body(encode) => {
                let body = encode(self.body_version.unwrap_or(req.version));
                let header_version = req.api.response_header_version(req.version);
                let mut buf = BytesMut::new();
                buf.put_i32(0);
                ResponseHeader::default()
                    .with_correlation_id(self.correlation_id.unwrap_or(req.correlation_id))
                    .encode(&mut buf, header_version)
                    .expect("response header");
                buf.put_slice(&body);
                let len = i32::try_from(buf.len() - 4).expect("frame size");
                buf[..4].copy_from_slice(&len.to_be_bytes());
                buf.freeze()
            }
        };
        let mut all = BytesMut::new();
        for _ in 0..self.copies {
            all.put_slice(&one);
        }
        let mut all = all.freeze();
        if let Some(n) = self.cut_after {
            all.truncate(n);
        }
        all
    }
}

type Rule = Arc<dyn Fn(&Received) -> Reply + Send + Sync>;

#[derive(Default)]
struct State {
    once: Vec<(ApiKey, Rule)>,
    always: BTreeMap<i16, Rule>,
    log: Vec<Received>,
    connections: usize,
    client_closed: usize,
    tasks: Vec<AbortHandle>,
    topics: Vec<MockTopic>,
}

/// A topic the standard Metadata answer lists.
#[derive(Clone, Debug)]
pub struct MockTopic {
    /// Its name.
    pub name: String,
    /// Its id.
    pub id: Uuid,
    /// Its partition count.
    pub partitions: i32,
}

/// An in-process broker that follows a script; see the module docs.
pub struct MockBroker {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for MockBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockBroker")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Drop for MockBroker {
    fn drop(&mut self) {
        for t in self.lock().tasks.drain(..) {
            t.abort();
        }
    }
}

impl MockBroker {
    /// Starts listening on an ephemeral loopback port. Must be called inside a tokio runtime.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("local address");
        let state = Arc::new(Mutex::new(State::default()));
        let accept = {
            let state = Arc::clone(&state);
            tokio::spawn(async move {
                loop {
                    let Ok((sock, _)) = listener.accept().await else {
                        return;
                    };
                    let _ = sock.set_nodelay(true);
                    let mut s = state.lock().expect("mock state");
                    s.connections += 1;
                    let id = s.connections;
                    let task = tokio::spawn(serve(sock, id, Arc::clone(&state)));
                    s.tasks.push(task.abort_handle());
                }
            })
        };
        state
            .lock()
            .expect("mock state")
            .tasks
            .push(accept.abort_handle());
        Self { addr, state }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `127.0.0.1:port`, for `bootstrap_servers`.
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// A consumer config for this broker with short timeouts and backoffs, so that every
    /// conversation ends within seconds; `request.timeout.ms` is 2 s unless overridden.
    pub fn client_config(&self, client_id: &str) -> kafka_source::ConsumerConfigBuilder {
        kafka_source::ConsumerConfig::builder()
            .bootstrap_servers([self.addr()])
            .client_id(client_id)
            .request_timeout(Duration::from_secs(2))
            .connect_timeout(Duration::from_secs(1))
            .fetch_max_wait(Duration::from_millis(100))
            .retry_backoff(Duration::from_millis(50))
            .reconnect_backoff(Duration::from_millis(20))
            .reconnect_backoff_max(Duration::from_millis(100))
            .close_timeout(Duration::from_secs(1))
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Answers the next request of `api` (after the one-shot rules already queued for it).
    pub fn once(&self, api: ApiKey, rule: impl Fn(&Received) -> Reply + Send + Sync + 'static) {
        self.lock().once.push((api, Arc::new(rule)));
    }

    /// Answers every request of `api` no one-shot rule takes; replaces an earlier standing rule.
    pub fn always(&self, api: ApiKey, rule: impl Fn(&Received) -> Reply + Send + Sync + 'static) {
        self.lock().always.insert(api as i16, Arc::new(rule));
    }

    /// Registers a topic for the standard Metadata answer (id `Uuid::from_u128(n)` for the
    /// n-th topic registered, from 1).
    pub fn topic(&self, name: &str, partitions: i32) -> Uuid {
        let mut s = self.lock();
        let id = Uuid::from_u128(s.topics.len() as u128 + 1);
        s.topics.push(MockTopic {
            name: name.to_owned(),
            id,
            partitions,
        });
        id
    }

    /// Standing answers to ApiVersions ([`KAFKA_4_1_VERSIONS`]) and Metadata
    /// ([`metadata`](Self::metadata) with every partition led by node 1).
    pub fn standard_handshake(&self) -> &Self {
        self.always(ApiKey::ApiVersions, |_| {
            Reply::message(api_versions(&KAFKA_4_1_VERSIONS))
        });
        let state = Arc::clone(&self.state);
        let port = self.port();
        self.always(ApiKey::Metadata, move |_| {
            let topics = state.lock().expect("mock state").topics.clone();
            Reply::message(metadata(port, &topics, |_, _| 1))
        });
        self
    }

    /// The standard Metadata answer, with the leader of each partition chosen by `leader`
    /// (topic name, partition) → node id. Node 1 is this mock.
    pub fn metadata(&self, leader: impl Fn(&str, i32) -> i32) -> MetadataResponse {
        let topics = self.lock().topics.clone();
        metadata(self.port(), &topics, leader)
    }

    /// Every request read so far, in order.
    pub fn requests(&self) -> Vec<Received> {
        self.lock().log.clone()
    }

    /// The requests of one API read so far.
    pub fn requests_of(&self, api: ApiKey) -> Vec<Received> {
        self.lock()
            .log
            .iter()
            .filter(|r| r.api == api)
            .cloned()
            .collect()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.lock().connections
    }

    /// Connections the client closed so far (the mock read end-of-file or an error).
    pub fn client_closes(&self) -> usize {
        self.lock().client_closed
    }
}

/// An ApiVersions response offering these ranges.
pub fn api_versions(ranges: &[(ApiKey, i16, i16)]) -> ApiVersionsResponse {
    ApiVersionsResponse::default().with_api_keys(
        ranges
            .iter()
            .map(|(k, lo, hi)| {
                ApiVersion::default()
                    .with_api_key(*k as i16)
                    .with_min_version(*lo)
                    .with_max_version(*hi)
            })
            .collect(),
    )
}

/// A Metadata response naming node 1 at `127.0.0.1:port` and `topics`, each partition led by
/// `leader(topic, partition)` at leader epoch 1.
pub fn metadata(
    port: u16,
    topics: &[MockTopic],
    leader: impl Fn(&str, i32) -> i32,
) -> MetadataResponse {
    MetadataResponse::default()
        .with_brokers(vec![
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(1))
                .with_host(StrBytes::from_static_str("127.0.0.1"))
                .with_port(i32::from(port)),
        ])
        .with_cluster_id(Some(StrBytes::from_static_str("mock")))
        .with_controller_id(BrokerId(1))
        .with_topics(
            topics
                .iter()
                .map(|t| {
                    MetadataResponseTopic::default()
                        .with_name(Some(TopicName(StrBytes::from_string(t.name.clone()))))
                        .with_topic_id(t.id)
                        .with_partitions(
                            (0..t.partitions)
                                .map(|p| {
                                    let l = leader(&t.name, p);
                                    MetadataResponsePartition::default()
                                        .with_partition_index(p)
                                        .with_leader_id(BrokerId(l))
                                        .with_leader_epoch(1)
                                        .with_replica_nodes(vec![BrokerId(1)])
                                        .with_isr_nodes(vec![BrokerId(1)])
                                })
                                .collect(),
                        )
                })
                .collect(),
        )
}

/// Serves one connection until the client closes it, a reply ends it, or the mock is dropped.
async fn serve(mut sock: TcpStream, connection: usize, state: Arc<Mutex<State>>) {
    let closed = |state: &Mutex<State>| {
        state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .client_closed += 1;
    };
    loop {
        let Ok(len) = sock.read_i32().await else {
            closed(&state);
            return;
        };
        let Ok(len) = usize::try_from(len) else {
            closed(&state);
            return;
        };
        let mut buf = vec![0u8; len];
        if sock.read_exact(&mut buf).await.is_err() {
            closed(&state);
            return;
        }
        let mut frame = Bytes::from(buf);
        let Ok(header) = decode_request_header_from_buffer(&mut frame) else {
            closed(&state);
            return;
        };
        let Ok(api) = ApiKey::try_from(header.request_api_key) else {
            closed(&state);
            return;
        };
        let req = Received {
            api,
            version: header.request_api_version,
            correlation_id: header.correlation_id,
            connection,
            body: frame,
        };
        let rule = {
            let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
            s.log.push(req.clone());
            match s.once.iter().position(|(a, _)| *a == api) {
                Some(i) => Some(s.once.remove(i).1),
                None => s.always.get(&(api as i16)).cloned(),
            }
        };
        let Some(rule) = rule else {
            continue;
        };
        let reply = rule(&req);
        if !reply.delay.is_zero() {
            tokio::time::sleep(reply.delay).await;
        }
        let bytes = reply.frame(&req);
        let written = match reply.pieces {
            Some((n, pause)) if !bytes.is_empty() => {
                let size = bytes.len().div_ceil(n);
                let mut ok = true;
                for (i, piece) in bytes.chunks(size).enumerate() {
                    if i > 0 {
                        tokio::time::sleep(pause).await;
                    }
                    if sock.write_all(piece).await.is_err() {
                        ok = false;
                        break;
                    }
                }
                ok
            }
            _ => sock.write_all(&bytes).await.is_ok(),
        };
        if !written {
            closed(&state);
            return;
        }
        let _ = sock.flush().await;
        match reply.end {
            End::Continue => {}
            End::Close => {
                let _ = sock.shutdown().await;
                return;
            }
            End::Reset => {
                let _ = sock.set_zero_linger();
                return;
            }
            End::Stall => {
                // Hold the socket until the mock is dropped (which aborts this task).
                std::future::pending::<()>().await;
            }
        }
    }
}

/// A response body as kafka-protocol encodes `message` at `version` (for hand-made frames).
pub fn encode<M: Encodable>(message: &M, version: i16) -> Bytes {
    let mut buf = BytesMut::new();
    message
        .encode(&mut buf, version)
        .unwrap_or_else(|e| panic!("encoding at v{version}: {e:#}"));
    buf.freeze()
}

/// A whole response frame (length prefix, header, body) for `message` at `version`.
pub fn frame<M: Encodable + HeaderVersion>(
    correlation_id: i32,
    message: &M,
    version: i16,
) -> Bytes {
    let mut buf = BytesMut::new();
    buf.put_i32(0);
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut buf, M::header_version(version))
        .expect("response header");
    message
        .encode(&mut buf, version)
        .unwrap_or_else(|e| panic!("encoding at v{version}: {e:#}"));
    let len = i32::try_from(buf.len() - 4).expect("frame size");
    buf[..4].copy_from_slice(&len.to_be_bytes());
    buf.freeze()
}

/// A record batch (magic 2) of `values` at offsets `base_offset..`, keys `"0"`, `"1"`, ...
/// relative to the batch, compressed with `compression`.
pub fn batch(
    base_offset: i64,
    values: &[&[u8]],
    compression: kafka_protocol::records::Compression,
) -> Bytes {
    use kafka_protocol::records::{Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, v)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: base_offset + i as i64,
            // Offset minus sequence is what kafka-protocol's encoder groups a batch by.
            sequence: (base_offset + i as i64) as i32,
            timestamp: 1_700_000_000_000 + i as i64,
            key: Some(Bytes::from(i.to_string())),
            value: Some(Bytes::copy_from_slice(v)),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression,
        },
    )
    .expect("encode a record batch");
    buf.freeze()
}

/// A Fetch response for one partition of `topic`, addressed by name or id as `version` needs.
pub fn fetch_response(
    version: i16,
    topic: &MockTopic,
    partition: i32,
    error_code: i16,
    high_watermark: i64,
    records: Option<Bytes>,
) -> kafka_protocol::messages::FetchResponse {
    use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
    let mut t = FetchableTopicResponse::default().with_partitions(vec![
        PartitionData::default()
            .with_partition_index(partition)
            .with_error_code(error_code)
            .with_high_watermark(high_watermark)
            .with_last_stable_offset(high_watermark)
            .with_log_start_offset(0)
            .with_records(records),
    ]);
    if version >= 13 {
        t.topic_id = topic.id;
    } else {
        t.topic = TopicName(StrBytes::from_string(topic.name.clone()));
    }
    kafka_protocol::messages::FetchResponse::default().with_responses(vec![t])
}

impl MockBroker {
    /// The registered topic called `name`.
    ///
    /// # Panics
    ///
    /// If no such topic was registered.
    pub fn topic_named(&self, name: &str) -> MockTopic {
        self.lock()
            .topics
            .iter()
            .find(|t| t.name == name)
            .cloned()
            .unwrap_or_else(|| panic!("no mock topic {name}"))
    }
}
