//! The classic group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) as a sans-IO state
//! machine.
//!
//! ```text
//!   Unjoined ─► JoinBackoff ─► Joining ─┬─► (leader) Assigning ─► Syncing ─► Stable
//!                  ▲   ▲          │     └─► (follower) ─────────► Syncing ─┘   │
//!                  │   └──────────┴ MEMBER_ID_REQUIRED, retriable errors       │
//!                  └── Revoking (the application gives partitions up) ◄────────┘
//!                                                          rejoin needed
//! ```
//!
//! The coordinator is looked up on its own (FindCoordinator whenever it is unknown); a lost
//! coordinator does not end the membership, heartbeats resume once it is found again.
//!
//! The machine never waits for the application by itself: when partitions must be given up it
//! emits [`GroupEvent::Revoke`] and stays in `Revoking` until
//! [`revocation_done`](ClassicMember::revocation_done). Heartbeats go on in the meantime, so a
//! slow listener does not cost the membership before `max.poll.interval.ms`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use kafka_protocol::error::{ParseResponseErrorCode, ResponseError};
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    GroupId, HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse,
    LeaveGroupRequest, SyncGroupRequest, SyncGroupResponse,
};
use kafka_protocol::protocol::StrBytes;

use crate::assignor::{Assignor, GroupMember, RebalanceProtocol, Subscription};
use crate::error::Error;
use crate::proto::group::consumer_protocol;
use crate::proto::group::{
    CoordinatorLookup, GroupAction, GroupConfig, GroupEvent, Identity, ms_i32 as ms,
};
use crate::types::TopicPartition;

/// The protocol type of consumer groups.
const PROTOCOL_TYPE: &str = "consumer";

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Not a member; joins once a coordinator is known (and something is subscribed).
    Unjoined,
    /// JoinGroup is out.
    Joining { seq: u64 },
    /// Waiting to join again after a retriable error.
    JoinBackoff { not_before: Instant },
    /// The leader waits for metadata of every member's topics.
    Assigning { seq: u64 },
    /// SyncGroup is out.
    Syncing { seq: u64 },
    /// A member of generation `generation`.
    Stable,
    /// The application is giving partitions up; rejoins after.
    Revoking,
    /// Left the group because `max.poll.interval.ms` passed; joins again when the application
    /// polls.
    Left,
    /// Closed: nothing more is sent, and nothing brings the member back.
    Closed,
    /// A fatal error; nothing more is sent.
    Fatal,
}

/// What the leader got from JoinGroup, kept while metadata is fetched.
#[derive(Debug, Clone)]
struct LeaderJob {
    protocol: String,
    members: Vec<GroupMember>,
}

/// One member of a classic group.
#[derive(Debug)]
pub(crate) struct ClassicMember {
    cfg: GroupConfig,
    group: GroupId,
    state: State,
    coordinator: CoordinatorLookup,
    member_id: String,
    generation: i32,
    protocol: Option<String>,
    /// The topics this member subscribes to.
    topics: BTreeSet<String>,
    /// Partitions this member owns now.
    owned: BTreeSet<TopicPartition>,
    /// A rejoin is wanted once the machine is stable (cooperative follow-up, metadata change).
    rejoin: bool,
    /// Partition counts of the subscribed topics when the assignment was made.
    counts_at_join: BTreeMap<String, i32>,
    leader_job: Option<LeaderJob>,
    /// Set when a revocation was asked of the application and not yet answered.
    revoking: Option<Vec<TopicPartition>>,
    next_heartbeat: Option<Instant>,
    heartbeat_in_flight: Option<u64>,
    /// When the last heartbeat (or join) was answered; the session is at risk past this plus
    /// the session timeout.
    seq: u64,
    events: Vec<GroupEvent>,
    fatal: Option<Error>,
}

impl ClassicMember {
    pub(crate) fn new(cfg: GroupConfig) -> Self {
        Self {
            group: GroupId(StrBytes::from_string(cfg.group_id.clone())),
            cfg,
            state: State::Unjoined,
            coordinator: CoordinatorLookup::default(),
            member_id: String::new(),
            generation: -1,
            protocol: None,
            topics: BTreeSet::new(),
            owned: BTreeSet::new(),
            rejoin: false,
            counts_at_join: BTreeMap::new(),
            leader_job: None,
            revoking: None,
            next_heartbeat: None,
            heartbeat_in_flight: None,
            seq: 0,
            events: Vec::new(),
            fatal: None,
        }
    }

    /// The identity commits carry: generation, member id, instance id. `None` while not a
    /// member of a generation.
    pub(crate) fn identity(&self) -> Option<Identity> {
        matches!(self.state, State::Stable | State::Revoking)
            .then(|| self.generation >= 0)
            .filter(|ok| *ok)
            .map(|_| Identity {
                generation_or_epoch: self.generation,
                member_id: self.member_id.clone(),
                instance_id: self.cfg.instance_id.clone(),
            })
    }

    /// The partitions owned now.
    pub(crate) fn owned(&self) -> &BTreeSet<TopicPartition> {
        &self.owned
    }

    /// The subscribed topics.
    pub(crate) fn topics(&self) -> &BTreeSet<String> {
        &self.topics
    }

    /// The fatal error, once one happened.
    pub(crate) fn fatal(&self) -> Option<&Error> {
        self.fatal.as_ref()
    }

    /// The group coordinator, when known.
    pub(crate) fn coordinator(&self) -> Option<i32> {
        self.coordinator.node()
    }

    /// Events for the application, oldest first.
    pub(crate) fn take_events(&mut self) -> Vec<GroupEvent> {
        std::mem::take(&mut self.events)
    }

    /// Replaces the assignors offered from the next JoinGroup on (a member rejoins).
    pub(crate) fn set_assignors(&mut self, assignors: Vec<Arc<dyn Assignor>>) {
        self.cfg.assignors = assignors;
        if matches!(self.state, State::Stable) {
            self.rejoin = true;
        }
    }

