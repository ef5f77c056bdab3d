//! Connections by purpose. A broker answers the requests of one connection in order, so a
//! Fetch parked for `fetch.max.wait.ms` holds up everything queued behind it on its connection.
//! Fetches therefore get data connections to themselves (`fetch.connections.per.broker` per
//! broker, one Fetch in flight on each), and everything else
//! (Metadata, ListOffsets, FindCoordinator, OffsetCommit, OffsetFetch) goes on a control
//! connection per broker, or a bootstrap connection, which never carries a Fetch. Failed
//! connections are replaced after an exponential backoff.
//!
//! Start-up takes no more connections than it needs, and no more round trips: once metadata
//! names the node at a bootstrap address, that node's control connection is the bootstrap
//! connection itself, and its data connections are spares opened to the same address as soon
//! as the first bootstrap connection's TCP handshake is done, while it negotiates its versions
//! and carries the first Metadata request ([`Pool::want_spares`]). So the first Fetch on each
//! of them does not wait for a connection and its ApiVersions exchange, and the first
//! ListOffsets goes on the first spare ([`Pool::spare_beside`]), answered beside the first
//! Metadata request rather than after it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use parking_lot::Mutex;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::error::{BrokerRef, Error, Result};
use crate::net::backoff::Backoff;
use crate::net::connection::{ConnOptions, Connection};
use crate::net::frame_pool::FramePool;
use crate::proto::fetch::Lane;

/// What a connection is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ConnKey {
    /// Fetch requests to a node, and nothing else: the node's id and which of its data
    /// connections.
    Data(Lane),
    /// Everything but Fetch to a node: metadata, offsets, coordinator traffic.
    Control(i32),
    /// Group membership requests to the coordinator (JoinGroup, SyncGroup, Heartbeat,
    /// LeaveGroup, ConsumerGroupHeartbeat): a JoinGroup is parked by the broker until the
    /// rebalance completes, and must not hold up commits or metadata.
    #[allow(dead_code)] // the group protocols use it
    Group(i32),
    /// A bootstrap address, by index, before metadata named the nodes.
    Bootstrap(usize),
    /// A further connection to the first bootstrap address connected to, for the node
    /// metadata finds there to take as its data connection of this index.
    Spare(u8),
}

#[derive(Default)]
struct Slot {
    conn: Option<Arc<Connection>>,
    failures: u32,
    retry_at: Option<Instant>,
}

/// All connections of one consumer.
pub(crate) struct Pool {
    opts: ConnOptions,
    backoff: Backoff,
    bootstrap: Vec<String>,
    nodes: Mutex<HashMap<i32, String>>,
    slots: Mutex<HashMap<ConnKey, Arc<tokio::sync::Mutex<Slot>>>>,
    /// How many spares the first bootstrap connection brings along.
    spares: AtomicU8,
    /// The tasks opening the spares, stopped with the pool.
    spare_tasks: Mutex<Vec<AbortHandle>>,
}

impl Drop for Pool {
    fn drop(&mut self) {
        for task in self.spare_tasks.lock().drain(..) {
            task.abort();
        }
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("bootstrap", &self.bootstrap)
            .finish_non_exhaustive()
    }
}

impl Pool {
    pub(crate) fn new(bootstrap: Vec<String>, opts: ConnOptions, backoff: Backoff) -> Self {
        Self {
            opts,
            backoff,
            bootstrap,
            nodes: Mutex::new(HashMap::new()),
            slots: Mutex::new(HashMap::new()),
            spares: AtomicU8::new(0),
            spare_tasks: Mutex::new(Vec::new()),
        }
    }

    /// The spare receive buffers of all the connections.
    pub(crate) fn frames(&self) -> &FramePool {
        &self.opts.frames
    }

    /// Replaces the known node addresses (from Metadata).
    pub(crate) fn set_nodes(&self, nodes: HashMap<i32, String>) {
        self.nodes.lock().extend(nodes);
    }

    /// Adds or updates one node's address (a coordinator from FindCoordinator).
    pub(crate) fn add_node(&self, id: i32, addr: String) {
        self.nodes.lock().insert(id, addr);
    }

