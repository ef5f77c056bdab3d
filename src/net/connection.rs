//! One broker connection: a writer, a reader task, and correlation-id demultiplexing.
//!
//! Requests are pipelined: any number may be in flight, each waiting on its own `oneshot`.
//! A request is written to the socket by the task that makes it, at once, when nothing is
//! queued before it and the socket takes it whole; otherwise it is queued (with whatever part
//! the socket did not take) for the writer task. Writing never awaits in the requester, so a
//! cancelled request never leaves half a frame behind it.
//! Kafka answers in order on a connection, but responses are routed by correlation id, and a
//! response nobody asked for is a protocol violation. Any framing error, I/O error or request
//! timeout *poisons* the connection: every waiting request fails with a copy of the error, and
//! the pool opens a new connection for the next request. The reader never allocates more than
//! the configured maximum response size, whatever a length prefix claims.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest};
use kafka_protocol::protocol::{Message, Request, StrBytes};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;

use crate::error::{ApiContext, BrokerRef, Error, ProtocolViolation, Result};
use crate::net::frame_pool::{FrameBuf, FramePool, ReadInto};
use crate::proto::crc_scan::{Checked, CrcScan};
use crate::proto::frame;
use crate::proto::versions::{BrokerVersions, Window};

/// Settings every connection shares.
#[derive(Clone, Debug)]
pub(crate) struct ConnOptions {
    pub(crate) client_id: StrBytes,
    pub(crate) max_response_size: usize,
    pub(crate) request_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    /// Check the CRCs of a Fetch response's batches as the response arrives (`check.crcs`).
    pub(crate) scan_crcs: bool,
    /// Spare receive buffers, shared by all of a consumer's connections.
    pub(crate) frames: Arc<FramePool>,
}

/// A response frame, and which of its record batches had their CRC checked on arrival.
type Reply = oneshot::Sender<Result<(Bytes, Checked)>>;

struct Pending {
    api: ApiContext,
    reply: Reply,
}

enum State {
    Open(HashMap<i32, Pending>),
    Poisoned(Error),
}

struct Shared {
    broker: BrokerRef,
    state: Mutex<State>,
}

impl Shared {
    /// Fails every waiting request with `err` and refuses new ones. The first poison wins.
    fn poison(&self, err: Error) {
        let pending = {
            let mut state = self.state.lock();
            match &mut *state {
                State::Poisoned(_) => return,
                State::Open(map) => {
                    let pending = std::mem::take(map);
                    tracing::debug!(broker = %self.broker, error = %err, "connection closed");
                    *state = State::Poisoned(err.duplicate());
                    pending
                }
            }
        };
        for (_, p) in pending {
            let mut e = err.duplicate();
            if let Error::Protocol { api, .. } = &mut e {
                api.get_or_insert(p.api);
            }
            let _ = p.reply.send(Err(e));
        }
    }
}

/// The write side: the socket, and the frames (or the rest of a frame) it has not taken yet.
///
/// Every write happens under `queue`'s lock, by the requester or by the writer task, so frames
/// never interleave. The lock is held across non-blocking writes only.
struct Writer {
    half: OwnedWriteHalf,
    queue: Mutex<WriteQueue>,
    /// Wakes the writer task when a frame is queued.
    queued: Notify,
}

/// Frames not yet written, the first perhaps in part. A failed write poisons the connection,
/// which then takes no more requests, so the queue needs no state of its own for that.
type WriteQueue = VecDeque<Bytes>;

impl Writer {
    /// Queues `frame` and, if nothing waited before it, writes at once what the socket takes;
    /// the writer task is woken for any rest. Never blocks on the socket.
    fn send(&self, frame: Bytes) -> std::io::Result<()> {
        let mut queue = self.queue.lock();
        let idle = queue.is_empty();
        queue.push_back(frame);
        // If frames waited before it, the writer task, woken for the first of them, writes
        // until the queue is empty.
        if idle && !Self::write_queued(&self.half, &mut queue)? {
            drop(queue);
            self.queued.notify_one();
        }
        Ok(())
    }

    /// Writes what the queue holds, waiting for the socket to become writable whenever it is
    /// full, until the queue is empty.
    async fn flush(&self) -> std::io::Result<()> {
        while !Self::write_queued(&self.half, &mut self.queue.lock())? {
            self.half.writable().await?;
        }
        Ok(())
    }