    /// Sets the subscribed topics. A change while a member asks for a rejoin.
    pub(crate) fn subscribe(&mut self, topics: BTreeSet<String>) {
        if topics == self.topics {
            return;
        }
        self.topics = topics;
        if self.state == State::Left {
            self.state = State::Unjoined;
        }
        self.rejoin = true;
    }

    /// Metadata of the subscribed topics changed: a partition count that differs from the one
    /// the assignment was made with triggers a rejoin.
    pub(crate) fn metadata(&mut self, counts: &BTreeMap<String, i32>) {
        if !matches!(self.state, State::Stable) {
            return;
        }
        // A topic first seen now is recorded; only a count that grew triggers a rejoin (counts
        // never shrink, so a lower one is stale metadata).
        let mut changed = false;
        for t in &self.topics {
            let Some(&n) = counts.get(t) else {
                continue;
            };
            let known = self.counts_at_join.entry(t.clone()).or_insert(n);
            if n > *known {
                *known = n;
                changed = true;
            }
        }
        if changed {
            tracing::info!(group = %self.cfg.group_id, "partition count of a subscribed topic changed; rejoining");
            self.rejoin = true;
        }
    }

    /// The application was away from `poll` past `max.poll.interval.ms`: leave the group (a
    /// static member only stops heartbeating), as the Java client does. Returns the LeaveGroup
    /// to send, if any.
    pub(crate) fn poll_timeout(&mut self) -> Option<GroupAction> {
        if matches!(
            self.state,
            State::Left | State::Closed | State::Fatal | State::Unjoined
        ) {
            return None;
        }
        tracing::warn!(
            group = %self.cfg.group_id,
            "the application did not poll within max.poll.interval.ms; leaving the group"
        );
        let leave = self.leave_action();
        self.lose_generation(false);
        self.state = State::Left;
        leave
    }

    /// The application polls again after a poll timeout: join again.
    pub(crate) fn resume_after_poll_timeout(&mut self) {
        if self.state == State::Left {
            self.state = State::Unjoined;
        }
    }

    /// Closing: the LeaveGroup to send (none for static members, which keep their
    /// assignment across restarts within the session timeout).
    pub(crate) fn close(&mut self) -> Option<GroupAction> {
        let leave = self.leave_action();
        self.owned.clear();
        self.revoking = None;
        self.generation = -1;
        self.heartbeat_in_flight = None;
        self.next_heartbeat = None;
        self.state = State::Closed;
        leave
    }

    fn leave_action(&self) -> Option<GroupAction> {
        if self.cfg.instance_id.is_some() || self.member_id.is_empty() {
            return None;
        }
        let node = self.coordinator.node()?;
        Some(GroupAction::Leave {
            node,
            request: LeaveGroupRequest::default()
                .with_group_id(self.group.clone())
                .with_members(vec![
                    MemberIdentity::default()
                        .with_member_id(StrBytes::from_string(self.member_id.clone()))
                        .with_reason(Some(StrBytes::from_static_str(
                            "the consumer is leaving the group",
                        ))),
                ]),
        })
    }

    /// The application gave up the partitions of the last [`GroupEvent::Revoke`].
    pub(crate) fn revocation_done(&mut self, now: Instant) {
        let Some(revoked) = self.revoking.take() else {
            return;
        };
        for tp in &revoked {
            self.owned.remove(tp);
        }
        if self.state == State::Revoking {
            self.state = State::Unjoined;
            self.join_now(now);
        }
    }

    fn lose_generation(&mut self, reset_member: bool) {
        self.generation = -1;
        if reset_member {
            self.member_id.clear();
        }
        self.heartbeat_in_flight = None;
        self.next_heartbeat = None;
        if !self.owned.is_empty() {
            let lost: Vec<TopicPartition> = std::mem::take(&mut self.owned).into_iter().collect();
            self.events.push(GroupEvent::Lost(lost));
        }
    }

    /// Starts a rejoin: gives partitions up first where the protocol needs it.
    fn prepare_rejoin(&mut self, now: Instant) {
        self.rejoin = false;
        self.heartbeat_in_flight = None;
        self.next_heartbeat = None;
        let eager = self.rebalance_protocol() == RebalanceProtocol::Eager;
        let revoke: Vec<TopicPartition> = if eager {
            self.owned.iter().cloned().collect()
        } else {
            // Cooperative: keep what is still subscribed.
            self.owned
                .iter()
                .filter(|tp| !self.topics.contains(&*tp.topic))
                .cloned()
                .collect()
        };
        if revoke.is_empty() {
            self.state = State::Unjoined;
            self.join_now(now);
        } else {
            self.revoking = Some(revoke.clone());
            self.state = State::Revoking;
            self.events.push(GroupEvent::Revoke(revoke));
        }
    }

    fn rebalance_protocol(&self) -> RebalanceProtocol {
        // The protocol of the assignor in use, else the best all offered assignors support.
        let assignors = &self.cfg.assignors;
        match self
            .protocol
            .as_deref()
            .and_then(|p| assignors.iter().find(|a| a.name() == p))
        {
            Some(a) => a.rebalance_protocol(),
            None => crate::assignor::rebalance_protocol(assignors),
        }
    }

