//! The crate's one public error type, and the context it carries.
//!
//! Every failure a caller can see is an [`Error`]. Variants say *what* went wrong and carry
//! *where*: the broker, the API and version, the partition. Callers decide with the predicates
//! ([`Error::is_retriable`], [`Error::kafka_code`], [`Error::is_fatal`]) instead of matching on
//! internals.

use std::fmt;
use std::time::Duration;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::ApiKey;

use crate::types::TopicPartition;

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A broker, as far as we know it when an error happens.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum BrokerRef {
    /// A bootstrap address, before metadata named the node.
    Address(String),
    /// A node from metadata, with its address.
    Node {
        /// The node id.
        id: i32,
        /// `host:port` as advertised.
        addr: String,
    },
}

impl BrokerRef {
    /// The address, as named when connecting.
    pub(crate) fn addr(&self) -> &str {
        match self {
            Self::Address(addr) | Self::Node { addr, .. } => addr,
        }
    }
}

impl fmt::Display for BrokerRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Address(a) => write!(f, "{a}"),
            Self::Node { id, addr } => write!(f, "node {id} ({addr})"),
        }
    }
}

/// Which request an error belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiContext {
    /// The request's API.
    pub api: ApiKey,
    /// The version it was sent at.
    pub version: i16,
}

impl fmt::Display for ApiContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} v{}", self.api, self.version)
    }
}

/// What was wrong with bytes a broker sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolViolation {
    /// A frame's length prefix was negative.
    #[error("negative frame length {0}")]
    NegativeLength(i32),
    /// A frame's length prefix was above the configured maximum response size.
    #[error("frame length {claimed} exceeds the maximum response size {max}")]
    FrameTooLarge {
        /// The length the prefix claimed.
        claimed: i32,
        /// The configured maximum.
        max: usize,
    },
    /// A response arrived with a correlation id that no request on this connection is waiting for.
    #[error("response with unknown correlation id {0}")]
    UnknownCorrelationId(i32),
    /// A response frame was shorter than its header.
    #[error("response frame of {0} bytes is too short for a header")]
    ShortFrame(usize),
    /// A record batch was malformed.
    #[error("record batch at offset {base_offset}: {reason}")]
    Batch {
        /// The batch's base offset, as read from its header (or -1 if unreadable).
        base_offset: i64,
        /// What was wrong.
        reason: String,
    },
    /// A record batch is in a format other than v2 (magic 2), the only one this crate reads.
    #[error(
        "record batch at offset {base_offset}: unsupported magic {magic} (only v2 batches are supported)"
    )]
    UnsupportedMagic {
        /// The batch's base offset.
        base_offset: i64,
        /// The magic byte found.
        magic: i8,
    },
    /// A record batch's CRC-32C did not match its contents.
    #[error(
        "record batch at offset {base_offset}: CRC mismatch (stored {stored:#010x}, computed {computed:#010x})"
    )]
    Crc {
        /// The batch's base offset.
        base_offset: i64,
        /// The CRC in the batch header.
        stored: u32,
        /// The CRC of the bytes received.
        computed: u32,
    },
    /// A compressed batch inflated past the allowed size.
    #[error(
        "record batch at offset {base_offset}: decompressed size exceeds the limit of {limit} bytes"
    )]
    DecompressionLimit {
        /// The batch's base offset.
        base_offset: i64,
        /// The limit in bytes.
        limit: usize,
    },
    /// A response body's structure was impossible, found before it was decoded: a length or
    /// element count that cannot fit in the bytes left, a body cut short, a malformed varint or
    /// tagged field.
    #[error("{api:?} v{version} response, field `{field}` at byte {offset}: {reason}")]
    Malformed {
        /// The response's API.
        api: ApiKey,
        /// The version it was decoded at.
        version: i16,
        /// The field's path in the body, e.g. `responses[0].partitions[3].aborted_transactions`.
        field: String,
        /// Where the offending length or field starts, counted from the start of the frame
        /// after its length prefix.
        offset: usize,
        /// What was wrong.
        reason: String,
    },
    /// A response did not make sense for the request it answers.
    #[error("{0}")]
    Unexpected(String),
}

/// Why a configuration was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration `{key}`: {reason}")]
pub struct ConfigError {
    /// The property or builder field.
    pub key: String,
    /// What was wrong with it.
    pub reason: String,
}

