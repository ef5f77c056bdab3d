//! The KIP-848 consumer group protocol (`group.protocol=consumer`): one
//! ConsumerGroupHeartbeat request carries membership, subscription and the acknowledgement of
//! the assignment; the broker computes assignments.
//!
//! ```text
//!   Unjoined ─► (epoch 0) ─► Member(epoch n) ─► ... ─► Leaving (epoch -1, or -2 static) ─► Left
//!                   ▲            │  FENCED_MEMBER_EPOCH / UNKNOWN_MEMBER_ID:
//!                   └────────────┘  partitions lost, join again at epoch 0, same member id
//! ```
//!
//! Reconciliation, as the Java client does it: each assignment the broker sends is the complete
//! set this member may own. Partitions missing from it are revoked first (the application may
//! commit them, with the current epoch), then the new ones are added, and the next heartbeat,
//! sent at once, carries the owned set as the acknowledgement.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use kafka_protocol::error::{ParseResponseErrorCode, ResponseError};
use kafka_protocol::messages::consumer_group_heartbeat_request::TopicPartitions;
use kafka_protocol::messages::{
    ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse, GroupId, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use crate::error::Error;
use crate::proto::group::{
    CoordinatorLookup, GroupAction, GroupConfig, GroupEvent, Identity, ms_i32 as ms,
};
use crate::types::TopicPartition;

/// The epoch a member leaves with.
const LEAVE_EPOCH: i32 = -1;
/// The epoch a static member leaves with when it means to come back.
const STATIC_LEAVE_EPOCH: i32 = -2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not a member; joins (epoch 0) once subscribed and the coordinator is known.
    Unjoined,
    /// A member (the join heartbeat may still be out).
    Member,
    /// Left because `max.poll.interval.ms` passed; joins again when the application polls.
    Left,
    /// Closed: nothing more is sent, and nothing brings the member back.
    Closed,
    Fatal,
}

/// One member of a KIP-848 group.
#[derive(Debug)]
pub(crate) struct ConsumerMember {
    cfg: GroupConfig,
    group: GroupId,
    state: State,
    coordinator: CoordinatorLookup,
    /// Generated once, kept for the life of the consumer (KIP-1082).
    member_id: String,
    epoch: i32,
    topics: BTreeSet<String>,
    pattern: Option<String>,
    owned: BTreeSet<TopicPartition>,
    /// The latest assignment from the broker, by topic id, until it is reconciled.
    target: Option<BTreeMap<Uuid, BTreeSet<i32>>>,
    /// Topic ids of owned partitions, for the acknowledgement.
    ids: BTreeMap<String, Uuid>,
    revoking: Option<Vec<TopicPartition>>,
    interval: Duration,
    next_heartbeat: Option<Instant>,
    in_flight: Option<u64>,
    /// The epoch the heartbeat in flight was sent with.
    sent_epoch: i32,
    seq: u64,
    events: Vec<GroupEvent>,
    fatal: Option<Error>,
    /// Topic ids of the target that metadata does not name yet.
    unresolved: bool,
}

impl ConsumerMember {
    pub(crate) fn new(cfg: GroupConfig) -> Self {
        Self {
            group: GroupId(StrBytes::from_string(cfg.group_id.clone())),
            interval: cfg.heartbeat_interval,
            cfg,
            state: State::Unjoined,
            coordinator: CoordinatorLookup::default(),
            member_id: Uuid::new_v4().to_string(),
            epoch: 0,
            topics: BTreeSet::new(),
            pattern: None,
            owned: BTreeSet::new(),
            target: None,
            ids: BTreeMap::new(),
            revoking: None,
            next_heartbeat: None,
            in_flight: None,
            sent_epoch: 0,
            seq: 0,
            events: Vec::new(),
            fatal: None,
            unresolved: false,
        }
    }

    pub(crate) fn identity(&self) -> Option<Identity> {
        (self.state == State::Member && self.epoch > 0).then(|| Identity {
            generation_or_epoch: self.epoch,
            member_id: self.member_id.clone(),
            instance_id: self.cfg.instance_id.clone(),
        })
    }

    pub(crate) fn owned(&self) -> &BTreeSet<TopicPartition> {
        &self.owned
    }

    pub(crate) fn fatal(&self) -> Option<&Error> {
        self.fatal.as_ref()
    }

    pub(crate) fn coordinator(&self) -> Option<i32> {
        self.coordinator.node()
    }

    pub(crate) fn is_fatal(&self) -> bool {
        self.state == State::Fatal
    }

