//! The consumer handle: assignment, positions, and the records handed to the application.
//!
//! [`Consumer`] talks to its network loop (a task it spawns) over channels. Fetched data
//! arrives still encoded; `poll` checks and decodes it on the caller's side, one partition's
//! fetched data at a time, so decompressed bytes exist only for the batch being handed out.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::Stream;
use kafka_protocol::protocol::StrBytes;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::checkpoint::{
    CheckpointHandle, CheckpointShared, CommitOutcomes, CommitRequest, CommitStats, Offsets,
    PartitionOffset, SOURCE_STATE_VERSION, SourceState,
};
use crate::config::{CommitMode, ConsumerConfig};
use crate::config::{GroupProtocol, OffsetReset};
use crate::error::{Error, Result};
use crate::net::backoff::Backoff;
use crate::net::connection::ConnOptions;
use crate::net::driver::{Command, Committed, Delivery, Driver, DriverConfig, Shared, Topics};
use crate::net::pool::Pool;
use crate::proto::chunk::{ChunkCursor, PIECE_RECORDS};
use crate::proto::commit::Committer;
use crate::proto::fetch::{Chunk, FetchConfig, FetchState, Lease};
use crate::proto::group::{
    GroupConfig, Membership, classic::ClassicMember, kip848::ConsumerMember,
};
use crate::proto::records::DecodeLimits;
use crate::rebalance::{RebalanceListener, Revocation};
use crate::types::{Batch, StartPosition, TopicPartition};

#[derive(Debug)]
struct Local {
    generation: u64,
    paused: bool,
    /// The next offset after the last record handed out, once anything was.
    handed: Option<i64>,
    /// The leader epoch of the last record handed out (-1 if none yet).
    leader_epoch: i32,
}

impl Local {
    fn new(generation: u64, start: StartPosition) -> Self {
        Self {
            generation,
            paused: false,
            handed: match start {
                StartPosition::Offset(o) => Some(o),
                _ => None,
            },
            leader_epoch: -1,
        }
    }
}

/// Data taken off the channel, not yet handed out.
#[derive(Debug)]
enum Ready {
    /// A decoded piece (or an error).
    Piece(Decoded),
    /// A chunk with pieces still to decode.
    Cursor(ChunkCursor),
}

impl Ready {
    fn tp(&self) -> &TopicPartition {
        match self {
            Self::Piece(d) => &d.tp,
            Self::Cursor(c) => &c.tp,
        }
    }
}

/// A decoded piece of a chunk, not yet handed out.
#[derive(Debug)]
struct Decoded {
    tp: TopicPartition,
    generation: u64,
    /// Records for the application, if any.
    batch: Option<Batch>,
    /// The position once this is handed out (`None`: unchanged).
    next_offset: Option<i64>,
    /// An error to hand out after the records.
    error: Option<Error>,
    /// Decompressed bytes held by `batch`.
    decompressed: usize,
    /// With a chunk's last piece: the chunk's lease, so that the fetched response it was cut
    /// from counts against the budget until this piece is handed out too (held for its drop).
    _lease: Option<Lease>,
}

/// An async Kafka consumer of explicitly assigned partitions.
///
/// Create it inside a Tokio runtime; it spawns its network loop there. Poll it from a task on
/// that runtime (or on a current-thread runtime): from `block_on` on a thread that is not one
/// of the runtime's workers, every hand-over from the network loop wakes that thread, which
/// costs CPU on every fetch. On a multi-thread runtime the connections' readers, the network
/// loop and the polling task usually run one after another on one worker (each wakes the next
/// into the worker's LIFO slot, which Tokio's other workers do not steal from), so receiving
/// and decoding share a core. A broker whose partitions are shared over two data connections
/// (`fetch.connections.per.broker`) has a second Fetch to answer while a response is decoded.
/// Spreading them over two cores did not pay where the broker shares a 2-vCPU machine: there
/// [`blocking::Consumer`](crate::blocking::Consumer), whose network loop has a thread of its
/// own, and this consumer on a runtime without the LIFO slot both read one partition slower,
/// with more CPU per record (the README's performance section has the figures).
///
/// Records come out of [`poll`](Self::poll) (or the [`Stream`] implementation) one partition's
/// batch at a time. Memory is bounded by `buffer.max.bytes`: the network loop stops fetching
/// while that much fetched data waits to be polled.
///
/// ```no_run
/// # async fn demo() -> kafka_source::Result<()> {
/// use kafka_source::{Consumer, ConsumerConfig, StartPosition, TopicPartition};
///
/// let config = ConsumerConfig::builder()
///     .bootstrap_servers(["127.0.0.1:9092"])
///     .commit_mode(kafka_source::CommitMode::Disabled)
///     .build()?;
/// let mut consumer = Consumer::new(config)?;
/// consumer.assign([(TopicPartition::new("events", 0), StartPosition::Earliest)]);
/// let batch = consumer.poll().await?;
/// for record in &batch.records {
///     println!("{} {:?}", record.offset, record.value);
/// }
/// consumer.close().await;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Consumer {
    config: Arc<ConsumerConfig>,
    commands: mpsc::UnboundedSender<Command>,
    deliveries: mpsc::UnboundedReceiver<Delivery>,
    shared: Arc<Shared>,
    partitions: HashMap<TopicPartition, Local>,
    /// Chunks of paused partitions, kept for when they resume.
    parked: Vec<Chunk>,
    /// Data taken off the channel and not yet handed out, in order.
    ready: VecDeque<Ready>,
    ckpt: Arc<CheckpointShared>,
    outcomes: Option<CommitOutcomes>,
    last_periodic: Instant,
    /// The positions the last periodic commit published.
    periodic_sent: Offsets,
    /// Wakes a waiting `poll` when handed-out positions are due for a periodic commit.
    periodic_timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Errors found while decoding, handed out by the next polls.
    pending_errors: Vec<Error>,
    /// Decompressed bytes of the last batch handed out, counted against the budget until the
    /// next poll.
    held: usize,
    next_generation: u64,
    driver: Option<JoinHandle<()>>,
    closed: bool,
    /// Subscribe mode: the group assigns the partitions.
    subscribed: bool,
    /// In a mutex only so that the consumer stays `Sync`; it is only used through `&mut self`.
    listener: parking_lot::Mutex<Box<dyn RebalanceListener>>,
    /// Subscribe mode: offsets from [`restore`](Self::restore), used when the group assigns
    /// these partitions.
    restored: HashMap<TopicPartition, (i64, i32)>,
}

