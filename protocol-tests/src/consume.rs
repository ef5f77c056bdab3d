//! Consuming with kafka-source in tests: config shortcuts and a checked drain.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kafka_source::{CommitMode, Consumer, ConsumerConfig, ConsumerConfigBuilder, TopicPartition};

use crate::records::record_checksum;

/// A name no other test (or earlier run) uses: `prefix` and the time in nanoseconds.
pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{prefix}-{nanos}")
}

/// Partitions `0..n` of `topic`.
pub fn partitions(topic: &str, n: i32) -> Vec<TopicPartition> {
    (0..n).map(|p| TopicPartition::new(topic, p)).collect()
}

/// A config builder for `bootstrap` with commits disabled (no group id).
pub fn config(bootstrap: &str) -> ConsumerConfigBuilder {
    ConsumerConfig::builder()
        .bootstrap_servers(bootstrap.split(',').map(str::to_owned))
        .client_id("protocol-tests")
        .commit_mode(CommitMode::Disabled)
}

/// What a drain saw.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Drained {
    /// Records seen.
    pub count: u64,
    /// Wrapping sum of [`record_checksum`] over keys and values.
    pub checksum: u64,
    /// Per partition, the offsets in the order they were handed out.
    pub offsets: BTreeMap<TopicPartition, Vec<i64>>,
    /// Payload bytes (keys and values).
    pub bytes: u64,
}

impl Drained {
    /// Panics unless every partition's offsets are strictly increasing by one from `first`.
    pub fn assert_contiguous_from(&self, first: &BTreeMap<TopicPartition, i64>) {
        for (tp, offsets) in &self.offsets {
            let start = first.get(tp).copied().unwrap_or(0);
            for (i, o) in offsets.iter().enumerate() {
                assert_eq!(
                    *o,
                    start + i as i64,
                    "{tp}: record #{i} has offset {o}, expected {}",
                    start + i as i64
                );
            }
        }
    }
}

/// Polls until `want` records arrived (or `timeout` passed, which panics), checking every record.
/// Errors from `poll` panic with the error.
pub async fn drain(consumer: &mut Consumer, want: u64, timeout: Duration) -> Drained {
    let deadline = Instant::now() + timeout;
    let mut d = Drained::default();
    while d.count < want {
        let left = deadline.saturating_duration_since(Instant::now());
        let batch = match tokio::time::timeout(left, consumer.poll()).await {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => panic!("poll failed after {} of {want} records: {e}", d.count),
            Err(_) => panic!("only {} of {want} records within {timeout:?}", d.count),
        };
        let offsets = d.offsets.entry(batch.partition.clone()).or_default();
        for r in &batch.records {
            let key = r.key.unwrap_or_default();
            let value = r.value.unwrap_or_default();
            d.checksum = d.checksum.wrapping_add(record_checksum(key, value));
            d.bytes += (key.len() + value.len()) as u64;
            offsets.push(r.offset);
            d.count += 1;
        }
    }
    d
}