    /// True while an assignment names topic ids that metadata does not know yet.
    pub(crate) fn needs_metadata(&self) -> bool {
        self.unresolved
    }

    /// The member id this member chose (for the fuzz harness).
    #[cfg(fuzzing)]
    pub(crate) fn member_id(&self) -> &str {
        &self.member_id
    }

    /// Whether heartbeat `seq` is still awaited (for the fuzz harness).
    #[cfg(fuzzing)]
    pub(crate) fn is_heartbeat_out(&self, seq: u64) -> bool {
        self.in_flight == Some(seq)
    }

    pub(crate) fn take_events(&mut self) -> Vec<GroupEvent> {
        std::mem::take(&mut self.events)
    }

    /// Subscribes by name. A change is sent with the next heartbeat, at once.
    pub(crate) fn subscribe(&mut self, topics: BTreeSet<String>, now: Instant) {
        if topics == self.topics && self.pattern.is_none() {
            return;
        }
        self.topics = topics;
        self.pattern = None;
        self.changed(now);
    }

    /// Subscribes by a regular expression the broker resolves (RE2J syntax).
    pub(crate) fn subscribe_pattern(&mut self, pattern: String, now: Instant) {
        if self.pattern.as_deref() == Some(pattern.as_str()) {
            return;
        }
        self.pattern = Some(pattern);
        self.topics.clear();
        self.changed(now);
    }

    fn changed(&mut self, now: Instant) {
        if self.state == State::Left {
            self.state = State::Unjoined;
        }
        self.next_heartbeat = Some(now);
    }