    fn join_now(&mut self, now: Instant) {
        if self.state == State::Unjoined {
            self.state = State::JoinBackoff { not_before: now };
        }
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// The next request to send, if one is due.
    pub(crate) fn poll_action(&mut self, now: Instant) -> Option<GroupAction> {
        if self.topics.is_empty() && self.state == State::Unjoined {
            return None;
        }
        if matches!(self.state, State::Left | State::Closed | State::Fatal) {
            return None;
        }
        // The coordinator is looked up on its own, whatever the membership is doing.
        let Some(node) = self.coordinator.node() else {
            let seq = &mut self.seq;
            return self.coordinator.poll(now, || {
                *seq += 1;
                *seq
            });
        };
        match self.state.clone() {
            State::Unjoined => {
                self.state = State::JoinBackoff { not_before: now };
                self.poll_action(now)
            }
            State::JoinBackoff { not_before } if now >= not_before => {
                let seq = self.next_seq();
                self.state = State::Joining { seq };
                // This join carries the current subscription and metadata.
                self.rejoin = false;
                let request = self.join_request();
                Some(GroupAction::Join { seq, node, request })
            }
            State::Stable | State::Revoking => {
                if self.state == State::Stable && self.rejoin && self.revoking.is_none() {
                    self.prepare_rejoin(now);
                    return self.poll_action(now);
                }
                // Heartbeats go on while the application revokes, so a slow listener does
                // not cost the membership.
                let due = self.next_heartbeat.is_some_and(|t| now >= t);
                if due && self.heartbeat_in_flight.is_none() && self.generation >= 0 {
                    let seq = self.next_seq();
                    self.heartbeat_in_flight = Some(seq);
                    self.next_heartbeat = None;
                    return Some(GroupAction::Heartbeat {
                        seq,
                        node,
                        request: self.heartbeat_request(),
                    });
                }
                None
            }
            _ => None,
        }
    }

    /// When the machine next needs attention without a response.
    pub(crate) fn next_timeout(&self) -> Option<Instant> {
        if self.coordinator.node().is_none() {
            return self.coordinator.next_timeout();
        }
        match self.state {
            State::JoinBackoff { not_before } => Some(not_before),
            State::Stable | State::Revoking if self.heartbeat_in_flight.is_none() => {
                self.next_heartbeat
            }
            _ => None,
        }
    }

    fn subscription(&self) -> Subscription {
        let cooperative = self.rebalance_protocol() == RebalanceProtocol::Cooperative;
        Subscription {
            topics: self.topics.iter().cloned().collect(),
            user_data: None,
            owned_partitions: if cooperative {
                self.owned.iter().cloned().collect()
            } else {
                Vec::new()
            },
            generation_id: self.generation,
            rack_id: None,
        }
    }

    fn join_request(&self) -> JoinGroupRequest {
        let base = self.subscription();
        // A subscription that cannot be encoded (a topic name over 32767 bytes) is left out;
        // with none left the broker refuses the join, which is reported.
        let protocols = self
            .cfg
            .assignors
            .iter()
            .filter_map(|a| {
                let mut sub = base.clone();
                sub.user_data = a.subscription_user_data(&self.topics, self.generation);
                match consumer_protocol::encode_subscription(&sub) {
                    Ok(metadata) => Some(
                        JoinGroupRequestProtocol::default()
                            .with_name(StrBytes::from_string(a.name().to_owned()))
                            .with_metadata(metadata),
                    ),
                    Err(e) => {
                        tracing::error!(error = %e, assignor = a.name(), "cannot encode the subscription");
                        None
                    }
                }
            })
            .collect();
        JoinGroupRequest::default()
            .with_group_id(self.group.clone())
            .with_session_timeout_ms(ms(self.cfg.session_timeout))
            .with_rebalance_timeout_ms(ms(self.cfg.rebalance_timeout))
            .with_member_id(StrBytes::from_string(self.member_id.clone()))
            .with_group_instance_id(self.cfg.instance_id.clone().map(StrBytes::from_string))
            .with_protocol_type(StrBytes::from_static_str(PROTOCOL_TYPE))
            .with_protocols(protocols)
            .with_reason(Some(StrBytes::from_static_str("joining the group")))
    }

    fn heartbeat_request(&self) -> HeartbeatRequest {
        HeartbeatRequest::default()
            .with_group_id(self.group.clone())
            .with_generation_id(self.generation)
            .with_member_id(StrBytes::from_string(self.member_id.clone()))
            .with_group_instance_id(self.cfg.instance_id.clone().map(StrBytes::from_string))
    }

    fn sync_request(&self, assignments: Vec<SyncGroupRequestAssignment>) -> SyncGroupRequest {
        SyncGroupRequest::default()
            .with_group_id(self.group.clone())
            .with_generation_id(self.generation)
            .with_member_id(StrBytes::from_string(self.member_id.clone()))
            .with_group_instance_id(self.cfg.instance_id.clone().map(StrBytes::from_string))
            .with_protocol_type(Some(StrBytes::from_static_str(PROTOCOL_TYPE)))
            .with_protocol_name(self.protocol.clone().map(StrBytes::from_string))
            .with_assignments(assignments)
    }

    /// The coordinator lookup answered (`Ok(node)`) or failed.
    pub(crate) fn handle_find_coordinator(
        &mut self,
        seq: u64,
        now: Instant,
        result: Result<i32, Error>,
    ) {
        let backoff = self.cfg.retry_backoff;
        if let Err(e) = self.coordinator.handle(seq, now, backoff, result)
            && let Some(code) = fatal_code(&e)
        {
            self.fail(code, "FindCoordinator", &e);
        }
    }

    /// The coordinator moved or failed: find it again. A request in flight to it is void.
    fn coordinator_lost(&mut self, now: Instant) {
        self.coordinator.lost(now + self.cfg.retry_backoff);
        self.heartbeat_in_flight = None;
        if self.state == State::Stable || self.state == State::Revoking {
            self.next_heartbeat = Some(now);
        }
        if matches!(
            self.state,
            State::Joining { .. } | State::Syncing { .. } | State::Assigning { .. }
        ) {
            self.leader_job = None;
            self.state = State::JoinBackoff { not_before: now };
        }
    }

    fn fail(&mut self, code: ResponseError, step: &str, cause: &Error) {
        let hint = match code {
            ResponseError::FencedInstanceId => {
                " (another consumer runs with the same group.instance.id)"
            }
            ResponseError::UnsupportedVersion => {
                " (the broker does not support this; check group.instance.id and group.protocol)"
            }
            ResponseError::InconsistentGroupProtocol => {
                " (the group's members share no assignor, or use another protocol type)"
            }
            _ => "",
        };
        let err = Error::broker(
            code,
            format!("{step} of group {}", self.cfg.group_id),
            Some(format!("fatal group error{hint}: {cause}")),
        );
        tracing::error!(error = %err, "leaving the group for good");
        self.fatal = Some(err);
        self.lose_generation(false);
        self.state = State::Fatal;
    }

    /// Applies a JoinGroup answer.
    pub(crate) fn handle_join(
        &mut self,
        seq: u64,
        now: Instant,
        result: Result<JoinGroupResponse, Error>,
    ) -> Option<GroupAction> {
        if self.state != (State::Joining { seq }) {
            return None;
        }
        let resp = match result {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "JoinGroup failed");
                self.coordinator_lost(now);
                return None;
            }
        };
        match resp.error_code.err() {
            None => {}
            Some(ResponseError::MemberIdRequired) => {
                self.member_id = resp.member_id.to_string();
                self.state = State::JoinBackoff { not_before: now };
                return None;
            }
            Some(ResponseError::UnknownMemberId) => {
                self.member_id.clear();
                self.state = State::JoinBackoff { not_before: now };
                return None;
            }
            Some(ResponseError::NotCoordinator | ResponseError::CoordinatorNotAvailable) => {
                self.coordinator_lost(now);
                return None;
            }
            Some(
                ResponseError::CoordinatorLoadInProgress
                | ResponseError::RebalanceInProgress
                | ResponseError::IllegalGeneration
                | ResponseError::RequestTimedOut,
            ) => {
                self.state = State::JoinBackoff {
                    not_before: now + self.cfg.retry_backoff,
                };
                return None;
            }
            Some(code) => {
                let e = Error::broker(code, "JoinGroup", None);
                self.fail(code, "JoinGroup", &e);
                return None;
            }
        }
        if resp
            .protocol_type
            .as_ref()
            .is_some_and(|t| t.as_str() != PROTOCOL_TYPE)
        {
            let e = Error::broker(
                ResponseError::InconsistentGroupProtocol,
                "JoinGroup",
                Some(format!(
                    "protocol type {:?}",
                    resp.protocol_type.as_ref().map(|t| t.as_str())
                )),
            );
            self.fail(ResponseError::InconsistentGroupProtocol, "JoinGroup", &e);
            return None;
        }
        self.member_id = resp.member_id.to_string();
        self.generation = resp.generation_id;
        self.protocol = resp.protocol_name.as_ref().map(|p| p.to_string());
        let is_leader = resp.leader.as_str() == self.member_id && !resp.skip_assignment;
        if !is_leader {
            let seq = self.next_seq();
            self.state = State::Syncing { seq };
            let node = self.coordinator.node()?;
            return Some(GroupAction::Sync {
                seq,
                node,
                request: self.sync_request(Vec::new()),
            });
        }
        let protocol = self.protocol.clone().unwrap_or_default();
        let mut members = Vec::with_capacity(resp.members.len());
        for m in &resp.members {
            match consumer_protocol::decode_subscription(&m.metadata) {
                Ok(subscription) => members.push(GroupMember {
                    member_id: m.member_id.to_string(),
                    group_instance_id: m.group_instance_id.as_ref().map(|s| s.to_string()),
                    subscription,
                }),
                Err(v) => {
                    // A member whose subscription we cannot read gets nothing; the others go on.
                    tracing::warn!(member = %m.member_id.as_str(), error = %v, "unreadable subscription");
                    members.push(GroupMember {
                        member_id: m.member_id.to_string(),
                        group_instance_id: m.group_instance_id.as_ref().map(|s| s.to_string()),
                        subscription: Subscription::default(),
                    });
                }
            }
        }
        let topics: BTreeSet<String> = members
            .iter()
            .flat_map(|m| m.subscription.topics.iter().cloned())
            .collect();
        self.leader_job = Some(LeaderJob { protocol, members });
        let seq = self.next_seq();
        self.state = State::Assigning { seq };
        Some(GroupAction::LeaderMetadata {
            seq,
            topics: topics.into_iter().collect(),
        })
    }

    /// The leader's metadata arrived (`counts`: partitions per topic; topics that do not exist
    /// are absent): runs the assignor and sends SyncGroup.
    pub(crate) fn handle_leader_metadata(
        &mut self,
        seq: u64,
        now: Instant,
        counts: Result<BTreeMap<String, i32>, Error>,
    ) -> Option<GroupAction> {
        if self.state != (State::Assigning { seq }) {
            return None;
        }
        let job = self.leader_job.take()?;
        let counts = match counts {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "leader metadata failed; joining again");
                self.state = State::JoinBackoff {
                    not_before: now + self.cfg.retry_backoff,
                };
                return None;
            }
        };
        let assignor: Option<Arc<dyn Assignor>> = self
            .cfg
            .assignors
            .iter()
            .find(|a| a.name() == job.protocol)
            .cloned();
        let Some(assignor) = assignor else {
            let e = Error::broker(
                ResponseError::InconsistentGroupProtocol,
                "SyncGroup",
                Some(format!(
                    "the group chose assignor {:?}, which this member does not have",
                    job.protocol
                )),
            );
            self.fail(ResponseError::InconsistentGroupProtocol, "SyncGroup", &e);
            return None;
        };
        let result = match assignor.assign(&counts, &job.members) {
            Ok(r) => r,
            Err(e) => {
                let e = Error::config("partition.assignment.strategy", e.to_string());
                self.fatal = Some(e);
                self.lose_generation(false);
                self.state = State::Fatal;
                return None;
            }
        };
        self.counts_at_join = counts;
        let mut assignments = Vec::with_capacity(job.members.len());
        for m in &job.members {
            let a = result.get(&m.member_id).cloned().unwrap_or_default();
            match consumer_protocol::encode_assignment(&a) {
                Ok(bytes) => assignments.push(
                    SyncGroupRequestAssignment::default()
                        .with_member_id(StrBytes::from_string(m.member_id.clone()))
                        .with_assignment(bytes),
                ),
                Err(e) => {
                    let e = Error::config("partition.assignment.strategy", e.to_string());
                    self.fatal = Some(e);
                    self.lose_generation(false);
                    self.state = State::Fatal;
                    return None;
                }
            }
        }
        let seq = self.next_seq();
        self.state = State::Syncing { seq };
        let node = self.coordinator.node()?;
        Some(GroupAction::Sync {
            seq,
            node,
            request: self.sync_request(assignments),
        })
    }

    /// Applies a SyncGroup answer. `counts` are the partition counts known now, kept to notice
    /// a change later.
    pub(crate) fn handle_sync(
        &mut self,
        seq: u64,
        now: Instant,
        result: Result<SyncGroupResponse, Error>,
        counts: &BTreeMap<String, i32>,
    ) {
        if self.state != (State::Syncing { seq }) {
            return;
        }
        let resp = match result {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "SyncGroup failed");
                self.coordinator_lost(now);
                return;
            }
        };
        match resp.error_code.err() {
            None => {}
            Some(ResponseError::NotCoordinator | ResponseError::CoordinatorNotAvailable) => {
                self.coordinator_lost(now);
                return;
            }
            Some(ResponseError::RebalanceInProgress) => {
                self.state = State::JoinBackoff { not_before: now };
                return;
            }
            // The generation is gone: what a cooperative member still owns is lost (an eager
            // member gave everything up before joining).
            Some(ResponseError::IllegalGeneration) => {
                self.lose_generation(false);
                self.state = State::JoinBackoff { not_before: now };
                return;
            }
            Some(ResponseError::UnknownMemberId) => {
                self.lose_generation(true);
                self.state = State::JoinBackoff { not_before: now };
                return;
            }
            Some(code) => {
                let e = Error::broker(code, "SyncGroup", None);
                self.fail(code, "SyncGroup", &e);
                return;
            }
        }
        if let (Some(name), Some(ours)) = (resp.protocol_name.as_ref(), self.protocol.as_ref())
            && name.as_str() != ours
        {
            let e = Error::broker(
                ResponseError::InconsistentGroupProtocol,
                "SyncGroup",
                Some(format!(
                    "protocol {} after joining with {ours}",
                    name.as_str()
                )),
            );
            self.fail(ResponseError::InconsistentGroupProtocol, "SyncGroup", &e);
            return;
        }
        let assignment = match consumer_protocol::decode_assignment(&resp.assignment) {
            Ok(a) => a,
            Err(v) => {
                tracing::warn!(error = %v, "unreadable assignment; joining again");
                self.state = State::JoinBackoff {
                    not_before: now + self.cfg.retry_backoff,
                };
                return;
            }
        };
        for (t, n) in counts {
            let known = self.counts_at_join.entry(t.clone()).or_insert(*n);
            *known = (*known).max(*n);
        }
        let assigned: BTreeSet<TopicPartition> = assignment.partitions.into_iter().collect();
        // Assigned topics must be subscribed; anything else is a stale or foreign assignment,
        // not applied: the member joins again with its current subscription.
        if assigned.iter().any(|tp| !self.topics.contains(&*tp.topic)) {
            tracing::info!(
                "the assignment names topics this member does not subscribe to; joining again"
            );
            self.state = State::JoinBackoff { not_before: now };
            return;
        }
        let revoked: Vec<TopicPartition> = self.owned.difference(&assigned).cloned().collect();
        let added: Vec<TopicPartition> = assigned.difference(&self.owned).cloned().collect();
        self.state = State::Stable;
        self.next_heartbeat = Some(now + self.cfg.heartbeat_interval);
        tracing::info!(
            group = %self.cfg.group_id,
            generation = self.generation,
            member = %self.member_id,
            assigned = assigned.len(),
            added = added.len(),
            revoked = revoked.len(),
            "joined the group"
        );
        if !revoked.is_empty() {
            // Cooperative: give up what moved, then join once more so it can go elsewhere.
            self.revoking = Some(revoked.clone());
            self.events.push(GroupEvent::Revoke(revoked));
            self.rejoin = true;
        }
        for tp in &added {
            self.owned.insert(tp.clone());
        }
        self.events.push(GroupEvent::Assign {
            added,
            generation: self.generation,
        });
    }

    /// Applies a Heartbeat answer.
    pub(crate) fn handle_heartbeat(
        &mut self,
        seq: u64,
        now: Instant,
        result: Result<HeartbeatResponse, Error>,
    ) {
        if self.heartbeat_in_flight != Some(seq) {
            return;
        }
        self.heartbeat_in_flight = None;
        if !matches!(self.state, State::Stable | State::Revoking) {
            return;
        }
        let code = match result {
            Ok(r) => r.error_code.err(),
            Err(e) => {
                // Keep the membership: heartbeats go on once the coordinator is found again.
                tracing::debug!(error = %e, "Heartbeat failed; finding the coordinator again");
                self.coordinator_lost(now);
                return;
            }
        };
        self.next_heartbeat = Some(now + self.cfg.heartbeat_interval);
        match code {
            None => {}
            // While already revoking for a rejoin, the rebalance is under way.
            Some(ResponseError::RebalanceInProgress) if self.state == State::Stable => {
                self.rejoin = true;
            }
            Some(ResponseError::RebalanceInProgress) => {}
            Some(ResponseError::IllegalGeneration | ResponseError::FencedMemberEpoch) => {
                self.lose_generation(false);
                self.revoking = None;
                self.state = State::JoinBackoff { not_before: now };
            }
            Some(ResponseError::UnknownMemberId) => {
                self.lose_generation(true);
                self.revoking = None;
                self.state = State::JoinBackoff { not_before: now };
            }
            Some(ResponseError::NotCoordinator | ResponseError::CoordinatorNotAvailable) => {
                self.coordinator_lost(now);
            }
            Some(ResponseError::CoordinatorLoadInProgress | ResponseError::RequestTimedOut) => {
                self.next_heartbeat = Some(now + self.cfg.retry_backoff);
            }
            Some(code) => {
                let e = Error::broker(code, "Heartbeat", None);
                self.fail(code, "Heartbeat", &e);
            }
        }
    }

    /// A commit was refused in a way that means this member must rejoin.
    pub(crate) fn commit_refused(&mut self, code: ResponseError, now: Instant) {
        match code {
            ResponseError::RebalanceInProgress if self.state == State::Stable => {
                self.rejoin = true;
            }
            ResponseError::IllegalGeneration => {
                if matches!(self.state, State::Stable | State::Revoking) {
                    self.lose_generation(false);
                    self.revoking = None;
                    self.state = State::JoinBackoff { not_before: now };
                }
            }
            ResponseError::UnknownMemberId => {
                if matches!(self.state, State::Stable | State::Revoking) {
                    self.lose_generation(true);
                    self.revoking = None;
                    self.state = State::JoinBackoff { not_before: now };
                }
            }
            ResponseError::FencedInstanceId => {
                let e = Error::broker(code, "OffsetCommit", None);
                self.fail(code, "OffsetCommit", &e);
            }
            _ => {}
        }
    }

    /// True once the machine can do nothing more.
    pub(crate) fn is_fatal(&self) -> bool {
        self.state == State::Fatal
    }

    /// The names of the assignors offered (for the fuzz harness).
    #[cfg(fuzzing)]
    pub(crate) fn assignor_names(&self) -> Vec<String> {
        self.cfg
            .assignors
            .iter()
            .map(|a| a.name().to_owned())
            .collect()
    }

    /// Whether the JoinGroup (`kind` 0), leader metadata (1) or SyncGroup (2) `seq` is still
    /// awaited (for the fuzz harness).
    #[cfg(fuzzing)]
    pub(crate) fn is_step_out(&self, seq: u64, kind: u8) -> bool {
        match kind {
            0 => self.state == State::Joining { seq },
            1 => self.state == State::Assigning { seq },
            _ => self.state == State::Syncing { seq },
        }
    }

    /// Whether heartbeat `seq` is still awaited (for the fuzz harness).
    #[cfg(fuzzing)]
    pub(crate) fn is_heartbeat_out(&self, seq: u64) -> bool {
        self.heartbeat_in_flight == Some(seq)
    }

    /// The state's name, for tests.
    #[cfg(test)]
    pub(crate) fn state_name(&self) -> &'static str {
        match self.state {
            State::Unjoined => "unjoined",
            State::Joining { .. } => "joining",
            State::JoinBackoff { .. } => "join-backoff",
            State::Assigning { .. } => "assigning",
            State::Syncing { .. } => "syncing",
            State::Stable => "stable",
            State::Revoking => "revoking",
            State::Left => "left",
            State::Closed => "closed",
            State::Fatal => "fatal",
        }
    }
}

