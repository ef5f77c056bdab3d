//! Partition assignment for consumer groups on the classic protocol: what each member tells the
//! group (its [`Subscription`]) and what the group leader hands back to it
//! ([`MemberAssignment`]).
//!
//! Both travel as the Java client's "ConsumerProtocol" bytes inside JoinGroup and SyncGroup, so
//! members of this crate and Java `KafkaConsumer`s can share a group. The leader runs an
//! [`Assignor`] over every member's subscription; [`builtin`] gives the built-in one for each
//! [`AssignmentStrategy`].

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;

use crate::config::AssignmentStrategy;
use crate::types::TopicPartition;

/// What a member sends when it joins the group: the topics it wants, and the partitions it owns
/// now (for sticky and cooperative assignment).
///
/// On the wire this is a `ConsumerProtocolSubscription` (versions 0 to 3).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Subscription {
    /// The subscribed topics. Encoded sorted; decoded in wire order.
    pub topics: Vec<String>,
    /// Assignor-specific data (`None` encodes as null).
    pub user_data: Option<Bytes>,
    /// The partitions the member owns now (version 1+). Encoded sorted by topic and partition.
    pub owned_partitions: Vec<TopicPartition>,
    /// The generation in which the member got `owned_partitions` (version 2+); -1 (any negative
    /// value) if it has none.
    pub generation_id: i32,
    /// The member's rack (`client.rack`, version 3+). An empty rack on the wire decodes as
    /// `None`, as in the Java client.
    pub rack_id: Option<String>,
}

impl Subscription {
    /// A subscription to `topics`, owning nothing, with no generation, user data or rack.
    pub fn new(topics: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            topics: topics.into_iter().map(Into::into).collect(),
            user_data: None,
            owned_partitions: Vec::new(),
            generation_id: -1,
            rack_id: None,
        }
    }
}

impl Default for Subscription {
    /// No topics, nothing owned, generation -1.
    fn default() -> Self {
        Self::new(Vec::<String>::new())
    }
}

/// What the group leader assigns to one member.
///
/// On the wire this is a `ConsumerProtocolAssignment` (versions 0 to 3, all the same body).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemberAssignment {
    /// The partitions the member is to consume.
    pub partitions: Vec<TopicPartition>,
    /// Assignor-specific data (`None` encodes as null).
    pub user_data: Option<Bytes>,
}

impl MemberAssignment {
    /// An assignment of `partitions`, without user data.
    pub fn new(partitions: Vec<TopicPartition>) -> Self {
        Self {
            partitions,
            user_data: None,
        }
    }
}

/// How members move partitions during a rebalance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RebalanceProtocol {
    /// Every member gives up all its partitions before rejoining (`range`, `roundrobin`).
    Eager,
    /// Members keep their partitions while rejoining and give up only those the new assignment
    /// moves elsewhere, then rejoin once more so the new owner gets them (KIP-429).
    Cooperative,
}

/// A member of the group as the leader sees it in the JoinGroup response.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupMember {
    /// The member id the coordinator gave the member.
    pub member_id: String,
    /// The member's `group.instance.id` (static membership, KIP-345), if it has one.
    pub group_instance_id: Option<String>,
    /// The member's decoded metadata.
    pub subscription: Subscription,
}

impl GroupMember {
    /// A dynamic member (no `group.instance.id`).
    pub fn new(member_id: impl Into<String>, subscription: Subscription) -> Self {
        Self {
            member_id: member_id.into(),
            group_instance_id: None,
            subscription,
        }
    }
}

/// Why an assignor could not compute an assignment.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AssignorError(String);

impl AssignorError {
    /// An error with this message.
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.0
    }
}

/// A partition assignment strategy, run by the member the coordinator picks as group leader.
///
/// The group agrees on one strategy by name: each member lists the names it supports, and the
/// coordinator picks one that every member supports. The built-ins ([`RangeAssignor`],
/// [`RoundRobinAssignor`], [`CooperativeStickyAssignor`]) compute exactly what the Java
/// client's assignors of the same name compute (see each for the details), so a group can mix
/// members of this crate and Java consumers whichever of them leads.
pub trait Assignor: Send + Sync + std::fmt::Debug {
    /// The protocol name advertised in JoinGroup (`range`, `roundrobin`, `cooperative-sticky`,
    /// or a custom strategy's name).
    fn name(&self) -> &str;

    /// The most capable rebalance protocol this assignor supports; every assignor supports
    /// [`RebalanceProtocol::Eager`]. A member follows the cooperative protocol only if all its
    /// assignors support it (see [`rebalance_protocol`]). Default: eager.
    fn rebalance_protocol(&self) -> RebalanceProtocol {
        RebalanceProtocol::Eager
    }