/// Every error this crate returns.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Connecting to, reading from or writing to a broker failed.
    #[error("I/O with broker {broker}: {source}")]
    Io {
        /// The broker.
        broker: BrokerRef,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The broker's bytes broke the protocol; the connection was closed.
    #[error("protocol violation by broker {broker}{}: {violation}", api.map(|a| format!(" in {a}")).unwrap_or_default())]
    Protocol {
        /// The broker.
        broker: BrokerRef,
        /// The request, when known.
        api: Option<ApiContext>,
        /// What was wrong.
        violation: ProtocolViolation,
    },
    /// A response's bytes did not decode as the response to the request.
    #[error("cannot decode {api} response from broker {broker}: {source}")]
    Decode {
        /// The broker.
        broker: BrokerRef,
        /// The request.
        api: ApiContext,
        /// The decoder's error.
        #[source]
        source: anyhow::Error,
    },
    /// A request could not be encoded (a bug or a value out of the protocol's range).
    #[error("cannot encode {api} request: {source}")]
    Encode {
        /// The request.
        api: ApiContext,
        /// The encoder's error.
        #[source]
        source: anyhow::Error,
    },
    /// A record batch from a fetch was malformed (bad CRC, bad length, decompression bomb...).
    #[error("corrupt data in {partition}: {violation}")]
    CorruptRecords {
        /// The partition.
        partition: TopicPartition,
        /// What was wrong.
        violation: ProtocolViolation,
    },
    /// The broker answered with a Kafka error code.
    #[error("broker error {code:?} ({}) for {context}{}", code.code(), message.as_ref().map(|m| format!(": {m}")).unwrap_or_default())]
    Broker {
        /// The Kafka error code.
        code: ResponseError,
        /// What the request was about.
        context: String,
        /// The broker's error message, if it sent one.
        message: Option<String>,
    },
    /// The broker does not support a version of an API in our window.
    #[error(
        "broker {broker} supports {api:?} v{broker_min}..=v{broker_max}, we need v{our_min}..=v{our_max}"
    )]
    UnsupportedVersion {
        /// The broker.
        broker: BrokerRef,
        /// The API.
        api: ApiKey,
        /// The broker's lowest version.
        broker_min: i16,
        /// The broker's highest version.
        broker_max: i16,
        /// Our lowest version.
        our_min: i16,
        /// Our highest version.
        our_max: i16,
    },
    /// A partition's offset is outside the log and the reset policy says to fail.
    #[error("offset {offset} is out of range for {partition} (log {log_start}..{log_end})")]
    OffsetOutOfRange {
        /// The partition.
        partition: TopicPartition,
        /// The offset that was asked for.
        offset: i64,
        /// The log start offset, or -1 if unknown.
        log_start: i64,
        /// The log end offset, or -1 if unknown.
        log_end: i64,
    },
    /// A topic or partition does not exist.
    #[error("unknown topic or partition {0}")]
    UnknownPartition(TopicPartition),
    /// An operation named a partition that is not assigned to this consumer.
    #[error("partition {0} is not assigned")]
    NotAssigned(TopicPartition),
    /// Subscribe mode: the group assigned a partition that has no committed offset, and
    /// `auto.offset.reset` is `none`. The partition is not read until
    /// [`seek`](crate::Consumer::seek) gives it a position.
    #[error("no committed offset for {0} and auto.offset.reset is none")]
    NoCommittedOffset(TopicPartition),
    /// A request or operation did not complete in time.
    #[error("{what} timed out after {after:?}")]
    Timeout {
        /// What timed out.
        what: String,
        /// The deadline that passed.
        after: Duration,
    },
    /// No broker could be reached.
    #[error("no broker reachable: {0}")]
    NoBroker(String),
    /// The configuration was rejected.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The group's partition assignor failed (this member was the group leader).
    #[error("partition assignment failed: {0}")]
    Assignor(#[from] crate::assignor::AssignorError),
    /// The consumer was closed, or its network loop ended.
    #[error("consumer closed")]
    Closed,
}

impl Error {
    /// True if the same operation may succeed when tried again: I/O errors, timeouts, and
    /// broker codes Kafka marks retriable.
    pub fn is_retriable(&self) -> bool {
        match self {
            Self::Io { .. } | Self::Timeout { .. } | Self::NoBroker(_) => true,
            Self::Protocol { .. } => true,
            Self::Broker { code, .. } => code.is_retriable(),
            _ => false,
        }
    }

