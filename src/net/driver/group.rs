//! The network loop's side of group membership: it runs the requests the membership machine
//! asks for, hands its events to the consumer one at a time, and keeps commits in step with
//! what this member owns.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kafka_protocol::error::{ParseResponseErrorCode, ResponseError};
use tokio::time::Instant;

use super::{Completion, Delivery, Driver};
use crate::error::{Error, Result};
use crate::net::pool::{ConnKey, Pool};
use crate::proto::commit;
use crate::proto::group::{GroupAction, GroupEvent, Membership};
use crate::proto::metadata::Metadata;
use crate::proto::versions;
use crate::types::TopicPartition;

/// What the consumer subscribed to.
#[derive(Debug, Clone)]
pub(crate) enum Topics {
    Names(BTreeSet<String>),
    /// A regular expression over topic names. The classic protocol matches it here against
    /// metadata; KIP-848 sends it to the broker.
    Pattern(regex::Regex),
}

/// A group event on its way to the consumer.
#[derive(Debug, Default)]
pub(crate) struct EventQueue {
    pending: std::collections::VecDeque<GroupEvent>,
    /// The event handed out last still needs an answer (a revocation, or the committed offsets
    /// of an assignment being looked up).
    busy: bool,
    /// The consumer answered a revocation; waiting for commits to drain before going on.
    flushing: bool,
}

impl Driver {
    /// Metadata topics for the subscription: names, or every topic for a pattern.
    pub(super) fn metadata_request(&self) -> Option<kafka_protocol::messages::MetadataRequest> {
        if matches!(self.subscription, Some(Topics::Pattern(_))) {
            return Some(Metadata::request_all());
        }
        let mut topics: BTreeSet<Arc<str>> = self.fetch.topics().into_iter().collect();
        if let Some(Topics::Names(names)) = &self.subscription {
            topics.extend(names.iter().map(|n| Arc::from(n.as_str())));
        }
        if topics.is_empty() {
            return None;
        }
        Some(Metadata::request(&topics.into_iter().collect::<Vec<_>>()))
    }

    pub(super) fn subscribe(&mut self, topics: Topics) {
        let now = Instant::now().into_std();
        self.subscription = Some(topics.clone());
        self.metadata_wanted = true;
        let Some(m) = self.group.as_mut() else {
            return;
        };
        match (m, topics) {
            (Membership::Classic(c), Topics::Names(names)) => c.subscribe(names),
            (Membership::Classic(_), Topics::Pattern(_)) => {
                // Resolved against metadata when it arrives.
            }
            (Membership::Consumer(c), Topics::Names(names)) => c.subscribe(names, now),
            (Membership::Consumer(c), Topics::Pattern(re)) => {
                c.subscribe_pattern(re.as_str().to_owned(), now);
            }
        }
    }

    /// After a metadata response: resolve a classic pattern, watch partition counts, resolve
    /// KIP-848 topic ids.
    pub(super) fn group_metadata(&mut self) {
        let now = Instant::now().into_std();
        let Some(m) = self.group.as_mut() else {
            return;
        };
        let meta = &self.meta;
        match m {
            Membership::Classic(c) => {
                if let Some(Topics::Pattern(re)) = &self.subscription {
                    let matched: BTreeSet<String> = meta
                        .topic_names()
                        .filter(|(name, internal)| !internal && re.is_match(name))
                        .map(|(name, _)| name.to_owned())
                        .collect();
                    c.subscribe(matched);
                }
                let counts: BTreeMap<String, i32> = c
                    .topics()
                    .iter()
                    .filter_map(|t| meta.partition_count(t).map(|n| (t.clone(), n)))
                    .collect();
                c.metadata(&counts);
            }
            Membership::Consumer(c) => {
                let names = |id: &uuid::Uuid| meta.name_by_id(id).map(|n| n.to_string());
                c.reconcile(now, &names);
            }
        }
    }

    /// Runs what the membership machine wants, and hands its events on. Called every turn.
    pub(super) fn schedule_group(&mut self, now: Instant) {
        if self.group.is_none() || self.subscription.is_none() {
            return;
        }
        self.check_poll_interval(now);
        // Commits carry the current identity, and only partitions owned now. Only a committer
        // with work reads them, so they are copied only then, not on every turn.
        if let (Some(m), Some(c)) = (self.group.as_ref(), self.committer.as_mut())
            && !c.is_idle()
        {
            c.set_member(m.identity(), Some(m.owned().clone()));
        }
        self.finish_revocation_if_drained(now);
        let std_now = now.into_std();
        while let Some(action) = self.group.as_mut().and_then(|m| m.poll_action(std_now)) {
            self.spawn_group_action(action);
        }
        if let Some(m) = self.group.as_mut() {
            let events = m.take_events();
            self.events.pending.extend(events);
            if let Some(e) = m
                .is_fatal()
                .then(|| m.fatal().map(Error::duplicate))
                .flatten()
                && !self.fatal_reported
            {
                self.fatal_reported = true;
                let _ = self.out.send(Delivery::Error(e));
            }
        }
        if let Membership::Consumer(c) = self.group.as_ref().expect("checked above")
            && c.needs_metadata()
        {
            self.metadata_wanted = true;
        }
        self.next_group_event();
    }

