//! The fetch path's state machine: per-partition positions, start-position resolution
//! (ListOffsets), fetch planning, and interpretation of Fetch responses.
//!
//! Sans-IO: the driver asks for plans (`plan_*`), sends them, and feeds the outcomes back
//! (`handle_*`) together with `now`. Nothing here reads a clock or touches a socket.
//!
//! Rules this module keeps:
//! - at most one fetch in flight per data connection (`fetch.connections.per.broker` of them
//!   per leader), and a partition in at most one request at a time;
//! - the next position after a batch is `baseOffset + lastOffsetDelta + 1`, so empty
//!   (compacted) batches and control batches still move the position;
//! - a response ending in a partial batch hands out only the complete batches before it;
//! - a response for a partition whose position or seek generation changed meanwhile is dropped.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::error::{ParseResponseErrorCode, ResponseError};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{
    BrokerId, FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use crate::config::{IsolationLevel, OffsetReset};
use crate::error::{Error, ProtocolViolation};
use crate::proto::crc_scan::Checked;
use crate::proto::metadata::Metadata;
use crate::proto::records::BatchIter;
use crate::proto::recovery::{FetchRecovery, fetch_recovery};
use crate::types::{StartPosition, TopicPartition};

/// Fetch settings, taken from the consumer configuration.
#[derive(Clone, Debug)]
pub(crate) struct FetchConfig {
    pub(crate) max_wait_ms: i32,
    pub(crate) min_bytes: i32,
    pub(crate) max_bytes: i32,
    pub(crate) partition_max_bytes: i32,
    pub(crate) isolation: IsolationLevel,
    pub(crate) reset: OffsetReset,
    pub(crate) restore_reset: OffsetReset,
    pub(crate) retry_backoff: Duration,
    /// Data connections per leader, each with at most one Fetch in flight
    /// (`fetch.connections.per.broker`, at least 1).
    pub(crate) connections_per_broker: u8,
}

impl FetchConfig {
    /// The most record bytes a Fetch for `partitions` partitions can return, and so what it
    /// takes of the memory budget: `fetch.max.bytes`, and no more than
    /// `max.partition.fetch.bytes` per partition. (The broker may exceed either limit by one
    /// whole batch, the first of the response, so that an oversized batch can be read at all;
    /// that holds of both limits alike.) Never 0.
    fn request_bytes(&self, partitions: usize) -> usize {
        let bytes = |limit: i32| usize::try_from(limit).unwrap_or(0).max(1);
        bytes(self.max_bytes).min(
            partitions
                .max(1)
                .saturating_mul(bytes(self.partition_max_bytes)),
        )
    }
}

/// One data connection: a leader's node id and the connection's index among that leader's
/// `fetch.connections.per.broker`.
pub(crate) type Lane = (i32, u8);

/// A partition's read position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Position {
    /// Waiting for ListOffsets to turn a start position into an offset.
    Unresolved(StartPosition),
    /// The next offset to fetch.
    Fetching(i64),
    /// Stopped after an error that was reported; a seek restarts it.
    Failed,
}

#[derive(Clone, Debug)]
struct PartitionState {
    position: Position,
    /// What to do when the position is out of range (differs for restored partitions).
    reset: OffsetReset,
    /// Seek generation, chosen by the consumer; data of an older generation is stale.
    generation: u64,
    /// The offset this generation started at, once resolved.
    start: Option<i64>,
    paused: bool,
    retry_at: Option<Instant>,
    failures: u32,
    /// Put this partition first in its next fetch: its next batch did not fit.
    first: bool,
    high_watermark: i64,
    last_stable_offset: i64,
    log_start_offset: i64,
}

impl PartitionState {
    fn new(start: StartPosition, generation: u64, reset: OffsetReset) -> Self {
        let (position, start) = match start {
            StartPosition::Offset(o) => (Position::Fetching(o), Some(o)),
            other => (Position::Unresolved(other), None),
        };
        Self {
            position,
            reset,
            generation,
            start,
            paused: false,
            retry_at: None,
            failures: 0,
            first: false,
            high_watermark: -1,
            last_stable_offset: -1,
            log_start_offset: -1,
        }
    }

    /// Not paused and not backing off (whether it is in a request is the caller's to check).
    fn ready(&self, now: Instant) -> bool {
        !self.paused && self.retry_at.is_none_or(|t| t <= now)
    }

    /// The ListOffsets timestamp to ask for `tp` with, if it is to be listed now: its start
    /// position is unresolved (and not an offset), it is ready, and it is in no request.
    fn to_list(
        &self,
        tp: &TopicPartition,
        now: Instant,
        in_flight: &HashSet<TopicPartition>,
    ) -> Option<i64> {
        let Position::Unresolved(start) = self.position else {
            return None;
        };
        if !self.ready(now) || in_flight.contains(tp) {
            return None;
        }
        list_timestamp(start)
    }

    /// Takes the offset a ListOffsets answer gave without an error.
    fn listed(&mut self, offset: i64) {
        if offset < 0 {
            // A timestamp after every record: start at the end, as documented.
            self.position = Position::Unresolved(StartPosition::Latest);
            return;
        }
        self.failures = 0;
        self.retry_at = None;
        self.position = Position::Fetching(offset);
        self.start = Some(offset);
    }

    fn back_off(&mut self, now: Instant, base: Duration) {
        self.failures = self.failures.saturating_add(1);
        let factor = 1u32 << self.failures.min(5);
        self.retry_at = Some(now + (base * factor).min(Duration::from_secs(2)));
    }
}

/// The ListOffsets timestamp for a start position; `None` for an offset, which needs none.
fn list_timestamp(start: StartPosition) -> Option<i64> {
    match start {
        StartPosition::Earliest => Some(-2),
        StartPosition::Latest => Some(-1),
        StartPosition::Timestamp(ts) => Some(ts.max(0)),
        StartPosition::Offset(_) => None,
    }
}

/// A partition's answer in a ListOffsets response.
fn listed<'a>(
    resp: &'a ListOffsetsResponse,
    tp: &TopicPartition,
) -> Option<&'a kafka_protocol::messages::list_offsets_response::ListOffsetsPartitionResponse> {
    resp.topics
        .iter()
        .filter(|t| t.name.0.as_str() == &*tp.topic)
        .flat_map(|t| t.partitions.iter())
        .find(|p| p.partition_index == tp.partition)
}

/// What a chunk holds until it is done with (decoded to its end, or dropped): the IO shell's
/// claim on the memory budget for the response the chunk was cut from. Opaque to the core.
pub(crate) type Lease = Arc<dyn std::any::Any + Send + Sync>;

/// Fetched data of one partition, for the consumer to decode and hand out.
#[derive(Clone, Debug)]
pub(crate) struct Chunk {
    pub(crate) tp: TopicPartition,
    pub(crate) generation: u64,
    /// The position the fetch asked for: records below it are not handed out.
    pub(crate) fetch_offset: i64,
    /// Complete record batches, a zero-copy slice of the response.
    pub(crate) records: Bytes,
    /// The batches of `records` whose CRC was checked as the response arrived: `(position in
    /// `records`, CRC)`, in order.
    pub(crate) checked: Vec<(u32, u32)>,
    /// The position after these batches.
    pub(crate) next_offset: i64,
    /// Aborted transactions, for `read_committed` filtering: `(producer id, first offset)`.
    pub(crate) aborted: Vec<(i64, i64)>,
    /// Set by the IO shell, dropped with the chunk (or its cursor).
    pub(crate) lease: Option<Lease>,
}

impl Chunk {
    /// Moves the records into a buffer of their own, under `lease` (for their length), so that
    /// the chunk no longer holds the response it was cut from: for a paused partition, whose
    /// records may wait for as long as the application likes.
    pub(crate) fn detach(&mut self, lease: impl FnOnce(usize) -> Lease) {
        self.records = Bytes::copy_from_slice(&self.records);
        self.lease = Some(lease(self.records.len()));
    }
}

/// Something the consumer must learn.
#[derive(Debug)]
pub(crate) enum FetchEvent {
    /// Data to hand out.
    Chunk(Chunk),
    /// A partition failed; it stays stopped until a seek.
    Failed {
        tp: TopicPartition,
        generation: u64,
        error: Error,
    },
}

/// A ListOffsets request to one leader.
#[derive(Clone, Debug)]
pub(crate) struct ListPlan {
    pub(crate) node: i32,
    entries: Vec<ListEntry>,
}

