#![doc = include_str!("../README.md")]

pub mod assignor;
pub mod blocking;
mod checkpoint;
pub mod config;
mod consumer;
mod error;
// Entry points for the fuzz targets in fuzz/; cargo-fuzz builds with `--cfg fuzzing`.
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing;
// The crate's only unsafe code: the lock-free handover slot, see its module docs.
#[allow(unsafe_code)]
pub mod handover;
mod net;
pub(crate) mod proto;
pub mod rebalance;
pub mod records;
mod sync;
mod types;

pub use checkpoint::{
    CheckpointHandle, CommitOutcome, CommitOutcomes, CommitStats, Offsets, Outcome,
    PartitionOffset, SOURCE_STATE_VERSION, SourceState,
};
pub use config::{
    AssignmentStrategy, CommitMode, ConsumerConfig, ConsumerConfigBuilder, GroupProtocol,
    IsolationLevel, OffsetReset,
};
pub use consumer::{Consumer, FetchStats};
pub use error::{ApiContext, BrokerRef, ConfigError, Error, ProtocolViolation, Result};
pub use rebalance::{RebalanceListener, Revocation};
pub use types::{Batch, Record, RecordIter, Records, StartPosition, TimestampType, TopicPartition};