    /// A revocation the consumer answered completes once its commits drained. Checked on every
    /// turn that may have drained them (a commit's completion wakes the loop).
    pub(super) fn finish_revocation_if_drained(&mut self, now: Instant) {
        if !self.events.flushing || !self.committer.as_ref().is_none_or(|c| c.is_idle()) {
            return;
        }
        self.events.flushing = false;
        self.events.busy = false;
        let meta = &self.meta;
        let names = |id: &uuid::Uuid| meta.name_by_id(id).map(|n| n.to_string());
        if let Some(m) = self.group.as_mut() {
            m.revocation_done(now.into_std(), &names);
        }
    }

    /// Hands the next event to the consumer once the previous one is answered.
    fn next_group_event(&mut self) {
        while !self.events.busy {
            let Some(ev) = self.events.pending.pop_front() else {
                return;
            };
            match ev {
                GroupEvent::Lost(tps) => {
                    let _ = self.out.send(Delivery::Lost(tps));
                }
                GroupEvent::Revoke(tps) => {
                    self.events.busy = true;
                    let _ = self.out.send(Delivery::Revoke(tps));
                }
                GroupEvent::Assign { added, generation } => {
                    self.events.busy = true;
                    self.lookup_positions(added, generation);
                }
            }
        }
    }

    /// The consumer gave the revoked partitions up (and offered any commits first).
    pub(super) fn revoke_done(&mut self) {
        if let Some(req) = self.ckpt.handover.take() {
            self.offer_commit(req);
        }
        self.events.flushing = true;
    }

    /// Committed offsets of newly assigned partitions, then the assignment goes to the consumer.
    fn lookup_positions(&mut self, added: Vec<TopicPartition>, generation: i32) {
        let Some(group) = self.cfg.group.clone() else {
            return;
        };
        if added.is_empty() {
            tracing::debug!(generation, "assignment unchanged");
            let _ = self.out.send(Delivery::Assigned { added: Vec::new() });
            self.events.busy = false;
            return;
        }
        let pool = Arc::clone(&self.pool);
        let backoff = self.cfg.retry_backoff;
        let timeout = self.cfg.request_timeout;
        self.inflight.push(Box::pin(async move {
            let deadline = Instant::now() + timeout;
            let res = loop {
                match super::offset_fetch(&pool, &group, added.clone()).await {
                    Err(e) if e.is_retriable() && Instant::now() + backoff < deadline => {
                        tokio::time::sleep(backoff).await;
                    }
                    other => break other,
                }
            };
            Completion::Positions(added, generation, res)
        }));
    }

    pub(super) fn handle_positions(
        &mut self,
        added: Vec<TopicPartition>,
        generation: i32,
        res: Result<super::Committed>,
    ) {
        self.events.busy = false;
        let owned = self
            .group
            .as_ref()
            .map(|m| m.owned().clone())
            .unwrap_or_default();
        // Partitions lost while the lookup ran are not handed out.
        let added: Vec<TopicPartition> =
            added.into_iter().filter(|tp| owned.contains(tp)).collect();
        match res {
            Ok(committed) => {
                let list = added
                    .into_iter()
                    .map(|tp| {
                        let c = committed.get(&tp).copied().flatten();
                        (tp, c)
                    })
                    .collect();
                tracing::debug!(generation, "new partitions positioned");
                let _ = self.out.send(Delivery::Assigned { added: list });
            }
            Err(e) if e.is_retriable() && !added.is_empty() => {
                // The coordinator is moving or loading: keep asking; the partitions cannot
                // start safely without their committed offsets.
                tracing::debug!(error = %e, "committed offsets of the new assignment; retrying");
                self.events.busy = true;
                self.lookup_positions(added, generation);
            }
            Err(e) => {
                // Not retriable (authorization, for one): the application hears of it, and the
                // partitions stay unread until the next rebalance.
                tracing::warn!(error = %e, "cannot read committed offsets of the new assignment");
                let _ = self.out.send(Delivery::Error(e));
                let _ = self.out.send(Delivery::Assigned { added: Vec::new() });
            }
        }
    }