/// A ListOffsets request sent ahead of the metadata that names the partitions' leaders, to the
/// address that answers the Metadata request (see [`FetchState::plan_list_offsets_ahead`]).
#[derive(Clone, Debug)]
pub(crate) struct AheadPlan(ListPlan);

#[derive(Clone, Debug)]
struct ListEntry {
    tp: TopicPartition,
    generation: u64,
    leader_epoch: i32,
    timestamp: i64,
}

/// A Fetch request to one leader, on one of its data connections.
#[derive(Clone, Debug)]
pub(crate) struct FetchPlan {
    pub(crate) node: i32,
    /// Which of the leader's data connections carries it.
    pub(crate) lane: u8,
    entries: Vec<FetchEntry>,
    pub(crate) max_bytes: i32,
}

impl ListPlan {
    /// How many partitions it lists.
    pub(crate) fn partitions(&self) -> usize {
        self.entries.len()
    }
}

impl FetchPlan {
    /// The data connection that carries it.
    pub(crate) fn connection(&self) -> Lane {
        (self.node, self.lane)
    }
}

#[derive(Clone, Debug)]
struct FetchEntry {
    tp: TopicPartition,
    topic_id: Uuid,
    generation: u64,
    offset: i64,
    leader_epoch: i32,
}

/// One leader's partitions while fetches are planned.
#[derive(Debug, Default)]
struct NodeFetches {
    /// Ready to fetch, each with whether its next batch did not fit last time.
    ready: Vec<(bool, FetchEntry)>,
    /// In a request not answered yet.
    in_flight: usize,
}

/// Outcome of handling a response.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub(crate) events: Vec<FetchEvent>,
    /// Leadership may have moved: refresh metadata soon.
    pub(crate) refresh_metadata: bool,
}

/// All assigned partitions and their positions.
#[derive(Debug)]
pub(crate) struct FetchState {
    cfg: Arc<FetchConfig>,
    parts: HashMap<TopicPartition, PartitionState>,
    /// Partitions in a request not answered yet, whatever their generation and even if no
    /// longer assigned: a partition assigned again (or re-assigned under a new generation)
    /// while its old request is out waits for that request, and the old answer releases the
    /// partition, not a newer request's.
    in_flight: HashSet<TopicPartition>,
    /// Rotates the order of partitions in requests, so none is always last.
    rotation: usize,
}

impl FetchState {
    pub(crate) fn new(cfg: FetchConfig) -> Self {
        Self {
            cfg: Arc::new(cfg),
            parts: HashMap::new(),
            in_flight: HashSet::new(),
            rotation: 0,
        }
    }

    /// Replaces the assignment. Partitions kept keep their state unless their generation
    /// changed.
    /// `restored` partitions use the restore policy for out-of-range offsets instead of
    /// `auto.offset.reset`.
    pub(crate) fn assign(
        &mut self,
        list: Vec<(TopicPartition, StartPosition, u64)>,
        restored: bool,
    ) {
        let reset = if restored {
            self.cfg.restore_reset
        } else {
            self.cfg.reset
        };
        let mut next = HashMap::with_capacity(list.len());
        for (tp, start, generation) in list {
            let state = match self.parts.remove(&tp) {
                Some(s) if s.generation == generation => s,
                _ => PartitionState::new(start, generation, reset),
            };
            next.insert(tp, state);
        }
        self.parts = next;
    }

    /// Adds partitions (subscribe mode), each under its own generation; partitions already
    /// assigned are replaced.
    pub(crate) fn add(&mut self, list: Vec<(TopicPartition, StartPosition, u64)>, restored: bool) {
        let reset = if restored {
            self.cfg.restore_reset
        } else {
            self.cfg.reset
        };
        for (tp, start, generation) in list {
            self.parts
                .insert(tp, PartitionState::new(start, generation, reset));
        }
    }

    /// Stops fetching partitions (subscribe mode: revoked or lost). A fetch in flight for them
    /// is ignored when it returns.
    pub(crate) fn unassign(&mut self, tps: &[TopicPartition]) {
        for tp in tps {
            self.parts.remove(tp);
        }
    }

    /// Moves a partition to a new start position under a new generation.
    pub(crate) fn seek(
        &mut self,
        tp: &TopicPartition,
        start: StartPosition,
        generation: u64,
    ) -> bool {
        let reset = self.cfg.reset;
        let Some(s) = self.parts.get_mut(tp) else {
            return false;
        };
        let paused = s.paused;
        *s = PartitionState::new(start, generation, reset);
        s.paused = paused;
        true
    }

    /// Stops or restarts fetching a partition.
    pub(crate) fn set_paused(&mut self, tp: &TopicPartition, paused: bool) {
        if let Some(s) = self.parts.get_mut(tp) {
            s.paused = paused;
        }
    }

    /// The start offset of a partition's current generation, once resolved.
    pub(crate) fn start_offset(&self, tp: &TopicPartition) -> Option<Result<i64, ()>> {
        let s = self.parts.get(tp)?;
        match (s.start, s.position) {
            (Some(o), _) => Some(Ok(o)),
            (None, Position::Failed) => Some(Err(())),
            (None, _) => None,
        }
    }

    /// True if the partition is assigned.
    pub(crate) fn is_assigned(&self, tp: &TopicPartition) -> bool {
        self.parts.contains_key(tp)
    }

    /// The assigned topics.
    pub(crate) fn topics(&self) -> Vec<Arc<str>> {
        let set: HashSet<&Arc<str>> = self.parts.keys().map(|tp| &tp.topic).collect();
        let mut v: Vec<Arc<str>> = set.into_iter().cloned().collect();
        v.sort();
        v
    }

    /// The earliest time a backed-off partition becomes ready again.
    pub(crate) fn next_retry(&self) -> Option<Instant> {
        self.parts
            .iter()
            .filter(|(tp, _)| !self.in_flight.contains(*tp))
            .filter_map(|(_, s)| s.retry_at)
            .min()
    }

    /// True if some assigned, unpaused partition has no known leader.
    pub(crate) fn needs_metadata(&self, meta: &Metadata) -> bool {
        self.parts.iter().any(|(tp, s)| {
            !s.paused
                && !matches!(s.position, Position::Failed)
                && meta.leader(&tp.topic, tp.partition).is_none()
        })
    }

    /// How many partitions are assigned.
    pub(crate) fn assigned(&self) -> usize {
        self.parts.len()
    }

    /// How many data connections `partitions` partitions of one leader take:
    /// `fetch.connections.per.broker`, no more than there are partitions, at least one.
    pub(crate) fn lanes_for(&self, partitions: usize) -> u8 {
        let partitions = u8::try_from(partitions).unwrap_or(u8::MAX).max(1);
        self.cfg.connections_per_broker.clamp(1, partitions)
    }

    /// ListOffsets requests for partitions whose start position is unresolved.
    pub(crate) fn plan_list_offsets(&mut self, now: Instant, meta: &Metadata) -> Vec<ListPlan> {
        let mut by_node: HashMap<i32, Vec<ListEntry>> = HashMap::new();
        for (tp, s) in &self.parts {
            let Some(timestamp) = s.to_list(tp, now, &self.in_flight) else {
                continue;
            };
            let Some(leader) = meta.leader(&tp.topic, tp.partition) else {
                continue;
            };
            self.in_flight.insert(tp.clone());
            by_node.entry(leader.node).or_default().push(ListEntry {
                tp: tp.clone(),
                generation: s.generation,
                leader_epoch: leader.epoch,
                timestamp,
            });
        }
        by_node
            .into_iter()
            .map(|(node, entries)| ListPlan { node, entries })
            .collect()
    }