    /// User data to put in this member's subscription to `topics`; `generation` is the
    /// generation of the member's last assignment (-1 if none). Default: none.
    fn subscription_user_data(&self, topics: &BTreeSet<String>, generation: i32) -> Option<Bytes> {
        let _ = (topics, generation);
        None
    }

    /// Computes every member's assignment.
    ///
    /// `partitions_per_topic` holds the partition count of each subscribed topic that exists;
    /// topics missing from it (or with no partitions) are not assigned. The result has an entry
    /// for every member, possibly empty.
    ///
    /// # Errors
    ///
    /// If the input is inconsistent (such as two members with the same id) or the strategy
    /// cannot assign it.
    fn assign(
        &self,
        partitions_per_topic: &BTreeMap<String, i32>,
        members: &[GroupMember],
    ) -> Result<BTreeMap<String, MemberAssignment>, AssignorError>;
}

/// The built-in assignor for a configured strategy.
pub fn builtin(strategy: AssignmentStrategy) -> Arc<dyn Assignor> {
    match strategy {
        AssignmentStrategy::CooperativeSticky => Arc::new(CooperativeStickyAssignor),
        AssignmentStrategy::Range => Arc::new(RangeAssignor),
        AssignmentStrategy::RoundRobin => Arc::new(RoundRobinAssignor),
    }
}

/// The rebalance protocol of a member with these assignors: cooperative only if every one of
/// them supports it, as in the Java client (the default `range,cooperative-sticky` is
/// therefore eager). Eager for an empty list.
pub fn rebalance_protocol(assignors: &[Arc<dyn Assignor>]) -> RebalanceProtocol {
    assignors
        .iter()
        .map(|a| a.rebalance_protocol())
        .min()
        .unwrap_or(RebalanceProtocol::Eager)
}

/// The `range` strategy: for each topic, the members subscribed to it get contiguous ranges of
/// its partitions.
///
/// The members of a topic are ordered as in the Java client: members with a
/// `group.instance.id` first, by that id, then the others by member id. With `n` partitions and
/// `k` members each gets `n / k`, and the first `n % k` one more.
///
/// The Java client's `RangeAssignor` (since Kafka 3.5, KIP-881) switches to a rack-aware variant
/// when members send a rack and the partitions' replicas have racks. We are not given the
/// replicas' racks, so we always compute the classic result, which is also what Java computes
/// when the metadata has no racks.
#[derive(Clone, Copy, Debug, Default)]
pub struct RangeAssignor;

impl Assignor for RangeAssignor {
    fn name(&self) -> &str {
        "range"
    }

    fn assign(
        &self,
        partitions_per_topic: &BTreeMap<String, i32>,
        members: &[GroupMember],
    ) -> Result<BTreeMap<String, MemberAssignment>, AssignorError> {
        let mut out = empty_assignment(members)?;
        let mut sorted: Vec<&GroupMember> = members.iter().collect();
        sorted.sort_by(|a, b| member_order(a, b));
        for (topic, &count) in partitions_per_topic {
            let subscribers: Vec<&GroupMember> = sorted
                .iter()
                .copied()
                .filter(|m| m.subscription.topics.iter().any(|t| t == topic))
                .collect();
            let (Ok(n), false) = (usize::try_from(count), subscribers.is_empty()) else {
                continue;
            };
            let topic: Arc<str> = Arc::from(topic.as_str());
            let (per, extra) = (n / subscribers.len(), n % subscribers.len());
            let mut next = 0;
            for (i, m) in subscribers.iter().enumerate() {
                let len = per + usize::from(i < extra);
                if let Some(a) = out.get_mut(&m.member_id) {
                    // `next + len <= n`, which came from an `i32`.
                    a.partitions.extend(
                        (next..next + len)
                            .filter_map(|p| i32::try_from(p).ok())
                            .map(|p| TopicPartition {
                                topic: Arc::clone(&topic),
                                partition: p,
                            }),
                    );
                }
                next += len;
            }
        }
        Ok(out)
    }
}

/// The `roundrobin` strategy: all partitions of all subscribed topics, sorted by topic and
/// partition, dealt to the members in turn (ordered as in [`RangeAssignor`]), skipping members
/// not subscribed to a partition's topic. As the Java client's `RoundRobinAssignor`.
#[derive(Clone, Copy, Debug, Default)]
pub struct RoundRobinAssignor;

impl Assignor for RoundRobinAssignor {
    fn name(&self) -> &str {
        "roundrobin"
    }