impl std::fmt::Debug for dyn RebalanceListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RebalanceListener")
    }
}

impl Consumer {
    /// Creates a consumer and spawns its network loop on the current Tokio runtime. Nothing is
    /// fetched until partitions are assigned.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when called outside a Tokio runtime.
    pub fn new(config: ConsumerConfig) -> Result<Self> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::config(
                "runtime",
                "Consumer::new needs a Tokio runtime; use blocking::Consumer outside one",
            )
        })?;
        let config = Arc::new(config);
        // Chosen here rather than while the first response is checked.
        if config.check_crcs() {
            crate::proto::records::prepare_batch_crc32c();
        }
        let opts = ConnOptions {
            client_id: StrBytes::from_string(config.client_id().to_owned()),
            max_response_size: config.max_response_size(),
            request_timeout: config.request_timeout(),
            connect_timeout: config.connect_timeout(),
            scan_crcs: config.check_crcs(),
            frames: Arc::default(),
        };
        let pool = Arc::new(Pool::new(
            config.bootstrap_servers().to_vec(),
            opts,
            Backoff {
                base: config.reconnect_backoff(),
                max: config.reconnect_backoff_max(),
            },
        ));
        let fetch = FetchState::new(FetchConfig {
            max_wait_ms: clamp_ms(config.fetch_max_wait()),
            min_bytes: clamp_i32(config.fetch_min_bytes() as usize),
            max_bytes: clamp_i32(config.fetch_max_bytes() as usize),
            partition_max_bytes: clamp_i32(config.max_partition_fetch_bytes() as usize),
            isolation: config.isolation_level(),
            reset: config.auto_offset_reset(),
            restore_reset: config.restore_out_of_range(),
            retry_backoff: config.retry_backoff(),
            connections_per_broker: config.fetch_connections_per_broker(),
        });
        let commits = config.commit_mode() != CommitMode::Disabled;
        let group = config.group_id().map(str::to_owned);
        let (outcome_tx, outcome_rx) = mpsc::channel(1024);
        let ckpt = Arc::new(CheckpointShared::new(
            commits && config.commit_mode() == CommitMode::OnCheckpoints,
            config.max_pending_checkpoints(),
            outcome_tx,
        ));
        let committer = match (&group, commits) {
            (Some(g), true) => Some(Committer::new(
                g,
                config.commit_timeout(),
                config.retry_backoff(),
            )),
            _ => None,
        };
        let group_membership = group.as_ref().map(|g| {
            let gc = GroupConfig {
                group_id: g.clone(),
                instance_id: config.group_instance_id().map(str::to_owned),
                session_timeout: config.session_timeout(),
                rebalance_timeout: config.max_poll_interval(),
                heartbeat_interval: config.heartbeat_interval(),
                retry_backoff: config.retry_backoff(),
                assignors: config
                    .partition_assignment_strategy()
                    .iter()
                    .map(|s| crate::assignor::builtin(*s))
                    .collect(),
            };
            match config.group_protocol() {
                GroupProtocol::Consumer => Membership::Consumer(ConsumerMember::new(gc)),
                _ => Membership::Classic(ClassicMember::new(gc)),
            }
        });
        let shared = Arc::new(Shared::default());
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let (out_tx, out_rx) = mpsc::unbounded_channel();
        let driver = Driver::new(
            DriverConfig {
                budget: config.buffer_max_bytes(),
                max_wait: config.fetch_max_wait(),
                metadata_max_age: config.metadata_max_age(),
                retry_backoff: config.retry_backoff(),
                group,
                close_timeout: config.close_timeout(),
                request_timeout: config.request_timeout(),
                max_poll_interval: config.max_poll_interval(),
            },
            pool,
            Arc::clone(&shared),
            fetch,
            cmd_rx,
            out_tx,
            Arc::clone(&ckpt),
            committer,
            group_membership,
        );
        let driver = handle.spawn(driver.run());
        Ok(Self {
            config,
            commands: cmd_tx,
            deliveries: out_rx,
            shared,
            partitions: HashMap::new(),
            parked: Vec::new(),
            ready: VecDeque::new(),
            ckpt,
            outcomes: Some(CommitOutcomes { rx: outcome_rx }),
            last_periodic: Instant::now(),
            periodic_sent: Offsets::new(),
            periodic_timer: None,
            pending_errors: Vec::new(),
            held: 0,
            next_generation: 1,
            driver: Some(driver),
            closed: false,
            subscribed: false,
            listener: parking_lot::Mutex::new(Box::new(())),
            restored: HashMap::new(),
        })
    }

    /// The configuration this consumer runs with.
    pub fn config(&self) -> &ConsumerConfig {
        &self.config
    }

    fn generation(&mut self) -> u64 {
        let g = self.next_generation;
        self.next_generation += 1;
        g
    }

    fn send(&self, cmd: Command) {
        // A send fails only when the loop has ended; `poll` then reports `Closed`.
        let _ = self.commands.send(cmd);
    }

    /// Joins the group (`group.id`) and consumes the partitions it assigns from these topics.
    /// With `group.protocol=classic` this member runs JoinGroup/SyncGroup with the assignors of
    /// `partition.assignment.strategy`; with `consumer` (KIP-848) the broker assigns. Calling it
    /// again changes the subscription (and rebalances). Assignment changes reach the
    /// [`RebalanceListener`] from inside `poll`.
    ///
    /// Newly assigned partitions start at the group's committed offset (the offset restored by
    /// [`restore`](Self::restore) wins), else at `auto.offset.reset`.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] without a `group.id`, or after [`assign`](Self::assign).
    pub fn subscribe<T: Into<String>>(
        &mut self,
        topics: impl IntoIterator<Item = T>,
    ) -> Result<()> {
        let names = topics.into_iter().map(Into::into).collect();
        self.start_subscription(Topics::Names(names))
    }

    /// Like [`subscribe`](Self::subscribe), for every topic whose whole name matches a regular
    /// expression (internal topics excluded). The classic protocol matches it against metadata,
    /// refreshed every `metadata.max.age.ms`; KIP-848 sends it to the broker, which uses RE2J
    /// syntax.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for an invalid expression, without a `group.id`, or after
    /// [`assign`](Self::assign).
    pub fn subscribe_pattern(&mut self, pattern: &str) -> Result<()> {
        let anchored = format!("^(?:{pattern})$");
        let re = regex::Regex::new(&anchored)
            .map_err(|e| Error::config("subscription pattern", e.to_string()))?;
        self.start_subscription(Topics::Pattern(re))
    }

    fn start_subscription(&mut self, topics: Topics) -> Result<()> {
        if self.config.group_id().is_none() {
            return Err(Error::config("group.id", "subscribe needs a group.id"));
        }
        if !self.subscribed && !self.partitions.is_empty() {
            return Err(Error::config(
                "subscription",
                "this consumer has assigned partitions; assign and subscribe do not mix",
            ));
        }
        self.subscribed = true;
        self.send(Command::Subscribe(topics));
        Ok(())
    }

    /// Offers these assignors (your own [`Assignor`](crate::assignor::Assignor)s, built-ins
    /// from [`assignor::builtin`](crate::assignor::builtin), or both), preferred first, instead
    /// of `partition.assignment.strategy`. Classic protocol only; call it before
    /// [`subscribe`](Self::subscribe) (later, the member rejoins to offer them). When this
    /// member leads the group, the group's chosen assignor runs here for every member.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for an empty list, repeated names, or with `group.protocol=consumer`
    /// (the broker assigns there).
    pub fn set_assignors(
        &mut self,
        assignors: Vec<Arc<dyn crate::assignor::Assignor>>,
    ) -> Result<()> {
        if self.config.group_protocol() != GroupProtocol::Classic {
            return Err(Error::config(
                "assignors",
                "the consumer protocol (KIP-848) assigns on the broker",
            ));
        }
        let mut names = std::collections::HashSet::new();
        if assignors.is_empty() || !assignors.iter().all(|a| names.insert(a.name().to_owned())) {
            return Err(Error::config(
                "assignors",
                "give at least one assignor, each name once",
            ));
        }
        self.send(Command::Assignors(assignors));
        Ok(())
    }

    /// Sets the callbacks for assignment changes (subscribe mode). The default does nothing.
    pub fn set_rebalance_listener(&mut self, listener: impl RebalanceListener + 'static) {
        self.listener = parking_lot::Mutex::new(Box::new(listener));
    }

    /// Replaces the assignment with these partitions, each read from its start position.
    /// Partitions not listed stop being fetched; their buffered data is dropped. Ignored (with
    /// a warning) in subscribe mode, where the group assigns.
    pub fn assign(
        &mut self,
        partitions: impl IntoIterator<Item = (TopicPartition, StartPosition)>,
    ) {
        self.assign_inner(partitions, false);
    }

    /// Starts from a checkpoint: assigns exactly the partitions in `state`, each at its
    /// checkpointed offset. In subscribe mode (call [`subscribe`](Self::subscribe) first) it
    /// assigns nothing: the offsets are used for those partitions the group assigns. Restored offsets always win over anything committed in Kafka. An
    /// offset that is out of range follows `restore.offset.out.of.range` (an error by default),
    /// not `auto.offset.reset`.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a state of a version this crate does not read.
    pub fn restore(&mut self, state: &SourceState) -> Result<()> {
        if state.version != SOURCE_STATE_VERSION {
            return Err(Error::config(
                "source state",
                format!(
                    "version {} is not readable (this crate writes {SOURCE_STATE_VERSION})",
                    state.version
                ),
            ));
        }
        if self.subscribed {
            self.restored = state
                .partitions
                .iter()
                .map(|p| {
                    (
                        TopicPartition::new(p.topic.as_str(), p.partition),
                        (p.next_offset, p.leader_epoch),
                    )
                })
                .collect();
            return Ok(());
        }
        let list: Vec<_> = state
            .partitions
            .iter()
            .map(|p| {
                (
                    TopicPartition::new(p.topic.as_str(), p.partition),
                    StartPosition::Offset(p.next_offset),
                )
            })
            .collect();
        self.assign_inner(list, true);
        for p in &state.partitions {
            if let Some(l) = self
                .partitions
                .get_mut(&TopicPartition::new(p.topic.as_str(), p.partition))
            {
                l.leader_epoch = p.leader_epoch;
            }
        }
        Ok(())
    }

    fn assign_inner(
        &mut self,
        partitions: impl IntoIterator<Item = (TopicPartition, StartPosition)>,
        restored: bool,
    ) {
        if self.subscribed {
            tracing::warn!("assign() on a subscribed consumer is ignored; the group assigns");
            return;
        }
        let mut list = Vec::new();
        let mut next = HashMap::new();
        for (tp, start) in partitions {
            let generation = self.generation();
            next.insert(tp.clone(), Local::new(generation, start));
            list.push((tp, start, generation));
        }
        self.partitions = next;
        self.drop_parked(|_| true);
        self.drop_ready(|_| true);
        self.send(Command::Assign(list, restored));
    }

    /// The assigned partitions.
    pub fn assignment(&self) -> Vec<TopicPartition> {
        let mut v: Vec<_> = self.partitions.keys().cloned().collect();
        v.sort();
        v
    }

    /// Moves a partition to a new start position. Data fetched from the old position is
    /// dropped; the next batch of this partition starts at the new one. Also restarts a
    /// partition stopped by an error.
    ///
    /// # Errors
    ///
    /// [`Error::NotAssigned`] if the partition is not assigned.
    pub fn seek(&mut self, tp: &TopicPartition, start: StartPosition) -> Result<()> {
        let generation = self.generation();
        let Some(local) = self.partitions.get_mut(tp) else {
            return Err(Error::NotAssigned(tp.clone()));
        };
        *local = Local::new(generation, start);
        let tp2 = tp.clone();
        self.drop_parked(|c| c.tp == tp2);
        self.drop_ready(|r| r.tp() == tp);
        self.send(Command::Seek(tp.clone(), start, generation));
        Ok(())
    }

    /// Stops handing out and fetching these partitions until [`resume`](Self::resume).
    /// Data already fetched is kept, copied out of the fetch responses it came in, so that it
    /// holds back neither those responses' memory nor, through `buffer.max.bytes`, the fetching
    /// of the other partitions.
    pub fn pause(&mut self, partitions: &[TopicPartition]) {
        self.set_paused(partitions, true);
    }

    /// Resumes partitions paused with [`pause`](Self::pause).
    pub fn resume(&mut self, partitions: &[TopicPartition]) {
        self.set_paused(partitions, false);
    }

    fn set_paused(&mut self, partitions: &[TopicPartition], paused: bool) {
        let mut list = Vec::new();
        let mut newly_paused = Vec::new();
        for tp in partitions {
            if let Some(l) = self.partitions.get_mut(tp) {
                if paused && !l.paused {
                    newly_paused.push(tp.clone());
                }
                l.paused = paused;
                list.push(tp.clone());
            }
        }
        self.detach_queued(&newly_paused);
        self.send(Command::Pause(list, paused));
    }

    /// Copies what waits to be handed out for `tps` (paused) out of the fetch responses it was
    /// cut from, each copy counted against the budget on its own. A response stays counted
    /// whole until the last of its records is handed out, so without this a paused partition
    /// would hold back every response it shares with others, and once those filled the budget,
    /// the fetching of every other partition: an application that pauses the partitions that
    /// are ahead until the others catch up would wait for ever.
    fn detach_queued(&mut self, tps: &[TopicPartition]) {
        if tps.is_empty() {
            return;
        }
        let shared = Arc::clone(&self.shared);
        let lease = |bytes| crate::net::driver::lease(&shared, bytes);
        for ready in self.ready.iter_mut().filter(|r| tps.contains(r.tp())) {
            match ready {
                Ready::Cursor(cursor) => cursor.detach(lease),
                Ready::Piece(d) => {
                    if let Some(batch) = &mut d.batch {
                        // Decompressed bytes are counted on their own already.
                        let fetched = batch.records.detach().saturating_sub(d.decompressed);
                        d._lease = Some(lease(fetched));
                    }
                }
            }
        }
    }

    /// The paused partitions.
    pub fn paused(&self) -> Vec<TopicPartition> {
        let mut v: Vec<_> = self
            .partitions
            .iter()
            .filter(|(_, l)| l.paused)
            .map(|(tp, _)| tp.clone())
            .collect();
        v.sort();
        v
    }

    /// The offset of the next record `poll` will hand out for this partition. Before any
    /// record was handed out this waits until the start position is resolved.
    ///
    /// # Errors
    ///
    /// [`Error::NotAssigned`] if the partition is not assigned (or stopped by an error before
    /// its start was known); [`Error::Closed`] if the consumer is closed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it changes no state.
    pub async fn position(&mut self, tp: &TopicPartition) -> Result<i64> {
        let Some(local) = self.partitions.get(tp) else {
            return Err(Error::NotAssigned(tp.clone()));
        };
        if let Some(h) = local.handed {
            return Ok(h);
        }
        let (tx, rx) = oneshot::channel();
        self.send(Command::StartOffset(tp.clone(), tx));
        rx.await.map_err(|_| Error::Closed)?
    }

    /// The next batch of records: records of one partition from one fetch, in offset order.
    ///
    /// A fetch's records are handed out in whole record batches, about 512 records at a time
    /// (more when one record batch holds more), so that the application reads records right
    /// after they were decoded, while their bytes are still in the core's caches.
    ///
    /// # Errors
    ///
    /// A partition-level error (an out-of-range offset under the `error` policy, corrupt data,
    /// authorization) stops that partition and is returned once; the other partitions go on,
    /// and [`seek`](Self::seek) restarts the failed one. [`Error::Closed`] after
    /// [`close`](Self::close) or when the network loop ended.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped before it completes, no record is lost; the next
    /// call returns it.
    pub async fn poll(&mut self) -> Result<Batch> {
        // Waiting in `poll` counts as polling for `max.poll.interval.ms`, until it returns or
        // its future is dropped.
        let _guard = PollGuard(Arc::clone(&self.shared));
        std::future::poll_fn(|cx| self.poll_batch(cx)).await
    }

    fn poll_batch(&mut self, cx: &mut Context<'_>) -> Poll<Result<Batch>> {
        // Recorded before the loop is woken, so that it sees this poll.
        self.shared.polled(false);
        if self
            .shared
            .left_for_poll_timeout
            .swap(false, Ordering::AcqRel)
        {
            self.send(Command::Polled);
        }
        let r = self.poll_batch_inner(cx);
        self.shared.polled(r.is_pending());
        r
    }

    fn poll_batch_inner(&mut self, cx: &mut Context<'_>) -> Poll<Result<Batch>> {
        self.release_held();
        self.maybe_commit_periodically();
        loop {
            if let Some(e) = self.pending_errors.pop() {
                return Poll::Ready(Err(e));
            }
            if self.closed {
                return Poll::Ready(Err(Error::Closed));
            }
            // The first queued entry of a partition that is not paused (a partition's entries
            // stay in order).
            let next = self.ready.iter().position(|r| !self.is_paused(r.tp()));
            if let Some(ready) = next.and_then(|i| self.ready.remove(i)) {
                let d = match ready {
                    Ready::Piece(d) => d,
                    Ready::Cursor(mut cursor) => {
                        let d = self.decode_piece(&mut cursor);
                        self.requeue(cursor);
                        d
                    }
                };
                if let Some(r) = self.hand_out(d) {
                    return Poll::Ready(r);
                }
                continue;
            }
            if let Some(i) = self.parked.iter().position(|c| !self.is_paused(&c.tp)) {
                let chunk = self.parked.swap_remove(i);
                let cursor = ChunkCursor::new(chunk, self.config.isolation_level());
                self.ready.push_back(Ready::Cursor(cursor));
                continue;
            }
            match self.deliveries.poll_recv(cx) {
                // Nothing to hand out: positions handed out earlier are still committed on
                // time, as the Java client's auto-commit does within a long `poll`.
                Poll::Pending if self.periodic_commit_due(cx) => self.commit_periodically(),
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => self.closed = true,
                Poll::Ready(Some(delivery)) => {
                    if let Some(ready) = self.accept(delivery) {
                        self.ready.push_back(ready);
                    }
                }
            }
        }
    }

    /// Turns a delivery from the network loop into something to hand out (or parks it).
    fn accept(&mut self, delivery: Delivery) -> Option<Ready> {
        match delivery {
            Delivery::Chunk(mut chunk) => {
                if !self.is_current(&chunk.tp, chunk.generation) {
                    return None;
                }
                if self.is_paused(&chunk.tp) {
                    // Its own copy, which holds back no response (see `detach_queued`).
                    chunk.detach(|bytes| crate::net::driver::lease(&self.shared, bytes));
                    self.parked.push(chunk);
                    return None;
                }
                Some(Ready::Cursor(ChunkCursor::new(
                    chunk,
                    self.config.isolation_level(),
                )))
            }
            Delivery::Failed {
                tp,
                generation,
                error,
            } => Some(Ready::Piece(Decoded {
                tp,
                generation,
                batch: None,
                next_offset: None,
                error: Some(error),
                decompressed: 0,
                _lease: None,
            })),
            Delivery::Error(e) => {
                self.pending_errors.push(e);
                None
            }
            Delivery::Revoke(tps) => {
                self.revoke(&tps, false);
                self.send(Command::RevokeDone);
                None
            }
            Delivery::Lost(tps) => {
                self.revoke(&tps, true);
                None
            }
            Delivery::Assigned { added } => {
                self.assigned(added);
                None
            }
        }
    }

    /// The group takes partitions away (`lost`: they are gone already): the listener runs,
    /// commits it asks for go out first, and the partitions' data is dropped.
    fn revoke(&mut self, tps: &[TopicPartition], lost: bool) {
        let tps: Vec<TopicPartition> = tps
            .iter()
            .filter(|tp| self.partitions.contains_key(*tp))
            .cloned()
            .collect();
        if lost {
            // Never committed: another member may own them already.
            self.ckpt.pending.lock().forget(&tps);
            self.listener.get_mut().on_partitions_lost(&tps);
        } else {
            let positions = self.handed_offsets();
            let mut commit = self.listener_revokes(&tps, &positions);
            if commit.is_none() && matches!(self.config.commit_mode(), CommitMode::Periodic(_)) {
                commit = Some(positions);
            }
            // Pending checkpoints lose the revoked partitions (see the `rebalance` module).
            self.ckpt.pending.lock().forget(&tps);
            self.submit_offsets(commit.unwrap_or_default());
        }
        for tp in &tps {
            self.partitions.remove(tp);
        }
        let gone: std::collections::HashSet<&TopicPartition> = tps.iter().collect();
        self.drop_parked(|c| gone.contains(&c.tp));
        self.drop_ready(|r| gone.contains(r.tp()));
        self.send(Command::Unassign(tps));
    }

    /// Runs the listener's revocation callback; returns the commit it asked for, if any.
    fn listener_revokes(
        &mut self,
        partitions: &[TopicPartition],
        positions: &Offsets,
    ) -> Option<Offsets> {
        let mut rev = Revocation {
            partitions,
            positions,
            commit: None,
        };
        self.listener.get_mut().on_partitions_revoked(&mut rev);
        rev.commit
    }

    /// Hands offsets to the network loop as a commit of no checkpoint (periodic, closing, or
    /// asked for by a revocation). Nothing for an empty set.
    fn submit_offsets(&self, offsets: Offsets) {
        if offsets.is_empty() {
            return;
        }
        self.ckpt.submit(CommitRequest {
            checkpoint_id: None,
            offsets: Arc::new(offsets),
            created: Instant::now(),
        });
    }

    /// The group assigned partitions: each starts at its restored offset, its committed
    /// offset, or `auto.offset.reset`.
    fn assigned(&mut self, added: Vec<(TopicPartition, Option<i64>)>) {
        let mut restored = Vec::new();
        let mut plain = Vec::new();
        let mut names = Vec::with_capacity(added.len());
        for (tp, committed) in added {
            let generation = self.generation();
            let (start, from_checkpoint, epoch) = match (self.restored.get(&tp), committed) {
                (Some((o, e)), _) => (StartPosition::Offset(*o), true, *e),
                (None, Some(o)) => (StartPosition::Offset(o), false, -1),
                (None, None) => match self.config.auto_offset_reset() {
                    OffsetReset::Earliest => (StartPosition::Earliest, false, -1),
                    OffsetReset::Latest => (StartPosition::Latest, false, -1),
                    OffsetReset::Error => {
                        // Owned, not read, until the application seeks.
                        let l = Local::new(generation, StartPosition::Earliest);
                        self.pending_errors
                            .push(Error::NoCommittedOffset(tp.clone()));
                        self.partitions.insert(tp.clone(), l);
                        names.push(tp);
                        continue;
                    }
                },
            };
            let mut local = Local::new(generation, start);
            local.leader_epoch = epoch;
            self.partitions.insert(tp.clone(), local);
            names.push(tp.clone());
            if from_checkpoint {
                restored.push((tp, start, generation));
            } else {
                plain.push((tp, start, generation));
            }
        }
        if !restored.is_empty() {
            self.send(Command::Add(restored, true));
        }
        if !plain.is_empty() {
            self.send(Command::Add(plain, false));
        }
        self.listener.get_mut().on_partitions_assigned(&names);
    }

    /// Hands a decoded chunk to the application: moves the position, returns the records (or
    /// the error). `None` when there is nothing to return.
    fn hand_out(&mut self, d: Decoded) -> Option<Result<Batch>> {
        if !self.is_current(&d.tp, d.generation) {
            self.release(d.decompressed);
            return None;
        }
        self.held += d.decompressed;
        let local = self.partitions.get_mut(&d.tp)?;
        if let Some(next) = d.next_offset {
            local.handed = Some(next);
        }
        if let Some(epoch) = d
            .batch
            .as_ref()
            .and_then(|b| b.records.last())
            .map(|r| r.leader_epoch)
        {
            local.leader_epoch = epoch;
        }
        match (d.batch, d.error) {
            (Some(b), Some(e)) => {
                self.pending_errors.push(e);
                Some(Ok(b))
            }
            (Some(b), None) => Some(Ok(b)),
            (None, Some(e)) => Some(Err(e)),
            (None, None) => None,
        }
    }

    /// Publishes handed-out positions every `auto.commit.interval.ms` in periodic mode.
    fn maybe_commit_periodically(&mut self) {
        let CommitMode::Periodic(interval) = self.config.commit_mode() else {
            return;
        };
        if self.config.group_id().is_none() || self.last_periodic.elapsed() < interval {
            return;
        }
        self.commit_periodically();
    }

    /// Publishes the handed-out positions now (periodic mode).
    fn commit_periodically(&mut self) {
        self.last_periodic = Instant::now();
        let offsets = self.handed_offsets();
        self.periodic_sent = offsets.clone();
        self.submit_offsets(offsets);
    }

    /// In periodic mode, while `poll` waits: true once the interval has passed and positions
    /// were handed out since the last periodic commit; otherwise arms a timer that wakes `cx`
    /// then.
    fn periodic_commit_due(&mut self, cx: &mut Context<'_>) -> bool {
        let CommitMode::Periodic(interval) = self.config.commit_mode() else {
            return false;
        };
        if self.config.group_id().is_none() || self.handed_offsets() == self.periodic_sent {
            self.periodic_timer = None;
            return false;
        }
        let deadline = tokio::time::Instant::from_std(self.last_periodic + interval);
        let timer = self
            .periodic_timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.deadline() != deadline {
            timer.as_mut().reset(deadline);
        }
        timer.as_mut().poll(cx).is_ready()
    }

    fn handed_offsets(&self) -> Offsets {
        self.partitions
            .iter()
            .filter_map(|(tp, l)| l.handed.map(|o| (tp.clone(), (o, l.leader_epoch))))
            .collect()
    }

    fn is_current(&self, tp: &TopicPartition, generation: u64) -> bool {
        self.partitions
            .get(tp)
            .is_some_and(|l| l.generation == generation)
    }

    fn is_paused(&self, tp: &TopicPartition) -> bool {
        self.partitions.get(tp).is_some_and(|l| l.paused)
    }

    /// Decodes the next piece of a chunk. Counts its decompressed bytes against the budget;
    /// the last piece carries the chunk's lease on the fetched bytes.
    fn decode_piece(&mut self, cursor: &mut ChunkCursor) -> Decoded {
        let limits = DecodeLimits::new(self.config.buffer_max_bytes())
            .with_check_crc(self.config.check_crcs());
        let soft_cap = self.config.max_partition_fetch_bytes() as usize;
        let piece = cursor.next_piece(&limits, soft_cap, PIECE_RECORDS);
        self.shared
            .buffered
            .fetch_add(piece.decompressed_bytes, Ordering::AcqRel);
        let error = piece.error.map(|violation| {
            self.send(Command::Fail(cursor.tp.clone(), cursor.generation));
            Error::CorruptRecords {
                partition: cursor.tp.clone(),
                violation,
            }
        });
        let batch = (!piece.records.is_empty()).then(|| Batch {
            partition: cursor.tp.clone(),
            records: piece.records,
            next_offset: piece.next_offset,
        });
        Decoded {
            tp: cursor.tp.clone(),
            generation: cursor.generation,
            batch,
            next_offset: Some(piece.next_offset),
            error,
            decompressed: piece.decompressed_bytes,
            _lease: cursor.take_lease(),
        }
    }

    /// Puts a cursor with pieces left back ahead of everything else of its partition.
    fn requeue(&mut self, cursor: ChunkCursor) {
        if cursor.is_done() {
            return;
        }
        let at = self
            .ready
            .iter()
            .position(|r| r.tp() == &cursor.tp)
            .unwrap_or(self.ready.len());
        self.ready.insert(at, Ready::Cursor(cursor));
    }

    fn release(&self, bytes: usize) {
        self.shared.release(bytes);
    }

    fn release_held(&mut self) {
        let held = std::mem::take(&mut self.held);
        self.release(held);
    }

    /// Drops queued pieces and chunks; their fetched bytes go back to the budget with their
    /// leases.
    fn drop_ready(&mut self, which: impl Fn(&Ready) -> bool) {
        let mut freed = 0;
        self.ready.retain(|r| {
            let drop = which(r);
            if drop && let Ready::Piece(d) = r {
                freed += d.decompressed;
            }
            !drop
        });
        self.release(freed);
    }

    fn drop_parked(&mut self, which: impl Fn(&Chunk) -> bool) {
        self.parked.retain(|c| !which(c));
    }

    /// The state to store in checkpoint `checkpoint_id`: for every assigned partition, the
    /// offset after the last record handed to the application, never the fetch position.
    /// The offsets are kept as pending until the checkpoint completes or aborts (see
    /// [`CheckpointHandle`]).
    ///
    /// Data already fetched that hands out no records (transaction markers, aborted
    /// transactions) moves the offset past it first, so a partition that was read to its end
    /// shows no false lag. A partition whose start position is not resolved yet is resolved
    /// first (ListOffsets), so no snapshot ever holds an unresolved position.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] if the consumer is closed; the errors of
    /// [`position`](Self::position) for a partition whose start cannot be resolved.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is recorded until it completes.
    pub async fn snapshot_state(&mut self, checkpoint_id: u64) -> Result<SourceState> {
        self.absorb();
        let unresolved: Vec<TopicPartition> = self
            .partitions
            .iter()
            .filter(|(_, l)| l.handed.is_none())
            .map(|(tp, _)| tp.clone())
            .collect();
        for tp in unresolved {
            let offset = self.position(&tp).await?;
            if let Some(l) = self.partitions.get_mut(&tp)
                && l.handed.is_none()
            {
                l.handed = Some(offset);
            }
        }
        let offsets = self.handed_offsets();
        let mut partitions: Vec<PartitionOffset> = offsets
            .iter()
            .map(|(tp, (o, e))| PartitionOffset {
                topic: tp.topic.to_string(),
                partition: tp.partition,
                next_offset: *o,
                leader_epoch: *e,
            })
            .collect();
        partitions.sort();
        if self.config.commit_mode() == CommitMode::OnCheckpoints {
            let dropped = self
                .ckpt
                .pending
                .lock()
                .insert(checkpoint_id, Arc::new(offsets));
            if dropped > 0 {
                self.ckpt.stats.lock().dropped_pending += dropped as u64;
                tracing::warn!(
                    dropped,
                    "too many pending checkpoints; the oldest were dropped"
                );
            }
        }
        Ok(SourceState {
            version: SOURCE_STATE_VERSION,
            checkpoint_id,
            partitions,
        })
    }

    /// Takes what the network loop already delivered off the channel. A chunk that hands out
    /// no records (markers, aborted transactions) for a partition with nothing queued moves its
    /// position at once; anything else waits in `ready` for `poll`, in order, with at most its
    /// first piece decoded.
    fn absorb(&mut self) {
        while let Ok(delivery) = self.deliveries.try_recv() {
            let Some(ready) = self.accept(delivery) else {
                continue;
            };
            let queued = self.ready.iter().any(|r| r.tp() == ready.tp());
            let Ready::Cursor(mut cursor) = ready else {
                self.ready.push_back(ready);
                continue;
            };
            if queued {
                self.ready.push_back(Ready::Cursor(cursor));
                continue;
            }
            loop {
                let d = self.decode_piece(&mut cursor);
                if d.batch.is_none() && d.error.is_none() {
                    let _ = self.hand_out(d);
                    if cursor.is_done() {
                        break;
                    }
                    continue;
                }
                self.ready.push_back(Ready::Piece(d));
                if !cursor.is_done() {
                    self.ready.push_back(Ready::Cursor(cursor));
                }
                break;
            }
        }
    }

    /// The handle for the checkpoint side: completions and aborts, from any thread.
    pub fn checkpoints(&self) -> CheckpointHandle {
        CheckpointHandle {
            shared: Arc::clone(&self.ckpt),
        }
    }

    /// The commit outcomes, once: later calls return `None`.
    pub fn commit_outcomes(&mut self) -> Option<CommitOutcomes> {
        self.outcomes.take()
    }

    /// Commit counters and the last acknowledged offsets.
    pub fn commit_stats(&self) -> CommitStats {
        self.ckpt.stats.lock().clone()
    }

    /// The group's committed offsets for these partitions, as the coordinator reports them
    /// (OffsetFetch with `require_stable`); `None` where nothing is committed.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] without a `group.id`; broker and connection errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn committed(&self, partitions: &[TopicPartition]) -> Result<Committed> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Committed(partitions.to_vec(), tx));
        rx.await.map_err(|_| Error::Closed)?
    }

    /// Fetch requests sent and answered so far, and the group coordinator (-1 if unknown):
    /// counters for monitoring and tests.
    pub fn fetch_stats(&self) -> FetchStats {
        FetchStats {
            buffered_bytes: self.shared.buffered.load(Ordering::Relaxed) as u64,
            requests: self.shared.fetches_sent.load(Ordering::Relaxed) as u64,
            responses: self.shared.fetches_done.load(Ordering::Relaxed) as u64,
            coordinator: self.shared.coordinator.load(Ordering::Relaxed),
        }
    }

    /// Closes the consumer: commits what the last completed checkpoint left pending (in
    /// periodic mode: the handed-out positions), waiting up to `close.timeout.ms` (a commit
    /// still open then is reported timed out), then stops the network loop. Returns the final counters; the outcomes are also on
    /// [`CommitOutcomes`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the future half-way stops the network loop without waiting for the flush.
    pub async fn close(mut self) -> CommitStats {
        self.shutdown().await;
        self.ckpt.stats.lock().clone()
    }

    async fn shutdown(&mut self) {
        if self.closed {
            return;
        }
        // Subscribe mode: the listener hears of the revocation (and may commit) first.
        if self.subscribed && !self.partitions.is_empty() {
            let all: Vec<TopicPartition> = self.partitions.keys().cloned().collect();
            let positions = self.handed_offsets();
            let commit = self.listener_revokes(&all, &positions);
            self.submit_offsets(commit.unwrap_or_default());
        }
        self.closed = true;
        // Periodic mode commits what was handed out last, as the Java client's auto-commit does
        // on close; checkpoint mode flushes only what a completed checkpoint left pending.
        if matches!(self.config.commit_mode(), CommitMode::Periodic(_))
            && self.config.group_id().is_some()
        {
            self.submit_offsets(self.handed_offsets());
        }
        let (tx, rx) = oneshot::channel();
        self.send(Command::Close(tx));
        // The loop flushes within close.timeout.ms; allow a little more for it to answer.
        let timeout = self.config.close_timeout() + Duration::from_secs(1);
        let _ = tokio::time::timeout(timeout, rx).await;
        if let Some(d) = self.driver.take() {
            d.abort();
        }
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        if let Some(d) = self.driver.take() {
            d.abort();
        }
    }
}

impl Stream for Consumer {
    type Item = Result<Batch>;

    /// Ends (`None`) once the consumer is closed; errors are items, as from `poll`.
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        match this.poll_batch(cx) {
            Poll::Ready(Err(Error::Closed)) => Poll::Ready(None),
            Poll::Ready(r) => Poll::Ready(Some(r)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Fetch counters, see [`Consumer::fetch_stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FetchStats {
    /// Bytes of the fetch responses whose records are not all handed out yet, each counted
    /// whole, and decompressed bytes not yet handed out (plus those of the batch handed out
    /// last).
    pub buffered_bytes: u64,
    /// Fetch requests sent.
    pub requests: u64,
    /// Fetch responses received (or failed).
    pub responses: u64,
    /// The group coordinator's node id, -1 if not known.
    pub coordinator: i32,
}

/// Marks the end of a `poll` call, however it ends.
struct PollGuard(Arc<Shared>);

impl Drop for PollGuard {
    fn drop(&mut self) {
        self.0.polled(false);
    }
}

fn clamp_i32(v: usize) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

fn clamp_ms(d: std::time::Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}
