//! The commit state machine: one commit in flight per group, a deadline per commit,
//! coordinator discovery that never caches a failure, and exactly one outcome per commit.
//!
//! ```text
//!  offer ──► next ──► current: NeedCoordinator ─► Finding ─► Ready ─► InFlight ─► Acked
//!              │            ▲   (FindCoordinator)            │          │       Failed
//!              │            └──── NOT_COORDINATOR, I/O ──────┴──────────┘       TimedOut
//!              └── a newer offer replaces `next` (and a `current` not yet sent): Superseded
//! ```
//!
//! With assigned partitions, commits use generation -1 and no member id: the consumer is not a
//! group member (as Flink's sources), so the broker accepts them while the group has no live
//! members. A subscribed consumer commits as a member: each request is built when it is sent,
//! with the generation (or KIP-848 member epoch) of that moment, and only for partitions the
//! member owns then. While the member has no generation (mid-rebalance) a commit waits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::error::{ParseResponseErrorCode, ResponseError};
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    FindCoordinatorRequest, FindCoordinatorResponse, GroupId, OffsetCommitRequest,
    OffsetCommitResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use std::collections::BTreeSet;

use crate::checkpoint::{CommitRequest, Offsets, Outcome};
use crate::error::Error;
use crate::proto::group::Identity;
use crate::types::TopicPartition;

/// What the driver must do next.
#[derive(Debug)]
pub(crate) enum Action {
    /// Ask any broker for the group coordinator (request id for matching the answer).
    FindCoordinator(u64),
    /// Send this commit to the coordinator node.
    Commit {
        seq: u64,
        node: i32,
        request: OffsetCommitRequest,
    },
}

/// A finished commit.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) request: CommitRequest,
    pub(crate) outcome: Outcome,
    /// Partitions the coordinator stored (all of them when acked).
    pub(crate) stored: Vec<(TopicPartition, i64)>,
    /// A refusal that concerns the group membership (the member must rejoin).
    pub(crate) refused: Option<ResponseError>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Needs a coordinator; may look one up from `not_before` on.
    NeedCoordinator { not_before: Instant },
    /// A FindCoordinator request is out.
    Finding { seq: u64 },
    /// Can be sent from `not_before` on.
    Ready { not_before: Instant },
    /// The OffsetCommit is out.
    InFlight { seq: u64 },
}

#[derive(Debug)]
struct Current {
    request: CommitRequest,
    deadline: Instant,
    phase: Phase,
}

/// The commit state machine of one group.
#[derive(Debug)]
pub(crate) struct Committer {
    group: GroupId,
    timeout: Duration,
    retry_backoff: Duration,
    coordinator: Option<i32>,
    current: Option<Current>,
    next: Option<CommitRequest>,
    /// Requests replaced by newer ones, for the driver to report.
    superseded: Vec<CommitRequest>,
    /// Commits that ended without a request (nothing owned left to commit).
    finished_early: Vec<Finished>,
    seq: u64,
    /// Group mode: the member's identity now (`None`: no generation, commits wait).
    member: Option<Identity>,
    /// Group mode: the partitions the member owns now.
    owned: Option<BTreeSet<TopicPartition>>,
}

impl Committer {
    pub(crate) fn new(group: &str, timeout: Duration, retry_backoff: Duration) -> Self {
        Self {
            group: GroupId(StrBytes::from_string(group.to_owned())),
            timeout,
            retry_backoff,
            coordinator: None,
            current: None,
            next: None,
            superseded: Vec::new(),
            finished_early: Vec::new(),
            seq: 0,
            member: None,
            owned: None,
        }
    }

    /// Group mode: who commits, and what it owns, from now on.
    pub(crate) fn set_member(
        &mut self,
        member: Option<Identity>,
        owned: Option<BTreeSet<TopicPartition>>,
    ) {
        self.member = member;
        self.owned = owned;
    }

    /// The coordinator in use, if known.
    pub(crate) fn coordinator(&self) -> Option<i32> {
        self.coordinator
    }

    /// True when nothing is pending or in flight.
    pub(crate) fn is_idle(&self) -> bool {
        self.current.is_none() && self.next.is_none()
    }