    fn write_queued(half: &OwnedWriteHalf, queue: &mut WriteQueue) -> std::io::Result<bool> {
        while let Some(front) = queue.front_mut() {
            match half.try_write(front) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) if n == front.len() => {
                    queue.pop_front();
                }
                Ok(n) => front.advance(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

/// A live connection to one broker, with its negotiated API versions.
pub(crate) struct Connection {
    shared: Arc<Shared>,
    writer: Arc<Writer>,
    next_correlation_id: AtomicI32,
    versions: BrokerVersions,
    opts: ConnOptions,
    tasks: [JoinHandle<()>; 2],
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("broker", &self.shared.broker)
            .field("alive", &self.is_alive())
            .finish()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Connection {
    /// Opens a TCP connection and negotiates API versions.
    pub(crate) async fn connect(addr: &str, broker: BrokerRef, opts: ConnOptions) -> Result<Self> {
        Self::connect_then(addr, broker, opts, || {}).await
    }

    /// [`connect`](Self::connect), calling `connected` once the TCP connection is up, before
    /// the versions are negotiated.
    pub(crate) async fn connect_then(
        addr: &str,
        broker: BrokerRef,
        opts: ConnOptions,
        connected: impl FnOnce(),
    ) -> Result<Self> {
        let io_err = |source| Error::Io {
            broker: broker.clone(),
            source,
        };
        let stream = tokio::time::timeout(opts.connect_timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| Error::timeout(format!("connecting to {broker}"), opts.connect_timeout))?
            .map_err(io_err)?;
        stream.set_nodelay(true).map_err(io_err)?;
        connected();
        Self::start(stream, broker, opts).await
    }

    async fn start(stream: TcpStream, broker: BrokerRef, opts: ConnOptions) -> Result<Self> {
        let (rd, wr) = stream.into_split();
        let shared = Arc::new(Shared {
            broker,
            state: Mutex::new(State::Open(HashMap::new())),
        });
        let writer = Arc::new(Writer {
            half: wr,
            queue: Mutex::new(WriteQueue::default()),
            queued: Notify::new(),
        });
        let reader = tokio::spawn(read_loop(
            rd,
            Arc::clone(&shared),
            Arc::clone(&opts.frames),
            opts.max_response_size,
            opts.scan_crcs,
        ));
        let write_task = tokio::spawn(write_loop(Arc::clone(&writer), Arc::clone(&shared)));
        let mut conn = Self {
            shared,
            writer,
            next_correlation_id: AtomicI32::new(0),
            versions: BrokerVersions::default(),
            opts,
            tasks: [reader, write_task],
        };
        conn.versions = conn.negotiate().await?;
        Ok(conn)
    }

    /// ApiVersions, with the KIP-511 fallback: a broker that does not know our version answers
    /// UNSUPPORTED_VERSION in a v0 body that lists its own ApiVersions range.
    async fn negotiate(&self) -> Result<BrokerVersions> {
        let mut version = <ApiVersionsRequest as Message>::VERSIONS.max;
        for _ in 0..2 {
            let req = ApiVersionsRequest::default()
                .with_client_software_name(StrBytes::from_static_str("kafka-source"))
                .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION")));
            let api = ApiContext {
                api: ApiKey::ApiVersions,
                version,
            };
            let raw = self.send_raw(&req, api).await?;
            if frame::peek_error_code_after_v0_header(&raw) == Some(35) && version > 0 {
                let v0 = frame::decode_api_versions_fallback(&raw)
                    .map_err(|e| self.decode_error(api, e))?;
                let theirs = v0
                    .api_keys
                    .iter()
                    .find(|k| k.api_key == ApiKey::ApiVersions as i16)
                    .map(|k| k.max_version)
                    .unwrap_or(0);
                version = theirs.min(version - 1).max(0);
                continue;
            }
            let resp = frame::decode_response::<ApiVersionsRequest>(raw, version)
                .map_err(|e| self.decode_error(api, e))?;
            if let Some(code) = kafka_protocol::error::ParseResponseErrorCode::err(resp.error_code)
            {
                return Err(Error::broker(
                    code,
                    format!("ApiVersions to {}", self.shared.broker),
                    None,
                ));
            }
            return Ok(BrokerVersions::from_response(&resp));
        }
        Err(Error::Protocol {
            broker: self.shared.broker.clone(),
            api: Some(ApiContext {
                api: ApiKey::ApiVersions,
                version,
            }),
            violation: ProtocolViolation::Unexpected(
                "ApiVersions fallback did not converge".into(),
            ),
        })
    }

    /// The broker this connection goes to, as it was named when connecting.
    pub(crate) fn broker(&self) -> &BrokerRef {
        &self.shared.broker
    }

    /// False once the connection failed; the pool then replaces it.
    pub(crate) fn is_alive(&self) -> bool {
        matches!(*self.shared.state.lock(), State::Open(_))
    }

    /// The version to use for an API on this broker, or a typed error when there is none.
    pub(crate) fn version(&self, w: Window) -> Result<i16> {
        self.versions.choose(w).map_err(|range| {
            let (broker_min, broker_max) = range.unwrap_or((-1, -1));
            Error::UnsupportedVersion {
                broker: self.shared.broker.clone(),
                api: w.api,
                broker_min,
                broker_max,
                our_min: w.min,
                our_max: w.max,
            }
        })
    }

    /// Sends a request and decodes its response. `extra_wait` extends the request timeout for
    /// requests the broker may hold on purpose (a long-polling Fetch).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future abandons the response, which the reader still consumes
    /// and discards, so the connection stays usable.
    pub(crate) async fn request<R: Request>(
        &self,
        req: &R,
        version: i16,
        extra_wait: Duration,
    ) -> Result<R::Response> {
        let api = ApiContext {
            api: frame::api_key::<R>(),
            version,
        };
        let (raw, _) = self.send_raw_with_wait(req, api, extra_wait).await?;
        frame::decode_response::<R>(raw, version).map_err(|e| self.decode_error(api, e))
    }

    /// [`request`](Self::request), with the record batches whose CRC the read loop checked as
    /// the response arrived (a Fetch response on a connection that scans them; none otherwise)
    /// and the response's length in bytes (the frame its byte fields are slices of).
    pub(crate) async fn request_checked<R: Request>(
        &self,
        req: &R,
        version: i16,
        extra_wait: Duration,
    ) -> Result<(R::Response, Checked, usize)> {
        let api = ApiContext {
            api: frame::api_key::<R>(),
            version,
        };
        let (raw, checked) = self.send_raw_with_wait(req, api, extra_wait).await?;
        let len = raw.len();
        let resp =
            frame::decode_response::<R>(raw, version).map_err(|e| self.decode_error(api, e))?;
        Ok((resp, checked, len))
    }

    /// The error for a response that did not decode. A body the structural check refused
    /// poisons the connection: a broker that sends impossible lengths is not trusted further.
    fn decode_error(&self, api: ApiContext, e: frame::DecodeError) -> Error {
        match e {
            frame::DecodeError::Violation(violation) => {
                let err = Error::Protocol {
                    broker: self.shared.broker.clone(),
                    api: Some(api),
                    violation,
                };
                tracing::warn!(broker = %self.shared.broker, error = %err, "malformed response; closing connection");
                self.shared.poison(err.duplicate());
                err
            }
            frame::DecodeError::Decode(source) => Error::Decode {
                broker: self.shared.broker.clone(),
                api,
                source,
            },
        }
    }

    async fn send_raw<R: Request>(&self, req: &R, api: ApiContext) -> Result<Bytes> {
        let (raw, _) = self.send_raw_with_wait(req, api, Duration::ZERO).await?;
        Ok(raw)
    }

    async fn send_raw_with_wait<R: Request>(
        &self,
        req: &R,
        api: ApiContext,
        extra_wait: Duration,
    ) -> Result<(Bytes, Checked)> {
        let correlation_id = self.next_correlation_id.fetch_add(1, Ordering::Relaxed);
        let mut buf = BytesMut::new();
        frame::encode_request(
            &mut buf,
            req,
            api.version,
            correlation_id,
            &self.opts.client_id,
        )
        .map_err(|source| Error::Encode { api, source })?;
        let (reply, rx) = oneshot::channel();
        {
            // Register before the frame can reach the broker, so the response always finds us.
            let mut state = self.shared.state.lock();
            match &mut *state {
                State::Poisoned(e) => return Err(e.duplicate()),
                State::Open(map) => {
                    map.insert(correlation_id, Pending { api, reply });
                }
            }
        }
        if let Err(source) = self.writer.send(buf.freeze()) {
            self.shared.poison(Error::Io {
                broker: self.shared.broker.clone(),
                source,
            });
        }
        let limit = self.opts.request_timeout + extra_wait;
        match tokio::time::timeout(limit, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(Error::Closed),
            Err(_) => {
                let err = Error::timeout(format!("{api} to {}", self.shared.broker), limit);
                // A broker that does not answer in time is not trusted with later requests
                // on this connection either (the Java client disconnects too).
                self.shared.poison(err.duplicate());
                Err(err)
            }
        }
    }
}

/// Writes the frames requesters queued. Ends at the first failed write, poisoning the
/// connection; the socket's write side shuts down when the connection is dropped.
async fn write_loop(writer: Arc<Writer>, shared: Arc<Shared>) {
    let err = loop {
        writer.queued.notified().await;
        if let Err(e) = writer.flush().await {
            break e;
        }
    };
    shared.poison(Error::Io {
        broker: shared.broker.clone(),
        source: err,
    });
}

/// Frames larger than this are read into a buffer grown in steps of this size, so a length
/// prefix alone never makes us allocate more than this ahead of the bytes that arrived.
const GROW_STEP: usize = 16 << 20;

/// At most this much is read while no frame is known: a small response usually arrives whole
/// in one such read, and of a larger frame only this much is copied into the frame's own
/// buffer (a fetch response of 1 MiB would otherwise pay for copying a whole socket read).
const HEAD_READ: usize = 8 * 1024;

/// While a scanned response is read, at most this much per read: each read's batches are
/// checked while the kernel's copy of them is still in the core's L2.
const SCAN_READ: usize = 256 * 1024;

/// The read limit for a response below [`SMALL_FRAME`] (one or two partitions' worth at the
/// default 1 MiB per partition), scanned or not, instead of [`SCAN_READ`] or the rest of the
/// frame. Measured, not derived: on an AMD EPYC (family 25 model 17) one partition ran 1.08x
/// and 1.13x as fast pair by pair with CRCs checked (two sets of 60 alternating rounds), CPU
/// per record unchanged, and 1.15x, 1.18x and 1.15x with `check.crcs=false` (three sets of 60
/// to 80; reads of the rest of the frame before), CPU per record from 3 % less to 8 % more; on
/// an Intel Xeon (family 6 model 207) 0.98x with CRCs checked (100 rounds; `check.crcs=false`
/// not measured there). Each read hands socket buffer back to the broker sooner, which may let its
/// next burst overlap this one's copy; that was not taken apart. Larger responses keep the
/// larger reads: on eight partitions reads of 64 KiB cost 20 % more CPU per record, for the
/// four times as many reads.
const SMALL_FRAME_READ: usize = 64 * 1024;

/// Responses below this size are read [`SMALL_FRAME_READ`] at a time. It happens to equal the
/// frame pool's threshold for mapped buffers, but does not follow it: the read size matters on
/// every platform, mapped or not.
const SMALL_FRAME: usize = 2 << 20;

/// A scan goes on once at least this much more of the frame is in (and at its end), so that a
/// broker dribbling bytes cannot make it walk the response's headers once per byte.
const SCAN_STEP: usize = 16 * 1024;

async fn read_loop(
    mut rd: OwnedReadHalf,
    shared: Arc<Shared>,
    pool: Arc<FramePool>,
    max: usize,
    scan_crcs: bool,
) {
    let mut buf = BytesMut::with_capacity(HEAD_READ);
    // Fetch responses are scanned: their batches' CRCs are checked as they arrive.
    let scan_for = |correlation_id: i32| {
        if !scan_crcs {
            return None;
        }
        match &*shared.state.lock() {
            State::Open(map) => map
                .get(&correlation_id)
                .filter(|p| p.api.api == ApiKey::Fetch)
                .map(|p| CrcScan::fetch(p.api.version)),
            State::Poisoned(_) => None,
        }
    };
    let err = loop {
        match read_frame(&mut rd, &mut buf, &pool, max, &scan_for).await {
            Ok(frame) => {
                if let Err(e) = deliver(&shared, frame) {
                    break e;
                }
            }
            Err(e) => break e,
        }
    };
    let err = match err {
        ReadError::Io(source) => Error::Io {
            broker: shared.broker.clone(),
            source,
        },
        ReadError::Protocol(violation) => {
            tracing::warn!(broker = %shared.broker, %violation, "protocol violation; closing connection");
            Error::Protocol {
                broker: shared.broker.clone(),
                api: None,
                violation,
            }
        }
    };
    shared.poison(err);
}

enum ReadError {
    Io(std::io::Error),
    Protocol(ProtocolViolation),
}

/// Reads one frame. `scan_for` gives the scan for a response (by correlation id) that is to be
/// checked as it arrives: only frames larger than one head read are.
async fn read_frame<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    pool: &Arc<FramePool>,
    max: usize,
    scan_for: &impl Fn(i32) -> Option<CrcScan>,
) -> Result<(Bytes, Checked), ReadError> {
    while buf.len() < frame::LENGTH_PREFIX {
        fill(rd, buf, HEAD_READ).await?;
    }
    let prefix = i32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let len = frame::check_length(prefix, max).map_err(ReadError::Protocol)?;
    let total = frame::LENGTH_PREFIX + len;
    if buf.len() >= total {
        let mut frame = buf.split_to(total);
        frame.advance(frame::LENGTH_PREFIX);
        return Ok((frame.freeze(), Checked::default()));
    }
    // The rest of the frame is read into a buffer of its own, of its size (or a spare of the
    // connection's a little larger). Cut from the shared read buffer instead, a frame would
    // keep that whole buffer alive (and it grows by doubling) for as long as any frame cut
    // from it is held: memory the fetch budget, which counts frame bytes, would not see.
    let mut frame = pool.take(len.min(GROW_STEP), len <= GROW_STEP);
    frame.extend_from_slice(&buf[frame::LENGTH_PREFIX..]);
    buf.clear();
    // Looked up once the correlation id is in (it almost always came with the head read).
    let mut scan: Option<Option<CrcScan>> = None;
    let mut scanned = 0;
    // The most one read takes: a scanned frame's batches are checked between reads, an
    // unscanned large frame is read as fast as it comes.
    let (scan_read, plain_read) = if len < SMALL_FRAME {
        (SMALL_FRAME_READ, SMALL_FRAME_READ)
    } else {
        (SCAN_READ, usize::MAX)
    };
    while frame.len() < len {
        if frame.len() == frame.capacity() {
            frame.reserve_exact((len - frame.len()).min(GROW_STEP));
        }
        if scan.is_none()
            && let Some(id) = frame.as_slice().first_chunk::<4>()
        {
            scan = Some(scan_for(i32::from_be_bytes(*id)));
        }
        // Never past this frame: what follows belongs to the next one.
        let missing = len - frame.len();
        let limit = match scan.as_mut() {
            Some(Some(s)) => {
                if frame.len() - scanned >= SCAN_STEP {
                    s.advance(frame.as_slice());
                    scanned = frame.len();
                }
                missing.min(scan_read)
            }
            _ => missing.min(plain_read),
        };
        read_part(rd, &mut frame, limit).await?;
    }
    let scan = scan.flatten().map(|mut s| {
        s.advance(frame.as_slice());
        s
    });
    let frame = pool.frame(frame);
    let checked = scan.map_or_else(Checked::default, |s| s.finish(&frame));
    Ok((frame, checked))
}

/// One read of at most `limit` bytes into `frame`; the end of the stream is an error.
async fn read_part<R: AsyncRead + Unpin>(
    rd: &mut R,
    frame: &mut FrameBuf,
    limit: usize,
) -> Result<(), ReadError> {
    match frame.read_into() {
        ReadInto::Heap(v) => read_some(rd, &mut v.limit(limit)).await,
        ReadInto::Mapped { room, filled } => {
            let end = limit.min(room.len());
            // A slice is a `BufMut` that advances past what a read fills.
            match rd.read_buf(&mut &mut room[..end]).await {
                Ok(0) => Err(closed()),
                Ok(n) => {
                    *filled += n;
                    Ok(())
                }
                Err(e) => Err(ReadError::Io(e)),
            }
        }
    }
}

async fn fill<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    want: usize,
) -> Result<(), ReadError> {
    buf.reserve(want);
    read_some(rd, &mut (&mut *buf).limit(want)).await
}

/// One read into `buf`'s spare room; the end of the stream is an error.
async fn read_some<R: AsyncRead + Unpin, B: BufMut>(
    rd: &mut R,
    buf: &mut B,
) -> Result<(), ReadError> {
    match rd.read_buf(buf).await {
        Ok(0) => Err(closed()),
        Ok(_) => Ok(()),
        Err(e) => Err(ReadError::Io(e)),
    }
}

/// The end of the stream, where more of a frame was due.
fn closed() -> ReadError {
    ReadError::Io(std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        "broker closed the connection",
    ))
}

fn deliver(shared: &Shared, (frame, checked): (Bytes, Checked)) -> Result<(), ReadError> {
    let id = frame::correlation_id(&frame).map_err(ReadError::Protocol)?;
    let pending = match &mut *shared.state.lock() {
        State::Open(map) => map.remove(&id),
        State::Poisoned(_) => return Ok(()),
    };
    let Some(p) = pending else {
        return Err(ReadError::Protocol(
            ProtocolViolation::UnknownCorrelationId(id),
        ));
    };
    // The requester may have given up (cancelled); its response is dropped here.
    let _ = p.reply.send(Ok((frame, checked)));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::versions;
    use bytes::BufMut;
    use kafka_protocol::messages::ApiVersionsResponse;
    use kafka_protocol::messages::api_versions_response::ApiVersion;
    use kafka_protocol::messages::{
        MetadataRequest, MetadataResponse, RequestHeader, ResponseHeader,
    };
    use kafka_protocol::protocol::{Encodable, HeaderVersion, decode_request_header_from_buffer};
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    fn opts() -> ConnOptions {
        ConnOptions {
            client_id: StrBytes::from_static_str("test"),
            max_response_size: 100 << 20,
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            scan_crcs: true,
            frames: Arc::default(),
        }
    }

    /// Reads one request frame; returns its header.
    async fn read_request(sock: &mut TcpStream) -> RequestHeader {
        let len = sock.read_i32().await.unwrap() as usize;
        let mut buf = vec![0u8; len];
        sock.read_exact(&mut buf).await.unwrap();
        let mut b = Bytes::from(buf);
        decode_request_header_from_buffer(&mut b).unwrap()
    }

    fn response_frame<R: Encodable + HeaderVersion>(corr: i32, body: &R, version: i16) -> Vec<u8> {
        let mut buf = BytesMut::new();
        buf.put_i32(0);
        ResponseHeader::default()
            .with_correlation_id(corr)
            .encode(&mut buf, R::header_version(version))
            .unwrap();
        body.encode(&mut buf, version).unwrap();
        let len = (buf.len() - 4) as i32;
        buf[..4].copy_from_slice(&len.to_be_bytes());
        buf.to_vec()
    }

    /// Answers the ApiVersions handshake like a Kafka 4.1 broker (Metadata 0..=13).
    async fn handshake(sock: &mut TcpStream) {
        let h = read_request(sock).await;
        assert_eq!(h.request_api_key, ApiKey::ApiVersions as i16);
        let resp = ApiVersionsResponse::default().with_api_keys(vec![
            ApiVersion::default()
                .with_api_key(ApiKey::ApiVersions as i16)
                .with_max_version(4),
            ApiVersion::default()
                .with_api_key(ApiKey::Metadata as i16)
                .with_max_version(13),
        ]);
        let frame = response_frame(h.correlation_id, &resp, h.request_api_version);
        sock.write_all(&frame).await.unwrap();
    }

    async fn metadata(conn: &Connection) -> Result<MetadataResponse> {
        let v = conn.version(versions::METADATA)?;
        conn.request(&MetadataRequest::default(), v, Duration::ZERO)
            .await
    }

    #[tokio::test]
    async fn pipelined_requests_are_routed_by_correlation_id() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            handshake(&mut sock).await;
            // Two requests in flight; answer them in reverse order.
            let a = read_request(&mut sock).await;
            let b = read_request(&mut sock).await;
            for (h, id) in [(b, 2), (a, 1)] {
                let resp = MetadataResponse::default().with_controller_id(id.into());
                let frame = response_frame(h.correlation_id, &resp, h.request_api_version);
                sock.write_all(&frame).await.unwrap();
            }
            sock
        });
        let conn = Connection::connect(&addr, BrokerRef::Address(addr.clone()), opts())
            .await
            .unwrap();
        assert_eq!(conn.version(versions::METADATA).unwrap(), 13);
        let (a, b) = tokio::join!(metadata(&conn), metadata(&conn));
        assert_eq!(a.unwrap().controller_id.0, 1);
        assert_eq!(b.unwrap().controller_id.0, 2);
        assert!(conn.is_alive());
        drop(server.await.unwrap());
    }

    /// A 2 GiB length prefix is a typed error, the connection is poisoned, and the claimed size
    /// is never allocated (the test binary's allocator records the largest request).
    #[tokio::test]
    async fn huge_length_prefix_is_refused_without_allocating() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            handshake(&mut sock).await;
            let _ = read_request(&mut sock).await;
            sock.write_all(&i32::MAX.to_be_bytes()).await.unwrap();
            sock.write_all(&[0u8; 64]).await.unwrap();
            sock
        });
        let conn = Connection::connect(&addr, BrokerRef::Address(addr.clone()), opts())
            .await
            .unwrap();
        let err = metadata(&conn).await.unwrap_err();
        match &err {
            Error::Protocol {
                violation: ProtocolViolation::FrameTooLarge { claimed, max },
                api,
                ..
            } => {
                assert_eq!(*claimed, i32::MAX);
                assert_eq!(*max, 100 << 20);
                assert_eq!(api.map(|a| a.api), Some(ApiKey::Metadata));
            }
            other => panic!("expected FrameTooLarge, got {other:?}"),
        }
        assert!(!conn.is_alive());
        assert!(
            metadata(&conn).await.is_err(),
            "a poisoned connection refuses requests"
        );
        drop(server.await.unwrap());
    }

    /// A broker that accepts a request and never answers fails it after the request timeout,
    /// and the connection is not trusted again.
    #[tokio::test]
    async fn a_silent_broker_times_out_the_request() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            handshake(&mut sock).await;
            let _ = read_request(&mut sock).await;
            sock // held open, silent
        });
        let mut o = opts();
        o.request_timeout = Duration::from_millis(300);
        let conn = Connection::connect(&addr, BrokerRef::Address(addr.clone()), o)
            .await
            .unwrap();
        let started = std::time::Instant::now();
        match metadata(&conn).await {
            Err(Error::Timeout { after, .. }) => assert_eq!(after, Duration::from_millis(300)),
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(!conn.is_alive());
        drop(server.await.unwrap());
    }

    /// The reader checks the prefix before it reserves anything: after a 2 GiB prefix (or a
    /// negative one) its buffer is still the small initial one.
    #[tokio::test]
    async fn reader_never_reserves_the_claimed_size() {
        for prefix in [i32::MAX, 1 << 30, -1, i32::MIN] {
            let (mut tx, mut rx) = tokio::io::duplex(1024);
            tx.write_all(&prefix.to_be_bytes()).await.unwrap();
            tx.write_all(&[7u8; 100]).await.unwrap();
            let mut buf = BytesMut::with_capacity(64 * 1024);
            let res = read_frame(&mut rx, &mut buf, &Arc::default(), 100 << 20, &|_| None)
                .await
                .map(|(f, _)| f);
            assert!(
                matches!(res, Err(ReadError::Protocol(_))),
                "prefix {prefix}"
            );
            assert!(
                buf.capacity() <= 64 * 1024,
                "prefix {prefix}: reserved {}",
                buf.capacity()
            );
        }
        // A frame over the limit but plausible is refused the same way.
        let (mut tx, mut rx) = tokio::io::duplex(1024);
        tx.write_all(&(2000i32).to_be_bytes()).await.unwrap();
        let mut buf = BytesMut::new();
        match read_frame(&mut rx, &mut buf, &Arc::default(), 1000, &|_| None)
            .await
            .map(|(f, _)| f)
        {
            Err(ReadError::Protocol(ProtocolViolation::FrameTooLarge {
                claimed: 2000,
                max: 1000,
            })) => {}
            _ => panic!("expected FrameTooLarge"),
        }
    }

    /// Frames of every size arrive whole and in order however the stream is cut: a large frame
    /// read into its own allocation never takes bytes of the frame after it.
    #[tokio::test]
    async fn frames_survive_any_cut() {
        let sizes = [0usize, 1, 5, 70_000, 3, 200_000, 64 * 1024, 10];
        let mut wire = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            wire.extend_from_slice(&i32::try_from(n).unwrap().to_be_bytes());
            wire.extend((0..n).map(|k| (k + i) as u8));
        }
        for cut in [1usize, 7, 4096, 65_536, 1 << 20] {
            let (mut tx, mut rx) = tokio::io::duplex(cut.max(64));
            let data = wire.clone();
            let writer = tokio::spawn(async move {
                for piece in data.chunks(cut) {
                    tx.write_all(piece).await.unwrap();
                }
            });
            let mut buf = BytesMut::with_capacity(64 * 1024);
            // Each frame is dropped before the next is read: large frames reuse the buffers
            // of the large frames before them.
            let pool = Arc::default();
            for (i, &n) in sizes.iter().enumerate() {
                let Ok((frame, _)) = read_frame(&mut rx, &mut buf, &pool, 1 << 20, &|_| None).await
                else {
                    panic!("cut {cut}, frame {i}: read failed");
                };
                assert_eq!(frame.len(), n, "cut {cut}, frame {i}");
                assert!(
                    frame.iter().enumerate().all(|(k, b)| *b == (k + i) as u8),
                    "cut {cut}, frame {i}: wrong bytes"
                );
            }
            writer.await.unwrap();
            assert!(buf.is_empty(), "cut {cut}: nothing left over");
            assert!(
                !pool.spare_capacities().is_empty(),
                "cut {cut}: buffers came back"
            );
        }
    }

    /// Serves `data` to every read as far as the read's room goes, and records each read's room.
    struct Recorded {
        data: Vec<u8>,
        at: usize,
        rooms: Vec<usize>,
    }

    impl AsyncRead for Recorded {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            let this = &mut *self;
            this.rooms.push(buf.remaining());
            let n = buf.remaining().min(this.data.len() - this.at);
            buf.put_slice(&this.data[this.at..this.at + n]);
            this.at += n;
            std::task::Poll::Ready(Ok(()))
        }
    }

    /// A response below 2 MiB is read at most 64 KiB at a time, scanned or not; a larger one at
    /// most 256 KiB if scanned, and in reads as large as the rest of it if not. All arrive
    /// whole.
    #[tokio::test]
    async fn responses_are_read_in_parts_by_their_size() {
        let small = 1usize << 20;
        let large = 3usize << 20;
        for (len, scanned, most) in [
            (small, true, SMALL_FRAME_READ),
            (large, true, SCAN_READ),
            (small, false, SMALL_FRAME_READ),
            // The first read after the head read takes the rest of the frame.
            (large, false, large - (HEAD_READ - frame::LENGTH_PREFIX)),
        ] {
            let mut data = i32::try_from(len).unwrap().to_be_bytes().to_vec();
            data.extend((0..len).map(|k| (k % 251) as u8));
            let mut rd = Recorded {
                data,
                at: 0,
                rooms: Vec::new(),
            };
            let mut buf = BytesMut::new();
            let pool = Arc::default();
            let scan = |_| scanned.then(|| CrcScan::fetch(12));
            let Ok((frame, _)) = read_frame(&mut rd, &mut buf, &pool, 16 << 20, &scan).await else {
                panic!("{len}: read failed");
            };
            assert_eq!(frame.len(), len);
            assert!(frame.iter().enumerate().all(|(k, b)| *b == (k % 251) as u8));
            assert_eq!(
                rd.rooms.iter().max(),
                Some(&most),
                "{len}, scanned {scanned}: {:?}",
                rd.rooms
            );
        }
    }

    /// A frame read into a mapping of its own (2 MiB and more) arrives whole however the
    /// stream is cut, never takes bytes of the frame after it, and its mapping serves the next
    /// frame of about its size.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn large_frames_arrive_whole_in_their_own_mappings() {
        let sizes = [3usize << 20, 10, (3 << 20) - 1000, 2 << 20, 5];
        let mut wire = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            wire.extend_from_slice(&i32::try_from(n).unwrap().to_be_bytes());
            wire.extend((0..n).map(|k| (k * 7 + i) as u8));
        }
        for cut in [1000usize, 65_536, 300_001, 4 << 20] {
            let (mut tx, mut rx) = tokio::io::duplex(cut.min(1 << 20));
            let data = wire.clone();
            let writer = tokio::spawn(async move {
                for piece in data.chunks(cut) {
                    tx.write_all(piece).await.unwrap();
                }
            });
            let mut buf = BytesMut::with_capacity(64 * 1024);
            let pool = Arc::default();
            let mut at = Vec::new();
            for (i, &n) in sizes.iter().enumerate() {
                let Ok((frame, _)) = read_frame(&mut rx, &mut buf, &pool, 8 << 20, &|_| None).await
                else {
                    panic!("cut {cut}, frame {i}: read failed");
                };
                assert_eq!(frame.len(), n, "cut {cut}, frame {i}");
                assert!(
                    frame
                        .iter()
                        .enumerate()
                        .all(|(k, b)| *b == (k * 7 + i) as u8),
                    "cut {cut}, frame {i}: wrong bytes"
                );
                at.push(frame.as_ptr());
            }
            writer.await.unwrap();
            assert!(buf.is_empty(), "cut {cut}: nothing left over");
            assert_eq!(
                at[2], at[0],
                "cut {cut}: the first mapping served the third frame"
            );
            // The third frame's mapping was let go for the fourth's, which did not fit it.
            assert_eq!(pool.spare_mapped(), [true], "cut {cut}");
        }
    }

    /// Requests larger than the socket buffers hold, made while the broker is not reading,
    /// reach it whole and in order (never interleaved), and each answer finds its requester.
    #[tokio::test]
    async fn frames_larger_than_the_socket_buffer_arrive_whole_and_in_order() {
        use kafka_protocol::messages::TopicName;
        use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
        use kafka_protocol::protocol::Decodable;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (go, wait) = oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            handshake(&mut sock).await;
            // Let the client fill the socket buffers before reading anything.
            wait.await.unwrap();
            let mut seen = Vec::new();
            for _ in 0..3 {
                let len = sock.read_i32().await.unwrap() as usize;
                let mut buf = vec![0u8; len];
                sock.read_exact(&mut buf).await.unwrap();
                let mut b = Bytes::from(buf);
                let h = decode_request_header_from_buffer(&mut b).unwrap();
                let req = MetadataRequest::decode(&mut b, h.request_api_version).unwrap();
                assert!(
                    b.is_empty(),
                    "request {} has trailing bytes",
                    h.correlation_id
                );
                seen.push((h.correlation_id, req.topics.map_or(0, |t| t.len())));
                let resp = MetadataResponse::default().with_controller_id(h.correlation_id.into());
                let frame = response_frame(h.correlation_id, &resp, h.request_api_version);
                sock.write_all(&frame).await.unwrap();
            }
            (seen, sock)
        });
        let conn = Connection::connect(&addr, BrokerRef::Address(addr.clone()), opts())
            .await
            .unwrap();
        let v = conn.version(versions::METADATA).unwrap();
        // About 5.5 MiB each: together more than a loopback connection buffers.
        let big = |n: usize| {
            MetadataRequest::default().with_topics(Some(
                (0..n)
                    .map(|i| {
                        MetadataRequestTopic::default()
                            .with_name(Some(TopicName(StrBytes::from_string(format!("{i:0>40}")))))
                    })
                    .collect(),
            ))
        };
        let (first, second, small) = (big(100_000), big(100_001), big(1));
        let requests = async {
            tokio::join!(
                conn.request(&first, v, Duration::ZERO),
                conn.request(&second, v, Duration::ZERO),
                conn.request(&small, v, Duration::ZERO),
            )
        };
        let release = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            go.send(()).unwrap();
        };
        let ((a, b, c), ()) = tokio::join!(requests, release);
        assert_eq!(a.unwrap().controller_id.0, 1);
        assert_eq!(b.unwrap().controller_id.0, 2);
        assert_eq!(c.unwrap().controller_id.0, 3);
        let (seen, sock) = server.await.unwrap();
        assert_eq!(seen, vec![(1, 100_000), (2, 100_001), (3, 1)]);
        assert!(conn.is_alive());
        drop(sock);
    }

    /// A response cut mid-frame fails the requests on that connection only; the pool opens a
    /// new connection for the next request.
    #[tokio::test]
    async fn cut_frame_fails_only_that_connection() {
        use crate::net::backoff::Backoff;
        use crate::net::pool::{ConnKey, Pool};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move {
            // Connection 1 (bootstrap 0): answers the handshake, then half a response, then EOF.
            let (mut one, _) = listener.accept().await.unwrap();
            handshake(&mut one).await;
            // Connection 2 (bootstrap 1): healthy.
            let (mut two, _) = listener.accept().await.unwrap();
            handshake(&mut two).await;
            let a = read_request(&mut one).await;
            let _b = read_request(&mut one).await;
            let resp = MetadataResponse::default().with_controller_id(7.into());
            let frame = response_frame(a.correlation_id, &resp, a.request_api_version);
            one.write_all(&frame[..frame.len() / 2]).await.unwrap();
            drop(one);
            let c = read_request(&mut two).await;
            let frame = response_frame(c.correlation_id, &resp, c.request_api_version);
            two.write_all(&frame).await.unwrap();
            // The pool reconnects bootstrap 0: connection 3, healthy.
            let (mut three, _) = listener.accept().await.unwrap();
            handshake(&mut three).await;
            let d = read_request(&mut three).await;
            let frame = response_frame(d.correlation_id, &resp, d.request_api_version);
            three.write_all(&frame).await.unwrap();
            (two, three)
        });
        let pool = Pool::new(
            vec![addr.clone(), addr.clone()],
            opts(),
            Backoff {
                base: Duration::from_millis(10),
                max: Duration::from_millis(50),
            },
        );
        let one = pool.get(ConnKey::Bootstrap(0)).await.unwrap();
        let two = pool.get(ConnKey::Bootstrap(1)).await.unwrap();
        let (a, b) = tokio::join!(metadata(&one), metadata(&one));
        for r in [a, b] {
            match r {
                Err(Error::Io { source, .. }) => {
                    assert_eq!(source.kind(), std::io::ErrorKind::UnexpectedEof)
                }
                other => panic!("expected an I/O error, got {other:?}"),
            }
        }
        assert!(!one.is_alive());
        assert_eq!(metadata(&two).await.unwrap().controller_id.0, 7);
        assert!(two.is_alive());
        let three = pool.get(ConnKey::Bootstrap(0)).await.unwrap();
        assert!(!Arc::ptr_eq(&one, &three));
        assert_eq!(metadata(&three).await.unwrap().controller_id.0, 7);
        drop(server.await.unwrap());
    }
}