    fn subscribed(&self) -> bool {
        self.pattern.is_some() || !self.topics.is_empty()
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    pub(crate) fn poll_action(&mut self, now: Instant) -> Option<GroupAction> {
        if !self.subscribed() || matches!(self.state, State::Left | State::Closed | State::Fatal) {
            return None;
        }
        let Some(node) = self.coordinator.node() else {
            let seq = &mut self.seq;
            return self.coordinator.poll(now, || {
                *seq += 1;
                *seq
            });
        };
        if self.in_flight.is_some() {
            return None;
        }
        if self.state == State::Unjoined {
            self.state = State::Member;
            self.epoch = 0;
            self.next_heartbeat = Some(now);
        }
        if self.next_heartbeat.is_none_or(|t| now < t) {
            return None;
        }
        let seq = self.next_seq();
        self.in_flight = Some(seq);
        self.sent_epoch = self.epoch;
        self.next_heartbeat = None;
        Some(GroupAction::ConsumerHeartbeat {
            seq,
            node,
            request: self.heartbeat_request(self.epoch),
        })
    }

    pub(crate) fn next_timeout(&self) -> Option<Instant> {
        if self.coordinator.node().is_none() {
            return self.coordinator.next_timeout();
        }
        if self.in_flight.is_some() {
            return None;
        }
        self.next_heartbeat
    }

    fn heartbeat_request(&self, epoch: i32) -> ConsumerGroupHeartbeatRequest {
        let mut req = ConsumerGroupHeartbeatRequest::default()
            .with_group_id(self.group.clone())
            .with_member_id(StrBytes::from_string(self.member_id.clone()))
            .with_member_epoch(epoch)
            .with_instance_id(self.cfg.instance_id.clone().map(StrBytes::from_string));
        if epoch < 0 {
            return req;
        }
        req = req.with_rebalance_timeout_ms(ms(self.cfg.rebalance_timeout));
        match &self.pattern {
            Some(p) => {
                req = req.with_subscribed_topic_regex(Some(StrBytes::from_string(p.clone())))
            }
            None => {
                req = req.with_subscribed_topic_names(Some(
                    self.topics
                        .iter()
                        .map(|t| TopicName(StrBytes::from_string(t.clone())))
                        .collect(),
                ));
            }
        }
        // The acknowledgement: what this member owns now (empty when joining).
        let mut by_topic: BTreeMap<Uuid, Vec<i32>> = BTreeMap::new();
        if epoch > 0 {
            for tp in &self.owned {
                if let Some(id) = self.ids.get(&*tp.topic) {
                    by_topic.entry(*id).or_default().push(tp.partition);
                }
            }
        }
        req.with_topic_partitions(Some(
            by_topic
                .into_iter()
                .map(|(id, partitions)| {
                    TopicPartitions::default()
                        .with_topic_id(id)
                        .with_partitions(partitions)
                })
                .collect(),
        ))
    }

    pub(crate) fn handle_find_coordinator(
        &mut self,
        seq: u64,
        now: Instant,
        result: Result<i32, Error>,
    ) {
        // A failed lookup is retried after the backoff; nothing else depends on it.
        let _ = self
            .coordinator
            .handle(seq, now, self.cfg.retry_backoff, result);
    }

    fn coordinator_lost(&mut self, now: Instant) {
        self.coordinator.lost(now);
        self.in_flight = None;
        self.next_heartbeat = Some(now);
    }

    fn fail(&mut self, code: ResponseError, message: Option<String>) {
        let hint = match code {
            ResponseError::UnsupportedVersion => {
                " (the broker does not support group.protocol=consumer; use classic)"
            }
            ResponseError::FencedInstanceId | ResponseError::UnreleasedInstanceId => {
                " (another consumer runs with the same group.instance.id)"
            }
            _ => "",
        };
        let err = Error::broker(
            code,
            format!("ConsumerGroupHeartbeat of group {}", self.cfg.group_id),
            Some(format!(
                "fatal group error{hint}{}",
                message.map(|m| format!(": {m}")).unwrap_or_default()
            )),
        );
        tracing::error!(error = %err, "leaving the group for good");
        self.fatal = Some(err);
        self.lose_all();
        self.state = State::Fatal;
    }

    fn lose_all(&mut self) {
        self.target = None;
        self.revoking = None;
        self.unresolved = false;
        if !self.owned.is_empty() {
            let lost: Vec<_> = std::mem::take(&mut self.owned).into_iter().collect();
            self.events.push(GroupEvent::Lost(lost));
        }
    }

    /// Applies a heartbeat answer, then reconciles what it assigned.
    pub(crate) fn handle_heartbeat(
        &mut self,
        seq: u64,
        now: Instant,
        result: Result<ConsumerGroupHeartbeatResponse, Error>,
        names: &dyn Fn(&Uuid) -> Option<String>,
    ) {
        if self.in_flight != Some(seq) {
            return;
        }
        self.in_flight = None;
        let resp = match result {
            Ok(r) => r,
            Err(e) => {
                if let Error::UnsupportedVersion { .. } = e {
                    self.fail(ResponseError::UnsupportedVersion, Some(e.to_string()));
                    return;
                }
                tracing::debug!(error = %e, "ConsumerGroupHeartbeat failed");
                self.coordinator_lost(now);
                return;
            }
        };
        let message = resp.error_message.as_ref().map(|m| m.to_string());
        match resp.error_code.err() {
            None => {}
            Some(ResponseError::FencedMemberEpoch | ResponseError::UnknownMemberId) => {
                tracing::info!(group = %self.cfg.group_id, epoch = self.epoch, "fenced; partitions lost, joining again");
                self.lose_all();
                self.epoch = 0;
                self.next_heartbeat = Some(now);
                return;
            }
            Some(ResponseError::NotCoordinator | ResponseError::CoordinatorNotAvailable) => {
                self.coordinator_lost(now);
                return;
            }
            Some(ResponseError::CoordinatorLoadInProgress | ResponseError::RequestTimedOut) => {
                self.next_heartbeat = Some(now + self.cfg.retry_backoff);
                return;
            }
            Some(code) => {
                self.fail(code, message);
                return;
            }
        }
        if self.sent_epoch < 0 {
            return; // the answer to leaving
        }
        if resp.member_epoch < 0 {
            // Negative epochs only ever mean leaving; a broker that answers one is treated as
            // having fenced this member: partitions lost, join again at epoch 0.
            tracing::warn!(group = %self.cfg.group_id, epoch = resp.member_epoch, "heartbeat answered with a negative member epoch; joining again");
            self.lose_all();
            self.epoch = 0;
            self.next_heartbeat = Some(now + self.cfg.retry_backoff);
            return;
        }
        if let Some(id) = resp.member_id.as_ref()
            && !id.is_empty()
        {
            self.member_id = id.to_string();
        }
        self.epoch = resp.member_epoch;
        if resp.heartbeat_interval_ms > 0 {
            self.interval = Duration::from_millis(resp.heartbeat_interval_ms as u64);
        }
        self.next_heartbeat = Some(now + self.interval);
        if let Some(a) = resp.assignment {
            let mut target: BTreeMap<Uuid, BTreeSet<i32>> = BTreeMap::new();
            for t in a.topic_partitions {
                target.entry(t.topic_id).or_default().extend(t.partitions);
            }
            self.target = Some(target);
        }
        self.reconcile(now, names);
    }

    /// Moves the owned set towards the broker's target: revocations first, then additions.
    pub(crate) fn reconcile(&mut self, now: Instant, names: &dyn Fn(&Uuid) -> Option<String>) {
        if self.revoking.is_some() || self.state != State::Member {
            return;
        }
        let Some(target) = self.target.as_ref() else {
            return;
        };
        let mut wanted = BTreeSet::new();
        let mut unresolved = false;
        for (id, parts) in target {
            let Some(name) = names(id) else {
                unresolved = true;
                continue;
            };
            self.ids.insert(name.clone(), *id);
            for p in parts {
                wanted.insert(TopicPartition::new(name.as_str(), *p));
            }
        }
        self.unresolved = unresolved;
        // Owned partitions always have a known topic id; one missing from the target goes.
        let revoked: Vec<TopicPartition> = self
            .owned
            .iter()
            .filter(|tp| {
                !self
                    .ids
                    .get(&*tp.topic)
                    .and_then(|id| target.get(id))
                    .is_some_and(|ps| ps.contains(&tp.partition))
            })
            .cloned()
            .collect();
        if !revoked.is_empty() {
            self.revoking = Some(revoked.clone());
            self.events.push(GroupEvent::Revoke(revoked));
            return;
        }
        let added: Vec<TopicPartition> = wanted.difference(&self.owned).cloned().collect();
        if !unresolved {
            self.target = None;
        }
        if added.is_empty() {
            return;
        }
        self.owned.extend(added.iter().cloned());
        self.events.push(GroupEvent::Assign {
            added,
            generation: self.epoch,
        });
        // Acknowledge at once.
        self.next_heartbeat = Some(now);
    }

    /// The application gave the revoked partitions up: acknowledge at once.
    pub(crate) fn revocation_done(
        &mut self,
        now: Instant,
        names: &dyn Fn(&Uuid) -> Option<String>,
    ) {
        let Some(revoked) = self.revoking.take() else {
            return;
        };
        for tp in &revoked {
            self.owned.remove(tp);
        }
        self.next_heartbeat = Some(now);
        self.reconcile(now, names);
    }

    /// A commit was refused for a reason that concerns the membership.
    pub(crate) fn commit_refused(&mut self, code: ResponseError, now: Instant) {
        match code {
            ResponseError::FencedMemberEpoch | ResponseError::UnknownMemberId
                if self.state == State::Member =>
            {
                self.lose_all();
                self.epoch = 0;
                self.in_flight = None;
                self.next_heartbeat = Some(now);
            }
            ResponseError::StaleMemberEpoch => {
                // A heartbeat brings the current epoch.
                self.next_heartbeat = Some(now);
            }
            ResponseError::FencedInstanceId => self.fail(code, None),
            _ => {}
        }
    }

    /// The application did not poll within `max.poll.interval.ms`: partitions are lost and the
    /// member leaves; it joins again (same member id, epoch 0) when the application polls.
    pub(crate) fn poll_timeout(&mut self) -> Option<GroupAction> {
        if self.state != State::Member {
            return None;
        }
        tracing::warn!(group = %self.cfg.group_id, "the application did not poll within max.poll.interval.ms; leaving the group");
        let leave = self.leave_action();
        self.lose_all();
        self.state = State::Left;
        self.epoch = 0;
        self.in_flight = None;
        leave
    }

    pub(crate) fn resume_after_poll_timeout(&mut self) {
        if self.state == State::Left {
            self.state = State::Unjoined;
        }
    }

    /// Closing: leave (epoch -1; a static member -2, keeping its assignment for a restart
    /// within the session timeout).
    pub(crate) fn close(&mut self) -> Option<GroupAction> {
        let leave = self.leave_action();
        self.owned.clear();
        self.target = None;
        self.revoking = None;
        self.unresolved = false;
        self.in_flight = None;
        self.state = State::Closed;
        leave
    }

    fn leave_action(&self) -> Option<GroupAction> {
        if self.state != State::Member || self.epoch <= 0 {
            return None;
        }
        let node = self.coordinator.node()?;
        let epoch = if self.cfg.instance_id.is_some() {
            STATIC_LEAVE_EPOCH
        } else {
            LEAVE_EPOCH
        };
        Some(GroupAction::ConsumerLeave {
            node,
            request: self.heartbeat_request(epoch),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::consumer_group_heartbeat_response::{
        Assignment, TopicPartitions as RespTopicPartitions,
    };

    const TOPIC: Uuid = Uuid::from_u128(7);

    fn member() -> ConsumerMember {
        ConsumerMember::new(GroupConfig {
            group_id: "g".into(),
            instance_id: None,
            session_timeout: Duration::from_secs(45),
            rebalance_timeout: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(3),
            retry_backoff: Duration::from_millis(100),
            assignors: Vec::new(),
        })
    }

    fn names(id: &Uuid) -> Option<String> {
        (*id == TOPIC).then(|| "t".to_owned())
    }

    fn tp(p: i32) -> TopicPartition {
        TopicPartition::new("t", p)
    }

    fn answer(epoch: i32, parts: Option<&[i32]>) -> ConsumerGroupHeartbeatResponse {
        let mut r = ConsumerGroupHeartbeatResponse::default()
            .with_member_epoch(epoch)
            .with_heartbeat_interval_ms(1000);
        if let Some(parts) = parts {
            r = r.with_assignment(Some(Assignment::default().with_topic_partitions(vec![
                RespTopicPartitions::default()
                    .with_topic_id(TOPIC)
                    .with_partitions(parts.to_vec()),
            ])));
        }
        r
    }

    fn heartbeat(m: &mut ConsumerMember, now: Instant) -> (u64, ConsumerGroupHeartbeatRequest) {
        match m.poll_action(now) {
            Some(GroupAction::ConsumerHeartbeat { seq, request, .. }) => (seq, request),
            other => panic!("expected a heartbeat, got {other:?}"),
        }
    }

    /// Joined at epoch 3 owning t-0..t-2.
    fn joined(now: Instant) -> ConsumerMember {
        let mut m = member();
        m.subscribe(["t".to_owned()].into(), now);
        let Some(GroupAction::FindCoordinator { seq }) = m.poll_action(now) else {
            panic!("expected FindCoordinator");
        };
        m.handle_find_coordinator(seq, now, Ok(1));
        let (seq, req) = heartbeat(&mut m, now);
        assert_eq!(req.member_epoch, 0);
        assert_eq!(
            req.topic_partitions,
            Some(Vec::new()),
            "a join owns nothing"
        );
        assert!(req.rebalance_timeout_ms > 0);
        m.handle_heartbeat(seq, now, Ok(answer(3, Some(&[0, 1, 2]))), &names);
        assert_eq!(
            m.take_events(),
            vec![GroupEvent::Assign {
                added: vec![tp(0), tp(1), tp(2)],
                generation: 3
            }]
        );
        // The acknowledgement goes out at once, with the owned set.
        let (seq, req) = heartbeat(&mut m, now);
        assert_eq!(req.member_epoch, 3);
        let owned = req.topic_partitions.unwrap();
        assert_eq!(owned[0].partitions, vec![0, 1, 2]);
        m.handle_heartbeat(seq, now, Ok(answer(3, None)), &names);
        m
    }

    #[test]
    fn joins_and_acknowledges_the_assignment() {
        let now = Instant::now();
        let m = joined(now);
        assert_eq!(m.identity().unwrap().generation_or_epoch, 3);
        assert_eq!(m.owned().len(), 3);
    }

    /// Joined, then an epoch-4 target without t-2: the revocation of t-2 is under way at the
    /// returned instant.
    fn revoking_t2() -> (ConsumerMember, Instant) {
        let now = Instant::now();
        let mut m = joined(now);
        let t = now + Duration::from_secs(1);
        let (seq, _) = heartbeat(&mut m, t);
        m.handle_heartbeat(seq, t, Ok(answer(4, Some(&[0, 1]))), &names);
        assert_eq!(m.take_events(), vec![GroupEvent::Revoke(vec![tp(2)])]);
        (m, t)
    }

    /// A partition missing from the new target is revoked first; the acknowledgement waits for
    /// the application, then names only what is still owned.
    #[test]
    fn revokes_before_acknowledging() {
        let (mut m, t) = revoking_t2();
        assert!(
            m.owned().contains(&tp(2)),
            "owned until the application answers"
        );
        m.revocation_done(t, &names);
        let (_, req) = heartbeat(&mut m, t);
        assert_eq!(req.member_epoch, 4);
        assert_eq!(req.topic_partitions.unwrap()[0].partitions, vec![0, 1]);
    }

    /// FENCED_MEMBER_EPOCH: everything is lost (never committed), and the member joins again at
    /// epoch 0 with the same member id.
    #[test]
    fn fenced_loses_everything_and_rejoins_with_the_same_id() {
        let now = Instant::now();
        let mut m = joined(now);
        let id = m.identity().unwrap().member_id;
        let t = now + Duration::from_secs(1);
        let (seq, _) = heartbeat(&mut m, t);
        let fenced = ConsumerGroupHeartbeatResponse::default()
            .with_error_code(ResponseError::FencedMemberEpoch.code());
        m.handle_heartbeat(seq, t, Ok(fenced), &names);
        assert_eq!(
            m.take_events(),
            vec![GroupEvent::Lost(vec![tp(0), tp(1), tp(2)])]
        );
        assert!(m.identity().is_none());
        let (_, req) = heartbeat(&mut m, t);
        assert_eq!(req.member_epoch, 0);
        assert_eq!(req.member_id.as_str(), id);
    }

    #[test]
    fn unsupported_version_is_fatal_with_a_hint() {
        let now = Instant::now();
        let mut m = joined(now);
        let t = now + Duration::from_secs(1);
        let (seq, _) = heartbeat(&mut m, t);
        let no = ConsumerGroupHeartbeatResponse::default()
            .with_error_code(ResponseError::UnsupportedVersion.code());
        m.handle_heartbeat(seq, t, Ok(no), &names);
        assert!(m.is_fatal());
        assert!(m.fatal().unwrap().to_string().contains("group.protocol"));
        assert!(m.poll_action(t + Duration::from_secs(10)).is_none());
    }

    /// Topic ids metadata does not know yet wait; nothing is revoked for them meanwhile.
    #[test]
    fn unknown_topic_ids_wait_for_metadata() {
        let now = Instant::now();
        let mut m = joined(now);
        let t = now + Duration::from_secs(1);
        let (seq, _) = heartbeat(&mut m, t);
        let other = Uuid::from_u128(9);
        let resp = answer(4, Some(&[0, 1, 2])).with_assignment(Some(
            Assignment::default().with_topic_partitions(vec![
                RespTopicPartitions::default()
                    .with_topic_id(TOPIC)
                    .with_partitions(vec![0, 1, 2]),
                RespTopicPartitions::default()
                    .with_topic_id(other)
                    .with_partitions(vec![0]),
            ]),
        ));
        m.handle_heartbeat(seq, t, Ok(resp), &names);
        assert!(m.take_events().is_empty());
        assert!(m.needs_metadata());
        let known = |id: &Uuid| match *id {
            TOPIC => Some("t".to_owned()),
            x if x == other => Some("u".to_owned()),
            _ => None,
        };
        m.reconcile(t, &known);
        assert_eq!(
            m.take_events(),
            vec![GroupEvent::Assign {
                added: vec![TopicPartition::new("u", 0)],
                generation: 4
            }]
        );
        assert!(!m.needs_metadata());
    }

    /// A successful answer with a negative epoch is not taken as the member's epoch.
    #[test]
    fn negative_epoch_in_an_answer_is_fencing() {
        let now = Instant::now();
        let mut m = joined(now);
        let t = now + Duration::from_secs(1);
        let (seq, _) = heartbeat(&mut m, t);
        m.handle_heartbeat(seq, t, Ok(answer(-65, None)), &names);
        assert_eq!(
            m.take_events(),
            vec![GroupEvent::Lost(vec![tp(0), tp(1), tp(2)])]
        );
        let (_, req) = heartbeat(&mut m, t + Duration::from_secs(1));
        assert_eq!(req.member_epoch, 0);
    }

    #[test]
    fn leaving_uses_epoch_minus_one() {
        let now = Instant::now();
        let mut m = joined(now);
        let Some(GroupAction::ConsumerLeave { request, .. }) = m.close() else {
            panic!("expected a leave heartbeat");
        };
        assert_eq!(request.member_epoch, LEAVE_EPOCH);
    }

    /// Closing in the middle of a revocation ends it: the revocation is forgotten, and neither a
    /// later subscription nor the application finishing the revocation brings the member back.
    #[test]
    fn close_is_final_even_while_revoking() {
        let (mut m, t) = revoking_t2();
        assert!(matches!(m.close(), Some(GroupAction::ConsumerLeave { .. })));
        assert!(m.owned().is_empty());
        assert!(m.identity().is_none());
        m.revocation_done(t, &names);
        m.subscribe(["t".to_owned()].into(), t);
        m.resume_after_poll_timeout();
        assert!(m.poll_action(t + Duration::from_secs(10)).is_none());
        assert_eq!(m.take_events(), Vec::new());
        assert!(m.owned().is_empty());
    }
}