    /// Queues a commit. What it supersedes (every older request not on the wire: the queued
    /// one, and the current one while it waits to be sent or retried, since a retry must not go
    /// out with stale offsets) goes to [`take_superseded`](Self::take_superseded).
    pub(crate) fn offer(&mut self, request: CommitRequest) {
        // A retry pending since the last offer gives way to the queued request first, so
        // superseded requests are reported oldest first.
        self.promote_next();
        if let Some(old) = self.next.replace(request) {
            self.superseded.push(old);
        }
        self.promote_next();
    }

    /// Commits that ended without being sent since the last call.
    pub(crate) fn take_finished(&mut self) -> Vec<Finished> {
        std::mem::take(&mut self.finished_early)
    }

    /// Requests replaced by newer ones since the last call, oldest first.
    pub(crate) fn take_superseded(&mut self) -> Vec<CommitRequest> {
        std::mem::take(&mut self.superseded)
    }

    /// A current request that is not on the wire gives way to a newer queued one, keeping its
    /// phase (a coordinator lookup under way still applies). Commits therefore never go out of
    /// checkpoint order.
    fn promote_next(&mut self) {
        let Some(cur) = self.current.as_mut() else {
            return;
        };
        if matches!(cur.phase, Phase::InFlight { .. }) {
            return;
        }
        let Some(newer) = self.next.take() else {
            return;
        };
        cur.deadline = newer.created + self.timeout;
        let old = std::mem::replace(&mut cur.request, newer);
        self.superseded.push(old);
    }

    /// The next request to send, if any is due at `now`.
    pub(crate) fn poll_action(&mut self, now: Instant) -> Option<Action> {
        // A commit that went back to a retry phase gives way to a newer one first.
        self.promote_next();
        if self.current.is_none() {
            let request = self.next.take()?;
            let phase = match self.coordinator {
                Some(_) => Phase::Ready { not_before: now },
                None => Phase::NeedCoordinator { not_before: now },
            };
            self.current = Some(Current {
                deadline: request.created + self.timeout,
                request,
                phase,
            });
        }
        let cur = self.current.as_mut()?;
        match cur.phase {
            Phase::NeedCoordinator { not_before } if now >= not_before => {
                self.seq += 1;
                cur.phase = Phase::Finding { seq: self.seq };
                Some(Action::FindCoordinator(self.seq))
            }
            Phase::Ready { not_before } if now >= not_before => {
                let Some(node) = self.coordinator else {
                    cur.phase = Phase::NeedCoordinator { not_before: now };
                    return self.poll_action(now);
                };
                if self.owned.is_some() && self.member.is_none() {
                    // Mid-rebalance: wait for a generation (or the deadline).
                    return None;
                }
                if let Some(owned) = &self.owned
                    && !cur.request.offsets.keys().any(|tp| owned.contains(tp))
                {
                    // Every partition of it went to another member: nothing may be sent.
                    let cur = self.current.take()?;
                    self.finished_early.push(Finished {
                        request: cur.request,
                        outcome: Outcome::NotOwned,
                        stored: Vec::new(),
                        refused: None,
                    });
                    return self.poll_action(now);
                }
                self.seq += 1;
                cur.phase = Phase::InFlight { seq: self.seq };
                Some(Action::Commit {
                    seq: self.seq,
                    node,
                    request: commit_request(
                        &self.group,
                        &cur.request.offsets,
                        self.member.as_ref(),
                        self.owned.as_ref(),
                    ),
                })
            }
            _ => None,
        }
    }

    /// When the machine next needs attention without a response (a deadline or a backoff).
    pub(crate) fn next_timeout(&self) -> Option<Instant> {
        let cur = self.current.as_ref()?;
        let phase_at = match cur.phase {
            Phase::NeedCoordinator { not_before } | Phase::Ready { not_before } => Some(not_before),
            _ => None,
        };
        Some(phase_at.map_or(cur.deadline, |t| t.min(cur.deadline)))
    }

