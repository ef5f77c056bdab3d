//! Plain data types of the public API: partitions, start positions, records.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

/// A topic name and partition index.
///
/// The name is shared (`Arc<str>`), so cloning is a reference-count increment.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicPartition {
    /// The topic's name.
    pub topic: Arc<str>,
    /// The partition index.
    pub partition: i32,
}

impl TopicPartition {
    /// A partition of a topic.
    pub fn new(topic: impl Into<Arc<str>>, partition: i32) -> Self {
        Self {
            topic: topic.into(),
            partition,
        }
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

impl fmt::Debug for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// Where to start reading a partition. Resolved to a real offset with ListOffsets before the
/// first fetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum StartPosition {
    /// The log start offset: the oldest record still kept.
    Earliest,
    /// The log end offset (the last stable offset under `read_committed`): only new records.
    Latest,
    /// The first record whose timestamp is at or after this many milliseconds since the Unix
    /// epoch; the log end if there is none.
    Timestamp(i64),
    /// This exact offset: the next record to read.
    Offset(i64),
}

/// How a record's timestamp was set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimestampType {
    /// Set by the producer.
    CreateTime,
    /// Set by the broker when it appended the batch.
    LogAppendTime,
}

/// One Kafka record, with its key and value as zero-copy slices of the fetched bytes (or of the
/// decompressed batch).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The record's offset in its partition.
    pub offset: i64,
    /// Milliseconds since the Unix epoch.
    pub timestamp: i64,
    /// How the timestamp was set.
    pub timestamp_type: TimestampType,
    /// The key, `None` for a null key.
    pub key: Option<Bytes>,
    /// The value, `None` for a null value (a tombstone).
    pub value: Option<Bytes>,
    /// The leader epoch of the batch the record came in (-1 if unknown).
    pub leader_epoch: i32,
    /// The record's headers, still encoded; read them with [`Record::headers`].
    pub(crate) headers: Bytes,
    /// How many headers `headers` holds.
    pub(crate) header_count: u32,
}

impl Record {
    /// The record's headers in order: name and value (`None` for a null value).
    ///
    /// The encoding was checked when the batch was decoded, so iteration yields exactly
    /// `header_count` entries.
    pub fn headers(&self) -> impl Iterator<Item = (Bytes, Option<Bytes>)> + '_ {
        crate::proto::records::HeaderIter::new(self.headers.clone(), self.header_count)
    }

    /// The number of headers.
    pub fn header_count(&self) -> usize {
        self.header_count as usize
    }
}

/// Records of one partition, in offset order, as handed out by `poll`.
#[derive(Clone, Debug)]
pub struct Batch {
    /// The partition the records belong to.
    pub partition: TopicPartition,
    /// The records, in offset order. May be empty only if the batch only moved the position
    /// (e.g. over transaction markers).
    pub records: Vec<Record>,
    /// The next offset to read after this batch: what a commit of "everything up to here" stores.
    pub next_offset: i64,
}