    /// `max.poll.interval.ms`: leave when the application stopped polling, join again once it
    /// polls.
    fn check_poll_interval(&mut self, now: Instant) {
        let Some(m) = self.group.as_mut() else {
            return;
        };
        let last = self.shared.last_poll_ms.load(Ordering::Acquire);
        let waiting = self.shared.in_poll.load(Ordering::Acquire);
        let since = self.shared.epoch.elapsed().as_millis() as u64;
        let idle = Duration::from_millis(since.saturating_sub(last));
        if self.poll_timed_out {
            if waiting || idle < self.cfg.max_poll_interval {
                self.poll_timed_out = false;
                m.resume_after_poll_timeout();
            }
            return;
        }
        if !waiting && idle >= self.cfg.max_poll_interval {
            self.poll_timed_out = true;
            self.shared
                .left_for_poll_timeout
                .store(true, Ordering::Release);
            if let Some(a) = m.poll_timeout() {
                self.spawn_group_action(a);
            }
            // A revocation the application never answered is void now.
            self.events.busy = false;
            self.events.flushing = false;
            let _ = now;
        }
    }

    /// When the group machine or the poll timer next needs a turn.
    pub(super) fn group_wake(&self) -> Option<Instant> {
        self.subscription.as_ref()?;
        let m = self.group.as_ref()?;
        let mut wake = m.next_timeout().map(Instant::from_std);
        if !self.poll_timed_out {
            let last = Duration::from_millis(self.shared.last_poll_ms.load(Ordering::Acquire));
            let t = Instant::from_std(self.shared.epoch) + last + self.cfg.max_poll_interval;
            wake = Some(wake.map_or(t, |w| w.min(t)));
        }
        wake
    }

    pub(super) fn spawn_group_action(&mut self, action: GroupAction) {
        let pool = Arc::clone(&self.pool);
        let group = self.cfg.group.clone().unwrap_or_default();
        let join_wait = self.cfg.max_poll_interval + Duration::from_secs(5);
        match action {
            GroupAction::FindCoordinator { seq } => self.inflight.push(Box::pin(async move {
                let res = find_coordinator(&pool, &group).await;
                Completion::GroupFind(seq, res)
            })),
            GroupAction::Join { seq, node, request } => {
                self.inflight.push(Box::pin(async move {
                    let res = async {
                        let conn = pool.get(ConnKey::Group(node)).await?;
                        let v = conn.version(versions::JOIN_GROUP)?;
                        // The broker parks JoinGroup until the rebalance completes.
                        conn.request(&request, v, join_wait).await
                    }
                    .await;
                    Completion::Join(seq, res)
                }));
            }
            GroupAction::LeaderMetadata { seq, topics } => {
                self.inflight.push(Box::pin(async move {
                    let res = async {
                        let conn = pool.any().await?;
                        let v = conn.version(versions::METADATA)?;
                        let names: Vec<Arc<str>> =
                            topics.iter().map(|t| Arc::from(t.as_str())).collect();
                        let resp = conn
                            .request(&Metadata::request(&names), v, Duration::ZERO)
                            .await?;
                        let mut meta = Metadata::default();
                        meta.handle_response(&resp);
                        Ok(topics
                            .into_iter()
                            .filter_map(|t| meta.partition_count(&t).map(|n| (t, n)))
                            .collect())
                    }
                    .await;
                    Completion::LeaderMetadata(seq, res)
                }));
            }
            GroupAction::Sync { seq, node, request } => {
                self.inflight.push(Box::pin(async move {
                    let res = async {
                        let conn = pool.get(ConnKey::Group(node)).await?;
                        let v = conn.version(versions::SYNC_GROUP)?;
                        conn.request(&request, v, join_wait).await
                    }
                    .await;
                    Completion::Sync(seq, res)
                }));
            }
            GroupAction::Heartbeat { seq, node, request } => {
                self.inflight.push(Box::pin(async move {
                    let res = async {
                        let conn = pool.get(ConnKey::Group(node)).await?;
                        let v = conn.version(versions::HEARTBEAT)?;
                        conn.request(&request, v, Duration::ZERO).await
                    }
                    .await;
                    Completion::Heartbeat(seq, res)
                }));
            }
            GroupAction::ConsumerHeartbeat { seq, node, request } => {
                self.inflight.push(Box::pin(async move {
                    let res = async {
                        let conn = pool.get(ConnKey::Group(node)).await?;
                        let v = conn.version(versions::CONSUMER_GROUP_HEARTBEAT)?;
                        conn.request(&request, v, Duration::ZERO).await
                    }
                    .await;
                    Completion::ConsumerHeartbeat(seq, res)
                }));
            }
            GroupAction::Leave { node, request } => {
                self.leaving += 1;
                self.inflight.push(Box::pin(async move {
                    let res: Result<()> = async {
                        let conn = pool.get(ConnKey::Group(node)).await?;
                        let v = conn.version(versions::LEAVE_GROUP)?;
                        let resp = conn.request(&request, v, Duration::ZERO).await?;
                        if let Some(code) = resp.error_code.err() {
                            return Err(Error::broker(code, "LeaveGroup", None));
                        }
                        Ok(())
                    }
                    .await;
                    if let Err(e) = res {
                        tracing::debug!(error = %e, "LeaveGroup failed");
                    }
                    Completion::Left
                }));
            }
            GroupAction::ConsumerLeave { node, request } => {
                self.leaving += 1;
                self.inflight.push(Box::pin(async move {
                    let res: Result<()> = async {
                        let conn = pool.get(ConnKey::Group(node)).await?;
                        let v = conn.version(versions::CONSUMER_GROUP_HEARTBEAT)?;
                        let resp = conn.request(&request, v, Duration::ZERO).await?;
                        if let Some(code) = resp.error_code.err() {
                            return Err(Error::broker(
                                code,
                                "ConsumerGroupHeartbeat (leave)",
                                None,
                            ));
                        }
                        Ok(())
                    }
                    .await;
                    if let Err(e) = res {
                        tracing::debug!(error = %e, "leaving the group failed");
                    }
                    Completion::Left
                }));
            }
        }
    }