    /// Ends the current commit if its deadline passed.
    pub(crate) fn handle_timeout(&mut self, now: Instant) -> Option<Finished> {
        let cur = self.current.as_ref()?;
        if now < cur.deadline {
            return None;
        }
        if matches!(cur.phase, Phase::InFlight { .. }) {
            // A late answer would be for a request we no longer track; forget the coordinator
            // so the next commit looks it up afresh.
            self.coordinator = None;
        }
        let cur = self.current.take()?;
        Some(Finished {
            request: cur.request,
            outcome: Outcome::TimedOut,
            stored: Vec::new(),
            refused: None,
        })
    }

    /// Applies a FindCoordinator outcome: `(node, "host:port")` or an error.
    pub(crate) fn handle_find_coordinator(
        &mut self,
        seq: u64,
        now: Instant,
        result: Result<FindCoordinatorResponse, Error>,
    ) -> Result<Option<(i32, String)>, Box<Finished>> {
        let Some(cur) = self.current.as_mut() else {
            return Ok(None);
        };
        if cur.phase != (Phase::Finding { seq }) {
            return Ok(None);
        }
        let backoff = Phase::NeedCoordinator {
            not_before: now + self.retry_backoff,
        };
        let resp = match result {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "FindCoordinator failed; retrying");
                cur.phase = backoff;
                return Ok(None);
            }
        };
        let (node, addr) = match coordinator_of(&resp, self.group.0.as_str()) {
            Ok(found) => found,
            // COORDINATOR_NOT_AVAILABLE while __consumer_offsets is created, and friends.
            Err(e) if e.is_retriable() => {
                cur.phase = backoff;
                return Ok(None);
            }
            Err(e) => {
                let Some(cur) = self.current.take() else {
                    return Ok(None);
                };
                return Err(Box::new(Finished {
                    request: cur.request,
                    outcome: Outcome::Failed(e),
                    stored: Vec::new(),
                    refused: None,
                }));
            }
        };
        self.coordinator = Some(node);
        cur.phase = Phase::Ready { not_before: now };
        Ok(Some((node, addr)))
    }

    /// Applies an OffsetCommit outcome.
    pub(crate) fn handle_commit(
        &mut self,
        seq: u64,
        now: Instant,
        result: Result<OffsetCommitResponse, Error>,
    ) -> Option<Finished> {
        let cur = self.current.as_mut()?;
        if cur.phase != (Phase::InFlight { seq }) {
            return None; // an answer after the commit timed out
        }
        let resp = match result {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "OffsetCommit failed; finding the coordinator again");
                self.coordinator = None;
                cur.phase = Phase::NeedCoordinator {
                    not_before: now + self.retry_backoff,
                };
                return None;
            }
        };
        let mut stored = Vec::new();
        let mut retry_coordinator = false;
        let mut retry_later = false;
        let mut fatal: Vec<(TopicPartition, ResponseError)> = Vec::new();
        let owned = self.owned.as_ref();
        let sent = cur
            .request
            .offsets
            .iter()
            .filter(|(tp, _)| owned.is_none_or(|o| o.contains(*tp)));
        for (tp, (offset, _)) in sent {
            let code = resp
                .topics
                .iter()
                .filter(|t| t.name.0.as_str() == &*tp.topic)
                .flat_map(|t| t.partitions.iter())
                .find(|p| p.partition_index == tp.partition)
                .map(|p| p.error_code);
            match code.map(ParseResponseErrorCode::err) {
                Some(None) => stored.push((tp.clone(), *offset)),
                Some(Some(
                    ResponseError::NotCoordinator
                    | ResponseError::CoordinatorNotAvailable
                    | ResponseError::RequestTimedOut,
                )) => retry_coordinator = true,
                Some(Some(
                    ResponseError::CoordinatorLoadInProgress
                    | ResponseError::UnknownTopicOrPartition
                    | ResponseError::StaleMemberEpoch,
                )) => retry_later = true,
                Some(Some(code)) => fatal.push((tp.clone(), code)),
                None => fatal.push((tp.clone(), ResponseError::UnknownServerError)),
            }
        }
        if fatal.is_empty() && (retry_coordinator || retry_later) && now < cur.deadline {
            if retry_coordinator {
                self.coordinator = None;
                cur.phase = Phase::NeedCoordinator {
                    not_before: now + self.retry_backoff,
                };
            } else {
                cur.phase = Phase::Ready {
                    not_before: now + self.retry_backoff,
                };
            }
            return None;
        }
        let cur = self.current.take()?;
        let outcome = if let Some((tp, code)) = fatal.first() {
            let missing = fatal
                .iter()
                .filter(|(_, c)| *c == ResponseError::UnknownServerError)
                .count();
            Outcome::Failed(Error::broker(
                *code,
                format!(
                    "OffsetCommit of group {} ({} of {} partitions refused, first {tp}{})",
                    self.group.0.as_str(),
                    fatal.len(),
                    cur.request.offsets.len(),
                    if missing > 0 {
                        "; partitions missing from the response count as refused"
                    } else {
                        ""
                    }
                ),
                Some(diagnosis(*code).to_owned()),
            ))
        } else if retry_coordinator || retry_later {
            Outcome::TimedOut
        } else {
            Outcome::Acked
        };
        let refused = fatal.iter().map(|(_, c)| *c).find(|c| {
            matches!(
                c,
                ResponseError::IllegalGeneration
                    | ResponseError::UnknownMemberId
                    | ResponseError::RebalanceInProgress
                    | ResponseError::FencedInstanceId
                    | ResponseError::FencedMemberEpoch
            )
        });
        Some(Finished {
            request: cur.request,
            outcome,
            stored,
            refused,
        })
    }

    /// Drops what is queued (at close, once the deadline for flushing passed).
    pub(crate) fn take_all(&mut self) -> Vec<CommitRequest> {
        let mut v: Vec<CommitRequest> =
            self.current.take().map(|c| c.request).into_iter().collect();
        v.extend(self.next.take());
        v
    }
}