    /// The address of a node, if metadata named it.
    pub(crate) fn node_addr(&self, id: i32) -> Option<String> {
        self.nodes.lock().get(&id).cloned()
    }

    fn target(&self, key: ConnKey) -> Result<(String, BrokerRef)> {
        match key {
            ConnKey::Data((id, _)) | ConnKey::Control(id) | ConnKey::Group(id) => {
                let addr = self
                    .node_addr(id)
                    .ok_or_else(|| Error::NoBroker(format!("node {id} is not in metadata")))?;
                Ok((addr.clone(), BrokerRef::Node { id, addr }))
            }
            ConnKey::Bootstrap(i) => {
                let addr = self
                    .bootstrap
                    .get(i)
                    .cloned()
                    .ok_or_else(|| Error::NoBroker(format!("no bootstrap address {i}")))?;
                Ok((addr.clone(), BrokerRef::Address(addr)))
            }
            ConnKey::Spare(_) => Err(Error::NoBroker(
                "a spare connection is only opened beside a bootstrap connection".to_owned(),
            )),
        }
    }

    /// The connection for `key`: the live one, or a new one once the backoff after the last
    /// failure has passed (waiting for it if needed).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a connection attempt abandoned half-way leaves no state behind.
    pub(crate) async fn get(&self, key: ConnKey) -> Result<Arc<Connection>> {
        let slot = Arc::clone(self.slots.lock().entry(key).or_default());
        let mut slot = slot.lock().await;
        if let Some(c) = &slot.conn {
            if c.is_alive() {
                return Ok(Arc::clone(c));
            }
            slot.conn = None;
        }
        if let Some(c) = self.adopt(key).await {
            slot.conn = Some(Arc::clone(&c));
            slot.failures = 0;
            slot.retry_at = None;
            return Ok(c);
        }
        if let Some(at) = slot.retry_at {
            tokio::time::sleep_until(at).await;
        }
        let (addr, broker) = self.target(key)?;
        let connected = || {
            if matches!(key, ConnKey::Bootstrap(_)) {
                self.open_spares(&addr);
            }
        };
        match Connection::connect_then(&addr, broker, self.opts.clone(), connected).await {
            Ok(c) => {
                let c = Arc::new(c);
                slot.conn = Some(Arc::clone(&c));
                slot.failures = 0;
                slot.retry_at = None;
                Ok(c)
            }
            Err(e) => {
                slot.failures += 1;
                slot.retry_at = Some(Instant::now() + self.backoff.delay(slot.failures));
                tracing::debug!(?key, error = %e, failures = slot.failures, "connect failed");
                Err(e)
            }
        }
    }

    /// A live connection already open to the address of `key`'s node, taken over for `key`: for
    /// a control connection the bootstrap connection to that address, for a data connection
    /// the spare of its index (waiting for it if it is still connecting). `None` for any other
    /// key, or if there is none.
    async fn adopt(&self, key: ConnKey) -> Option<Arc<Connection>> {
        let (from, addr) = match key {
            ConnKey::Control(id) => {
                let addr = self.node_addr(id)?;
                let i = self.bootstrap.iter().position(|b| *b == addr)?;
                (ConnKey::Bootstrap(i), addr)
            }
            ConnKey::Data((id, lane)) => (ConnKey::Spare(lane), self.node_addr(id)?),
            ConnKey::Group(_) | ConnKey::Bootstrap(_) | ConnKey::Spare(_) => return None,
        };
        let slot = self.slots.lock().get(&from).map(Arc::clone)?;
        let mut slot = slot.lock().await;
        if !slot.conn.as_ref().is_some_and(|c| live_at(c, &addr)) {
            return None;
        }
        let c = slot.conn.take()?;
        tracing::debug!(?from, to = ?key, %addr, "connection taken over");
        Some(c)
    }

    /// How many data connections the node at the first bootstrap address will want at start-up,
    /// to be opened beside that bootstrap connection as spares (none until this is called).
    /// Call it before the request that connects first.
    pub(crate) fn want_spares(&self, count: u8) {
        self.spares.store(count, Ordering::Relaxed);
    }

