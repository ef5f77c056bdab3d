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
//! connection itself, and its data connection is a spare that was opened to the same address
//! while the first Metadata request was out ([`Pool::open_spare`]). So the first ListOffsets goes
//! out as soon as metadata is in, and the first Fetch does not wait for a connection and its
//! ApiVersions exchange.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::error::{BrokerRef, Error, Result};
use crate::net::backoff::Backoff;
use crate::net::connection::{ConnOptions, Connection};
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
    /// A second connection to the bootstrap address that answered the first Metadata request,
    /// for the node metadata finds there to take as its data connection.
    Spare,
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
    /// The task opening the spare, stopped with the pool.
    spare_task: Mutex<Option<AbortHandle>>,
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Some(task) = self.spare_task.lock().take() {
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
            spare_task: Mutex::new(None),
        }
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
            ConnKey::Spare => Err(Error::NoBroker(
                "the spare connection is only opened by Pool::open_spare".to_owned(),
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
        match Connection::connect(&addr, broker, self.opts.clone()).await {
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
    /// a control connection the bootstrap connection to that address, for its first data
    /// connection the spare (waiting for it if it is still connecting). `None` for any other key, or if there
    /// is none.
    async fn adopt(&self, key: ConnKey) -> Option<Arc<Connection>> {
        let (from, addr) = match key {
            ConnKey::Control(id) => {
                let addr = self.node_addr(id)?;
                let i = self.bootstrap.iter().position(|b| *b == addr)?;
                (ConnKey::Bootstrap(i), addr)
            }
            ConnKey::Data((id, 0)) => (ConnKey::Spare, self.node_addr(id)?),
            ConnKey::Data(..) | ConnKey::Group(_) | ConnKey::Bootstrap(_) | ConnKey::Spare => {
                return None;
            }
        };
        let slot = self.slots.lock().get(&from).map(Arc::clone)?;
        let mut slot = slot.lock().await;
        let at_addr = |c: &Arc<Connection>| {
            c.is_alive() && matches!(c.broker(), BrokerRef::Address(a) if *a == addr)
        };
        if !slot.conn.as_ref().is_some_and(at_addr) {
            return None;
        }
        let c = slot.conn.take()?;
        tracing::debug!(?from, to = ?key, %addr, "connection taken over");
        Some(c)
    }

    /// Opens the spare: a second connection to `conn`'s address, for the node metadata finds
    /// there to take as its data connection. Only the first time, while no node is known, and
    /// only for a bootstrap connection; call it with the connection the first Metadata request
    /// goes on, before sending it. The spare's slot is held from this call on, so a data
    /// connection asked for once that metadata is in waits for the spare rather than racing it.
    /// The spare carries nothing until a node takes it: a spare that no node takes stays idle.
    pub(crate) fn open_spare(&self, conn: &Connection) {
        let BrokerRef::Address(addr) = conn.broker() else {
            return;
        };
        if !self.nodes.lock().is_empty() {
            return;
        }
        // The spare's slot exists from its first try on: there is one try per pool.
        let slot = {
            let mut slots = self.slots.lock();
            if slots.contains_key(&ConnKey::Spare) {
                return;
            }
            Arc::clone(slots.entry(ConnKey::Spare).or_default())
        };
        let Ok(mut slot) = slot.try_lock_owned() else {
            return;
        };
        let addr = addr.clone();
        let opts = self.opts.clone();
        let task = tokio::spawn(async move {
            let broker = BrokerRef::Address(addr.clone());
            match Connection::connect(&addr, broker, opts).await {
                Ok(c) => slot.conn = Some(Arc::new(c)),
                Err(e) => tracing::debug!(error = %e, %addr, "spare connection failed"),
            }
        });
        *self.spare_task.lock() = Some(task.abort_handle());
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
                    !matches!(k, ConnKey::Data(..) | ConnKey::Group(_) | ConnKey::Spare)
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