/// What an application should know about a commit error.
fn diagnosis(code: ResponseError) -> &'static str {
    match code {
        ResponseError::UnknownMemberId | ResponseError::IllegalGeneration => {
            "the group has active members (a subscribe()-mode consumer uses this group.id); commits from a consumer that is not a member are refused while it has any: use a group.id of its own"
        }
        ResponseError::GroupAuthorizationFailed => "this client may not commit for the group",
        ResponseError::TopicAuthorizationFailed => "this client may not read the topic",
        ResponseError::OffsetMetadataTooLarge => {
            "the commit metadata is larger than offset.metadata.max.bytes"
        }
        ResponseError::InvalidGroupId => "the group id is not valid",
        ResponseError::UnknownServerError => {
            "the coordinator's answer did not cover every partition"
        }
        _ => "the coordinator refused the commit",
    }
}

/// The OffsetCommit request for these offsets: as a member (`member`, only the `owned`
/// partitions), or without group membership.
pub(crate) fn commit_request(
    group: &GroupId,
    offsets: &Arc<Offsets>,
    member: Option<&Identity>,
    owned: Option<&BTreeSet<TopicPartition>>,
) -> OffsetCommitRequest {
    let mut topics: Vec<OffsetCommitRequestTopic> = Vec::new();
    let sent = offsets
        .iter()
        .filter(|(tp, _)| owned.is_none_or(|o| o.contains(*tp)));
    for (tp, (offset, epoch)) in sent {
        let p = OffsetCommitRequestPartition::default()
            .with_partition_index(tp.partition)
            .with_committed_offset(*offset)
            .with_committed_leader_epoch(*epoch);
        match topics
            .last_mut()
            .filter(|t| t.name.0.as_str() == &*tp.topic)
        {
            Some(t) => t.partitions.push(p),
            None => topics.push(
                OffsetCommitRequestTopic::default()
                    .with_name(TopicName(StrBytes::from_string(tp.topic.to_string())))
                    .with_partitions(vec![p]),
            ),
        }
    }
    let req = OffsetCommitRequest::default()
        .with_group_id(group.clone())
        .with_topics(topics);
    match member {
        Some(m) => req
            .with_generation_id_or_member_epoch(m.generation_or_epoch)
            .with_member_id(StrBytes::from_string(m.member_id.clone()))
            .with_group_instance_id(m.instance_id.clone().map(StrBytes::from_string)),
        None => req
            .with_generation_id_or_member_epoch(-1)
            .with_member_id(StrBytes::from_static_str("")),
    }
}