    /// The Kafka error code, if the broker sent one.
    pub fn kafka_code(&self) -> Option<ResponseError> {
        match self {
            Self::Broker { code, .. } => Some(*code),
            Self::OffsetOutOfRange { .. } => Some(ResponseError::OffsetOutOfRange),
            Self::UnknownPartition(_) => Some(ResponseError::UnknownTopicOrPartition),
            _ => None,
        }
    }

    /// True for errors that will not go away by themselves: configuration, corrupt data,
    /// unsupported versions, authorization, and the consumer being closed.
    pub fn is_fatal(&self) -> bool {
        !self.is_retriable()
    }

    pub(crate) fn broker(
        code: ResponseError,
        context: impl Into<String>,
        message: Option<String>,
    ) -> Self {
        Self::Broker {
            code,
            context: context.into(),
            message,
        }
    }

    pub(crate) fn timeout(what: impl Into<String>, after: Duration) -> Self {
        Self::Timeout {
            what: what.into(),
            after,
        }
    }

    pub(crate) fn config(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Config(ConfigError {
            key: key.into(),
            reason: reason.into(),
        })
    }

    /// A copy for delivery to several waiters (I/O sources are not `Clone`).
    pub(crate) fn duplicate(&self) -> Self {
        match self {
            Self::Io { broker, source } => Self::Io {
                broker: broker.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            Self::Protocol {
                broker,
                api,
                violation,
            } => Self::Protocol {
                broker: broker.clone(),
                api: *api,
                violation: violation.clone(),
            },
            Self::Decode {
                broker,
                api,
                source,
            } => Self::Decode {
                broker: broker.clone(),
                api: *api,
                source: anyhow::anyhow!("{source:#}"),
            },
            Self::Encode { api, source } => Self::Encode {
                api: *api,
                source: anyhow::anyhow!("{source:#}"),
            },
            Self::CorruptRecords {
                partition,
                violation,
            } => Self::CorruptRecords {
                partition: partition.clone(),
                violation: violation.clone(),
            },
            Self::Broker {
                code,
                context,
                message,
            } => Self::Broker {
                code: *code,
                context: context.clone(),
                message: message.clone(),
            },
            Self::UnsupportedVersion {
                broker,
                api,
                broker_min,
                broker_max,
                our_min,
                our_max,
            } => Self::UnsupportedVersion {
                broker: broker.clone(),
                api: *api,
                broker_min: *broker_min,
                broker_max: *broker_max,
                our_min: *our_min,
                our_max: *our_max,
            },
            Self::OffsetOutOfRange {
                partition,
                offset,
                log_start,
                log_end,
            } => Self::OffsetOutOfRange {
                partition: partition.clone(),
                offset: *offset,
                log_start: *log_start,
                log_end: *log_end,
            },
            Self::UnknownPartition(tp) => Self::UnknownPartition(tp.clone()),
            Self::NotAssigned(tp) => Self::NotAssigned(tp.clone()),
            Self::NoCommittedOffset(tp) => Self::NoCommittedOffset(tp.clone()),
            Self::Timeout { what, after } => Self::Timeout {
                what: what.clone(),
                after: *after,
            },
            Self::NoBroker(s) => Self::NoBroker(s.clone()),
            Self::Config(c) => Self::Config(c.clone()),
            Self::Assignor(e) => Self::Assignor(e.clone()),
            Self::Closed => Self::Closed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predicates() {
        let e = Error::broker(ResponseError::NotLeaderOrFollower, "fetch t-0", None);
        assert!(e.is_retriable());
        assert_eq!(e.kafka_code(), Some(ResponseError::NotLeaderOrFollower));
        let e = Error::broker(ResponseError::TopicAuthorizationFailed, "fetch t-0", None);
        assert!(e.is_fatal());
        let e = Error::config("fetch.max.bytes", "not a number");
        assert!(e.is_fatal());
        assert!(e.to_string().contains("fetch.max.bytes"));
        assert_eq!(e.kafka_code(), None);
    }

    #[test]
    fn duplicate_keeps_message() {
        let e = Error::Io {
            broker: BrokerRef::Address("127.0.0.1:9".into()),
            source: std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset"),
        };
        assert_eq!(e.to_string(), e.duplicate().to_string());
    }
}
