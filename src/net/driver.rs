//! The network loop: one task per consumer that owns the fetch state machine, the metadata,
//! and every request in flight.
//!
//! Each turn it plans (metadata refresh, ListOffsets, one Fetch per idle data connection within
//! the memory budget), then waits for whichever comes first: a command from the consumer, a
//! response, freed budget, or a timer. Requests run as futures the loop polls; none of them
//! blocks the loop, and a request's response is never dropped half-read (the connection's
//! reader owns the socket).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use std::collections::BTreeMap;

use kafka_protocol::error::ParseResponseErrorCode;
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::{
    FetchResponse, FindCoordinatorResponse, GroupId, ListOffsetsResponse, MetadataResponse,
    OffsetCommitResponse, OffsetFetchRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;

use crate::checkpoint::{CheckpointShared, CommitOutcome};
use crate::error::{Error, Result};
use crate::net::inflight::InFlight;
use crate::net::pool::{ConnKey, Pool};
use crate::proto::commit::{self, Action, Committer, Finished};
use crate::proto::crc_scan::Checked;
use crate::proto::fetch::{
    AheadPlan, Chunk, FetchEvent, FetchPlan, FetchState, Lane, Lease, ListPlan, Outcome,
};
use crate::proto::group::Membership;
use crate::proto::metadata::{Metadata, TopicProblem};
use crate::proto::versions;
use crate::types::{StartPosition, TopicPartition};

mod group;

pub(crate) use group::Topics;

/// State shared between the consumer handle and its network loop.
#[derive(Debug)]
pub(crate) struct Shared {
    /// Bytes of fetch responses with records not yet handed out, each counted whole (see
    /// [`FetchedBytes`]), and decompressed bytes (plus those of the batch last handed out).
    pub(crate) buffered: AtomicUsize,
    /// Signalled when `buffered` drops while the loop waits for budget, so it can fetch again.
    pub(crate) budget_freed: Notify,
    /// Set by the loop while it holds fetches back for want of budget; only then does a
    /// release wake it (otherwise every chunk the application finished would).
    wants_budget: AtomicBool,
    /// Releases so far (wrapping): lets the loop see a release that raced with setting
    /// `wants_budget`.
    releases: AtomicUsize,
    /// Fetch requests sent.
    pub(crate) fetches_sent: AtomicUsize,
    /// Fetch responses (or failures) received.
    pub(crate) fetches_done: AtomicUsize,
    /// The group coordinator's node id, or -1.
    pub(crate) coordinator: std::sync::atomic::AtomicI32,
    /// When the application last called `poll`, in ms since the loop started.
    pub(crate) last_poll_ms: std::sync::atomic::AtomicU64,
    /// True while the application waits in `poll` (waiting counts as polling).
    pub(crate) in_poll: std::sync::atomic::AtomicBool,
    /// The origin of `last_poll_ms`.
    pub(crate) epoch: std::time::Instant,
    /// Set by the loop when the member left for `max.poll.interval.ms`; the next poll wakes
    /// the loop (`Command::Polled`) so that it joins again at once.
    pub(crate) left_for_poll_timeout: std::sync::atomic::AtomicBool,
}

impl Shared {
    /// The application is done with `bytes` of fetched data: gives them back to the budget,
    /// waking the loop if it waits for budget.
    pub(crate) fn release(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        // SeqCst here and in `wait_for_budget`: either this sees the loop's flag, or the loop
        // sees this release in `releases` (neither can miss both).
        self.buffered.fetch_sub(bytes, Ordering::SeqCst);
        self.releases.fetch_add(1, Ordering::SeqCst);
        if self.wants_budget.load(Ordering::SeqCst)
            && self.wants_budget.swap(false, Ordering::SeqCst)
        {
            self.budget_freed.notify_one();
        }
    }

    /// Called by the loop when budget holds fetches back. `releases_seen` was read before the
    /// `buffered` value the loop planned with: a release after it (whose flag check may have
    /// come before the flag was set) makes the loop's next wait end at once.
    fn wait_for_budget(&self, releases_seen: usize) {
        self.wants_budget.store(true, Ordering::SeqCst);
        if self.releases.load(Ordering::SeqCst) != releases_seen {
            self.budget_freed.notify_one();
        }
    }

    /// Records a call to `poll` (`waiting`: it is about to wait for data).
    pub(crate) fn polled(&self, waiting: bool) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_poll_ms.store(ms, Ordering::Release);
        self.in_poll.store(waiting, Ordering::Release);
    }
}

