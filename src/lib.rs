#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod config;
mod error;
#[allow(unsafe_code)] // the crate's only unsafe code: the lock-free handover slot, see its module docs
mod handover;
mod net;
pub(crate) mod proto;
mod types;

pub use config::{ConsumerConfig, ConsumerConfigBuilder, IsolationLevel, OffsetReset};
pub use error::{ApiContext, BrokerRef, ConfigError, Error, ProtocolViolation, Result};
pub use types::{Batch, Record, StartPosition, TimestampType, TopicPartition};