    /// ListOffsets for partitions whose start position is unresolved and whose leader
    /// metadata does not name yet, to go to the broker that answers the Metadata request that
    /// will name it, before that request is answered (the network loop sends it on the spare
    /// connection opened to the same address, or, if the Metadata answer comes first, on the
    /// Metadata request's own connection), so that the answer comes with the metadata rather
    /// than a round trip after it. A broker
    /// answers ListOffsets only for partitions it leads; the answers are taken only for
    /// partitions that the metadata, answered by the same broker, says it leads (see
    /// [`handle_list_offsets_ahead`](Self::handle_list_offsets_ahead)). `None` if no
    /// partition is waiting so.
    pub(crate) fn plan_list_offsets_ahead(
        &mut self,
        now: Instant,
        meta: &Metadata,
    ) -> Option<AheadPlan> {
        let mut entries = Vec::new();
        for (tp, s) in &self.parts {
            let Some(timestamp) = s.to_list(tp, now, &self.in_flight) else {
                continue;
            };
            if meta.leader(&tp.topic, tp.partition).is_some() {
                continue;
            }
            entries.push(ListEntry {
                tp: tp.clone(),
                generation: s.generation,
                // Unknown until the metadata is in: the broker does not check it.
                leader_epoch: -1,
                timestamp,
            });
        }
        if entries.is_empty() {
            return None;
        }
        entries.sort_by(|a, b| a.tp.cmp(&b.tp));
        for e in &entries {
            self.in_flight.insert(e.tp.clone());
        }
        Some(AheadPlan(ListPlan { node: -1, entries }))
    }

    /// The ListOffsets request for a plan made ahead of the metadata.
    pub(crate) fn list_offsets_request_ahead(&self, plan: &AheadPlan) -> ListOffsetsRequest {
        self.list_offsets_request(&plan.0)
    }

    /// Applies the outcome of a ListOffsets sent ahead of the metadata, once that metadata is
    /// in `meta`. `answered_by` is the node at the address that answered both, if the metadata
    /// names one there. An offset is taken only for a partition that node leads, and only if
    /// it came without an error; every other partition is left as it was before the plan,
    /// with no back-off, for [`plan_list_offsets`](Self::plan_list_offsets) to ask its leader.
    pub(crate) fn handle_list_offsets_ahead(
        &mut self,
        AheadPlan(plan): AheadPlan,
        result: Result<ListOffsetsResponse, Error>,
        meta: &Metadata,
        answered_by: Option<i32>,
    ) {
        for entry in &plan.entries {
            self.in_flight.remove(&entry.tp);
        }
        let (Ok(resp), Some(node)) = (result, answered_by) else {
            return;
        };
        for entry in plan.entries {
            let leads = meta
                .leader(&entry.tp.topic, entry.tp.partition)
                .is_some_and(|l| l.node == node);
            if !leads {
                continue;
            }
            let Some(s) = self.current(&entry.tp, entry.generation) else {
                continue;
            };
            if !matches!(s.position, Position::Unresolved(_)) {
                continue;
            }
            if let Some(p) = listed(&resp, &entry.tp)
                && p.error_code == 0
            {
                s.listed(p.offset);
            }
        }
    }

    /// The ListOffsets request for a plan.
    pub(crate) fn list_offsets_request(&self, plan: &ListPlan) -> ListOffsetsRequest {
        let mut topics: Vec<ListOffsetsTopic> = Vec::new();
        for e in &plan.entries {
            let p = ListOffsetsPartition::default()
                .with_partition_index(e.tp.partition)
                .with_current_leader_epoch(e.leader_epoch)
                .with_timestamp(e.timestamp);
            match topics
                .iter_mut()
                .find(|t| t.name.0.as_str() == &*e.tp.topic)
            {
                Some(t) => t.partitions.push(p),
                None => topics.push(
                    ListOffsetsTopic::default()
                        .with_name(topic_name(&e.tp.topic))
                        .with_partitions(vec![p]),
                ),
            }
        }
        ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_isolation_level(self.cfg.isolation.as_i8())
            .with_topics(topics)
    }

