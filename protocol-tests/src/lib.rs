//! Test support for kafka-source: real Apache Kafka brokers started from the Maven jars, the Kafka
//! command-line tools, and a deterministic Java producer, for the live-broker tests in `tests/`;
//! and a scripted in-process mock broker ([`mock`]) for the hostile-broker tests.
//!
//! See [`cluster`] and this crate's README.

pub mod cluster;
pub mod consume;
pub mod group;
pub mod interop;
mod java;
mod lock;
pub mod mock;
mod probe;
pub mod proxy;
mod records;
mod tools;

pub use cluster::{Cluster, Compression, LogsOnPanic, PartitionInfo, ProduceResult, ProduceSpec};
pub use java::{kafka_libs, target_dir, test_root};
pub use records::{expected_key, expected_value, record_checksum};
