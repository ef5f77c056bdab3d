//! Consumer-group membership, sans IO: the classic protocol (JoinGroup, SyncGroup, Heartbeat,
//! LeaveGroup) and KIP-848 (ConsumerGroupHeartbeat), and the ConsumerProtocol bytes members
//! exchange.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::{
    ConsumerGroupHeartbeatRequest, HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest,
    SyncGroupRequest,
};

use crate::assignor::Assignor;
use crate::error::Error;
use crate::types::TopicPartition;

pub(crate) mod classic;
pub(crate) mod consumer_protocol;
pub(crate) mod kip848;

/// Settings of one membership.
#[derive(Clone, Debug)]
pub(crate) struct GroupConfig {
    pub(crate) group_id: String,
    pub(crate) instance_id: Option<String>,
    pub(crate) session_timeout: Duration,
    /// `max.poll.interval.ms`: how long the group waits for this member to rejoin.
    pub(crate) rebalance_timeout: Duration,
    pub(crate) heartbeat_interval: Duration,
    pub(crate) retry_backoff: Duration,
    /// Classic protocol: the assignors offered, in order of preference.
    pub(crate) assignors: Vec<Arc<dyn Assignor>>,
}

/// Who a commit comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    /// The classic generation, or the KIP-848 member epoch.
    pub(crate) generation_or_epoch: i32,
    pub(crate) member_id: String,
    pub(crate) instance_id: Option<String>,
}

/// A request the network loop must send for the membership.
#[derive(Debug)]
pub(crate) enum GroupAction {
    /// Ask any broker for the group coordinator.
    FindCoordinator { seq: u64 },
    /// JoinGroup to the coordinator; parked by the broker until the rebalance completes.
    Join {
        seq: u64,
        node: i32,
        request: JoinGroupRequest,
    },
    /// The leader needs the partition counts of these topics.
    LeaderMetadata { seq: u64, topics: Vec<String> },
    Sync {
        seq: u64,
        node: i32,
        request: SyncGroupRequest,
    },
    Heartbeat {
        seq: u64,
        node: i32,
        request: HeartbeatRequest,
    },
    /// KIP-848 heartbeat.
    ConsumerHeartbeat {
        seq: u64,
        node: i32,
        request: ConsumerGroupHeartbeatRequest,
    },
    /// Best effort; no answer is awaited.
    Leave {
        node: i32,
        request: LeaveGroupRequest,
    },
    /// KIP-848 leave (epoch -1, or -2 for a static member); best effort.
    ConsumerLeave {
        node: i32,
        request: ConsumerGroupHeartbeatRequest,
    },
}

/// What the application must learn about its assignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GroupEvent {
    /// Give these partitions up (commit first if you like); the membership waits for the
    /// answer before it goes on.
    Revoke(Vec<TopicPartition>),
    /// These partitions are gone already (the membership was lost); do not commit them.
    Lost(Vec<TopicPartition>),
    /// A new assignment: the partitions added by it (maybe none).
    Assign {
        added: Vec<TopicPartition>,
        generation: i32,
    },
}

/// The membership of a subscribed consumer, whichever protocol it speaks.
#[derive(Debug)]
pub(crate) enum Membership {
    Classic(classic::ClassicMember),
    Consumer(kip848::ConsumerMember),
}

/// Resolves a topic id to its name (from metadata).
pub(crate) type Names<'a> = &'a dyn Fn(&uuid::Uuid) -> Option<String>;

impl Membership {
    pub(crate) fn identity(&self) -> Option<Identity> {
        match self {
            Self::Classic(m) => m.identity(),
            Self::Consumer(m) => m.identity(),
        }
    }

    pub(crate) fn owned(&self) -> &std::collections::BTreeSet<TopicPartition> {
        match self {
            Self::Classic(m) => m.owned(),
            Self::Consumer(m) => m.owned(),
        }
    }

    pub(crate) fn coordinator(&self) -> Option<i32> {
        match self {
            Self::Classic(m) => m.coordinator(),
            Self::Consumer(m) => m.coordinator(),
        }
    }

    pub(crate) fn fatal(&self) -> Option<&crate::error::Error> {
        match self {
            Self::Classic(m) => m.fatal(),
            Self::Consumer(m) => m.fatal(),
        }
    }

    pub(crate) fn is_fatal(&self) -> bool {
        match self {
            Self::Classic(m) => m.is_fatal(),
            Self::Consumer(m) => m.is_fatal(),
        }
    }