    /// Applies a ListOffsets outcome.
    pub(crate) fn handle_list_offsets(
        &mut self,
        plan: ListPlan,
        result: Result<ListOffsetsResponse, Error>,
        now: Instant,
    ) -> Outcome {
        let mut out = Outcome::default();
        let resp = match result {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(node = plan.node, error = %e, "ListOffsets failed");
                self.release_and_back_off(plan.entries.iter().map(|e| (&e.tp, e.generation)), now);
                out.refresh_metadata = true;
                return out;
            }
        };
        for entry in plan.entries {
            let retry_backoff = self.cfg.retry_backoff;
            self.in_flight.remove(&entry.tp);
            let Some(s) = self.current(&entry.tp, entry.generation) else {
                continue;
            };
            if !matches!(s.position, Position::Unresolved(_)) {
                // Failed meanwhile (the consumer found corrupt data): it stays stopped until a
                // seek.
                continue;
            }
            let Some(p) = listed(&resp, &entry.tp) else {
                s.back_off(now, retry_backoff);
                continue;
            };
            if let Some(code) = p.error_code.err() {
                match fetch_recovery(code) {
                    FetchRecovery::Fatal => {
                        s.position = Position::Failed;
                        out.events.push(FetchEvent::Failed {
                            tp: entry.tp.clone(),
                            generation: entry.generation,
                            error: Error::broker(
                                code,
                                format!("ListOffsets for {}", entry.tp),
                                None,
                            ),
                        });
                    }
                    FetchRecovery::RefreshMetadata | FetchRecovery::OutOfRange => {
                        out.refresh_metadata = true;
                        s.back_off(now, retry_backoff);
                    }
                    FetchRecovery::Backoff => s.back_off(now, retry_backoff),
                }
                continue;
            }
            s.listed(p.offset);
        }
        out
    }

    /// Fetch requests, at most one per data connection not in `busy`, within `budget` bytes in
    /// total. A request takes of the budget what it can return (see
    /// [`FetchConfig::request_bytes`]), at most what is left of it.
    ///
    /// A leader's partitions are shared out over its idle data connections, round robin in the
    /// order they go into requests. No request takes more than its share of the partitions the
    /// leader serves (ready or in flight) over all its connections: a connection that comes free
    /// while the others are out takes its share and leaves the rest waiting for the next free
    /// one, so the partitions spread evenly again within one response. When the budget allows
    /// fewer requests than there are idle connections, those requests carry every ready
    /// partition.
    pub(crate) fn plan_fetches(
        &mut self,
        now: Instant,
        meta: &Metadata,
        busy: &HashSet<Lane>,
        mut budget: usize,
    ) -> Vec<FetchPlan> {
        let connections = self.cfg.connections_per_broker.max(1);
        let mut keys: Vec<&TopicPartition> = self.parts.keys().collect();
        keys.sort();
        if !keys.is_empty() {
            let r = self.rotation % keys.len();
            keys.rotate_left(r);
        }
        self.rotation = self.rotation.wrapping_add(1);
        let mut by_node: HashMap<i32, NodeFetches> = HashMap::new();
        for tp in keys {
            let Some(s) = self.parts.get(tp) else {
                continue;
            };
            let Position::Fetching(offset) = s.position else {
                continue;
            };
            let Some(leader) = meta.leader(&tp.topic, tp.partition) else {
                continue;
            };
            if self.in_flight.contains(tp) {
                by_node.entry(leader.node).or_default().in_flight += 1;
                continue;
            }
            if !s.ready(now) {
                continue;
            }
            let Some(topic_id) = meta.topic(&tp.topic).map(|t| t.id) else {
                continue;
            };
            by_node.entry(leader.node).or_default().ready.push((
                s.first,
                FetchEntry {
                    tp: tp.clone(),
                    topic_id,
                    generation: s.generation,
                    offset,
                    leader_epoch: leader.epoch,
                },
            ));
        }
        let mut plans = Vec::new();
        let mut nodes: Vec<i32> = by_node.keys().copied().collect();
        nodes.sort_unstable();
        for node in nodes {
            if budget == 0 {
                break;
            }
            let Some(NodeFetches {
                ready: mut entries,
                in_flight,
            }) = by_node.remove(&node)
            else {
                continue;
            };
            let free: Vec<u8> = (0..connections)
                .filter(|&lane| !busy.contains(&(node, lane)))
                .collect();
            if entries.is_empty() || free.is_empty() {
                continue;
            }
            // Partitions whose next batch did not fit go first: the broker always returns
            // the first partition's first batch whole (KIP-74).
            entries.sort_by_key(|(first, _)| !*first);
            let share = (entries.len() + in_flight).div_ceil(usize::from(connections));
            let by_share = free.len().min(entries.len().div_ceil(share));
            let affordable = budget.div_ceil(self.cfg.request_bytes(share));
            let requests = by_share.min(affordable);
            if requests == by_share {
                // The rest waits for the next connection to come free.
                entries.truncate(requests * share);
            }
            // Else the budget allows fewer requests than there are free connections, and those
            // carry every ready partition.
            let mut groups: Vec<Vec<FetchEntry>> =
                (0..requests).map(|_| Vec::with_capacity(share)).collect();
            for (i, (_, e)) in entries.into_iter().enumerate() {
                groups[i % requests].push(e);
            }
            for (lane, entries) in free.into_iter().zip(groups) {
                if budget == 0 {
                    break;
                }
                let max_bytes = budget.min(self.cfg.request_bytes(entries.len()));
                budget -= max_bytes;
                for e in &entries {
                    self.in_flight.insert(e.tp.clone());
                }
                plans.push(FetchPlan {
                    node,
                    lane,
                    entries,
                    max_bytes: i32::try_from(max_bytes).unwrap_or(i32::MAX),
                });
            }
        }
        plans
    }

    /// The settings requests are built with.
    pub(crate) fn config(&self) -> Arc<FetchConfig> {
        Arc::clone(&self.cfg)
    }

    /// The Fetch request for a plan at `version` (v12 addresses topics by name, v13+ by id).
    pub(crate) fn fetch_request(cfg: &FetchConfig, plan: &FetchPlan, version: i16) -> FetchRequest {
        let by_id = version >= 13;
        let mut topics: Vec<FetchTopic> = Vec::new();
        for e in &plan.entries {
            let p = FetchPartition::default()
                .with_partition(e.tp.partition)
                .with_current_leader_epoch(e.leader_epoch)
                .with_fetch_offset(e.offset)
                .with_partition_max_bytes(cfg.partition_max_bytes);
            let same = |t: &FetchTopic| {
                if by_id {
                    t.topic_id == e.topic_id
                } else {
                    t.topic.0.as_str() == &*e.tp.topic
                }
            };
            match topics.last_mut().filter(|t| same(t)) {
                Some(t) => t.partitions.push(p),
                None => {
                    let mut t = FetchTopic::default().with_partitions(vec![p]);
                    if by_id {
                        t.topic_id = e.topic_id;
                    } else {
                        t.topic = topic_name(&e.tp.topic);
                    }
                    topics.push(t);
                }
            }
        }
        FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(cfg.max_wait_ms)
            .with_min_bytes(cfg.min_bytes)
            .with_max_bytes(plan.max_bytes)
            .with_isolation_level(cfg.isolation.as_i8())
            // Sessionless full fetches: the broker keeps no per-consumer session state.
            .with_session_id(0)
            .with_session_epoch(-1)
            .with_topics(topics)
    }

    /// After a failed request: its partitions are no longer in flight (whatever their
    /// generation), and those still at the request's generation back off.
    fn release_and_back_off<'a>(
        &mut self,
        entries: impl IntoIterator<Item = (&'a TopicPartition, u64)>,
        now: Instant,
    ) {
        let backoff = self.cfg.retry_backoff;
        for (tp, generation) in entries {
            self.in_flight.remove(tp);
            if let Some(s) = self.parts.get_mut(tp)
                && s.generation == generation
            {
                s.back_off(now, backoff);
            }
        }
    }

    fn current(&mut self, tp: &TopicPartition, generation: u64) -> Option<&mut PartitionState> {
        self.parts
            .get_mut(tp)
            .filter(|s| s.generation == generation)
    }

    /// Applies a Fetch outcome.
    #[cfg(any(test, fuzzing))]
    pub(crate) fn handle_fetch(
        &mut self,
        plan: FetchPlan,
        result: Result<FetchResponse, Error>,
        now: Instant,
    ) -> Outcome {
        self.handle_fetch_checked(plan, result, &Checked::default(), now)
    }

    /// Applies a Fetch outcome whose batches in `checked` had their CRCs checked as the response
    /// arrived: each chunk carries those within its records. (`handle_fetch`, built for tests
    /// and fuzzing only, is this with nothing checked.)
    pub(crate) fn handle_fetch_checked(
        &mut self,
        plan: FetchPlan,
        result: Result<FetchResponse, Error>,
        checked: &Checked,
        now: Instant,
    ) -> Outcome {
        let mut out = Outcome::default();
        for e in &plan.entries {
            self.in_flight.remove(&e.tp);
        }
        let resp = match result {
            Ok(r) => r,
            Err(err) => {
                tracing::debug!(node = plan.node, error = %err, "fetch failed");
                self.release_and_back_off(plan.entries.iter().map(|e| (&e.tp, e.generation)), now);
                out.refresh_metadata = true;
                return out;
            }
        };
        if let Some(code) = resp.error_code.err() {
            tracing::debug!(node = plan.node, ?code, "fetch failed at the top level");
            self.release_and_back_off(plan.entries.iter().map(|e| (&e.tp, e.generation)), now);
            out.refresh_metadata = matches!(fetch_recovery(code), FetchRecovery::RefreshMetadata);
            return out;
        }
        // Responses name topics by id (v13+) or by name (v12); index the plan both ways once,
        // rather than searching it for every partition of a large response.
        let by_id: HashMap<(Uuid, i32), &FetchEntry> = plan
            .entries
            .iter()
            .map(|e| ((e.topic_id, e.tp.partition), e))
            .collect();
        let by_name: HashMap<(&str, i32), &FetchEntry> = plan
            .entries
            .iter()
            .map(|e| ((&*e.tp.topic, e.tp.partition), e))
            .collect();
        for topic in resp.responses {
            for p in topic.partitions {
                let entry = if topic.topic_id.is_nil() {
                    by_name.get(&(topic.topic.0.as_str(), p.partition_index))
                } else {
                    by_id.get(&(topic.topic_id, p.partition_index))
                };
                let Some(&entry) = entry else {
                    tracing::debug!(
                        partition = p.partition_index,
                        "fetch response for a partition we did not ask for"
                    );
                    continue;
                };
                self.handle_partition(entry, p, checked, now, &mut out);
            }
        }
        out
    }

    fn handle_partition(
        &mut self,
        entry: &FetchEntry,
        p: kafka_protocol::messages::fetch_response::PartitionData,
        checked: &Checked,
        now: Instant,
        out: &mut Outcome,
    ) {
        let cfg_backoff = self.cfg.retry_backoff;
        let Some(s) = self.current(&entry.tp, entry.generation) else {
            return; // re-assigned or seeked meanwhile
        };
        let reset = s.reset;
        if s.position != Position::Fetching(entry.offset) {
            return; // stale
        }
        if p.high_watermark >= 0 {
            s.high_watermark = p.high_watermark;
        }
        if p.last_stable_offset >= 0 {
            s.last_stable_offset = p.last_stable_offset;
        }
        if p.log_start_offset >= 0 {
            s.log_start_offset = p.log_start_offset;
        }
        if let Some(code) = p.error_code.err() {
            match fetch_recovery(code) {
                FetchRecovery::OutOfRange => match reset {
                    OffsetReset::Earliest => {
                        tracing::info!(tp = %entry.tp, offset = entry.offset, "offset out of range; resetting to earliest");
                        s.position = Position::Unresolved(StartPosition::Earliest);
                    }
                    OffsetReset::Latest => {
                        tracing::info!(tp = %entry.tp, offset = entry.offset, "offset out of range; resetting to latest");
                        s.position = Position::Unresolved(StartPosition::Latest);
                    }
                    OffsetReset::Error => {
                        s.position = Position::Failed;
                        out.events.push(FetchEvent::Failed {
                            tp: entry.tp.clone(),
                            generation: entry.generation,
                            error: Error::OffsetOutOfRange {
                                partition: entry.tp.clone(),
                                offset: entry.offset,
                                log_start: s.log_start_offset,
                                log_end: s.high_watermark,
                            },
                        });
                    }
                },
                FetchRecovery::RefreshMetadata => {
                    s.back_off(now, cfg_backoff);
                    out.refresh_metadata = true;
                }
                FetchRecovery::Backoff => s.back_off(now, cfg_backoff),
                FetchRecovery::Fatal => {
                    s.position = Position::Failed;
                    out.events.push(FetchEvent::Failed {
                        tp: entry.tp.clone(),
                        generation: entry.generation,
                        error: error_for(code, &entry.tp),
                    });
                }
            }
            return;
        }
        s.failures = 0;
        let records = p.records.unwrap_or_default();
        if records.is_empty() {
            return;
        }
        let mut iter = BatchIter::new(records.clone());
        let mut end = 0usize;
        let mut next = entry.offset;
        let mut error = None;
        for item in iter.by_ref() {
            match item {
                Ok(batch) => {
                    end += batch.as_bytes().len();
                    next = next.max(batch.header().next_offset());
                }
                Err(v) => {
                    error = Some(v);
                    break;
                }
            }
        }
        let trailing = iter.remaining_bytes();
        if end == 0 {
            if let Some(v) = error {
                s.position = Position::Failed;
                out.events.push(FetchEvent::Failed {
                    tp: entry.tp.clone(),
                    generation: entry.generation,
                    error: Error::CorruptRecords {
                        partition: entry.tp.clone(),
                        violation: v,
                    },
                });
            } else if trailing > 0 {
                if s.first {
                    // Even first in the request the batch did not fit: it is larger than
                    // every limit we fetch with.
                    s.position = Position::Failed;
                    out.events.push(FetchEvent::Failed {
                        tp: entry.tp.clone(),
                        generation: entry.generation,
                        error: Error::CorruptRecords {
                            partition: entry.tp.clone(),
                            violation: ProtocolViolation::Batch {
                                base_offset: entry.offset,
                                reason: format!(
                                    "the batch at the fetch position does not fit in the response ({trailing} bytes received)"
                                ),
                            },
                        },
                    });
                } else {
                    s.first = true;
                }
            }
            return;
        }
        s.first = false;
        // Complete batches before a malformed one are handed out; the error surfaces when the
        // consumer reaches the bad batch, whose offset the position then stays at.
        s.position = Position::Fetching(next);
        let aborted = p
            .aborted_transactions
            .unwrap_or_default()
            .iter()
            .map(|a| (a.producer_id.0, a.first_offset))
            .collect();
        let records = records.slice(..end);
        let chunk = Chunk {
            tp: entry.tp.clone(),
            generation: entry.generation,
            fetch_offset: entry.offset,
            checked: checked.within(&records),
            records,
            next_offset: next,
            aborted,
            lease: None,
        };
        out.events.push(FetchEvent::Chunk(chunk));
        if let Some(v) = error {
            // Stop after the good part; the bad batch is reported once the good part is out.
            let bad_offset = next;
            s.position = Position::Failed;
            out.events.push(FetchEvent::Failed {
                tp: entry.tp.clone(),
                generation: entry.generation,
                error: Error::CorruptRecords {
                    partition: entry.tp.clone(),
                    violation: match v {
                        ProtocolViolation::Batch { reason, .. } => ProtocolViolation::Batch {
                            base_offset: bad_offset,
                            reason,
                        },
                        other => other,
                    },
                },
            });
        }
    }

    /// Stops a partition after the consumer found corrupt data in it.
    pub(crate) fn fail(&mut self, tp: &TopicPartition, generation: u64) {
        if let Some(s) = self.current(tp, generation) {
            s.position = Position::Failed;
        }
    }

    /// Marks every partition of a plan whose leader connection failed as needing a new leader.
    pub(crate) fn leaders_of(plan: &FetchPlan) -> Vec<TopicPartition> {
        plan.entries.iter().map(|e| e.tp.clone()).collect()
    }
}

