//! The cluster as metadata describes it: brokers, topic ids, partition leaders and epochs.

use std::collections::HashMap;
use std::sync::Arc;

use kafka_protocol::error::{ParseResponseErrorCode, ResponseError};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

/// Where a partition lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Leader {
    /// The leader's node id (-1: no leader right now).
    pub(crate) node: i32,
    /// The leader epoch (KIP-320), sent with Fetch and ListOffsets to fence stale leaders.
    pub(crate) epoch: i32,
}

/// One topic.
#[derive(Clone, Debug)]
pub(crate) struct TopicMeta {
    pub(crate) id: Uuid,
    /// An internal topic (`__consumer_offsets`, `__transaction_state`).
    pub(crate) internal: bool,
    /// Leaders by partition index.
    pub(crate) partitions: HashMap<i32, Leader>,
}

/// What a metadata response said about a topic we asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum TopicProblem {
    /// The topic does not exist (or we may not see it).
    Error(Arc<str>, ResponseError),
}

/// The consumer's view of the cluster.
#[derive(Clone, Debug, Default)]
pub(crate) struct Metadata {
    brokers: HashMap<i32, String>,
    topics: HashMap<Arc<str>, TopicMeta>,
    names: HashMap<Uuid, Arc<str>>,
}

impl Metadata {
    /// A request for the given topics (never creating them).
    pub(crate) fn request(topics: &[Arc<str>]) -> MetadataRequest {
        MetadataRequest::default()
            .with_allow_auto_topic_creation(false)
            .with_topics(Some(
                topics
                    .iter()
                    .map(|t| {
                        MetadataRequestTopic::default()
                            .with_name(Some(TopicName(StrBytes::from_string(t.to_string()))))
                    })
                    .collect(),
            ))
    }

    /// A request for every topic (pattern subscriptions).
    pub(crate) fn request_all() -> MetadataRequest {
        MetadataRequest::default()
            .with_allow_auto_topic_creation(false)
            .with_topics(None)
    }

    /// Every known topic's name, and whether it is internal.
    pub(crate) fn topic_names(&self) -> impl Iterator<Item = (&str, bool)> {
        self.topics.iter().map(|(n, t)| (&**n, t.internal))
    }

    /// The number of partitions of a topic, if known.
    pub(crate) fn partition_count(&self, topic: &str) -> Option<i32> {
        self.topics
            .get(topic)
            .map(|t| i32::try_from(t.partitions.len()).unwrap_or(i32::MAX))
    }

    /// A topic's name by id.
    pub(crate) fn name_by_id(&self, id: &Uuid) -> Option<&Arc<str>> {
        self.names.get(id)
    }

    /// Applies a response. Topics absent from the response keep their old entry; topics the
    /// response reports an error for are dropped and returned.
    pub(crate) fn handle_response(&mut self, resp: &MetadataResponse) -> Vec<TopicProblem> {
        let brokers: HashMap<i32, String> = resp
            .brokers
            .iter()
            .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
            .collect();
        if !brokers.is_empty() {
            self.brokers = brokers;
        }
        let mut problems = Vec::new();
        for t in &resp.topics {
            let Some(name) = t.name.as_ref() else {
                continue;
            };
            let name: Arc<str> = Arc::from(name.0.as_str());
            if let Some(code) = t.error_code.err() {
                if let Some(old) = self.topics.remove(&name) {
                    self.names.remove(&old.id);
                }
                problems.push(TopicProblem::Error(name, code));
                continue;
            }
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    let node = if p.error_code.is_ok() || p.leader_id.0 >= 0 {
                        p.leader_id.0
                    } else {
                        -1
                    };
                    (
                        p.partition_index,
                        Leader {
                            node,
                            epoch: p.leader_epoch,
                        },
                    )
                })
                .collect();
            if let Some(old) = self.topics.get(&name)
                && old.id != t.topic_id
            {
                self.names.remove(&old.id);
            }
            self.names.insert(t.topic_id, Arc::clone(&name));
            self.topics.insert(
                name,
                TopicMeta {
                    id: t.topic_id,
                    internal: t.is_internal,
                    partitions,
                },
            );
        }
        problems
    }

    /// Node id → `host:port`.
    pub(crate) fn brokers(&self) -> &HashMap<i32, String> {
        &self.brokers
    }

    /// A topic by name.
    pub(crate) fn topic(&self, name: &str) -> Option<&TopicMeta> {
        self.topics.get(name)
    }

    /// A topic's name by id.
    #[cfg(test)]
    fn name_of(&self, id: &Uuid) -> Option<&Arc<str>> {
        self.names.get(id)
    }

    /// The leader of a partition, if known and present. A leader that is not among the known
    /// brokers counts as unknown.
    pub(crate) fn leader(&self, topic: &str, partition: i32) -> Option<Leader> {
        let l = *self.topics.get(topic)?.partitions.get(&partition)?;
        (l.node >= 0 && self.brokers.contains_key(&l.node)).then_some(l)
    }

    /// Forgets a partition's leader until the next refresh (after NOT_LEADER_OR_FOLLOWER or a
    /// dead connection).
    pub(crate) fn invalidate_leader(&mut self, topic: &str, partition: i32) {
        if let Some(t) = self.topics.get_mut(topic)
            && let Some(l) = t.partitions.get_mut(&partition)
        {
            l.node = -1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::BrokerId;
    use kafka_protocol::messages::metadata_response::{
        MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
    };

    fn response(leader: i32, epoch: i32, id: Uuid) -> MetadataResponse {
        MetadataResponse::default()
            .with_brokers(vec![
                MetadataResponseBroker::default()
                    .with_node_id(BrokerId(1))
                    .with_host(StrBytes::from_static_str("127.0.0.1"))
                    .with_port(9092),
            ])
            .with_topics(vec![
                MetadataResponseTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_static_str("t"))))
                    .with_topic_id(id)
                    .with_partitions(vec![
                        MetadataResponsePartition::default()
                            .with_partition_index(0)
                            .with_leader_id(BrokerId(leader))
                            .with_leader_epoch(epoch),
                    ]),
                MetadataResponseTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_static_str("gone"))))
                    .with_error_code(ResponseError::UnknownTopicOrPartition.code()),
            ])
    }

    #[test]
    fn leaders_ids_and_problems() {
        let mut m = Metadata::default();
        let id = Uuid::from_u128(7);
        let problems = m.handle_response(&response(1, 5, id));
        assert_eq!(
            problems,
            vec![TopicProblem::Error(
                Arc::from("gone"),
                ResponseError::UnknownTopicOrPartition
            )]
        );
        assert_eq!(m.leader("t", 0), Some(Leader { node: 1, epoch: 5 }));
        assert_eq!(m.name_of(&id).map(|s| &**s), Some("t"));
        assert_eq!(
            m.brokers().get(&1).map(String::as_str),
            Some("127.0.0.1:9092")
        );
        m.invalidate_leader("t", 0);
        assert_eq!(m.leader("t", 0), None);
        // A leader on a node we do not know is no leader.
        m.handle_response(&response(9, 6, id));
        assert_eq!(m.leader("t", 0), None);
        // A recreated topic gets its new id.
        let id2 = Uuid::from_u128(8);
        m.handle_response(&response(1, 0, id2));
        assert_eq!(m.topic("t").map(|t| t.id), Some(id2));
        assert!(m.name_of(&id).is_none());
    }

    #[test]
    fn request_never_creates_topics() {
        let r = Metadata::request(&[Arc::from("a")]);
        assert!(!r.allow_auto_topic_creation);
        assert_eq!(r.topics.as_ref().map(Vec::len), Some(1));
    }
}