    fn assign(
        &self,
        partitions_per_topic: &BTreeMap<String, i32>,
        members: &[GroupMember],
    ) -> Result<BTreeMap<String, MemberAssignment>, AssignorError> {
        let mut out = empty_assignment(members)?;
        let mut sorted: Vec<&GroupMember> = members.iter().collect();
        sorted.sort_by(|a, b| member_order(a, b));
        let subscribed: Vec<BTreeSet<&str>> = sorted
            .iter()
            .map(|m| m.subscription.topics.iter().map(String::as_str).collect())
            .collect();
        let mut topics: Vec<&str> = subscribed.iter().flatten().copied().collect();
        topics.sort_by(|a, b| java_cmp(a, b));
        topics.dedup();
        let mut next = 0;
        for topic in topics {
            let Some(&count) = partitions_per_topic.get(topic) else {
                continue;
            };
            let name: Arc<str> = Arc::from(topic);
            for partition in 0..count.max(0) {
                // Some member subscribes to `topic` (it came from a subscription), so this ends.
                while !subscribed[next].contains(topic) {
                    next = (next + 1) % sorted.len();
                }
                if let Some(a) = out.get_mut(&sorted[next].member_id) {
                    a.partitions.push(TopicPartition {
                        topic: Arc::clone(&name),
                        partition,
                    });
                }
                next = (next + 1) % sorted.len();
            }
        }
        Ok(out)
    }
}

/// The `cooperative-sticky` strategy (KIP-429): balanced, sticky, and cooperative.
///
/// - **Balanced**: when all members subscribe to the same topics, their partition counts differ
///   by at most one; otherwise the Java client's general algorithm balances as far as the
///   subscriptions allow.
/// - **Sticky**: members keep as many of the partitions they own (`owned_partitions`) as
///   balance allows. When two members claim the same partition, the claim of the newer
///   generation wins; claims of the same generation both lapse.
/// - **Cooperative**: a partition that would move from one member to another is left out of
///   this round's assignment. Its owner revokes it and rejoins, and the next round gives it to
///   its new member.
///
/// This is the Java client's `CooperativeStickyAssignor` (the algorithm of
/// `AbstractStickyAssignor`) without its rack-aware variant (we are not given the replicas'
/// racks, as in [`RangeAssignor`]). Where Java's choices depend on the iteration order of its
/// hash maps, we use sorted member ids and sorted partitions, so our result does not depend on
/// the order of `members` but may differ from a Java leader's in which of several equally good
/// assignments it picks. A member's generation comes from its subscription (version 2+) or,
/// for older members, from the four bytes of user data [`Assignor::subscription_user_data`]
/// writes, as in Java.
#[derive(Clone, Copy, Debug, Default)]
pub struct CooperativeStickyAssignor;

impl Assignor for CooperativeStickyAssignor {
    fn name(&self) -> &str {
        "cooperative-sticky"
    }

    fn rebalance_protocol(&self) -> RebalanceProtocol {
        RebalanceProtocol::Cooperative
    }

    /// The generation as a big-endian `i32`, as the Java client writes it for members that
    /// read the generation from user data (subscription versions before 2).
    fn subscription_user_data(&self, _topics: &BTreeSet<String>, generation: i32) -> Option<Bytes> {
        Some(Bytes::copy_from_slice(&generation.to_be_bytes()))
    }

    fn assign(
        &self,
        partitions_per_topic: &BTreeMap<String, i32>,
        members: &[GroupMember],
    ) -> Result<BTreeMap<String, MemberAssignment>, AssignorError> {
        let mut out = empty_assignment(members)?;
        for (member, partitions) in sticky::assign(partitions_per_topic, members)? {
            if let Some(a) = out.get_mut(member) {
                a.partitions = partitions;
            }
        }
        Ok(out)
    }
}

/// An empty assignment for every member; duplicate member ids are an error.
fn empty_assignment(
    members: &[GroupMember],
) -> Result<BTreeMap<String, MemberAssignment>, AssignorError> {
    let mut out = BTreeMap::new();
    for m in members {
        if out
            .insert(m.member_id.clone(), MemberAssignment::default())
            .is_some()
        {
            return Err(AssignorError::new(format!(
                "member id {:?} appears twice in the group",
                m.member_id
            )));
        }
    }
    Ok(out)
}

/// Java's `String.compareTo`: lexicographic over UTF-16 code units (which differs from Rust's
/// byte order only between characters above U+FFFF and those in U+E000..=U+FFFF).
fn java_cmp(a: &str, b: &str) -> Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

/// The Java client's member order (`AbstractPartitionAssignor.MemberInfo`): members with a
/// `group.instance.id` first, by that id, then the others by member id.
fn member_order(a: &GroupMember, b: &GroupMember) -> Ordering {
    match (&a.group_instance_id, &b.group_instance_id) {
        (Some(x), Some(y)) => java_cmp(x, y),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => java_cmp(&a.member_id, &b.member_id),
    }
}

mod sticky;

#[cfg(test)]
mod tests;