impl Default for Shared {
    fn default() -> Self {
        Self {
            buffered: AtomicUsize::new(0),
            budget_freed: Notify::new(),
            wants_budget: AtomicBool::new(false),
            releases: AtomicUsize::new(0),
            fetches_sent: AtomicUsize::new(0),
            fetches_done: AtomicUsize::new(0),
            coordinator: std::sync::atomic::AtomicI32::new(-1),
            last_poll_ms: std::sync::atomic::AtomicU64::new(0),
            in_poll: std::sync::atomic::AtomicBool::new(false),
            epoch: std::time::Instant::now(),
            left_for_poll_timeout: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

/// Committed offsets as OffsetFetch reports them (`None`: nothing committed).
pub(crate) type Committed = BTreeMap<TopicPartition, Option<i64>>;

/// What the consumer asks of its loop.
#[derive(Debug)]
pub(crate) enum Command {
    /// The new assignment; `true` when it comes from a restored checkpoint.
    Assign(Vec<(TopicPartition, StartPosition, u64)>, bool),
    Seek(TopicPartition, StartPosition, u64),
    /// Subscribe mode: partitions the group assigned; `true` when from a restored checkpoint.
    Add(Vec<(TopicPartition, StartPosition, u64)>, bool),
    /// Subscribe mode: partitions given up.
    Unassign(Vec<TopicPartition>),
    Pause(Vec<TopicPartition>, bool),
    /// The consumer found corrupt data at this generation; stop fetching.
    Fail(TopicPartition, u64),
    StartOffset(TopicPartition, oneshot::Sender<Result<i64>>),
    /// The group's committed offsets for these partitions (OffsetFetch).
    Committed(Vec<TopicPartition>, oneshot::Sender<Result<Committed>>),
    /// Join the group with this subscription.
    Subscribe(Topics),
    /// Classic protocol: the assignors to offer, replacing `partition.assignment.strategy`.
    Assignors(Vec<Arc<dyn crate::assignor::Assignor>>),
    /// The application gave up the partitions of the last `Delivery::Revoke`.
    RevokeDone,
    /// The application polls again after the member left for `max.poll.interval.ms`.
    Polled,
    Close(oneshot::Sender<()>),
}

/// What the loop hands the consumer.
#[derive(Debug)]
pub(crate) enum Delivery {
    Chunk(Chunk),
    Failed {
        tp: TopicPartition,
        generation: u64,
        error: Error,
    },
    /// An error not tied to one partition (e.g. a topic that does not exist).
    Error(Error),
    /// The group takes these partitions away; answer with `Command::RevokeDone`.
    Revoke(Vec<TopicPartition>),
    /// These partitions are no longer this member's (the membership was lost).
    Lost(Vec<TopicPartition>),
    /// The group assigned these partitions, with their committed offsets.
    Assigned {
        added: Vec<(TopicPartition, Option<i64>)>,
    },
}

enum Completion {
    /// A Metadata answer, the address that gave it, and the answer to a ListOffsets sent right
    /// behind it.
    Metadata {
        res: Result<MetadataResponse>,
        at: Option<String>,
        ahead: Option<(AheadPlan, Result<ListOffsetsResponse>)>,
    },
    List(ListPlan, Result<ListOffsetsResponse>),
    /// A Fetch answer: the response, the batches checked as it arrived, and its length.
    Fetch(FetchPlan, Result<(FetchResponse, Checked, usize)>),
    FindCoordinator(u64, Result<FindCoordinatorResponse>),
    Commit(u64, Result<OffsetCommitResponse>),
    /// A query finished and its answer went to its own channel, or a connection was warmed up:
    /// nothing left to handle.
    Answered,
    GroupFind(u64, Result<(i32, String)>),
    Join(u64, Result<kafka_protocol::messages::JoinGroupResponse>),
    LeaderMetadata(u64, Result<BTreeMap<String, i32>>),
    Sync(u64, Result<kafka_protocol::messages::SyncGroupResponse>),
    Heartbeat(u64, Result<kafka_protocol::messages::HeartbeatResponse>),
    ConsumerHeartbeat(
        u64,
        Result<kafka_protocol::messages::ConsumerGroupHeartbeatResponse>,
    ),
    /// Committed offsets of a new assignment.
    Positions(Vec<TopicPartition>, i32, Result<Committed>),
    /// A LeaveGroup (or leave heartbeat) finished.
    Left,
}

/// Fetched bytes counted against the budget from when this is made until it is dropped: a
/// whole fetch response, shared by the chunks cut from it and released when the last of them
/// is done with, or a paused partition's records copied out of one.
///
/// A response is counted whole: headers, every partition's records, and the partial batch a
/// broker may end a partition with, which no chunk holds but which stays in memory with the
/// rest. Counting only each chunk's complete batches, each released as the chunk was decoded,
/// let the responses still held grow past the budget.
struct FetchedBytes {
    bytes: usize,
    shared: Arc<Shared>,
}

impl Drop for FetchedBytes {
    fn drop(&mut self) {
        self.shared.release(self.bytes);
    }
}

/// Counts `bytes` against the budget until the lease is dropped.
pub(crate) fn lease(shared: &Arc<Shared>, bytes: usize) -> Lease {
    shared.buffered.fetch_add(bytes, Ordering::AcqRel);
    Arc::new(FetchedBytes {
        bytes,
        shared: Arc::clone(shared),
    })
}

/// Gives each chunk of one response a share of its lease, and the last chunk the lease itself:
/// once the chunks are sent, the loop holds no share, so the response stops counting against
/// the budget the moment the application is done with the last of its records, not whenever
/// the loop's thread next runs.
fn share_lease(events: &mut [FetchEvent], mut lease: Option<Lease>) {
    let mut chunks = events
        .iter_mut()
        .filter_map(|ev| match ev {
            FetchEvent::Chunk(c) => Some(c),
            FetchEvent::Failed { .. } => None,
        })
        .peekable();
    while let Some(chunk) = chunks.next() {
        chunk.lease = if chunks.peek().is_some() {
            lease.clone()
        } else {
            lease.take()
        };
    }
}

/// Settings the loop needs beyond the fetch state machine's.
#[derive(Clone, Debug)]
pub(crate) struct DriverConfig {
    pub(crate) budget: usize,
    pub(crate) max_wait: Duration,
    pub(crate) metadata_max_age: Duration,
    pub(crate) retry_backoff: Duration,
    pub(crate) group: Option<String>,
    pub(crate) close_timeout: Duration,
    pub(crate) request_timeout: Duration,
    pub(crate) max_poll_interval: Duration,
}

pub(crate) struct Driver {
    cfg: DriverConfig,
    pool: Arc<Pool>,
    shared: Arc<Shared>,
    meta: Metadata,
    fetch: FetchState,
    commands: mpsc::UnboundedReceiver<Command>,
    out: mpsc::UnboundedSender<Delivery>,
    inflight: InFlight<Completion>,
    /// Data connections with a fetch in flight.
    busy: HashSet<Lane>,
    /// Bytes reserved by fetches in flight.
    reserved: usize,
    metadata_in_flight: bool,
    metadata_wanted: bool,
    metadata_at: Option<Instant>,
    metadata_not_before: Instant,
    metadata_failures: u32,
    reported_topics: HashSet<Arc<str>>,
    start_waiters: Vec<(TopicPartition, oneshot::Sender<Result<i64>>)>,
    ckpt: Arc<CheckpointShared>,
    committer: Option<Committer>,
    closing: Option<(oneshot::Sender<()>, Instant)>,
    group: Option<Membership>,
    subscription: Option<Topics>,
    events: group::EventQueue,
    fatal_reported: bool,
    poll_timed_out: bool,
    /// Leave requests in flight.
    leaving: usize,
    /// The leave was sent (at close).
    left: bool,
}

impl Driver {
    #[allow(clippy::too_many_arguments)] // each is a distinct part the loop owns; a struct would only rename them
    pub(crate) fn new(
        cfg: DriverConfig,
        pool: Arc<Pool>,
        shared: Arc<Shared>,
        fetch: FetchState,
        commands: mpsc::UnboundedReceiver<Command>,
        out: mpsc::UnboundedSender<Delivery>,
        ckpt: Arc<CheckpointShared>,
        committer: Option<Committer>,
        group: Option<Membership>,
    ) -> Self {
        Self {
            ckpt,
            committer,
            closing: None,
            group,
            subscription: None,
            events: group::EventQueue::default(),
            fatal_reported: false,
            poll_timed_out: false,
            leaving: 0,
            left: false,
            cfg,
            pool,
            shared,
            meta: Metadata::default(),
            fetch,
            commands,
            out,
            inflight: InFlight::new(),
            busy: HashSet::new(),
            reserved: 0,
            metadata_in_flight: false,
            metadata_wanted: true,
            metadata_at: None,
            metadata_not_before: Instant::now(),
            metadata_failures: 0,
            reported_topics: HashSet::new(),
            start_waiters: Vec::new(),
        }
    }

    /// Runs until the consumer closes or is dropped.
    pub(crate) async fn run(mut self) {
        // One timer for the whole loop, moved only when the wake time changes. A timer made
        // and dropped every turn is registered in and removed from the runtime's timer wheel
        // on every response and commit, and each registration earlier than the runtime's own
        // next wake-up also wakes its I/O driver: a write to its eventfd, then an extra
        // `epoll_wait`. Moving a registered timer later costs neither.
        let timer = tokio::time::sleep_until(Instant::now());
        tokio::pin!(timer);
        loop {
            // Take a completed checkpoint's offsets at the top of every turn.
            if let Some(req) = self.ckpt.handover.take() {
                self.offer_commit(req);
            }
            let now = Instant::now();
            if self.close_done(now) {
                return;
            }
            self.schedule(now);
            let wake = self.next_wake(now);
            if let Some(at) = wake
                && timer.deadline() != at
            {
                timer.as_mut().reset(at);
            }
            let ckpt = Arc::clone(&self.ckpt);
            tokio::select! {
                biased;
                () = ckpt.handover.notified() => {}
                cmd = self.commands.recv(), if self.closing.is_none() => match cmd {
                    Some(Command::Close(done)) => {
                        let deadline = Instant::now() + self.cfg.close_timeout;
                        self.closing = Some((done, deadline));
                    }
                    Some(cmd) => self.handle_command(cmd),
                    None => return,
                },
                done = self.inflight.next(), if !self.inflight.is_empty() => {
                    self.handle_completion(done);
                }
                () = self.shared.budget_freed.notified() => {}
                () = &mut timer, if wake.is_some() => {}
            }
        }
    }

    /// While closing: done once no commit is left, or the close deadline passed (what is left
    /// is reported timed out).
    fn close_done(&mut self, now: Instant) -> bool {
        let Some((_, deadline)) = &self.closing else {
            return false;
        };
        let deadline = *deadline;
        let idle = self.committer.as_ref().is_none_or(Committer::is_idle);
        if !idle && now < deadline {
            return false;
        }
        // Then leave the group, and wait for the answer within the same deadline.
        if !self.left {
            self.left = true;
            self.leave_group();
        }
        if self.leaving > 0 && now < deadline {
            return false;
        }
        if let Some(c) = self.committer.as_mut() {
            for req in c.take_all() {
                self.ckpt.report(CommitOutcome {
                    checkpoint_id: req.checkpoint_id,
                    latency: req.created.elapsed(),
                    offsets: req.offsets,
                    outcome: crate::checkpoint::Outcome::TimedOut,
                });
            }
        }
        if let Some((done, _)) = self.closing.take() {
            let _ = done.send(());
        }
        true
    }

    fn offer_commit(&mut self, req: crate::checkpoint::CommitRequest) {
        let Some(c) = self.committer.as_mut() else {
            return;
        };
        c.offer(req);
        self.report_superseded();
    }

    fn report_superseded(&mut self) {
        let Some(c) = self.committer.as_mut() else {
            return;
        };
        let early = c.take_finished();
        for old in c.take_superseded() {
            self.ckpt.report(CommitOutcome {
                checkpoint_id: old.checkpoint_id,
                latency: old.created.elapsed(),
                offsets: old.offsets,
                outcome: crate::checkpoint::Outcome::Superseded,
            });
        }
        for f in early {
            self.finish_commit(f);
        }
    }

    fn finish_commit(&mut self, f: Finished) {
        if !f.stored.is_empty() {
            self.ckpt.acked(f.stored);
        }
        self.ckpt.report(CommitOutcome {
            checkpoint_id: f.request.checkpoint_id,
            latency: f.request.created.elapsed(),
            offsets: f.request.offsets,
            outcome: f.outcome,
        });
    }

    fn next_wake(&self, now: Instant) -> Option<Instant> {
        let mut wake = self.fetch.next_retry().map(Instant::from_std);
        if let Some(t) = self.committer.as_ref().and_then(Committer::next_timeout) {
            let t = Instant::from_std(t);
            wake = Some(wake.map_or(t, |w| w.min(t)));
        }
        if let Some((_, t)) = &self.closing {
            wake = Some(wake.map_or(*t, |w| w.min(*t)));
        }
        if let Some(t) = self.group_wake() {
            wake = Some(wake.map_or(t, |w| w.min(t)));
        }
        let meta_due = metadata_due(
            self.metadata_wanted,
            self.fetch.needs_metadata(&self.meta),
            self.metadata_not_before,
            self.metadata_at,
            self.cfg.metadata_max_age,
        );
        if !self.metadata_in_flight
            && let Some(t) = meta_due
        {
            wake = Some(wake.map_or(t, |w| w.min(t)));
        }
        wake.map(|w| w.max(now))
    }

    fn handle_command(&mut self, cmd: Command) {
        match cmd {
            Command::Assign(list, restored) => {
                self.fetch.assign(list, restored);
                self.metadata_wanted = true;
                self.start_waiters
                    .retain(|(tp, _)| self.fetch.is_assigned(tp));
            }
            Command::Seek(tp, pos, generation) => {
                let owned = self.group.as_ref().is_some_and(|m| m.owned().contains(&tp));
                if !self.fetch.seek(&tp, pos, generation) && owned {
                    // An owned partition that had no start position yet.
                    self.fetch.add(vec![(tp, pos, generation)], false);
                    self.metadata_wanted = true;
                }
            }
            Command::Add(list, restored) => {
                self.fetch.add(list, restored);
                self.metadata_wanted = true;
            }
            Command::Unassign(tps) => {
                self.fetch.unassign(&tps);
                self.start_waiters
                    .retain(|(tp, _)| self.fetch.is_assigned(tp));
            }
            Command::Pause(tps, paused) => {
                for tp in &tps {
                    self.fetch.set_paused(tp, paused);
                }
            }
            Command::Fail(tp, generation) => self.fetch.fail(&tp, generation),
            Command::StartOffset(tp, reply) => {
                if !self.fetch.is_assigned(&tp) {
                    let _ = reply.send(Err(Error::NotAssigned(tp)));
                    return;
                }
                self.start_waiters.push((tp, reply));
                self.answer_start_waiters();
            }
            Command::Committed(tps, reply) => self.query_committed(tps, reply),
            Command::Subscribe(topics) => self.subscribe(topics),
            Command::Assignors(list) => {
                if let Some(Membership::Classic(c)) = self.group.as_mut() {
                    c.set_assignors(list);
                }
            }
            Command::RevokeDone => self.revoke_done(),
            // The turn this command starts notices the poll and joins again.
            Command::Polled => {}
            Command::Close(_) => {}
        }
    }

    fn query_committed(
        &mut self,
        tps: Vec<TopicPartition>,
        reply: oneshot::Sender<Result<Committed>>,
    ) {
        let Some(group) = self.cfg.group.clone() else {
            let _ = reply.send(Err(Error::config(
                "group.id",
                "committed offsets need a group.id",
            )));
            return;
        };
        let pool = Arc::clone(&self.pool);
        let deadline = Instant::now() + self.cfg.request_timeout;
        let backoff = self.cfg.retry_backoff;
        self.inflight.push(Box::pin(async move {
            // Retriable errors (the coordinator loading or moving, an unstable offset under
            // require_stable, I/O) are retried until the request timeout, as Java's
            // committed() does.
            let result = loop {
                match offset_fetch(&pool, &group, tps.clone()).await {
                    Err(e) if e.is_retriable() && Instant::now() + backoff < deadline => {
                        tracing::debug!(error = %e, "OffsetFetch failed; retrying");
                        tokio::time::sleep(backoff).await;
                    }
                    other => break other,
                }
            };
            let _ = reply.send(result);
            Completion::Answered
        }));
    }

    fn answer_start_waiters(&mut self) {
        let waiters = std::mem::take(&mut self.start_waiters);
        for (tp, reply) in waiters {
            match self.fetch.start_offset(&tp) {
                Some(Ok(o)) => {
                    let _ = reply.send(Ok(o));
                }
                Some(Err(())) => {
                    let _ = reply.send(Err(Error::NotAssigned(tp)));
                }
                None if !reply.is_closed() => self.start_waiters.push((tp, reply)),
                None => {}
            }
        }
    }

    fn schedule(&mut self, now: Instant) {
        let std_now = now.into_std();
        if let Some(f) = self
            .committer
            .as_mut()
            .and_then(|c| c.handle_timeout(std_now))
        {
            self.finish_commit(f);
        }
        // Metadata: when wanted (after an error, at start, when leaders are unknown), or when
        // it is older than metadata.max.age.
        if !self.metadata_in_flight {
            let stale = self
                .metadata_at
                .is_none_or(|t| now >= t + self.cfg.metadata_max_age);
            let wanted = self.metadata_wanted || self.fetch.needs_metadata(&self.meta);
            let req = if (stale || wanted) && now >= self.metadata_not_before {
                self.metadata_request()
            } else {
                None
            };
            if let Some(req) = req {
                self.metadata_in_flight = true;
                self.metadata_wanted = false;
                let ahead = self
                    .fetch
                    .plan_list_offsets_ahead(std_now, &self.meta)
                    .map(|plan| {
                        let req = self.fetch.list_offsets_request_ahead(&plan);
                        (plan, req)
                    });
                self.pool
                    .want_spares(self.fetch.lanes_for(self.fetch.assigned()));
                let pool = Arc::clone(&self.pool);
                self.inflight.push(Box::pin(async move {
                    let conn = match pool.any().await {
                        Ok(conn) => conn,
                        Err(e) => {
                            return Completion::Metadata {
                                res: Err(e),
                                at: None,
                                ahead: ahead.map(|(plan, _)| (plan, Err(Error::Closed))),
                            };
                        }
                    };
                    let answered = Notify::new();
                    let metadata = async {
                        let v = conn.version(versions::METADATA)?;
                        let res = conn.request(&req, v, Duration::ZERO).await;
                        answered.notify_one();
                        res
                    };
                    // `join!` polls the Metadata request first, so it is written first.
                    // ListOffsets goes to the same address on the spare opened beside this
                    // connection, once that has negotiated its versions: the broker then
                    // answers both at once, where on one connection it would take them one
                    // after the other. If Metadata is answered first (the spare is slow, or
                    // there is none), ListOffsets follows on this connection.
                    let listed = async {
                        let (_, req) = ahead.as_ref()?;
                        let spare = tokio::select! {
                            biased;
                            spare = pool.spare_beside(&conn) => spare,
                            () = answered.notified() => None,
                        };
                        let on = spare.as_deref().unwrap_or(&conn);
                        let listed = async {
                            let v = on.version(versions::LIST_OFFSETS)?;
                            on.request(req, v, Duration::ZERO).await
                        };
                        Some(listed.await)
                    };
                    let (res, listed) = futures::join!(metadata, listed);
                    Completion::Metadata {
                        res,
                        at: Some(conn.broker().addr().to_owned()),
                        ahead: ahead.zip(listed).map(|((plan, _), listed)| (plan, listed)),
                    }
                }));
            }
        }
        for plan in self.fetch.plan_list_offsets(std_now, &self.meta) {
            let req = self.fetch.list_offsets_request(&plan);
            let pool = Arc::clone(&self.pool);
            // The partitions' first Fetches go to the same leader on its data connections:
            // connect them (and negotiate their versions) while ListOffsets is answered,
            // instead of after. A failure here is met again, and reported, by a Fetch.
            for lane in 0..self.fetch.lanes_for(plan.partitions()) {
                let warm = Arc::clone(&pool);
                let node = plan.node;
                self.inflight.push(Box::pin(async move {
                    let _ = warm.get(ConnKey::Data((node, lane))).await;
                    Completion::Answered
                }));
            }
            self.inflight.push(Box::pin(async move {
                let res = async {
                    let conn = pool.get(ConnKey::Control(plan.node)).await?;
                    let v = conn.version(versions::LIST_OFFSETS)?;
                    conn.request(&req, v, Duration::ZERO).await
                }
                .await;
                Completion::List(plan, res)
            }));
        }
        self.schedule_group(now);
        while let Some(action) = self.committer.as_mut().and_then(|c| c.poll_action(std_now)) {
            self.spawn_commit_action(action);
        }
        self.report_superseded();
        // A commit that ended without a request may have drained a revocation's commits.
        self.finish_revocation_if_drained(now);
        let releases = self.shared.releases.load(Ordering::SeqCst);
        let buffered = self.shared.buffered.load(Ordering::SeqCst);
        let budget = self.pool.frames().room_beside(
            self.cfg
                .budget
                .saturating_sub(buffered)
                .saturating_sub(self.reserved),
        );
        let plans = if budget == 0 {
            Vec::new()
        } else {
            self.fetch
                .plan_fetches(std_now, &self.meta, &self.busy, budget)
        };
        let planned: usize = plans.iter().map(|p| p.max_bytes as usize).sum();
        if planned >= budget {
            // All of it is taken: a fetch may be held back until the application frees some.
            self.shared.wait_for_budget(releases);
        } else {
            self.shared.wants_budget.store(false, Ordering::SeqCst);
        }
        for plan in plans {
            self.busy.insert(plan.connection());
            self.reserved += plan.max_bytes as usize;
            self.shared.fetches_sent.fetch_add(1, Ordering::Relaxed);
            let pool = Arc::clone(&self.pool);
            let fetch_cfg = self.fetch.config();
            let max_wait = self.cfg.max_wait;
            self.inflight.push(Box::pin(async move {
                let res = async {
                    let conn = pool.get(ConnKey::Data(plan.connection())).await?;
                    // Built once the broker's version is known: v12 names topics, v13+ ids.
                    let v = conn.version(versions::FETCH)?;
                    let req = FetchState::fetch_request(&fetch_cfg, &plan, v);
                    conn.request_checked(&req, v, max_wait).await
                }
                .await;
                Completion::Fetch(plan, res)
            }));
        }
    }

    fn spawn_commit_action(&mut self, action: Action) {
        let pool = Arc::clone(&self.pool);
        let group = self.cfg.group.clone().unwrap_or_default();
        match action {
            Action::FindCoordinator(seq) => self.inflight.push(Box::pin(async move {
                let res = async {
                    let conn = pool.any().await?;
                    let v = conn.version(versions::FIND_COORDINATOR)?;
                    let req = commit::find_coordinator_request(&group, v);
                    conn.request(&req, v, Duration::ZERO).await
                }
                .await;
                Completion::FindCoordinator(seq, res)
            })),
            Action::Commit { seq, node, request } => self.inflight.push(Box::pin(async move {
                let res = async {
                    // A control connection: never behind a parked Fetch.
                    let conn = pool.get(ConnKey::Control(node)).await?;
                    let v = conn.version(versions::OFFSET_COMMIT)?;
                    conn.request(&request, v, Duration::ZERO).await
                }
                .await;
                Completion::Commit(seq, res)
            })),
        }
    }

    fn handle_completion(&mut self, done: Completion) {
        let now = Instant::now().into_std();
        match done {
            Completion::Answered => {}
            Completion::Positions(added, generation, res) => {
                self.handle_positions(added, generation, res);
            }
            done @ (Completion::GroupFind(..)
            | Completion::Join(..)
            | Completion::LeaderMetadata(..)
            | Completion::Sync(..)
            | Completion::Heartbeat(..)
            | Completion::ConsumerHeartbeat(..)
            | Completion::Left) => self.handle_group_completion(done),
            Completion::FindCoordinator(seq, res) => {
                let Some(c) = self.committer.as_mut() else {
                    return;
                };
                match c.handle_find_coordinator(seq, now, res) {
                    Ok(Some((node, addr))) => {
                        self.pool.add_node(node, addr);
                        if self.subscription.is_none() {
                            self.shared.coordinator.store(node, Ordering::Relaxed);
                        }
                    }
                    Ok(None) => {}
                    Err(f) => self.finish_commit(*f),
                }
            }
            Completion::Commit(seq, res) => {
                let Some(c) = self.committer.as_mut() else {
                    return;
                };
                let finished = c.handle_commit(seq, now, res);
                // In subscribe mode the membership reports the coordinator.
                if c.coordinator().is_none() && self.subscription.is_none() {
                    self.shared.coordinator.store(-1, Ordering::Relaxed);
                }
                if let Some(f) = finished {
                    if let Some(code) = f.refused {
                        self.group_commit_refused(code);
                    }
                    self.finish_commit(f);
                }
            }
            Completion::Metadata { res, at, ahead } => {
                self.metadata_in_flight = false;
                match res {
                    Ok(resp) => {
                        self.metadata_failures = 0;
                        let problems = self.meta.handle_response(&resp);
                        self.pool.set_nodes(self.meta.brokers().clone());
                        self.metadata_at = Some(Instant::now());
                        self.metadata_not_before = Instant::now() + self.cfg.retry_backoff;
                        let assigned = self.fetch.topics();
                        for TopicProblem::Error(topic, code) in problems {
                            // Only assigned topics are errors; a subscribed topic that does
                            // not exist yet simply gets no partitions.
                            if assigned.contains(&topic)
                                && self.reported_topics.insert(Arc::clone(&topic))
                            {
                                tracing::warn!(%topic, ?code, "metadata error for an assigned topic");
                                let err = Error::broker(
                                    code,
                                    format!("metadata for topic {topic}"),
                                    None,
                                );
                                let _ = self.out.send(Delivery::Error(err));
                            }
                        }
                        let known: Vec<Arc<str>> = self
                            .fetch
                            .topics()
                            .into_iter()
                            .filter(|t| self.meta.topic(t).is_some())
                            .collect();
                        for t in known {
                            self.reported_topics.remove(&t);
                        }
                        self.group_metadata();
                    }
                    Err(e) => {
                        self.metadata_failures += 1;
                        self.metadata_wanted = true;
                        let delay = self.cfg.retry_backoff * (1 << self.metadata_failures.min(4));
                        self.metadata_not_before = Instant::now() + delay;
                        tracing::debug!(error = %e, "metadata request failed");
                    }
                }
                if let Some((plan, listed)) = ahead {
                    let answered_by = at.and_then(|at| {
                        self.meta
                            .brokers()
                            .iter()
                            .find_map(|(&id, addr)| (*addr == at).then_some(id))
                    });
                    self.fetch
                        .handle_list_offsets_ahead(plan, listed, &self.meta, answered_by);
                    self.answer_start_waiters();
                }
            }
            Completion::List(plan, res) => {
                let out = self.fetch.handle_list_offsets(plan, res, now);
                self.apply(out);
                self.answer_start_waiters();
            }
            Completion::Fetch(plan, res) => {
                self.shared.fetches_done.fetch_add(1, Ordering::Relaxed);
                self.busy.remove(&plan.connection());
                self.reserved = self.reserved.saturating_sub(plan.max_bytes as usize);
                if res.is_err() {
                    for tp in FetchState::leaders_of(&plan) {
                        self.meta.invalidate_leader(&tp.topic, tp.partition);
                    }
                }
                let (res, checked, len) = match res {
                    Ok((resp, checked, len)) => (Ok(resp), checked, len),
                    Err(e) => (Err(e), Checked::default(), 0),
                };
                let out = self.fetch.handle_fetch_checked(plan, res, &checked, now);
                self.apply_fetched(out, len);
            }
        }
    }

    fn apply(&mut self, out: Outcome) {
        self.apply_fetched(out, 0);
    }

    /// Delivers what a response of `len` bytes brought. Its chunks share one lease on the
    /// budget for the whole response (at least their own bytes): all of it stays in memory for
    /// as long as any chunk cut from it does, however small the chunk.
    fn apply_fetched(&mut self, out: Outcome, len: usize) {
        if out.refresh_metadata {
            self.metadata_wanted = true;
        }
        let chunks: usize = out
            .events
            .iter()
            .map(|ev| match ev {
                FetchEvent::Chunk(c) => c.records.len(),
                FetchEvent::Failed { .. } => 0,
            })
            .sum();
        let mut events = out.events;
        share_lease(
            &mut events,
            (chunks > 0).then(|| lease(&self.shared, len.max(chunks))),
        );
        for ev in events {
            match ev {
                FetchEvent::Chunk(chunk) => {
                    let _ = self.out.send(Delivery::Chunk(chunk));
                }
                FetchEvent::Failed {
                    tp,
                    generation,
                    error,
                } => {
                    let _ = self.out.send(Delivery::Failed {
                        tp,
                        generation,
                        error,
                    });
                }
            }
        }
    }
}

/// When the loop must wake for the next Metadata request: once the backoff allows, while one
/// is wanted (after an error) or an assigned partition has no known leader (`schedule` asks
/// again then too); otherwise when the last answer reaches `metadata.max.age`.
fn metadata_due(
    wanted: bool,
    leaders_missing: bool,
    not_before: Instant,
    last: Option<Instant>,
    max_age: Duration,
) -> Option<Instant> {
    if wanted || leaders_missing {
        Some(not_before)
    } else {
        last.map(|t| t + max_age)
    }
}

/// The group's committed offsets for `tps`: FindCoordinator, then OffsetFetch with
/// `require_stable` (KIP-447) on the coordinator's connection.
async fn offset_fetch(pool: &Pool, group: &str, tps: Vec<TopicPartition>) -> Result<Committed> {
    let (node, addr) = group::find_coordinator(pool, group).await?;
    pool.add_node(node, addr);
    let conn = pool.get(ConnKey::Control(node)).await?;
    let v = conn.version(versions::OFFSET_FETCH)?;
    let mut by_topic: BTreeMap<Arc<str>, Vec<i32>> = BTreeMap::new();
    for tp in &tps {
        by_topic
            .entry(Arc::clone(&tp.topic))
            .or_default()
            .push(tp.partition);
    }
    let group_id = GroupId(StrBytes::from_string(group.to_owned()));
    let mut req = OffsetFetchRequest::default().with_require_stable(true);
    if v >= 8 {
        req.groups = vec![
            OffsetFetchRequestGroup::default()
                .with_group_id(group_id)
                .with_member_epoch(-1)
                .with_topics(Some(
                    by_topic
                        .iter()
                        .map(|(t, ps)| {
                            OffsetFetchRequestTopics::default()
                                .with_name(TopicName(StrBytes::from_string(t.to_string())))
                                .with_partition_indexes(ps.clone())
                        })
                        .collect(),
                )),
        ];
    } else {
        req.group_id = group_id;
        req.topics = Some(
            by_topic
                .iter()
                .map(|(t, ps)| {
                    kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic::default()
                        .with_name(TopicName(StrBytes::from_string(t.to_string())))
                        .with_partition_indexes(ps.clone())
                })
                .collect(),
        );
    }
    let resp = conn.request(&req, v, Duration::ZERO).await?;
    // v7 answers at the top level, v8+ per group; the other shape's fields stay empty.
    let group_error = std::iter::once(resp.error_code)
        .chain(resp.groups.iter().map(|g| g.error_code))
        .find_map(ParseResponseErrorCode::err);
    if let Some(code) = group_error {
        return Err(Error::broker(
            code,
            format!("OffsetFetch for group {group}"),
            None,
        ));
    }
    let v7 = resp.topics.iter().flat_map(|t| {
        t.partitions
            .iter()
            .map(move |p| (&t.name, p.partition_index, p.committed_offset, p.error_code))
    });
    let v8 = resp.groups.iter().flat_map(|g| &g.topics).flat_map(|t| {
        t.partitions
            .iter()
            .map(move |p| (&t.name, p.partition_index, p.committed_offset, p.error_code))
    });
    let mut out: Committed = tps.iter().map(|tp| (tp.clone(), None)).collect();
    for (topic, partition, offset, code) in v7.chain(v8) {
        let topic = topic.0.as_str();
        if let Some(code) = code.err() {
            return Err(Error::broker(
                code,
                format!("OffsetFetch of {topic}-{partition} for group {group}"),
                None,
            ));
        }
        if let Some(slot) = out.get_mut(&TopicPartition::new(topic, partition)) {
            *slot = (offset >= 0).then_some(offset);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    /// True if a wait on `budget_freed` would end at once (a wakeup is pending).
    fn woken(shared: &Shared) -> bool {
        let notified = shared.budget_freed.notified();
        let mut notified = std::pin::pin!(notified);
        notified.as_mut().enable()
    }

    /// A release wakes the loop only while it waits for budget, once per wait.
    #[test]
    fn releases_wake_the_loop_only_while_it_waits_for_budget() {
        let shared = Shared::default();
        shared.buffered.store(100, Ordering::SeqCst);
        shared.release(10);
        assert!(!woken(&shared), "no wait for budget, no wakeup");
        shared.wait_for_budget(shared.releases.load(Ordering::SeqCst));
        assert!(!woken(&shared), "nothing released since the loop looked");
        shared.release(0);
        assert!(!woken(&shared), "releasing nothing wakes nothing");
        shared.release(10);
        assert!(woken(&shared), "a release while the loop waits wakes it");
        shared.release(10);
        assert!(!woken(&shared), "one wakeup per wait");
        assert_eq!(shared.buffered.load(Ordering::SeqCst), 70);
    }

    /// A release between the loop reading the budget and setting its flag is not lost.
    #[test]
    fn a_release_racing_the_wait_is_not_lost() {
        let shared = Shared::default();
        shared.buffered.store(100, Ordering::SeqCst);
        let seen = shared.releases.load(Ordering::SeqCst);
        // The application releases before the loop says it waits: it sees no flag.
        shared.release(10);
        assert!(!woken(&shared));
        shared.wait_for_budget(seen);
        assert!(woken(&shared), "the loop plans again at once");
    }

    fn chunk(partition: i32) -> FetchEvent {
        FetchEvent::Chunk(Chunk {
            tp: TopicPartition::new("t", partition),
            generation: 0,
            fetch_offset: 0,
            records: Bytes::from_static(b"batches"),
            checked: Vec::new(),
            next_offset: 1,
            aborted: Vec::new(),
            lease: None,
        })
    }

    fn lease_of(ev: FetchEvent) -> Option<Lease> {
        match ev {
            FetchEvent::Chunk(c) => c.lease,
            FetchEvent::Failed { .. } => None,
        }
    }

    /// A response's chunks hold every share of its lease: it is released when the last chunk
    /// is dropped, with nothing left behind in the loop, whichever chunk goes last.
    #[test]
    fn a_responses_chunks_hold_its_whole_lease() {
        let shared = Arc::new(Shared::default());
        let mut events = vec![
            chunk(0),
            FetchEvent::Failed {
                tp: TopicPartition::new("t", 2),
                generation: 0,
                error: Error::Closed,
            },
            chunk(1),
        ];
        share_lease(&mut events, Some(lease(&shared, 1_000)));
        let mut leases: Vec<Lease> = events.into_iter().filter_map(lease_of).collect();
        assert_eq!(leases.len(), 2, "each chunk has a share, a failure none");
        assert_eq!(Arc::strong_count(&leases[0]), 2, "no other share exists");
        // The last chunk is handed out first, the first one last.
        drop(leases.pop());
        assert_eq!(shared.buffered.load(Ordering::SeqCst), 1_000);
        drop(leases.pop());
        assert_eq!(shared.buffered.load(Ordering::SeqCst), 0);

        let mut events = vec![chunk(0)];
        share_lease(&mut events, None);
        assert!(lease_of(events.remove(0)).is_none(), "no lease, no share");
    }

    /// A partition without a leader (leader -1, or a node the metadata does not list) makes the
    /// loop wake for metadata after the retry backoff, not after `metadata.max.age`.
    #[test]
    fn metadata_is_due_soon_while_a_leader_is_missing() {
        let now = Instant::now();
        let soon = now + Duration::from_millis(100);
        let age = Duration::from_secs(300);
        assert_eq!(metadata_due(false, true, soon, Some(now), age), Some(soon));
        assert_eq!(metadata_due(true, false, soon, Some(now), age), Some(soon));
        assert_eq!(
            metadata_due(false, false, soon, Some(now), age),
            Some(now + age)
        );
        assert_eq!(metadata_due(false, false, soon, None, age), None);
    }
}