/// Error codes that end the membership for good.
fn fatal_code(e: &Error) -> Option<ResponseError> {
    match e {
        Error::Broker { code, .. }
            if matches!(
                code,
                ResponseError::GroupAuthorizationFailed | ResponseError::InvalidGroupId
            ) =>
        {
            Some(*code)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::assignor::MemberAssignment;
    use crate::config::AssignmentStrategy;
    use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;

    fn cfg(strategy: AssignmentStrategy) -> GroupConfig {
        GroupConfig {
            group_id: "g".into(),
            instance_id: None,
            session_timeout: Duration::from_secs(10),
            rebalance_timeout: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(1),
            retry_backoff: Duration::from_millis(100),
            assignors: vec![crate::assignor::builtin(strategy)],
        }
    }

    fn tp(p: i32) -> TopicPartition {
        TopicPartition::new("t", p)
    }

    /// Drives a fresh member to its JoinGroup; returns the join's seq.
    fn to_join(m: &mut ClassicMember, now: Instant) -> u64 {
        m.subscribe(["t".to_owned()].into());
        let Some(GroupAction::FindCoordinator { seq }) = m.poll_action(now) else {
            panic!("expected FindCoordinator");
        };
        m.handle_find_coordinator(seq, now, Ok(1));
        match m.poll_action(now) {
            Some(GroupAction::Join { seq, node: 1, .. }) => seq,
            other => panic!("expected Join, got {other:?}"),
        }
    }

    fn joined(member: &str, leader: &str, generation: i32) -> JoinGroupResponse {
        JoinGroupResponse::default()
            .with_member_id(StrBytes::from_string(member.into()))
            .with_leader(StrBytes::from_string(leader.into()))
            .with_generation_id(generation)
            .with_protocol_type(Some(StrBytes::from_static_str("consumer")))
            .with_protocol_name(Some(StrBytes::from_static_str("range")))
    }

    fn synced(parts: &[i32]) -> SyncGroupResponse {
        let a = MemberAssignment::new(parts.iter().map(|p| tp(*p)).collect());
        SyncGroupResponse::default()
            .with_protocol_name(Some(StrBytes::from_static_str("range")))
            .with_assignment(consumer_protocol::encode_assignment(&a).unwrap())
    }

    /// A follower: MEMBER_ID_REQUIRED round trip, SyncGroup, then stable with heartbeats.
    fn stable_follower(now: Instant) -> ClassicMember {
        let mut m = ClassicMember::new(cfg(AssignmentStrategy::Range));
        let seq = to_join(&mut m, now);
        let required = JoinGroupResponse::default()
            .with_error_code(ResponseError::MemberIdRequired.code())
            .with_member_id(StrBytes::from_static_str("m-1"));
        assert!(m.handle_join(seq, now, Ok(required)).is_none());
        let Some(GroupAction::Join { seq, request, .. }) = m.poll_action(now) else {
            panic!("expected a second Join");
        };
        assert_eq!(request.member_id.as_str(), "m-1");
        let Some(GroupAction::Sync { seq, request, .. }) =
            m.handle_join(seq, now, Ok(joined("m-1", "other", 5)))
        else {
            panic!("expected Sync");
        };
        assert!(
            request.assignments.is_empty(),
            "a follower sends no assignments"
        );
        m.handle_sync(seq, now, Ok(synced(&[0, 1])), &BTreeMap::new());
        assert_eq!(m.state_name(), "stable");
        assert_eq!(
            m.take_events(),
            vec![GroupEvent::Assign {
                added: vec![tp(0), tp(1)],
                generation: 5
            }]
        );
        assert_eq!(m.identity().unwrap().generation_or_epoch, 5);
        m
    }

    /// An assignment naming a topic this member does not subscribe to is not applied: no
    /// partition of it is owned or announced, and the member joins again.
    #[test]
    fn assignment_of_an_unsubscribed_topic_is_not_applied() {
        let now = Instant::now();
        let mut m = ClassicMember::new(cfg(AssignmentStrategy::Range));
        let seq = to_join(&mut m, now);
        let Some(GroupAction::Sync { seq, .. }) =
            m.handle_join(seq, now, Ok(joined("m-1", "other", 5)))
        else {
            panic!("expected Sync");
        };
        let a = MemberAssignment::new(vec![tp(0), TopicPartition::new("other", 0)]);
        let resp = SyncGroupResponse::default()
            .with_assignment(consumer_protocol::encode_assignment(&a).unwrap());
        m.handle_sync(seq, now, Ok(resp), &BTreeMap::new());
        assert!(m.owned().is_empty());
        assert!(m.take_events().is_empty());
        assert!(m.identity().is_none());
        let Some(GroupAction::Join { request, .. }) = m.poll_action(now) else {
            panic!("expected a Join");
        };
        assert_eq!(request.member_id.as_str(), "m-1");
    }

    /// Sends the due heartbeat and applies an answer with `code`.
    fn heartbeat_answered(m: &mut ClassicMember, t: Instant, code: ResponseError) {
        let Some(GroupAction::Heartbeat { seq, .. }) = m.poll_action(t) else {
            panic!("expected Heartbeat");
        };
        let answer = HeartbeatResponse::default().with_error_code(code.code());
        m.handle_heartbeat(seq, t, Ok(answer));
    }

    #[test]
    fn follower_joins_and_heartbeats() {
        let now = Instant::now();
        let mut m = stable_follower(now);
        assert!(
            m.poll_action(now).is_none(),
            "no heartbeat before the interval"
        );
        let later = now + Duration::from_secs(1);
        let Some(GroupAction::Heartbeat { seq, request, .. }) = m.poll_action(later) else {
            panic!("expected Heartbeat");
        };
        assert_eq!(request.generation_id, 5);
        m.handle_heartbeat(seq, later, Ok(HeartbeatResponse::default()));
        assert_eq!(m.state_name(), "stable");
    }

    /// REBALANCE_IN_PROGRESS under an eager assignor: everything is revoked (and the
    /// application answers) before the member joins again, keeping its member id.
    #[test]
    fn eager_rebalance_revokes_before_rejoining() {
        let now = Instant::now();
        let mut m = stable_follower(now);
        let t = now + Duration::from_secs(1);
        heartbeat_answered(&mut m, t, ResponseError::RebalanceInProgress);
        assert!(
            m.poll_action(t).is_none(),
            "no join before the revocation is answered"
        );
        assert_eq!(
            m.take_events(),
            vec![GroupEvent::Revoke(vec![tp(0), tp(1)])]
        );
        // Commits may still go out with the current generation meanwhile.
        assert_eq!(m.identity().unwrap().generation_or_epoch, 5);
        m.revocation_done(t);
        let Some(GroupAction::Join { request, .. }) = m.poll_action(t) else {
            panic!("expected Join after the revocation");
        };
        assert_eq!(request.member_id.as_str(), "m-1");
        assert!(m.owned().is_empty());
    }

    /// Closing in the middle of a revocation ends the membership for good: the member leaves,
    /// owns nothing, and neither the application finishing the revocation nor a new
    /// subscription makes it join again.
    #[test]
    fn close_is_final_even_while_revoking() {
        let now = Instant::now();
        let mut m = stable_follower(now);
        let t = now + Duration::from_secs(1);
        heartbeat_answered(&mut m, t, ResponseError::RebalanceInProgress);
        assert!(m.poll_action(t).is_none());
        assert_eq!(
            m.take_events(),
            vec![GroupEvent::Revoke(vec![tp(0), tp(1)])]
        );
        assert!(matches!(m.close(), Some(GroupAction::Leave { .. })));
        assert_eq!(m.state_name(), "closed");
        assert!(m.owned().is_empty());
        assert!(m.identity().is_none());
        m.revocation_done(t);
        m.subscribe(["t".to_owned(), "u".to_owned()].into());
        m.resume_after_poll_timeout();
        assert!(m.poll_action(t + Duration::from_secs(10)).is_none());
        assert!(m.poll_timeout().is_none());
        assert!(m.take_events().is_empty());
    }

    /// ILLEGAL_GENERATION on a heartbeat: the partitions are lost (not revoked, so never
    /// committed) and the member joins again.
    #[test]
    fn illegal_generation_loses_the_partitions() {
        let now = Instant::now();
        let mut m = stable_follower(now);
        let t = now + Duration::from_secs(1);
        heartbeat_answered(&mut m, t, ResponseError::IllegalGeneration);
        assert_eq!(m.take_events(), vec![GroupEvent::Lost(vec![tp(0), tp(1)])]);
        assert!(m.identity().is_none(), "no commits without a generation");
        assert!(matches!(m.poll_action(t), Some(GroupAction::Join { .. })));
    }

    #[test]
    fn fenced_instance_id_is_fatal() {
        let now = Instant::now();
        let mut m = stable_follower(now);
        let t = now + Duration::from_secs(1);
        heartbeat_answered(&mut m, t, ResponseError::FencedInstanceId);
        assert!(m.is_fatal());
        let msg = m.fatal().unwrap().to_string();
        assert!(msg.contains("group.instance.id"), "{msg}");
        assert!(m.poll_action(t + Duration::from_secs(5)).is_none());
    }

    /// A lost coordinator does not end the membership: after FindCoordinator the heartbeats
    /// resume with the same generation.
    #[test]
    fn coordinator_loss_keeps_the_membership() {
        let now = Instant::now();
        let mut m = stable_follower(now);
        let t = now + Duration::from_secs(1);
        heartbeat_answered(&mut m, t, ResponseError::NotCoordinator);
        let t2 = t + Duration::from_millis(100);
        let Some(GroupAction::FindCoordinator { seq }) = m.poll_action(t2) else {
            panic!("expected FindCoordinator");
        };
        m.handle_find_coordinator(seq, t2, Ok(2));
        let Some(GroupAction::Heartbeat { node, request, .. }) = m.poll_action(t2) else {
            panic!("expected a heartbeat to the new coordinator");
        };
        assert_eq!((node, request.generation_id), (2, 5));
        assert!(m.take_events().is_empty());
    }

    /// The leader decodes every member's subscription, asks for metadata, runs the assignor
    /// and sends every member's assignment.
    #[test]
    fn leader_assigns_every_member() {
        let now = Instant::now();
        let mut m = ClassicMember::new(cfg(AssignmentStrategy::Range));
        let seq = to_join(&mut m, now);
        let sub =
            consumer_protocol::encode_subscription(&crate::assignor::Subscription::new(["t"]))
                .unwrap();
        let resp = joined("m-1", "m-1", 1).with_members(vec![
            JoinGroupResponseMember::default()
                .with_member_id(StrBytes::from_static_str("m-1"))
                .with_metadata(sub.clone()),
            JoinGroupResponseMember::default()
                .with_member_id(StrBytes::from_static_str("m-2"))
                .with_metadata(sub),
        ]);
        let Some(GroupAction::LeaderMetadata { seq, topics }) = m.handle_join(seq, now, Ok(resp))
        else {
            panic!("expected LeaderMetadata");
        };
        assert_eq!(topics, vec!["t".to_owned()]);
        let counts = BTreeMap::from([("t".to_owned(), 4)]);
        let Some(GroupAction::Sync { request, .. }) =
            m.handle_leader_metadata(seq, now, Ok(counts))
        else {
            panic!("expected Sync");
        };
        let mut got: Vec<(String, Vec<TopicPartition>)> = request
            .assignments
            .iter()
            .map(|a| {
                let d = consumer_protocol::decode_assignment(&a.assignment).unwrap();
                (a.member_id.to_string(), d.partitions)
            })
            .collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                ("m-1".to_owned(), vec![tp(0), tp(1)]),
                ("m-2".to_owned(), vec![tp(2), tp(3)])
            ]
        );
    }

    /// A user-written assignor: offered in JoinGroup under its own name and run by the leader.
    #[test]
    fn custom_assignor_runs_on_the_leader() {
        #[derive(Debug)]
        struct AllToFirst;
        impl Assignor for AllToFirst {
            fn name(&self) -> &str {
                "all-to-first"
            }
            fn assign(
                &self,
                partitions_per_topic: &BTreeMap<String, i32>,
                members: &[GroupMember],
            ) -> Result<BTreeMap<String, MemberAssignment>, crate::assignor::AssignorError>
            {
                let mut ids: Vec<&str> = members.iter().map(|m| m.member_id.as_str()).collect();
                ids.sort_unstable();
                let all = partitions_per_topic
                    .iter()
                    .flat_map(|(t, n)| (0..*n).map(|p| TopicPartition::new(t.as_str(), p)))
                    .collect();
                let mut out: BTreeMap<String, MemberAssignment> = ids
                    .iter()
                    .map(|id| ((*id).to_owned(), MemberAssignment::default()))
                    .collect();
                out.insert(ids[0].to_owned(), MemberAssignment::new(all));
                Ok(out)
            }
        }
        let now = Instant::now();
        let mut m = ClassicMember::new(cfg(AssignmentStrategy::Range));
        m.set_assignors(vec![Arc::new(AllToFirst)]);
        let seq = to_join(&mut m, now);
        let sub =
            consumer_protocol::encode_subscription(&crate::assignor::Subscription::new(["t"]))
                .unwrap();
        let resp = joined("m-2", "m-2", 1)
            .with_protocol_name(Some(StrBytes::from_static_str("all-to-first")))
            .with_members(vec![
                JoinGroupResponseMember::default()
                    .with_member_id(StrBytes::from_static_str("m-1"))
                    .with_metadata(sub.clone()),
                JoinGroupResponseMember::default()
                    .with_member_id(StrBytes::from_static_str("m-2"))
                    .with_metadata(sub),
            ]);
        let Some(GroupAction::LeaderMetadata { seq, .. }) = m.handle_join(seq, now, Ok(resp))
        else {
            panic!("expected LeaderMetadata");
        };
        let Some(GroupAction::Sync { request, .. }) =
            m.handle_leader_metadata(seq, now, Ok(BTreeMap::from([("t".to_owned(), 3)])))
        else {
            panic!("expected Sync");
        };
        for a in &request.assignments {
            let d = consumer_protocol::decode_assignment(&a.assignment).unwrap();
            let want = if a.member_id.as_str() == "m-1" { 3 } else { 0 };
            assert_eq!(d.partitions.len(), want, "{}", a.member_id.as_str());
        }
    }

    /// A partition count that grows triggers a rejoin; a lower (stale) count does not.
    #[test]
    fn partition_count_growth_rejoins() {
        let now = Instant::now();
        let mut m = stable_follower(now);
        m.metadata(&BTreeMap::from([("t".to_owned(), 2)]));
        m.metadata(&BTreeMap::from([("t".to_owned(), 1)]));
        assert!(!m.rejoin);
        m.metadata(&BTreeMap::from([("t".to_owned(), 3)]));
        assert!(m.rejoin);
        m.poll_action(now);
        assert_eq!(
            m.take_events(),
            vec![GroupEvent::Revoke(vec![tp(0), tp(1)])]
        );
    }
}