fn topic_name(t: &str) -> TopicName {
    TopicName(StrBytes::from_string(t.to_owned()))
}

fn error_for(code: ResponseError, tp: &TopicPartition) -> Error {
    match code {
        ResponseError::UnknownTopicOrPartition | ResponseError::UnknownTopicId => {
            Error::UnknownPartition(tp.clone())
        }
        _ => Error::broker(code, format!("fetch of {tp}"), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::messages::MetadataResponse;
    use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
    use kafka_protocol::messages::list_offsets_response::{
        ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
    };
    use kafka_protocol::messages::metadata_response::{
        MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
    };
    use kafka_protocol::records::{
        Compression, Record as KpRecord, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    const TOPIC_ID: Uuid = Uuid::from_u128(42);

    fn cfg(reset: OffsetReset) -> FetchConfig {
        FetchConfig {
            max_wait_ms: 500,
            min_bytes: 1,
            max_bytes: 1 << 20,
            partition_max_bytes: 1 << 16,
            isolation: IsolationLevel::ReadUncommitted,
            reset,
            restore_reset: OffsetReset::Error,
            retry_backoff: Duration::from_millis(100),
            connections_per_broker: 1,
        }
    }

    /// Two partitions of "t", led by nodes 1 and 2.
    fn meta() -> Metadata {
        meta_with(&[1, 2])
    }

    /// Partitions of "t", partition `i` led by node `leaders[i]`.
    fn meta_with(leaders: &[i32]) -> Metadata {
        let mut m = Metadata::default();
        let broker = |id: i32| {
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(id))
                .with_host(StrBytes::from_static_str("127.0.0.1"))
                .with_port(9000 + id)
        };
        let part = |p: i32, leader: i32| {
            MetadataResponsePartition::default()
                .with_partition_index(p)
                .with_leader_id(BrokerId(leader))
                .with_leader_epoch(3)
        };
        m.handle_response(
            &MetadataResponse::default()
                .with_brokers(vec![broker(1), broker(2)])
                .with_topics(vec![
                    MetadataResponseTopic::default()
                        .with_name(Some(topic_name("t")))
                        .with_topic_id(TOPIC_ID)
                        .with_partitions(
                            (0..)
                                .zip(leaders)
                                .map(|(p, &leader)| part(p, leader))
                                .collect(),
                        ),
                ]),
        );
        m
    }

    fn tp(p: i32) -> TopicPartition {
        TopicPartition::new("t", p)
    }

    /// `n` one-record batches from `base`, as the broker sends them.
    fn batches(base: i64, n: i64) -> Bytes {
        let mut buf = BytesMut::new();
        for o in base..base + n {
            let r = KpRecord {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 3,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: TimestampType::Creation,
                offset: o,
                sequence: -1,
                timestamp: 1_700_000_000_000,
                key: None,
                value: Some(Bytes::from_static(b"v")),
                headers: Default::default(),
            };
            RecordBatchEncoder::encode(
                &mut buf,
                [r].iter(),
                &RecordEncodeOptions {
                    version: 2,
                    compression: Compression::None,
                },
            )
            .unwrap();
        }
        buf.freeze()
    }

    fn response(parts: Vec<PartitionData>) -> Result<FetchResponse, Error> {
        Ok(FetchResponse::default().with_responses(vec![
            FetchableTopicResponse::default()
                .with_topic_id(TOPIC_ID)
                .with_partitions(parts),
        ]))
    }

    fn data(p: i32, records: Bytes) -> PartitionData {
        PartitionData::default()
            .with_partition_index(p)
            .with_high_watermark(100)
            .with_records(Some(records))
    }

    fn error(p: i32, code: ResponseError) -> PartitionData {
        PartitionData::default()
            .with_partition_index(p)
            .with_error_code(code.code())
    }

    fn single<T: std::fmt::Debug>(plans: Vec<T>) -> T {
        assert_eq!(plans.len(), 1, "{plans:?}");
        plans.into_iter().next().unwrap()
    }

    fn chunks(out: &Outcome) -> Vec<&Chunk> {
        out.events
            .iter()
            .filter_map(|e| match e {
                FetchEvent::Chunk(c) => Some(c),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn start_positions_resolve_through_list_offsets() {
        let now = Instant::now();
        let m = meta();
        let mut f = FetchState::new(cfg(OffsetReset::Error));
        f.assign(
            vec![
                (tp(0), StartPosition::Timestamp(5), 1),
                (tp(1), StartPosition::Offset(7), 2),
            ],
            false,
        );
        assert_eq!(f.start_offset(&tp(1)), Some(Ok(7)));
        assert_eq!(f.start_offset(&tp(0)), None);
        let plan = single(f.plan_list_offsets(now, &m));
        assert_eq!(plan.node, 1);
        let req = f.list_offsets_request(&plan);
        assert_eq!(req.topics[0].partitions[0].timestamp, 5);
        assert_eq!(req.topics[0].partitions[0].current_leader_epoch, 3);
        // No timestamp at or after 5: the answer is -1, and the partition goes to the end.
        let answer = |offset: i64| {
            Ok(ListOffsetsResponse::default().with_topics(vec![
                ListOffsetsTopicResponse::default()
                    .with_name(topic_name("t"))
                    .with_partitions(vec![
                        ListOffsetsPartitionResponse::default()
                            .with_partition_index(0)
                            .with_offset(offset),
                    ]),
            ]))
        };
        f.handle_list_offsets(plan, answer(-1), now);
        let plan = single(f.plan_list_offsets(now, &m));
        assert_eq!(
            f.list_offsets_request(&plan).topics[0].partitions[0].timestamp,
            -1
        );
        f.handle_list_offsets(plan, answer(40), now);
        assert_eq!(f.start_offset(&tp(0)), Some(Ok(40)));
        assert!(f.plan_list_offsets(now, &m).is_empty());
    }

    #[test]
    fn one_fetch_per_leader_and_none_while_busy_or_in_flight() {
        let now = Instant::now();
        let m = meta();
        let mut f = FetchState::new(cfg(OffsetReset::Error));
        f.assign(
            vec![
                (tp(0), StartPosition::Offset(0), 1),
                (tp(1), StartPosition::Offset(0), 2),
            ],
            false,
        );
        let busy: HashSet<Lane> = [(2, 0)].into_iter().collect();
        let plan = single(f.plan_fetches(now, &m, &busy, 10 << 20));
        assert_eq!((plan.node, plan.lane), (1, 0));
        // In flight: not planned again, even with the leader free.
        assert!(
            f.plan_fetches(now, &m, &HashSet::new(), 10 << 20)
                .iter()
                .all(|p| p.node != 1)
        );
        let v13 = FetchState::fetch_request(&f.config(), &plan, 13);
        assert_eq!(v13.topics[0].topic_id, TOPIC_ID);
        assert_eq!((v13.session_id, v13.session_epoch), (0, -1));
        let v12 = FetchState::fetch_request(&f.config(), &plan, 12);
        assert_eq!(v12.topics[0].topic.0.as_str(), "t");
        assert!(
            f.plan_fetches(now, &m, &HashSet::new(), 0).is_empty(),
            "no budget, no fetch"
        );
    }

    /// The partitions in each plan (sorted), by lane.
    fn lanes(plans: &[FetchPlan]) -> Vec<(u8, Vec<i32>)> {
        plans
            .iter()
            .map(|p| {
                let mut parts: Vec<i32> = p.entries.iter().map(|e| e.tp.partition).collect();
                parts.sort_unstable();
                (p.lane, parts)
            })
            .collect()
    }

    /// Partitions `0..partitions` of "t", each to be read from offset 0 (generation 1).
    fn from_zero(partitions: i32) -> Vec<(TopicPartition, StartPosition, u64)> {
        (0..partitions)
            .map(|p| (tp(p), StartPosition::Offset(0), 1))
            .collect()
    }

    #[test]
    fn a_leaders_partitions_are_shared_out_over_its_connections() {
        let now = Instant::now();
        let m = meta_with(&[1; 8]);
        let all = || from_zero(8);
        let answered = |f: &mut FetchState, plan: FetchPlan| {
            // No data: the partitions are free again at the same positions.
            let out = f.handle_fetch(plan, response(vec![]), now);
            assert!(out.events.is_empty(), "{out:?}");
        };
        let busy = |lanes: &[u8]| -> HashSet<Lane> { lanes.iter().map(|&l| (1, l)).collect() };

        // One connection: every partition in one request, as the Java client does.
        let mut f = FetchState::new(cfg(OffsetReset::Error));
        f.assign(all(), false);
        let plan = single(f.plan_fetches(now, &m, &busy(&[]), 10 << 20));
        assert_eq!(lanes(&[plan]), [(0, (0..8).collect())]);

        // Two: half each, round robin in request order.
        let mut f = FetchState::new(FetchConfig {
            connections_per_broker: 2,
            ..cfg(OffsetReset::Error)
        });
        f.assign(all(), false);
        let plans = f.plan_fetches(now, &m, &busy(&[]), 10 << 20);
        let got = lanes(&plans);
        let (a, b) = (vec![0, 2, 4, 6], vec![1, 3, 5, 7]);
        assert!(
            got == [(0, a.clone()), (1, b.clone())] || got == [(0, b), (1, a)],
            "{got:?}"
        );
        // Each takes of the budget what its four partitions can return.
        assert_eq!(
            plans.iter().map(|p| p.max_bytes).collect::<Vec<_>>(),
            [4 << 16, 4 << 16]
        );
        // Every partition in flight: nothing more.
        assert!(f.plan_fetches(now, &m, &busy(&[]), 10 << 20).is_empty());
        // The first answered: its connection takes its partitions again, and only those.
        let mut plans = plans.into_iter();
        let first = plans.next().unwrap();
        let kept = lanes(std::slice::from_ref(&first));
        answered(&mut f, first);
        let again = f.plan_fetches(now, &m, &busy(&[1]), 10 << 20);
        assert_eq!(lanes(&again), kept);
        answered(&mut f, plans.next().unwrap());
        answered(&mut f, single(again));

        // A connection that comes free while the other is out takes no more than its share.
        // Lane 1 busy (by a request not of this state): lane 0 takes half, half waits.
        let plan = single(f.plan_fetches(now, &m, &busy(&[1]), 10 << 20));
        assert_eq!((plan.lane, plan.entries.len()), (0, 4));
        // Lane 1 free, lane 0 out: lane 1 takes the other half.
        let other = single(f.plan_fetches(now, &m, &busy(&[0]), 10 << 20));
        assert_eq!((other.lane, other.entries.len()), (1, 4));
        answered(&mut f, plan);
        answered(&mut f, other);

        // 7 out on lane 0 and 1 on lane 1 (three moved between two requests of 4 by hand):
        // once lane 0 is answered it takes 4 and leaves 3 for lane 1, which takes them (and its
        // own 1) once it is answered.
        let mut on_lane0 = single(f.plan_fetches(now, &m, &busy(&[1]), 10 << 20));
        let mut on_lane1 = single(f.plan_fetches(now, &m, &busy(&[0]), 10 << 20));
        on_lane0.entries.extend(on_lane1.entries.drain(..3));
        assert_eq!((on_lane0.entries.len(), on_lane1.entries.len()), (7, 1));
        answered(&mut f, on_lane0);
        let plan = single(f.plan_fetches(now, &m, &busy(&[1]), 10 << 20));
        assert_eq!((plan.lane, plan.entries.len()), (0, 4));
        answered(&mut f, on_lane1);
        let plan = single(f.plan_fetches(now, &m, &busy(&[0]), 10 << 20));
        assert_eq!((plan.lane, plan.entries.len()), (1, 4));

        // A budget for one request only: it carries every ready partition, none waits for a
        // connection the budget would not let fetch anyway.
        let mut f = FetchState::new(FetchConfig {
            connections_per_broker: 2,
            ..cfg(OffsetReset::Error)
        });
        f.assign(all(), false);
        let plan = single(f.plan_fetches(now, &m, &busy(&[]), 200 << 10));
        assert_eq!((plan.lane, plan.max_bytes), (0, 200 << 10));
        assert_eq!(plan.entries.len(), 8);
    }

    /// A budget below `fetch.max.bytes` still lets every connection fetch when each request's
    /// partitions can return no more than their share of it: a request reserves what its
    /// partitions can return, not `fetch.max.bytes` (which took the whole budget for one
    /// request, and left the other connection idle).
    #[test]
    fn a_request_reserves_what_its_partitions_can_return() {
        let now = Instant::now();
        let m = meta_with(&[1; 8]);
        let mut f = FetchState::new(FetchConfig {
            connections_per_broker: 2,
            ..cfg(OffsetReset::Error)
        });
        f.assign(from_zero(8), false);
        // 1 MiB fetch.max.bytes, 64 KiB per partition: four partitions return at most 256 KiB.
        let plans = f.plan_fetches(now, &m, &HashSet::new(), 512 << 10);
        let got: Vec<(u8, usize, i32)> = plans
            .iter()
            .map(|p| (p.lane, p.entries.len(), p.max_bytes))
            .collect();
        assert_eq!(got, [(0, 4, 256 << 10), (1, 4, 256 << 10)]);

        // One partition: its own limit.
        let mut f = FetchState::new(cfg(OffsetReset::Error));
        f.assign(vec![(tp(0), StartPosition::Offset(0), 1)], false);
        let plan = single(f.plan_fetches(now, &m, &HashSet::new(), 10 << 20));
        assert_eq!(plan.max_bytes, 1 << 16);

        // More partitions than fetch.max.bytes covers: fetch.max.bytes.
        let mut f = FetchState::new(FetchConfig {
            partition_max_bytes: 1 << 19,
            ..cfg(OffsetReset::Error)
        });
        f.assign(from_zero(8), false);
        let plan = single(f.plan_fetches(now, &m, &HashSet::new(), 10 << 20));
        assert_eq!((plan.entries.len(), plan.max_bytes), (8, 1 << 20));
    }

    #[test]
    fn partial_last_batch_is_left_for_the_next_fetch() {
        let now = Instant::now();
        let m = meta();
        let mut f = FetchState::new(cfg(OffsetReset::Error));
        f.assign(vec![(tp(0), StartPosition::Offset(10), 1)], false);
        let plan = single(f.plan_fetches(now, &m, &HashSet::new(), 1 << 20));
        let full = batches(10, 3);
        let cut = full.slice(..full.len() - 5);
        let out = f.handle_fetch(plan, response(vec![data(0, cut)]), now);
        let c = chunks(&out);
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].fetch_offset, c[0].next_offset), (10, 12));
        let plan = single(f.plan_fetches(now, &m, &HashSet::new(), 1 << 20));
        assert_eq!(plan.entries[0].offset, 12);
    }

    #[test]
    fn a_failed_list_offsets_after_a_seek_does_not_leave_the_partition_in_flight() {
        let now = Instant::now();
        let m = meta();
        let mut f = FetchState::new(cfg(OffsetReset::Error));
        f.assign(vec![(tp(0), StartPosition::Earliest, 1)], false);
        let plan = single(f.plan_list_offsets(now, &m));
        f.seek(&tp(0), StartPosition::Latest, 2);
        f.handle_list_offsets(plan, Err(Error::Closed), now);
        let plan = single(f.plan_list_offsets(now, &m));
        assert_eq!(
            f.list_offsets_request(&plan).topics[0].partitions[0].timestamp,
            -1
        );
    }

    /// A ListOffsets answer for partitions of "t": `(partition, error code, offset)`.
    fn list_answers(parts: &[(i32, i16, i64)]) -> Result<ListOffsetsResponse, Error> {
        Ok(ListOffsetsResponse::default().with_topics(vec![
            ListOffsetsTopicResponse::default()
                .with_name(topic_name("t"))
                .with_partitions(
                    parts
                        .iter()
                        .map(|&(p, code, offset)| {
                            ListOffsetsPartitionResponse::default()
                                .with_partition_index(p)
                                .with_error_code(code)
                                .with_offset(offset)
                        })
                        .collect(),
                ),
        ]))
    }

    /// Before metadata names a leader, the partitions to be listed go in one request sent ahead
    /// of it, without a leader epoch; partitions with an offset need none, and a partition in
    /// that request is in no other until its answer is in.
    #[test]
    fn list_offsets_ahead_of_metadata_asks_for_every_unresolved_partition() {
        let now = Instant::now();
        let mut f = FetchState::new(cfg(OffsetReset::Error));
        f.assign(
            vec![
                (tp(0), StartPosition::Earliest, 1),
                (tp(1), StartPosition::Latest, 1),
                (tp(2), StartPosition::Offset(4), 1),
            ],
            false,
        );
        let none = Metadata::default();
        let plan = f.plan_list_offsets_ahead(now, &none).expect("a plan");
        let req = f.list_offsets_request_ahead(&plan);
        let asked: Vec<(i32, i32, i64)> = req.topics[0]
            .partitions
            .iter()
            .map(|p| (p.partition_index, p.current_leader_epoch, p.timestamp))
            .collect();
        assert_eq!(asked, [(0, -1, -2), (1, -1, -1)]);
        assert!(
            f.plan_list_offsets_ahead(now, &none).is_none(),
            "asked twice"
        );
        // Metadata is in: the partitions are still out ahead of it.
        let m = meta_with(&[1, 1, 1]);
        assert!(f.plan_list_offsets(now, &m).is_empty(), "two ListOffsets");
        // Once a leader is known, nothing goes ahead of metadata.
        let mut f = FetchState::new(cfg(OffsetReset::Error));
        f.assign(vec![(tp(0), StartPosition::Earliest, 1)], false);
        assert!(f.plan_list_offsets_ahead(now, &m).is_none());
    }

    /// An answer sent ahead of metadata is taken for the partitions that the metadata, from the
    /// same broker, says it leads, and only where it has no error. Every other partition is
    /// listed again at once by its leader, with no back-off, as is every partition when the
    /// request failed or no node is known at the address that answered.
    #[test]
    fn list_offsets_ahead_of_metadata_is_taken_only_from_the_leader() {
        let now = Instant::now();
        let m = meta_with(&[1, 2, 1, 1]);
        let assign = |f: &mut FetchState| {
            f.assign(
                (0..4)
                    .map(|p| (tp(p), StartPosition::Earliest, 1))
                    .collect(),
                false,
            );
        };
        let mut f = FetchState::new(cfg(OffsetReset::Error));
        assign(&mut f);
        let plan = f
            .plan_list_offsets_ahead(now, &Metadata::default())
            .unwrap();
        let answer = list_answers(&[
            (0, 0, 10),
            // Led by node 2: whatever node 1 says of it is not taken.
            (1, 0, 11),
            (2, ResponseError::NotLeaderOrFollower.code(), -1),
            // Partition 3 is missing from the answer.
        ]);
        f.handle_list_offsets_ahead(plan, answer, &m, Some(1));
        assert_eq!(f.start_offset(&tp(0)), Some(Ok(10)));
        for p in 1..4 {
            assert_eq!(f.start_offset(&tp(p)), None, "partition {p}");
        }
        let mut listed: Vec<(i32, Vec<i32>)> = f
            .plan_list_offsets(now, &m)
            .iter()
            .map(|plan| {
                let req = f.list_offsets_request(plan);
                let parts = req.topics[0]
                    .partitions
                    .iter()
                    .map(|p| p.partition_index)
                    .collect();
                (plan.node, parts)
            })
            .collect();
        listed.iter_mut().for_each(|(_, parts)| parts.sort());
        listed.sort();
        assert_eq!(listed, [(1, vec![2, 3]), (2, vec![1])]);

        for (result, answered_by) in [
            (Err(Error::Closed), Some(1)),
            (list_answers(&[(0, 0, 10)]), None),
        ] {
            let mut f = FetchState::new(cfg(OffsetReset::Error));
            assign(&mut f);
            let plan = f
                .plan_list_offsets_ahead(now, &Metadata::default())
                .unwrap();
            f.handle_list_offsets_ahead(plan, result, &m, answered_by);
            assert_eq!(f.start_offset(&tp(0)), None);
            let listed: usize = f
                .plan_list_offsets(now, &m)
                .iter()
                .map(|p| p.partitions())
                .sum();
            assert_eq!(listed, 4);
        }
    }

    /// An answer sent ahead of metadata for a partition sought meanwhile is not taken: the seek's
    /// start position is listed instead.
    #[test]
    fn list_offsets_ahead_of_metadata_is_dropped_after_a_seek() {
        let now = Instant::now();
        let m = meta_with(&[1]);
        let mut f = FetchState::new(cfg(OffsetReset::Error));
        f.assign(vec![(tp(0), StartPosition::Earliest, 1)], false);
        let plan = f
            .plan_list_offsets_ahead(now, &Metadata::default())
            .unwrap();
        f.seek(&tp(0), StartPosition::Latest, 2);
        f.handle_list_offsets_ahead(plan, list_answers(&[(0, 0, 0)]), &m, Some(1));
        assert_eq!(f.start_offset(&tp(0)), None);
        let plan = single(f.plan_list_offsets(now, &m));
        assert_eq!(
            f.list_offsets_request(&plan).topics[0].partitions[0].timestamp,
            -1
        );
    }

    fn list_answer(p: i32, offset: i64) -> Result<ListOffsetsResponse, Error> {
        Ok(ListOffsetsResponse::default().with_topics(vec![
            ListOffsetsTopicResponse::default()
                .with_name(topic_name("t"))
                .with_partitions(vec![
                    ListOffsetsPartitionResponse::default()
                        .with_partition_index(p)
                        .with_offset(offset),
                ]),
        ]))
    }

    /// A partition the consumer failed (corrupt data in a chunk handed out earlier) while an
    /// offset reset's ListOffsets was out stays failed: the answer used to set its position,
    /// and fetching resumed after the failure had been reported.
    #[test]
    fn a_list_offsets_answer_does_not_restart_a_failed_partition() {
        let now = Instant::now();
        let m = meta();
        let mut f = FetchState::new(cfg(OffsetReset::Earliest));
        f.assign(vec![(tp(0), StartPosition::Offset(10), 1)], false);
        let plan = single(f.plan_fetches(now, &m, &HashSet::new(), 1 << 20));
        let out = f.handle_fetch(plan, response(vec![data(0, batches(10, 2))]), now);
        assert_eq!(chunks(&out).len(), 1);
        let plan = single(f.plan_fetches(now, &m, &HashSet::new(), 1 << 20));
        f.handle_fetch(
            plan,
            response(vec![error(0, ResponseError::OffsetOutOfRange)]),
            now,
        );
        let list = single(f.plan_list_offsets(now, &m));
        // The consumer decodes the first chunk and finds a corrupt batch.
        f.fail(&tp(0), 1);
        let out = f.handle_list_offsets(list, list_answer(0, 0), now);
        assert!(out.events.is_empty());
        assert!(f.plan_fetches(now, &m, &HashSet::new(), 1 << 20).is_empty());
        assert!(f.plan_list_offsets(now, &m).is_empty());
        // A seek restarts it.
        f.seek(&tp(0), StartPosition::Offset(0), 2);
        assert_eq!(
            single(f.plan_fetches(now, &m, &HashSet::new(), 1 << 20)).entries[0].offset,
            0
        );
    }

    /// A partition given up and assigned again (or assigned under a new generation) while its
    /// fetch is out waits for that fetch. The stale answer used to clear the new generation's
    /// in-flight mark, so a second ListOffsets went out for the same generation, and its late
    /// answer moved the position back after records had been handed out.
    #[test]
    fn a_partition_assigned_again_waits_for_its_old_request() {
        let now = Instant::now();
        let m = meta();
        let mut f = FetchState::new(cfg(OffsetReset::Error));
        f.assign(vec![(tp(0), StartPosition::Offset(0), 1)], false);
        let old = single(f.plan_fetches(now, &m, &HashSet::new(), 1 << 20));
        f.unassign(&[tp(0)]);
        f.add(vec![(tp(0), StartPosition::Earliest, 2)], false);
        assert!(
            f.plan_list_offsets(now, &m).is_empty(),
            "the old fetch is still out"
        );
        let out = f.handle_fetch(old, response(vec![data(0, batches(0, 5))]), now);
        assert!(
            out.events.is_empty(),
            "the old generation's data is dropped"
        );
        let list = single(f.plan_list_offsets(now, &m));
        // Re-assigned under yet another generation while the ListOffsets is out: still one
        // request at a time.
        f.assign(vec![(tp(0), StartPosition::Earliest, 3)], false);
        assert!(f.plan_list_offsets(now, &m).is_empty(), "two ListOffsets");
        f.handle_list_offsets(list, list_answer(0, 7), now);
        let list = single(f.plan_list_offsets(now, &m));
        assert!(f.plan_list_offsets(now, &m).is_empty(), "two ListOffsets");
        f.handle_list_offsets(list, list_answer(0, 0), now);
        let plan = single(f.plan_fetches(now, &m, &HashSet::new(), 1 << 20));
        assert_eq!((plan.entries[0].offset, plan.entries[0].generation), (0, 3));
        let out = f.handle_fetch(plan, response(vec![data(0, batches(0, 3))]), now);
        assert_eq!(chunks(&out)[0].next_offset, 3);
        let plan = single(f.plan_fetches(now, &m, &HashSet::new(), 1 << 20));
        assert_eq!(
            plan.entries[0].offset, 3,
            "the position stays where the data left it"
        );
    }

    #[test]
    fn a_response_after_a_seek_is_dropped() {
        let now = Instant::now();
        let m = meta();
        let mut f = FetchState::new(cfg(OffsetReset::Error));
        f.assign(vec![(tp(0), StartPosition::Offset(0), 1)], false);
        let plan = single(f.plan_fetches(now, &m, &HashSet::new(), 1 << 20));
        f.seek(&tp(0), StartPosition::Offset(50), 2);
        let out = f.handle_fetch(plan, response(vec![data(0, batches(0, 5))]), now);
        assert!(out.events.is_empty());
        let plan = single(f.plan_fetches(now, &m, &HashSet::new(), 1 << 20));
        assert_eq!(plan.entries[0].offset, 50);
        assert_eq!(plan.entries[0].generation, 2);
    }

    #[test]
    fn out_of_range_follows_the_policy() {
        let now = Instant::now();
        let m = meta();
        for (reset, restored, expect) in [
            (OffsetReset::Error, false, None),
            (OffsetReset::Earliest, false, Some(-2)),
            (OffsetReset::Latest, false, Some(-1)),
            // Restored partitions use the restore policy (Error here), not auto.offset.reset.
            (OffsetReset::Earliest, true, None),
        ] {
            let mut f = FetchState::new(cfg(reset));
            f.assign(vec![(tp(0), StartPosition::Offset(500), 1)], restored);
            let plan = single(f.plan_fetches(now, &m, &HashSet::new(), 1 << 20));
            let out = f.handle_fetch(
                plan,
                response(vec![error(0, ResponseError::OffsetOutOfRange)]),
                now,
            );
            match expect {
                None => {
                    assert!(matches!(
                        &out.events[..],
                        [FetchEvent::Failed {
                            error: Error::OffsetOutOfRange { offset: 500, .. },
                            ..
                        }]
                    ));
                    assert!(f.plan_list_offsets(now, &m).is_empty());
                    assert!(f.plan_fetches(now, &m, &HashSet::new(), 1 << 20).is_empty());
                }
                Some(ts) => {
                    assert!(out.events.is_empty());
                    let plan = single(f.plan_list_offsets(now, &m));
                    assert_eq!(
                        f.list_offsets_request(&plan).topics[0].partitions[0].timestamp,
                        ts
                    );
                }
            }
        }
    }

    #[test]
    fn leadership_errors_refresh_metadata_and_back_off() {
        let now = Instant::now();
        let m = meta();
        let mut f = FetchState::new(cfg(OffsetReset::Error));
        f.assign(vec![(tp(0), StartPosition::Offset(0), 1)], false);
        let plan = single(f.plan_fetches(now, &m, &HashSet::new(), 1 << 20));
        let out = f.handle_fetch(
            plan,
            response(vec![error(0, ResponseError::NotLeaderOrFollower)]),
            now,
        );
        assert!(out.refresh_metadata);
        assert!(out.events.is_empty());
        assert!(
            f.plan_fetches(now, &m, &HashSet::new(), 1 << 20).is_empty(),
            "backing off"
        );
        let later = f.next_retry().unwrap();
        let plan = single(f.plan_fetches(later, &m, &HashSet::new(), 1 << 20));
        assert_eq!(plan.entries[0].offset, 0, "the position did not move");
        // A transport failure does the same for every partition of the request.
        let out = f.handle_fetch(plan, Err(Error::Closed), later);
        assert!(out.refresh_metadata);
        // A fatal code stops the partition and reports it.
        let mut f = FetchState::new(cfg(OffsetReset::Error));
        f.assign(vec![(tp(0), StartPosition::Offset(0), 1)], false);
        let plan = single(f.plan_fetches(now, &m, &HashSet::new(), 1 << 20));
        let out = f.handle_fetch(
            plan,
            response(vec![error(0, ResponseError::TopicAuthorizationFailed)]),
            now,
        );
        assert!(matches!(
            &out.events[..],
            [FetchEvent::Failed { error, .. }] if error.kafka_code() == Some(ResponseError::TopicAuthorizationFailed)
        ));
    }

    #[test]
    fn a_corrupt_batch_after_good_ones_hands_out_the_good_ones_and_stops() {
        let now = Instant::now();
        let m = meta();
        let mut f = FetchState::new(cfg(OffsetReset::Error));
        f.assign(vec![(tp(0), StartPosition::Offset(0), 1)], false);
        let plan = single(f.plan_fetches(now, &m, &HashSet::new(), 1 << 20));
        let good = batches(0, 2);
        let mut bad = BytesMut::from(&batches(2, 1)[..]);
        bad[16] = 9; // magic
        let mut all = BytesMut::from(&good[..]);
        all.extend_from_slice(&bad);
        let out = f.handle_fetch(plan, response(vec![data(0, all.freeze())]), now);
        let c = chunks(&out);
        assert_eq!(c[0].next_offset, 2);
        assert!(
            out.events
                .iter()
                .any(|e| matches!(e, FetchEvent::Failed { .. }))
        );
        assert!(f.plan_fetches(now, &m, &HashSet::new(), 1 << 20).is_empty());
    }
}