/// The coordinator a FindCoordinator response names, as `(node, "host:port")` (v4+ answers in
/// `coordinators`, v3 in the top-level fields). An error code, or an answer without a usable
/// node, is an [`Error::Broker`] (the latter as retriable `COORDINATOR_NOT_AVAILABLE`).
pub(crate) fn coordinator_of(
    resp: &FindCoordinatorResponse,
    group: &str,
) -> Result<(i32, String), Error> {
    let (code, message, node, host, port) = match resp.coordinators.first() {
        Some(c) => (
            c.error_code,
            c.error_message.as_ref(),
            c.node_id.0,
            &c.host,
            c.port,
        ),
        None => (
            resp.error_code,
            resp.error_message.as_ref(),
            resp.node_id.0,
            &resp.host,
            resp.port,
        ),
    };
    if let Some(code) = code.err() {
        return Err(Error::broker(
            code,
            format!("FindCoordinator for group {group}"),
            message.map(|m| m.to_string()),
        ));
    }
    if node < 0 || port <= 0 {
        return Err(Error::broker(
            ResponseError::CoordinatorNotAvailable,
            format!("FindCoordinator for group {group}"),
            Some(format!("answer names node {node} at port {port}")),
        ));
    }
    Ok((node, format!("{}:{port}", host.as_str())))
}

