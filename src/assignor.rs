//! Partition assignment for consumer groups on the classic protocol: what each member tells the
//! group (its [`Subscription`]) and what the group leader hands back to it
//! ([`MemberAssignment`]).
//!
//! Both travel as the Java client's "ConsumerProtocol" bytes inside JoinGroup and SyncGroup, so
//! members of this crate and Java `KafkaConsumer`s can share a group.

use bytes::Bytes;

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
