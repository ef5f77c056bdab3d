//! Connections by purpose: one data connection per broker, one dedicated coordinator
//! connection per broker (so a commit never queues behind a long-polling Fetch), and the
//! bootstrap addresses. Failed connections are replaced after an exponential backoff.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::error::{BrokerRef, Error, Result};
use crate::net::backoff::Backoff;
use crate::net::connection::{ConnOptions, Connection};

/// What a connection is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ConnKey {
    /// Fetch, ListOffsets and Metadata to a node.
    Data(i32),
    /// Group coordinator traffic to a node.
    Coordinator(i32),
    /// A bootstrap address, by index, before metadata named the nodes.
    Bootstrap(usize),
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
            ConnKey::Data(id) | ConnKey::Coordinator(id) => {
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

    /// Any live connection, else the first node or bootstrap address that accepts one. Used for
    /// Metadata, which any broker answers.
    pub(crate) async fn any(&self) -> Result<Arc<Connection>> {
        let live: Vec<Arc<Connection>> = {
            let slots: Vec<_> = self.slots.lock().values().cloned().collect();
            let mut live = Vec::new();
            for s in slots {
                if let Ok(s) = s.try_lock()
                    && let Some(c) = &s.conn
                    && c.is_alive()
                {
                    live.push(Arc::clone(c));
                }
            }
            live
        };
        if let Some(c) = live.into_iter().next() {
            return Ok(c);
        }
        let mut keys: Vec<ConnKey> = self
            .nodes
            .lock()
            .keys()
            .map(|id| ConnKey::Data(*id))
            .collect();
        keys.sort_by_key(|k| match k {
            ConnKey::Data(id) => *id,
            _ => 0,
        });
        keys.extend((0..self.bootstrap.len()).map(ConnKey::Bootstrap));
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