/// The FindCoordinator request for a group, at `version` (v3: `key`, v4+: `coordinator_keys`).
pub(crate) fn find_coordinator_request(group: &str, version: i16) -> FindCoordinatorRequest {
    let key = StrBytes::from_string(group.to_owned());
    let req = FindCoordinatorRequest::default().with_key_type(0);
    if version >= 4 {
        req.with_coordinator_keys(vec![key])
    } else {
        req.with_key(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::BrokerId;
    use kafka_protocol::messages::find_coordinator_response::Coordinator;
    use kafka_protocol::messages::offset_commit_response::{
        OffsetCommitResponsePartition, OffsetCommitResponseTopic,
    };

    fn req(n: i64, created: Instant) -> CommitRequest {
        CommitRequest {
            checkpoint_id: Some(n as u64),
            offsets: Arc::new(
                [
                    (TopicPartition::new("t", 0), (n, 0)),
                    (TopicPartition::new("t", 1), (n, 0)),
                ]
                .into_iter()
                .collect(),
            ),
            created,
        }
    }

    fn found(node: i32) -> Result<FindCoordinatorResponse, Error> {
        Ok(FindCoordinatorResponse::default().with_coordinators(vec![
            Coordinator::default()
                .with_node_id(BrokerId(node))
                .with_host(StrBytes::from_static_str("127.0.0.1"))
                .with_port(9092),
        ]))
    }

    fn answer(codes: &[(i32, ResponseError)]) -> Result<OffsetCommitResponse, Error> {
        let parts = (0..2)
            .map(|p| {
                let code = codes.iter().find(|c| c.0 == p).map_or(0, |c| c.1.code());
                OffsetCommitResponsePartition::default()
                    .with_partition_index(p)
                    .with_error_code(code)
            })
            .collect();
        Ok(OffsetCommitResponse::default().with_topics(vec![
            OffsetCommitResponseTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("t")))
                .with_partitions(parts),
        ]))
    }

    fn committer() -> Committer {
        Committer::new("g", Duration::from_secs(10), Duration::from_millis(100))
    }

    fn expect_find(c: &mut Committer, now: Instant) -> u64 {
        match c.poll_action(now) {
            Some(Action::FindCoordinator(seq)) => seq,
            other => panic!("expected FindCoordinator, got {other:?}"),
        }
    }

    fn expect_commit(c: &mut Committer, now: Instant) -> (u64, i32, OffsetCommitRequest) {
        match c.poll_action(now) {
            Some(Action::Commit { seq, node, request }) => (seq, node, request),
            other => panic!("expected Commit, got {other:?}"),
        }
    }

    #[test]
    fn happy_path_then_coordinator_is_reused() {
        let t0 = Instant::now();
        let mut c = committer();
        c.offer(req(1, t0));
        assert!(c.take_superseded().is_empty());
        let f = expect_find(&mut c, t0);
        assert_eq!(
            c.handle_find_coordinator(f, t0, found(2)).unwrap(),
            Some((2, "127.0.0.1:9092".into()))
        );
        let (seq, node, r) = expect_commit(&mut c, t0);
        assert_eq!(node, 2);
        assert_eq!(r.generation_id_or_member_epoch, -1);
        assert_eq!(r.topics[0].partitions.len(), 2);
        assert!(c.poll_action(t0).is_none(), "one commit in flight at most");
        let done = c.handle_commit(seq, t0, answer(&[])).unwrap();
        assert!(matches!(done.outcome, Outcome::Acked));
        assert_eq!(done.stored.len(), 2);
        assert!(c.is_idle());
        c.offer(req(2, t0));
        expect_commit(&mut c, t0); // no lookup: the coordinator is known
    }

    #[test]
    fn queued_commit_is_superseded_while_one_is_in_flight() {
        let t0 = Instant::now();
        let mut c = committer();
        c.coordinator = Some(1);
        c.offer(req(1, t0));
        let (seq, _, _) = expect_commit(&mut c, t0);
        c.offer(req(2, t0));
        assert!(c.take_superseded().is_empty());
        c.offer(req(3, t0));
        let old = c.take_superseded();
        assert_eq!(old.len(), 1);
        assert_eq!(old[0].checkpoint_id, Some(2));
        assert!(c.poll_action(t0).is_none());
        c.handle_commit(seq, t0, answer(&[])).unwrap();
        let (_, _, r) = expect_commit(&mut c, t0);
        assert_eq!(r.topics[0].partitions[0].committed_offset, 3);
    }

    #[test]
    fn not_coordinator_rediscovers_and_failed_lookup_is_not_cached() {
        let t0 = Instant::now();
        let mut c = committer();
        c.coordinator = Some(1);
        c.offer(req(1, t0));
        let (seq, _, _) = expect_commit(&mut c, t0);
        assert!(
            c.handle_commit(seq, t0, answer(&[(0, ResponseError::NotCoordinator)]))
                .is_none()
        );
        assert_eq!(c.coordinator(), None);
        assert!(c.poll_action(t0).is_none(), "backs off first");
        let t1 = t0 + Duration::from_millis(100);
        let f = expect_find(&mut c, t1);
        // A failed lookup is retried, never cached.
        let not_available = Ok(FindCoordinatorResponse::default().with_coordinators(vec![
            Coordinator::default().with_error_code(ResponseError::CoordinatorNotAvailable.code()),
        ]));
        assert_eq!(
            c.handle_find_coordinator(f, t1, not_available).unwrap(),
            None
        );
        assert_eq!(c.coordinator(), None);
        let t2 = t1 + Duration::from_millis(100);
        let f = expect_find(&mut c, t2);
        c.handle_find_coordinator(f, t2, found(3)).unwrap();
        let (seq, node, _) = expect_commit(&mut c, t2);
        assert_eq!(node, 3);
        assert!(matches!(
            c.handle_commit(seq, t2, answer(&[])).unwrap().outcome,
            Outcome::Acked
        ));
    }

    /// A commit that must be retried while newer ones arrive is replaced by the newest, and
    /// commits never go out of checkpoint order (a live run once committed 4, then 3).
    #[test]
    fn a_retrying_commit_gives_way_and_order_is_kept() {
        let t0 = Instant::now();
        let mut c = committer();
        c.coordinator = Some(1);
        c.offer(req(2, t0));
        let (seq, _, _) = expect_commit(&mut c, t0);
        c.offer(req(3, t0)); // queued behind the one in flight
        // The coordinator is still loading: 2 goes back to waiting for a retry...
        assert!(
            c.handle_commit(
                seq,
                t0,
                answer(&[(0, ResponseError::CoordinatorLoadInProgress)])
            )
            .is_none()
        );
        // ...and 3, newer, replaces it at once; 4 then replaces 3.
        let t1 = t0 + Duration::from_millis(100);
        let (seq, _, r) = expect_commit(&mut c, t1);
        assert_eq!(r.topics[0].partitions[0].committed_offset, 3);
        c.offer(req(4, t1));
        assert!(
            c.handle_commit(seq, t1, answer(&[(0, ResponseError::NotCoordinator)]))
                .is_none()
        );
        c.offer(req(5, t1));
        let superseded: Vec<_> = c
            .take_superseded()
            .iter()
            .map(|r| r.checkpoint_id)
            .collect();
        assert_eq!(superseded, vec![Some(2), Some(3), Some(4)]);
        let t2 = t1 + Duration::from_millis(100);
        let f = expect_find(&mut c, t2);
        c.handle_find_coordinator(f, t2, found(1)).unwrap();
        let (seq, _, r) = expect_commit(&mut c, t2);
        assert_eq!(r.topics[0].partitions[0].committed_offset, 5);
        assert!(matches!(
            c.handle_commit(seq, t2, answer(&[])).unwrap().outcome,
            Outcome::Acked
        ));
        assert!(c.is_idle());
        assert!(c.poll_action(t2).is_none());
    }

    #[test]
    fn deadline_times_out_and_late_answer_is_ignored() {
        let t0 = Instant::now();
        let mut c = committer();
        c.coordinator = Some(1);
        c.offer(req(1, t0));
        let (seq, _, _) = expect_commit(&mut c, t0);
        assert!(c.handle_timeout(t0 + Duration::from_secs(9)).is_none());
        let done = c.handle_timeout(t0 + Duration::from_secs(10)).unwrap();
        assert!(matches!(done.outcome, Outcome::TimedOut));
        assert!(c.handle_commit(seq, t0, answer(&[])).is_none());
        assert!(c.is_idle());
    }

    #[test]
    fn fatal_codes_fail_with_a_diagnosis() {
        let t0 = Instant::now();
        let mut c = committer();
        c.coordinator = Some(1);
        c.offer(req(1, t0));
        let (seq, _, _) = expect_commit(&mut c, t0);
        let done = c
            .handle_commit(seq, t0, answer(&[(1, ResponseError::UnknownMemberId)]))
            .unwrap();
        match done.outcome {
            Outcome::Failed(e) => {
                assert_eq!(e.kafka_code(), Some(ResponseError::UnknownMemberId));
                assert!(e.to_string().contains("active members"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(done.stored, vec![(TopicPartition::new("t", 0), 1)]);
    }

    #[test]
    fn missing_partitions_in_the_answer_are_failures() {
        let t0 = Instant::now();
        let mut c = committer();
        c.coordinator = Some(1);
        c.offer(req(1, t0));
        let (seq, _, _) = expect_commit(&mut c, t0);
        let done = c
            .handle_commit(seq, t0, Ok(OffsetCommitResponse::default()))
            .unwrap();
        assert!(matches!(done.outcome, Outcome::Failed(_)));
        assert!(done.stored.is_empty());
    }

    #[test]
    fn a_commit_waiting_to_retry_is_replaced_not_retried_with_stale_offsets() {
        let t0 = Instant::now();
        let mut c = committer();
        c.offer(req(1, t0));
        let f = expect_find(&mut c, t0);
        c.handle_find_coordinator(f, t0, Err(Error::Closed))
            .unwrap();
        c.offer(req(2, t0));
        let old = c.take_superseded();
        assert_eq!(old[0].checkpoint_id, Some(1));
        let f = expect_find(&mut c, t0 + Duration::from_millis(100));
        c.handle_find_coordinator(f, t0, found(1)).unwrap();
        let (_, _, r) = expect_commit(&mut c, t0);
        assert_eq!(r.topics[0].partitions[0].committed_offset, 2);
    }
}