    /// Opens the spares to `addr`, the address a bootstrap connection was just made to: only
    /// while no node is known, and one try per spare and pool. A spare's slot is held from
    /// this call on, so a data connection asked for once metadata is in waits for its spare
    /// rather than racing it. A spare carries nothing until a node takes it: one that no node
    /// takes stays idle.
    fn open_spares(&self, addr: &str) {
        if !self.nodes.lock().is_empty() {
            return;
        }
        for lane in 0..self.spares.load(Ordering::Relaxed) {
            let slot = {
                let mut slots = self.slots.lock();
                if slots.contains_key(&ConnKey::Spare(lane)) {
                    continue;
                }
                Arc::clone(slots.entry(ConnKey::Spare(lane)).or_default())
            };
            let Ok(mut slot) = slot.try_lock_owned() else {
                continue;
            };
            let addr = addr.to_owned();
            let opts = self.opts.clone();
            let task = tokio::spawn(async move {
                let broker = BrokerRef::Address(addr.clone());
                match Connection::connect(&addr, broker, opts).await {
                    Ok(c) => slot.conn = Some(Arc::new(c)),
                    Err(e) => tracing::debug!(error = %e, %addr, lane, "spare connection failed"),
                }
            });
            self.spare_tasks.lock().push(task.abort_handle());
        }
    }

    /// The first spare opened beside `conn` (a bootstrap connection), once its connection
    /// attempt is over: `None` when there is none, it failed, or it goes elsewhere. It stays in
    /// its slot, to be taken over as a data connection later.
    pub(crate) async fn spare_beside(&self, conn: &Connection) -> Option<Arc<Connection>> {
        let BrokerRef::Address(addr) = conn.broker() else {
            return None;
        };
        let slot = self.slots.lock().get(&ConnKey::Spare(0)).map(Arc::clone)?;
        // The task opening the spare holds the slot until it is connected (or failed).
        let slot = slot.lock().await;
        slot.conn
            .as_ref()
            .filter(|c| live_at(c, addr))
            .map(Arc::clone)
    }

    fn in_backoff(&self, key: ConnKey, now: Instant) -> bool {
        let slot = self.slots.lock().get(&key).map(Arc::clone);
        slot.and_then(|s| {
            s.try_lock()
                .ok()
                .map(|s| s.retry_at.is_some_and(|t| t > now))
        })
        .unwrap_or(false)
    }

    /// Any live control or bootstrap connection (never a data, group or spare one, which are
    /// kept for Fetch and group membership), else the first node (control connection) or
    /// bootstrap address that accepts one. For requests any broker answers: Metadata and
    /// FindCoordinator.
    pub(crate) async fn any(&self) -> Result<Arc<Connection>> {
        let live: Option<Arc<Connection>> = {
            let slots: Vec<_> = self
                .slots
                .lock()
                .iter()
                .filter(|(k, _)| {
                    !matches!(k, ConnKey::Data(..) | ConnKey::Group(_) | ConnKey::Spare(_))
                })
                .map(|(_, s)| Arc::clone(s))
                .collect();
            slots.into_iter().find_map(|s| {
                let s = s.try_lock().ok()?;
                s.conn.as_ref().filter(|c| c.is_alive()).map(Arc::clone)
            })
        };
        if let Some(c) = live {
            return Ok(c);
        }
        let mut ids: Vec<i32> = self.nodes.lock().keys().copied().collect();
        ids.sort_unstable();
        let mut keys: Vec<ConnKey> = ids
            .into_iter()
            .map(ConnKey::Control)
            .chain((0..self.bootstrap.len()).map(ConnKey::Bootstrap))
            .collect();
        // Addresses that just failed go last, so one dead broker does not delay the rest.
        let now = Instant::now();
        keys.sort_by_key(|k| self.in_backoff(*k, now));
        let mut errors = Vec::new();
        for key in keys {
            match self.get(key).await {
                Ok(c) => return Ok(c),
                Err(e) => errors.push(e.to_string()),
            }
        }
        Err(Error::NoBroker(errors.join("; ")))
    }
}

/// Whether `c` is alive and was opened to `addr` by address (a bootstrap or spare connection).
fn live_at(c: &Connection, addr: &str) -> bool {
    c.is_alive() && matches!(c.broker(), BrokerRef::Address(a) if a == addr)
}
