//! A recording TCP proxy between a client and one real broker: every response frame is kept
//! with the API key and version of the request it answers, for fuzz seed corpora.
//!
//! The proxy listens on `127.0.0.1` and forwards each accepted connection to the broker. It
//! reads request headers (to pair each response with its request by correlation id) and rewrites
//! the broker's own address to the proxy's in Metadata and FindCoordinator responses, so every
//! later connection of the client also goes through the proxy. What it records is the frame as
//! the broker sent it, before any rewriting. Only single-broker clusters are supported.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, FetchRequest, FindCoordinatorResponse, MetadataResponse, ResponseHeader,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes, decode_request_header_from_buffer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

/// One response as the broker sent it.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// The API of the request it answers.
    pub api: ApiKey,
    /// The request's version.
    pub version: i16,
    /// For Fetch: whether the request asked for `read_committed`.
    pub read_committed: bool,
    /// The whole frame: length prefix, header, body.
    pub frame: Bytes,
    /// Which of the client's connections it came on, counted from 0 in the order the proxy
    /// accepted them.
    pub connection: usize,
}

/// A request or a response passing the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Passed {
    /// A request on its way to the broker.
    Request(ApiKey),
    /// A response on its way to the client.
    Response(ApiKey),
}

#[derive(Default)]
struct State {
    recorded: Vec<Recorded>,
    /// `(connection, what)`, in the order the proxy passed them on.
    passed: Vec<(usize, Passed)>,
    tasks: Vec<AbortHandle>,
    connections: usize,
}

/// The proxy; see the module docs. Its tasks stop when it is dropped.
pub struct RecordingProxy {
    port: u16,
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for RecordingProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordingProxy")
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl Drop for RecordingProxy {
    fn drop(&mut self) {
        for t in self.lock().tasks.drain(..) {
            t.abort();
        }
    }
}

impl RecordingProxy {
    /// Starts forwarding to `broker` (`host:port`). Must be called inside a tokio runtime.
    pub async fn start(broker: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let state = Arc::new(Mutex::new(State::default()));
        let broker = broker.to_owned();
        let accept = {
            let state = Arc::clone(&state);
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(upstream) = TcpStream::connect(&broker).await else {
                        continue;
                    };
                    let connection = {
                        let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                        s.connections += 1;
                        s.connections - 1
                    };
                    let task = tokio::spawn(relay(
                        client,
                        upstream,
                        port,
                        connection,
                        Arc::clone(&state),
                    ));
                    state
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .tasks
                        .push(task.abort_handle());
                }
            })
        };
        state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .tasks
            .push(accept.abort_handle());
        Self { port, state }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `127.0.0.1:port`, for `bootstrap_servers`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Every response recorded so far.
    pub fn recorded(&self) -> Vec<Recorded> {
        self.lock().recorded.clone()
    }

    /// What passed the proxy so far, requests and responses in the order it passed them on,
    /// each with its connection (counted from 0 in the order the proxy accepted them).
    pub fn passed(&self) -> Vec<(usize, Passed)> {
        self.lock().passed.clone()
    }

    /// What passed the proxy on connection `connection` so far, in order.
    pub fn passed_on(&self, connection: usize) -> Vec<Passed> {
        self.passed()
            .into_iter()
            .filter(|(c, _)| *c == connection)
            .map(|(_, p)| p)
            .collect()
    }

    /// How many client connections the proxy accepted (and connected to the broker) so far.
    pub fn connections(&self) -> usize {
        self.lock().connections
    }
}

type Requests = Arc<Mutex<HashMap<i32, (ApiKey, i16, bool)>>>;

async fn read_frame(rd: &mut (impl AsyncReadExt + Unpin)) -> Option<Bytes> {
    let len = rd.read_i32().await.ok()?;
    let len = usize::try_from(len).ok()?;
    let mut buf = BytesMut::zeroed(4 + len);
    buf[..4].copy_from_slice(&(len as i32).to_be_bytes());
    rd.read_exact(&mut buf[4..]).await.ok()?;
    Some(buf.freeze())
}

async fn relay(
    client: TcpStream,
    upstream: TcpStream,
    port: u16,
    connection: usize,
    state: Arc<Mutex<State>>,
) {
    let (mut crd, mut cwr) = client.into_split();
    let (mut urd, mut uwr) = upstream.into_split();
    let requests: Requests = Arc::default();
    let up = {
        let requests = Arc::clone(&requests);
        let state = Arc::clone(&state);
        async move {
            while let Some(frame) = read_frame(&mut crd).await {
                let mut b = frame.slice(4..);
                if let Ok(h) = decode_request_header_from_buffer(&mut b)
                    && let Ok(api) = ApiKey::try_from(h.request_api_key)
                {
                    let read_committed = api == ApiKey::Fetch
                        && FetchRequest::decode(&mut b, h.request_api_version)
                            .is_ok_and(|r| r.isolation_level == 1);
                    requests.lock().unwrap_or_else(|e| e.into_inner()).insert(
                        h.correlation_id,
                        (api, h.request_api_version, read_committed),
                    );
                    state
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .passed
                        .push((connection, Passed::Request(api)));
                }
                if uwr.write_all(&frame).await.is_err() {
                    return;
                }
            }
        }
    };
    let down = async move {
        while let Some(frame) = read_frame(&mut urd).await {
            let corr = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
            let req = requests
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&corr);
            let out = match req {
                Some((api, version, read_committed)) => {
                    let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                    s.recorded.push(Recorded {
                        api,
                        version,
                        read_committed,
                        frame: frame.clone(),
                        connection,
                    });
                    s.passed.push((connection, Passed::Response(api)));
                    drop(s);
                    rewrite(api, version, &frame, port).unwrap_or(frame)
                }
                None => frame,
            };
            if cwr.write_all(&out).await.is_err() {
                return;
            }
        }
    };
    tokio::join!(up, down);
}

/// Metadata and FindCoordinator answers with every broker address replaced by the proxy's.
fn rewrite(api: ApiKey, version: i16, frame: &Bytes, port: u16) -> Option<Bytes> {
    let header_version = api.response_header_version(version);
    let mut b = frame.slice(4..);
    let header = ResponseHeader::decode(&mut b, header_version).ok()?;
    let host = StrBytes::from_static_str("127.0.0.1");
    let mut out = BytesMut::new();
    out.extend_from_slice(&[0; 4]);
    header.encode(&mut out, header_version).ok()?;
    match api {
        ApiKey::Metadata => {
            let mut m = MetadataResponse::decode(&mut b, version).ok()?;
            for broker in &mut m.brokers {
                broker.host = host.clone();
                broker.port = i32::from(port);
            }
            m.encode(&mut out, version).ok()?;
        }
        ApiKey::FindCoordinator => {
            let mut f = FindCoordinatorResponse::decode(&mut b, version).ok()?;
            if version < 4 {
                f.host = host.clone();
                f.port = i32::from(port);
            }
            for c in &mut f.coordinators {
                c.host = host.clone();
                c.port = i32::from(port);
            }
            f.encode(&mut out, version).ok()?;
        }
        _ => return None,
    }
    let len = i32::try_from(out.len() - 4).ok()?;
    out[..4].copy_from_slice(&len.to_be_bytes());
    Some(out.freeze())
}