    /// Applies a group completion.
    pub(super) fn handle_group_completion(&mut self, done: Completion) {
        let now = Instant::now().into_std();
        let meta = &self.meta;
        let names = |id: &uuid::Uuid| meta.name_by_id(id).map(|n| n.to_string());
        let Some(m) = self.group.as_mut() else {
            return;
        };
        let follow = match (m, done) {
            (m, Completion::GroupFind(seq, res)) => {
                let res = res.map(|(node, addr)| {
                    self.pool.add_node(node, addr);
                    self.shared.coordinator.store(node, Ordering::Relaxed);
                    node
                });
                m.handle_find_coordinator(seq, now, res);
                None
            }
            (Membership::Classic(c), Completion::Join(seq, res)) => c.handle_join(seq, now, res),
            (Membership::Classic(c), Completion::LeaderMetadata(seq, res)) => {
                c.handle_leader_metadata(seq, now, res)
            }
            (Membership::Classic(c), Completion::Sync(seq, res)) => {
                let counts: BTreeMap<String, i32> = c
                    .topics()
                    .iter()
                    .filter_map(|t| meta.partition_count(t).map(|n| (t.clone(), n)))
                    .collect();
                c.handle_sync(seq, now, res, &counts);
                None
            }
            (Membership::Classic(c), Completion::Heartbeat(seq, res)) => {
                c.handle_heartbeat(seq, now, res);
                None
            }
            (Membership::Consumer(c), Completion::ConsumerHeartbeat(seq, res)) => {
                c.handle_heartbeat(seq, now, res, &names);
                None
            }
            (_, Completion::Left) => {
                self.leaving = self.leaving.saturating_sub(1);
                None
            }
            _ => None,
        };
        if let Some(a) = follow {
            self.spawn_group_action(a);
        }
        if self
            .group
            .as_ref()
            .and_then(Membership::coordinator)
            .is_none()
        {
            self.shared.coordinator.store(-1, Ordering::Relaxed);
        }
    }

    /// A commit finished with a code that concerns the membership.
    pub(super) fn group_commit_refused(&mut self, code: ResponseError) {
        if let Some(m) = self.group.as_mut() {
            m.commit_refused(code, Instant::now().into_std());
        }
    }

    /// Closing: leave the group (static members do not).
    pub(super) fn leave_group(&mut self) {
        if let Some(a) = self.group.as_mut().and_then(Membership::close) {
            self.spawn_group_action(a);
        }
    }
}

/// FindCoordinator for a group: `(node, "host:port")`.
pub(super) async fn find_coordinator(pool: &Pool, group: &str) -> Result<(i32, String)> {
    let conn = pool.any().await?;
    let v = conn.version(versions::FIND_COORDINATOR)?;
    let resp = conn
        .request(
            &commit::find_coordinator_request(group, v),
            v,
            Duration::ZERO,
        )
        .await?;
    commit::coordinator_of(&resp, group)
}