    pub(crate) fn take_events(&mut self) -> Vec<GroupEvent> {
        match self {
            Self::Classic(m) => m.take_events(),
            Self::Consumer(m) => m.take_events(),
        }
    }

    pub(crate) fn poll_action(&mut self, now: std::time::Instant) -> Option<GroupAction> {
        match self {
            Self::Classic(m) => m.poll_action(now),
            Self::Consumer(m) => m.poll_action(now),
        }
    }

    pub(crate) fn next_timeout(&self) -> Option<std::time::Instant> {
        match self {
            Self::Classic(m) => m.next_timeout(),
            Self::Consumer(m) => m.next_timeout(),
        }
    }

    pub(crate) fn handle_find_coordinator(
        &mut self,
        seq: u64,
        now: std::time::Instant,
        result: Result<i32, crate::error::Error>,
    ) {
        match self {
            Self::Classic(m) => m.handle_find_coordinator(seq, now, result),
            Self::Consumer(m) => m.handle_find_coordinator(seq, now, result),
        }
    }

    pub(crate) fn revocation_done(&mut self, now: std::time::Instant, names: Names<'_>) {
        match self {
            Self::Classic(m) => m.revocation_done(now),
            Self::Consumer(m) => m.revocation_done(now, names),
        }
    }

    pub(crate) fn commit_refused(
        &mut self,
        code: kafka_protocol::error::ResponseError,
        now: std::time::Instant,
    ) {
        match self {
            Self::Classic(m) => m.commit_refused(code, now),
            Self::Consumer(m) => m.commit_refused(code, now),
        }
    }

    pub(crate) fn poll_timeout(&mut self) -> Option<GroupAction> {
        match self {
            Self::Classic(m) => m.poll_timeout(),
            Self::Consumer(m) => m.poll_timeout(),
        }
    }

    pub(crate) fn resume_after_poll_timeout(&mut self) {
        match self {
            Self::Classic(m) => m.resume_after_poll_timeout(),
            Self::Consumer(m) => m.resume_after_poll_timeout(),
        }
    }

    pub(crate) fn close(&mut self) -> Option<GroupAction> {
        match self {
            Self::Classic(m) => m.close(),
            Self::Consumer(m) => m.close(),
        }
    }
}

/// Finding the group coordinator, the same for both protocols: one FindCoordinator out at a
/// time, a backoff after a failure, and a failure never cached.
#[derive(Debug, Default)]
pub(crate) struct CoordinatorLookup {
    node: Option<i32>,
    /// The FindCoordinator out, if any.
    finding: Option<u64>,
    /// When the coordinator may be looked up again.
    not_before: Option<Instant>,
}

impl CoordinatorLookup {
    /// The coordinator, when known.
    pub(crate) fn node(&self) -> Option<i32> {
        self.node
    }

    /// While the coordinator is unknown: the lookup to send now (`seq` names it), if one is due.
    pub(crate) fn poll(&mut self, now: Instant, seq: impl FnOnce() -> u64) -> Option<GroupAction> {
        if self.node.is_some() || self.finding.is_some() || self.not_before.is_some_and(|t| now < t)
        {
            return None;
        }
        let seq = seq();
        self.finding = Some(seq);
        Some(GroupAction::FindCoordinator { seq })
    }

    /// When a lookup is next due, while the coordinator is unknown and none is out.
    pub(crate) fn next_timeout(&self) -> Option<Instant> {
        if self.node.is_some() || self.finding.is_some() {
            return None;
        }
        self.not_before
    }

    /// Applies a lookup's answer. A failure of the lookup out is returned (the next one waits
    /// `backoff`); answers to older lookups are ignored.
    pub(crate) fn handle(
        &mut self,
        seq: u64,
        now: Instant,
        backoff: Duration,
        result: Result<i32, Error>,
    ) -> Result<(), Error> {
        if self.finding != Some(seq) {
            return Ok(());
        }
        self.finding = None;
        match result {
            Ok(node) => {
                self.node = Some(node);
                self.not_before = None;
                Ok(())
            }
            Err(e) => {
                tracing::debug!(error = %e, "FindCoordinator for the group failed");
                self.not_before = Some(now + backoff);
                Err(e)
            }
        }
    }

    /// The coordinator moved or failed: look it up again from `not_before` on.
    pub(crate) fn lost(&mut self, not_before: Instant) {
        self.node = None;
        self.not_before = Some(not_before);
    }
}

/// A duration as the protocol's `i32` milliseconds, saturating.
pub(crate) fn ms_i32(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}
