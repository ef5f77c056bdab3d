//! Consumer configuration: a validated, immutable [`ConsumerConfig`] and its builder.
//!
//! This module turns settings into a [`ConsumerConfig`] and checks them once, in
//! [`ConsumerConfigBuilder::build`]. It does not connect to anything. Every other part of the
//! consumer reads a `ConsumerConfig` and can rely on its invariants (listed under
//! [`ConsumerConfigBuilder::build`]) without checking again.
//!
//! Settings come either from typed builder methods or from the property names of the Java
//! client (plus a few of our own), through [`ConsumerConfigBuilder::set`] and
//! [`ConsumerConfigBuilder::from_properties`]. Both routes produce equal configurations. An
//! unknown property name is an error, never silently ignored; so is a value that does not parse.
//!
//! ```
//! use std::time::Duration;
//! use kafka_source::{ConsumerConfig, ConsumerConfigBuilder, OffsetReset};
//!
//! # fn main() -> kafka_source::Result<()> {
//! let typed = ConsumerConfig::builder()
//!     .bootstrap_servers(["broker-1:9092", "broker-2:9092"])
//!     .group_id("billing")
//!     .auto_offset_reset(OffsetReset::Earliest)
//!     .fetch_max_wait(Duration::from_millis(250))
//!     .build()?;
//!
//! let from_properties = ConsumerConfigBuilder::from_properties([
//!     ("bootstrap.servers", "broker-1:9092,broker-2:9092"),
//!     ("group.id", "billing"),
//!     ("auto.offset.reset", "earliest"),
//!     ("fetch.max.wait.ms", "250"),
//! ])?
//! .build()?;
//!
//! assert_eq!(typed, from_properties);
//! # Ok(())
//! # }
//! ```
//!
//! # Properties
//!
//! Values are trimmed. Choices (`earliest`, `read_committed`, …) and booleans are matched
//! case-insensitively; property names are not. Times are whole milliseconds. Byte counts and
//! times are non-negative whole numbers; the last column gives further limits checked by
//! [`build`](ConsumerConfigBuilder::build).
//!
//! ## Brokers and connections
//!
//! | Property | Default | Meaning | Limits |
//! |---|---|---|---|
//! | `bootstrap.servers` | required | Comma-separated `host:port` list used to discover the cluster; IPv6 as `[::1]:9092`. | at least one; port 1..=65535 |
//! | `client.id` | `kafka-source` | Sent with every request; shows in broker logs and quotas. | at most 32767 bytes |
//! | `socket.connection.setup.timeout.ms` | `10000` | How long one TCP connection attempt may take. | ≥ 1 |
//! | `request.timeout.ms` | `30000` | How long to wait for the response to one request. | ≥ 1, > `fetch.max.wait.ms` |
//! | `reconnect.backoff.ms` | `50` | First wait before reconnecting to a broker; doubles per failure. | ≥ 1, ≤ `reconnect.backoff.max.ms` |
//! | `reconnect.backoff.max.ms` | `1000` | Cap of the reconnect wait. | ≥ 1 |
//! | `retry.backoff.ms` | `100` | Wait before retrying a request that failed with a retriable error. | ≥ 1 |
//! | `metadata.max.age.ms` | `300000` | Refresh cluster metadata at least this often. | ≥ 1 |
//! | `max.response.size` | `104857600` (100 MiB) | Largest response frame accepted; a larger length prefix is a protocol error. | ≥ `fetch.max.bytes` + 1 MiB |
//! | `security.protocol` | `PLAINTEXT` | Accepted for compatibility; only `PLAINTEXT` is supported. | `PLAINTEXT` |
//!
//! ## Fetching
//!
//! | Property | Default | Meaning | Limits |
//! |---|---|---|---|
//! | `fetch.max.bytes` | `52428800` (50 MiB) | Most data one fetch response should carry, over all partitions. | 1..=2147483647 |
//! | `max.partition.fetch.bytes` | `1048576` (1 MiB) | Most data one fetch response should carry per partition. | 1..=2147483647 |
//! | `fetch.min.bytes` | `1` | The broker waits until it has this much data (or `fetch.max.wait.ms` passed). | ≤ `fetch.max.bytes` |
//! | `fetch.max.wait.ms` | `500` | The longest the broker holds a fetch waiting for `fetch.min.bytes`. | 0 allowed |
//! | `isolation.level` | `read_uncommitted` | `read_uncommitted` or `read_committed` (skip aborted transactions, stop at the last stable offset). | |
//! | `restore.offset.out.of.range` | `none` | What to do when an offset restored from a checkpoint ([`SourceState`](crate::SourceState)) is out of range: `earliest`, `latest`, or `none` (alias `error`) to fail. | |
//! | `auto.offset.reset` | `none` | What to do when an offset is out of range or missing: `earliest`, `latest`, or `none` (alias `error`) to fail. | |
//! | `buffer.max.bytes` | `67108864` (64 MiB) | Memory budget for fetched data not yet handed to the application: each fetch response whole, until the last of its records is handed out, and decompressed bytes. | ≥ `max.partition.fetch.bytes` |
//! | `fetch.connections.per.broker` | `2` | Data connections per broker, each with one Fetch in flight; a broker's partitions are shared out over them. `1` fetches as the Java client does. | 1..=16 |
//! | `check.crcs` | `true` | Check each record batch's CRC-32C before decoding it (as the Java client does; librdkafka does not by default). | |
//!
//! ## Offset commits
//!
//! | Property | Default | Meaning | Limits |
//! |---|---|---|---|
//! | `group.id` | unset | Consumer group whose offsets are committed. | non-empty; needed unless `commit.mode=disabled` |
//! | `commit.mode` | `on_checkpoints` | `on_checkpoints`, `disabled` or `periodic`. | |
//! | `enable.auto.commit` | unset | `true` means `commit.mode=periodic`; `false` leaves `commit.mode` as configured. | must agree with `commit.mode` if both are set |
//! | `auto.commit.interval.ms` | `5000` | The period of `commit.mode=periodic`. | ≥ 1 |
//! | `commit.timeout.ms` | `10000` | Deadline of one offset commit, retries included. | ≥ 1 |
//! | `max.pending.checkpoints` | `100` | Checkpoints whose offsets are kept while waiting for them to complete. | ≥ 1 |
//! | `close.timeout.ms` | `10000` | How long closing waits for outstanding work, such as a final commit. | 0 allowed |
//!
//! ## Group membership (subscribe mode)
//!
//! These are parsed, checked and stored now so that the API is stable, but they take effect only
//! in subscribe mode, where the consumer joins its group and the group assigns partitions. With
//! partitions assigned by the application they are ignored.
//!
//! | Property | Default | Meaning | Limits |
//! |---|---|---|---|
//! | `group.instance.id` | unset | Static membership id (KIP-345). | non-empty; needs `group.id` |
//! | `group.protocol` | `classic` | `classic` (JoinGroup/SyncGroup) or `consumer` (KIP-848, broker-side assignment). | |
//! | `partition.assignment.strategy` | `range,cooperative-sticky` | Ordered list of `range`, `roundrobin`, `cooperative-sticky` (Java class names accepted). | `classic` only; non-empty, no repeats |
//! | `session.timeout.ms` | `45000` | The group evicts a member not heard from for this long. | `classic` only; ≥ 1 |
//! | `heartbeat.interval.ms` | `3000` | Time between heartbeats. | `classic` only; ≥ 1, < `session.timeout.ms` |
//! | `max.poll.interval.ms` | `300000` | Longest allowed gap between polls before the member leaves the group. | ≥ 1 |
//!
//! Every time is at most 2147483647 ms (about 24.8 days): most are sent to brokers as 32-bit
//! milliseconds, and one limit for all keeps deadline arithmetic free of overflow.

use std::fmt;
use std::net::Ipv6Addr;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result};

/// `i32::MAX` milliseconds: the longest time any setting may have.
const MAX_TIME: Duration = Duration::from_millis(i32::MAX as u64);

/// Room for response headers above `fetch.max.bytes` that `max.response.size` must leave.
const RESPONSE_HEADROOM: usize = 1 << 20;

/// The longest string the protocol can carry (an `int16` length prefix).
const MAX_PROTOCOL_STRING: usize = i16::MAX as usize;

/// Default values, one place.
mod default {
    use std::time::Duration;

    use super::AssignmentStrategy;

    pub(super) const CLIENT_ID: &str = "kafka-source";
    pub(super) const FETCH_MAX_BYTES: u32 = 52_428_800;
    pub(super) const MAX_PARTITION_FETCH_BYTES: u32 = 1_048_576;
    pub(super) const FETCH_MAX_WAIT: Duration = Duration::from_millis(500);
    pub(super) const FETCH_MIN_BYTES: u32 = 1;
    pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
    pub(super) const MAX_RESPONSE_SIZE: usize = 100 << 20;
    pub(super) const BUFFER_MAX_BYTES: usize = 64 << 20;
    pub(super) const FETCH_CONNECTIONS_PER_BROKER: u8 = 2;
    pub(super) const METADATA_MAX_AGE: Duration = Duration::from_secs(5 * 60);
    pub(super) const RECONNECT_BACKOFF: Duration = Duration::from_millis(50);
    pub(super) const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(1);
    pub(super) const RETRY_BACKOFF: Duration = Duration::from_millis(100);
    pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
    pub(super) const AUTO_COMMIT_INTERVAL: Duration = Duration::from_secs(5);
    pub(super) const COMMIT_TIMEOUT: Duration = Duration::from_secs(10);
    pub(super) const MAX_PENDING_CHECKPOINTS: usize = 100;
    pub(super) const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);
    pub(super) const ASSIGNMENT_STRATEGY: [AssignmentStrategy; 2] = [
        AssignmentStrategy::Range,
        AssignmentStrategy::CooperativeSticky,
    ];
    pub(super) const SESSION_TIMEOUT: Duration = Duration::from_secs(45);
    pub(super) const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(3);
    pub(super) const MAX_POLL_INTERVAL: Duration = Duration::from_secs(5 * 60);
}

/// Every property name [`ConsumerConfigBuilder::set`] accepts, in the order of the module docs.
const PROPERTIES: &[&str] = &[
    "bootstrap.servers",
    "client.id",
    "socket.connection.setup.timeout.ms",
    "request.timeout.ms",
    "reconnect.backoff.ms",
    "reconnect.backoff.max.ms",
    "retry.backoff.ms",
    "metadata.max.age.ms",
    "max.response.size",
    "security.protocol",
    "fetch.max.bytes",
    "max.partition.fetch.bytes",
    "fetch.min.bytes",
    "fetch.max.wait.ms",
    "isolation.level",
    "auto.offset.reset",
    "restore.offset.out.of.range",
    "buffer.max.bytes",
    "fetch.connections.per.broker",
    "check.crcs",
    "group.id",
    "commit.mode",
    "enable.auto.commit",
    "auto.commit.interval.ms",
    "commit.timeout.ms",
    "max.pending.checkpoints",
    "close.timeout.ms",
    "group.instance.id",
    "group.protocol",
    "partition.assignment.strategy",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "max.poll.interval.ms",
];

/// A checked, immutable consumer configuration.
///
/// Made by [`ConsumerConfig::builder`] and [`ConsumerConfigBuilder::build`]; the getters return
/// what was set or the default. The [module docs](self) list every setting with its property
/// name and default.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ConsumerConfig {
    bootstrap_servers: Vec<String>,
    client_id: String,
    fetch_max_bytes: u32,
    max_partition_fetch_bytes: u32,
    fetch_max_wait: Duration,
    fetch_min_bytes: u32,
    auto_offset_reset: OffsetReset,
    restore_out_of_range: OffsetReset,
    request_timeout: Duration,
    max_response_size: usize,
    buffer_max_bytes: usize,
    isolation_level: IsolationLevel,
    fetch_connections_per_broker: u8,
    check_crcs: bool,
    metadata_max_age: Duration,
    reconnect_backoff: Duration,
    reconnect_backoff_max: Duration,
    retry_backoff: Duration,
    connect_timeout: Duration,
    group_id: Option<String>,
    commit_mode: CommitMode,
    commit_timeout: Duration,
    max_pending_checkpoints: usize,
    close_timeout: Duration,
    group_instance_id: Option<String>,
    group_protocol: GroupProtocol,
    partition_assignment_strategy: Vec<AssignmentStrategy>,
    session_timeout: Duration,
    heartbeat_interval: Duration,
    max_poll_interval: Duration,
}

impl ConsumerConfig {
    /// A builder with every setting at its default.
    pub fn builder() -> ConsumerConfigBuilder {
        ConsumerConfigBuilder::default()
    }

    /// The bootstrap brokers, each `host:port` (`[v6-address]:port` for IPv6). Never empty.
    ///
    /// Property `bootstrap.servers`.
    pub fn bootstrap_servers(&self) -> &[String] {
        &self.bootstrap_servers
    }

    /// The client id sent with every request.
    ///
    /// Property `client.id`; default `kafka-source`.
    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// The most bytes one fetch response should carry over all partitions (the request's
    /// `max_bytes`); between 1 and `i32::MAX`.
    ///
    /// Property `fetch.max.bytes`; default 52428800 (50 MiB).
    pub fn fetch_max_bytes(&self) -> u32 {
        self.fetch_max_bytes
    }

    /// The most bytes one fetch response should carry per partition (the request's
    /// `partition_max_bytes`); between 1 and `i32::MAX`.
    ///
    /// Property `max.partition.fetch.bytes`; default 1048576 (1 MiB).
    pub fn max_partition_fetch_bytes(&self) -> u32 {
        self.max_partition_fetch_bytes
    }

    /// The longest the broker holds a fetch waiting for [`fetch_min_bytes`](Self::fetch_min_bytes);
    /// shorter than [`request_timeout`](Self::request_timeout).
    ///
    /// Property `fetch.max.wait.ms`; default 500 ms.
    pub fn fetch_max_wait(&self) -> Duration {
        self.fetch_max_wait
    }

    /// The least data the broker should gather before answering a fetch; at most
    /// [`fetch_max_bytes`](Self::fetch_max_bytes).
    ///
    /// Property `fetch.min.bytes`; default 1.
    pub fn fetch_min_bytes(&self) -> u32 {
        self.fetch_min_bytes
    }

    /// What to do when a partition's offset is out of range or missing.
    ///
    /// Property `auto.offset.reset`; default [`OffsetReset::Error`] (`none`).
    pub fn auto_offset_reset(&self) -> OffsetReset {
        self.auto_offset_reset
    }

    /// Property `restore.offset.out.of.range`; default [`OffsetReset::Error`] (`none`).
    pub fn restore_out_of_range(&self) -> OffsetReset {
        self.restore_out_of_range
    }

    /// How long to wait for the response to one request.
    ///
    /// Property `request.timeout.ms`; default 30 s.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// The largest response frame accepted, in bytes; at least
    /// [`fetch_max_bytes`](Self::fetch_max_bytes) + 1 MiB, at most `i32::MAX`.
    ///
    /// Property `max.response.size`; default 104857600 (100 MiB).
    pub fn max_response_size(&self) -> usize {
        self.max_response_size
    }

    /// The memory budget, in bytes, for fetched data not yet handed to the application: each
    /// fetch response whole (headers and a partial last batch included), until the last of its
    /// records is handed out, and decompressed bytes; at least
    /// [`max_partition_fetch_bytes`](Self::max_partition_fetch_bytes).
    ///
    /// Property `buffer.max.bytes`; default 67108864 (64 MiB).
    pub fn buffer_max_bytes(&self) -> usize {
        self.buffer_max_bytes
    }

    /// Whether fetches see records of aborted and open transactions.
    ///
    /// Property `isolation.level`; default [`IsolationLevel::ReadUncommitted`].
    pub fn isolation_level(&self) -> IsolationLevel {
        self.isolation_level
    }

    /// Data connections per broker, each with at most one Fetch in flight.
    ///
    /// Property `fetch.connections.per.broker`; default 2.
    pub fn fetch_connections_per_broker(&self) -> u8 {
        self.fetch_connections_per_broker
    }

    /// Whether each record batch's CRC-32C is checked before it is decoded.
    ///
    /// Property `check.crcs`; default `true`.
    pub fn check_crcs(&self) -> bool {
        self.check_crcs
    }

    /// Cluster metadata is refreshed at least this often.
    ///
    /// Property `metadata.max.age.ms`; default 5 min.
    pub fn metadata_max_age(&self) -> Duration {
        self.metadata_max_age
    }

    /// The first wait before reconnecting to a broker; at most
    /// [`reconnect_backoff_max`](Self::reconnect_backoff_max).
    ///
    /// Property `reconnect.backoff.ms`; default 50 ms.
    pub fn reconnect_backoff(&self) -> Duration {
        self.reconnect_backoff
    }

    /// The cap of the reconnect wait.
    ///
    /// Property `reconnect.backoff.max.ms`; default 1 s.
    pub fn reconnect_backoff_max(&self) -> Duration {
        self.reconnect_backoff_max
    }

    /// The wait before retrying a request that failed with a retriable error.
    ///
    /// Property `retry.backoff.ms`; default 100 ms.
    pub fn retry_backoff(&self) -> Duration {
        self.retry_backoff
    }

    /// How long one TCP connection attempt may take.
    ///
    /// Property `socket.connection.setup.timeout.ms`; default 10 s.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The consumer group, if any. Set whenever the [commit mode](Self::commit_mode) commits.
    ///
    /// Property `group.id`; default unset.
    pub fn group_id(&self) -> Option<&str> {
        self.group_id.as_deref()
    }

    /// When offsets are committed.
    ///
    /// Properties `commit.mode`, `enable.auto.commit`, `auto.commit.interval.ms`; default
    /// [`CommitMode::OnCheckpoints`].
    pub fn commit_mode(&self) -> CommitMode {
        self.commit_mode
    }

    /// The deadline of one offset commit, retries included.
    ///
    /// Property `commit.timeout.ms`; default 10 s.
    pub fn commit_timeout(&self) -> Duration {
        self.commit_timeout
    }

    /// How many checkpoints' offsets are kept while waiting for those checkpoints to complete;
    /// at least 1.
    ///
    /// Property `max.pending.checkpoints`; default 100.
    pub fn max_pending_checkpoints(&self) -> usize {
        self.max_pending_checkpoints
    }

    /// How long closing the consumer waits for outstanding work; zero does not wait.
    ///
    /// Property `close.timeout.ms`; default 10 s.
    pub fn close_timeout(&self) -> Duration {
        self.close_timeout
    }

    /// The static membership id (KIP-345), if any. Takes effect in subscribe mode.
    ///
    /// Property `group.instance.id`; default unset.
    pub fn group_instance_id(&self) -> Option<&str> {
        self.group_instance_id.as_deref()
    }

    /// The group membership protocol. Takes effect in subscribe mode.
    ///
    /// Property `group.protocol`; default [`GroupProtocol::Classic`].
    pub fn group_protocol(&self) -> GroupProtocol {
        self.group_protocol
    }

    /// The assignment strategies this member supports, preferred first; never empty, no
    /// repeats. Used by the [classic](GroupProtocol::Classic) protocol in subscribe mode.
    ///
    /// Property `partition.assignment.strategy`; default `range,cooperative-sticky`.
    pub fn partition_assignment_strategy(&self) -> &[AssignmentStrategy] {
        &self.partition_assignment_strategy
    }

    /// How long the group waits for a silent member before evicting it. Used by the
    /// [classic](GroupProtocol::Classic) protocol in subscribe mode.
    ///
    /// Property `session.timeout.ms`; default 45 s.
    pub fn session_timeout(&self) -> Duration {
        self.session_timeout
    }

    /// The time between heartbeats; shorter than [`session_timeout`](Self::session_timeout).
    /// Used by the [classic](GroupProtocol::Classic) protocol in subscribe mode.
    ///
    /// Property `heartbeat.interval.ms`; default 3 s.
    pub fn heartbeat_interval(&self) -> Duration {
        self.heartbeat_interval
    }

    /// The longest allowed gap between polls before the member leaves its group. Takes effect
    /// in subscribe mode.
    ///
    /// Property `max.poll.interval.ms`; default 5 min.
    pub fn max_poll_interval(&self) -> Duration {
        self.max_poll_interval
    }
}

/// Collects settings for a [`ConsumerConfig`]; nothing is checked until
/// [`build`](Self::build), except that [`set`](Self::set) rejects names and values that do not
/// parse.
///
/// Typed setters take and return the builder, so calls chain. Setting a value twice keeps the
/// last one.
#[derive(Clone, Debug)]
pub struct ConsumerConfigBuilder {
    bootstrap_servers: Vec<String>,
    client_id: String,
    fetch_max_bytes: u32,
    max_partition_fetch_bytes: u32,
    fetch_max_wait: Duration,
    fetch_min_bytes: u32,
    auto_offset_reset: OffsetReset,
    restore_out_of_range: OffsetReset,
    request_timeout: Duration,
    max_response_size: usize,
    buffer_max_bytes: usize,
    isolation_level: IsolationLevel,
    fetch_connections_per_broker: u8,
    check_crcs: bool,
    metadata_max_age: Duration,
    reconnect_backoff: Duration,
    reconnect_backoff_max: Duration,
    retry_backoff: Duration,
    connect_timeout: Duration,
    group_id: Option<String>,
    /// Set explicitly, by [`commit_mode`](Self::commit_mode) or `commit.mode`.
    commit_mode: Option<CommitModeKind>,
    /// The period for [`CommitMode::Periodic`]; `auto.commit.interval.ms`.
    auto_commit_interval: Option<Duration>,
    /// `enable.auto.commit`, reconciled with `commit_mode` in `build`.
    enable_auto_commit: Option<bool>,
    commit_timeout: Duration,
    max_pending_checkpoints: usize,
    close_timeout: Duration,
    group_instance_id: Option<String>,
    group_protocol: GroupProtocol,
    /// `None` until set: the `consumer` protocol rejects explicit classic-only settings.
    partition_assignment_strategy: Option<Vec<AssignmentStrategy>>,
    session_timeout: Option<Duration>,
    heartbeat_interval: Option<Duration>,
    max_poll_interval: Duration,
}

impl ConsumerConfigBuilder {
    /// A builder with the given properties [set](Self::set), in order (a later duplicate
    /// overrides an earlier one).
    ///
    /// Accepts anything that yields pairs of strings, such as a `HashMap<String, String>`, a
    /// reference to one, or an array of `(&str, &str)`. The result does not depend on the
    /// order of distinct keys.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for the first unknown property name or value that does not parse.
    pub fn from_properties<K, V>(properties: impl IntoIterator<Item = (K, V)>) -> Result<Self>
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        properties
            .into_iter()
            .try_fold(Self::default(), |builder, (key, value)| {
                builder.set(key.as_ref(), value.as_ref())
            })
    }

    /// Sets one setting by its property name; the [module docs](self) list the names.
    ///
    /// The value is trimmed and parsed here; limits that involve other settings are checked by
    /// [`build`](Self::build).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming the key if the key is unknown (with the nearest known name
    /// when one is close) or unsupported, or naming the key, the value and the expected form
    /// if the value does not parse.
    pub fn set(mut self, key: &str, value: &str) -> Result<Self> {
        let value = value.trim();
        match key {
            "bootstrap.servers" => {
                self.bootstrap_servers = parse_list(key, value)?
                    .into_iter()
                    .map(|address| {
                        parse_broker_address(address)
                            .map(str::to_owned)
                            .map_err(|reason| Error::config(key, reason))
                    })
                    .collect::<Result<_>>()?;
            }
            "client.id" => self.client_id = value.to_owned(),
            "socket.connection.setup.timeout.ms" => self.connect_timeout = parse_ms(key, value)?,
            "request.timeout.ms" => self.request_timeout = parse_ms(key, value)?,
            "reconnect.backoff.ms" => self.reconnect_backoff = parse_ms(key, value)?,
            "reconnect.backoff.max.ms" => self.reconnect_backoff_max = parse_ms(key, value)?,
            "retry.backoff.ms" => self.retry_backoff = parse_ms(key, value)?,
            "metadata.max.age.ms" => self.metadata_max_age = parse_ms(key, value)?,
            "max.response.size" => self.max_response_size = parse_bytes(key, value)?,
            "security.protocol" => {
                parse_choice(key, value, &[("PLAINTEXT", ())])?;
            }
            "fetch.max.bytes" => self.fetch_max_bytes = parse_bytes(key, value)?,
            "max.partition.fetch.bytes" => {
                self.max_partition_fetch_bytes = parse_bytes(key, value)?
            }
            "fetch.min.bytes" => self.fetch_min_bytes = parse_bytes(key, value)?,
            "fetch.max.wait.ms" => self.fetch_max_wait = parse_ms(key, value)?,
            "isolation.level" => {
                self.isolation_level = parse_choice(
                    key,
                    value,
                    &[
                        ("read_uncommitted", IsolationLevel::ReadUncommitted),
                        ("read_committed", IsolationLevel::ReadCommitted),
                    ],
                )?;
            }
            "auto.offset.reset" => {
                self.auto_offset_reset = parse_choice(
                    key,
                    value,
                    &[
                        ("earliest", OffsetReset::Earliest),
                        ("latest", OffsetReset::Latest),
                        ("none", OffsetReset::Error),
                        ("error", OffsetReset::Error),
                    ],
                )?;
            }
            "restore.offset.out.of.range" => {
                self.restore_out_of_range = parse_choice(
                    key,
                    value,
                    &[
                        ("earliest", OffsetReset::Earliest),
                        ("latest", OffsetReset::Latest),
                        ("none", OffsetReset::Error),
                        ("error", OffsetReset::Error),
                    ],
                )?;
            }
            "buffer.max.bytes" => self.buffer_max_bytes = parse_bytes(key, value)?,
            "fetch.connections.per.broker" => {
                self.fetch_connections_per_broker = parse_number(key, value, "a count, e.g. 2")?;
            }
            "check.crcs" => {
                self.check_crcs = parse_choice(key, value, &[("true", true), ("false", false)])?;
            }
            "group.id" => self.group_id = Some(value.to_owned()),
            "commit.mode" => {
                self.commit_mode = Some(parse_choice(
                    key,
                    value,
                    &[
                        ("on_checkpoints", CommitModeKind::OnCheckpoints),
                        ("disabled", CommitModeKind::Disabled),
                        ("periodic", CommitModeKind::Periodic),
                    ],
                )?);
            }
            "enable.auto.commit" => {
                self.enable_auto_commit = Some(parse_choice(
                    key,
                    value,
                    &[("true", true), ("false", false)],
                )?);
            }
            "auto.commit.interval.ms" => self.auto_commit_interval = Some(parse_ms(key, value)?),
            "commit.timeout.ms" => self.commit_timeout = parse_ms(key, value)?,
            "max.pending.checkpoints" => {
                self.max_pending_checkpoints = parse_number(key, value, "a count, e.g. 100")?;
            }
            "close.timeout.ms" => self.close_timeout = parse_ms(key, value)?,
            "group.instance.id" => self.group_instance_id = Some(value.to_owned()),
            "group.protocol" => {
                self.group_protocol = parse_choice(
                    key,
                    value,
                    &[
                        ("classic", GroupProtocol::Classic),
                        ("consumer", GroupProtocol::Consumer),
                    ],
                )?;
            }
            "partition.assignment.strategy" => {
                self.partition_assignment_strategy = Some(
                    parse_list(key, value)?
                        .into_iter()
                        .map(|name| parse_assignment_strategy(key, name))
                        .collect::<Result<_>>()?,
                );
            }
            "session.timeout.ms" => self.session_timeout = Some(parse_ms(key, value)?),
            "heartbeat.interval.ms" => self.heartbeat_interval = Some(parse_ms(key, value)?),
            "max.poll.interval.ms" => self.max_poll_interval = parse_ms(key, value)?,
            _ => return Err(unknown_property(key)),
        }
        Ok(self)
    }

    /// The brokers to bootstrap from, each `host:port`; an IPv6 address goes in brackets, as
    /// in `[::1]:9092`. Replaces any earlier list.
    ///
    /// Property `bootstrap.servers` (comma-separated). Required: there is no default.
    pub fn bootstrap_servers(
        mut self,
        servers: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        self.bootstrap_servers = servers.into_iter().map(Into::into).collect();
        self
    }

    /// The client id sent with every request; brokers use it in logs, metrics and quotas.
    ///
    /// Property `client.id`; default `kafka-source`.
    pub fn client_id(mut self, client_id: impl Into<String>) -> Self {
        self.client_id = client_id.into();
        self
    }

    /// The most bytes one fetch response should carry over all partitions.
    ///
    /// Not an absolute limit: if the first record batch of the first non-empty partition is
    /// larger, the broker returns it anyway so that the consumer makes progress. Must be
    /// between 1 and `i32::MAX`.
    ///
    /// Property `fetch.max.bytes`; default 52428800 (50 MiB).
    pub fn fetch_max_bytes(mut self, bytes: u32) -> Self {
        self.fetch_max_bytes = bytes;
        self
    }

    /// The most bytes one fetch response should carry per partition; like
    /// [`fetch_max_bytes`](Self::fetch_max_bytes), not absolute for the first batch. Must be
    /// between 1 and `i32::MAX`.
    ///
    /// Property `max.partition.fetch.bytes`; default 1048576 (1 MiB).
    pub fn max_partition_fetch_bytes(mut self, bytes: u32) -> Self {
        self.max_partition_fetch_bytes = bytes;
        self
    }

    /// The longest the broker holds a fetch while waiting for
    /// [`fetch_min_bytes`](Self::fetch_min_bytes) of data. Zero answers at once (and makes an
    /// idle consumer poll in a tight loop). Must be shorter than
    /// [`request_timeout`](Self::request_timeout).
    ///
    /// Property `fetch.max.wait.ms`; default 500 ms.
    pub fn fetch_max_wait(mut self, wait: Duration) -> Self {
        self.fetch_max_wait = wait;
        self
    }

    /// The least data the broker should gather before answering a fetch. Must not exceed
    /// [`fetch_max_bytes`](Self::fetch_max_bytes).
    ///
    /// Property `fetch.min.bytes`; default 1.
    pub fn fetch_min_bytes(mut self, bytes: u32) -> Self {
        self.fetch_min_bytes = bytes;
        self
    }

    /// What to do when the consumer needs a new position: a fetch offset is out of range
    /// (records deleted by retention, or an offset from another cluster), or, in subscribe
    /// mode, the group has no committed offset for a partition.
    ///
    /// The default is [`OffsetReset::Error`], unlike the Java client's `latest`, on purpose:
    /// a silent reset skips records (`latest`) or delivers them again (`earliest`), and a stream
    /// processor whose state was checkpointed against exact offsets cannot tell that it
    /// happened. Failing lets the application decide, and choosing a reset policy is one line.
    ///
    /// Property `auto.offset.reset` (`earliest`, `latest`, `none`, or its alias `error`);
    /// default `none`.
    pub fn auto_offset_reset(mut self, reset: OffsetReset) -> Self {
        self.auto_offset_reset = reset;
        self
    }

    /// What to do when an offset restored from a checkpoint is out of range (deleted by
    /// retention, or beyond the log after an unclean election). Kept apart from
    /// [`auto_offset_reset`](Self::auto_offset_reset): a fresh start and a restore are different
    /// decisions, and a restore that silently jumps skips or repeats records the checkpointed
    /// state depends on.
    ///
    /// Property `restore.offset.out.of.range` (`earliest`, `latest`, `none`, or its alias
    /// `error`); default `none`.
    pub fn restore_out_of_range(mut self, policy: OffsetReset) -> Self {
        self.restore_out_of_range = policy;
        self
    }

    /// How long to wait for the response to one request before failing it. Must be longer
    /// than [`fetch_max_wait`](Self::fetch_max_wait), which a fetch may spend waiting on the
    /// broker.
    ///
    /// Property `request.timeout.ms`; default 30 s.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The largest response frame accepted from a broker, in bytes. A length prefix above it
    /// is a [`ProtocolViolation::FrameTooLarge`](crate::ProtocolViolation::FrameTooLarge) and
    /// closes the connection before anything is allocated for the frame.
    ///
    /// Must be at least [`fetch_max_bytes`](Self::fetch_max_bytes) + 1 MiB, the room left for
    /// the response's headers, and at most `i32::MAX` (frame lengths are 32-bit). Since the
    /// broker returns a first batch whole even when it is larger than `fetch.max.bytes`, topics
    /// whose `max.message.bytes` exceeds `fetch.max.bytes` need this raised to match.
    ///
    /// Property `max.response.size`; default 104857600 (100 MiB).
    pub fn max_response_size(mut self, bytes: usize) -> Self {
        self.max_response_size = bytes;
        self
    }

    /// The memory budget, in bytes, for fetched records that the application has not yet
    /// polled. Decompressed bytes count against it, not only the bytes received.
    ///
    /// Must be at least [`max_partition_fetch_bytes`](Self::max_partition_fetch_bytes), so
    /// that one partition's full fetch fits into an empty buffer and the consumer always makes
    /// progress. It may be smaller than [`fetch_max_bytes`](Self::fetch_max_bytes): the budget
    /// is a limit on memory, and the consumer asks a broker for no more than the budget has
    /// free.
    ///
    /// Property `buffer.max.bytes`; default 67108864 (64 MiB).
    pub fn buffer_max_bytes(mut self, bytes: usize) -> Self {
        self.buffer_max_bytes = bytes;
        self
    }

    /// Whether fetches see records of aborted and still-open transactions.
    ///
    /// The default, [`IsolationLevel::ReadUncommitted`], matches the Java client, so a
    /// configuration carried over from it behaves the same (librdkafka defaults to
    /// `read_committed`). Choose [`IsolationLevel::ReadCommitted`] when the topics are written
    /// by transactional producers and aborted records must not reach the application.
    ///
    /// Property `isolation.level` (`read_uncommitted` or `read_committed`); default
    /// `read_uncommitted`.
    pub fn isolation_level(mut self, level: IsolationLevel) -> Self {
        self.isolation_level = level;
        self
    }

    /// How many data connections to open to each broker, each with at most one Fetch in
    /// flight; the partitions a broker leads are shared out over them.
    ///
    /// A broker answers one connection's requests in order, so with one connection (as the
    /// Java client and librdkafka fetch) nothing is on its way while the consumer receives and
    /// decodes a response. With two, the broker reads its log and sends one response while the
    /// consumer works through the other. Partitions are never in two requests at once, and
    /// every request counts against `buffer.max.bytes` as before. A broker that leads a single
    /// assigned partition gets one data connection whatever this says.
    ///
    /// Property `fetch.connections.per.broker` (1 to 16); default 2.
    pub fn fetch_connections_per_broker(mut self, connections: u8) -> Self {
        self.fetch_connections_per_broker = connections;
        self
    }

    /// Whether to check each record batch's CRC-32C before decoding it, as the Java client's
    /// `check.crcs` does.
    ///
    /// On small uncompressed records the check is about a tenth of the consumer's CPU time.
    /// Without it, corruption on the wire or on the broker's disk is still a typed error when
    /// it breaks a batch's structure, but goes unnoticed when it only changes the bytes of a
    /// key, value or header. librdkafka does not check by default; the Java client does.
    ///
    /// Property `check.crcs` (`true` or `false`); default `true`.
    pub fn check_crcs(mut self, check: bool) -> Self {
        self.check_crcs = check;
        self
    }

    /// How often cluster metadata is refreshed even when nothing suggests it changed.
    ///
    /// Property `metadata.max.age.ms`; default 5 min.
    pub fn metadata_max_age(mut self, age: Duration) -> Self {
        self.metadata_max_age = age;
        self
    }

    /// The first wait before reconnecting to a broker; it doubles with every failed attempt up
    /// to [`reconnect_backoff_max`](Self::reconnect_backoff_max), which it must not exceed.
    ///
    /// Property `reconnect.backoff.ms`; default 50 ms.
    pub fn reconnect_backoff(mut self, backoff: Duration) -> Self {
        self.reconnect_backoff = backoff;
        self
    }

    /// The cap of the reconnect wait.
    ///
    /// Property `reconnect.backoff.max.ms`; default 1 s.
    pub fn reconnect_backoff_max(mut self, backoff: Duration) -> Self {
        self.reconnect_backoff_max = backoff;
        self
    }

    /// The wait before retrying a request that failed with a retriable error.
    ///
    /// Property `retry.backoff.ms`; default 100 ms.
    pub fn retry_backoff(mut self, backoff: Duration) -> Self {
        self.retry_backoff = backoff;
        self
    }

    /// How long one TCP connection attempt may take.
    ///
    /// Property `socket.connection.setup.timeout.ms`; default 10 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The consumer group: offsets are committed to it, and in subscribe mode the consumer
    /// joins it. Required by the committing [commit modes](CommitMode); must not be empty.
    ///
    /// Property `group.id`; default unset.
    pub fn group_id(mut self, group_id: impl Into<String>) -> Self {
        self.group_id = Some(group_id.into());
        self
    }

    /// When offsets are committed; see [`CommitMode`].
    ///
    /// Property `commit.mode` (`on_checkpoints`, `disabled`, `periodic`), with the period from
    /// `auto.commit.interval.ms` (default 5000). The Java name `enable.auto.commit=true` also
    /// selects `periodic`; `false` leaves the commit mode as configured. Default
    /// [`CommitMode::OnCheckpoints`].
    pub fn commit_mode(mut self, mode: CommitMode) -> Self {
        match mode {
            CommitMode::Disabled => self.commit_mode = Some(CommitModeKind::Disabled),
            CommitMode::OnCheckpoints => self.commit_mode = Some(CommitModeKind::OnCheckpoints),
            CommitMode::Periodic(interval) => {
                self.commit_mode = Some(CommitModeKind::Periodic);
                self.auto_commit_interval = Some(interval);
            }
        }
        self
    }

    /// The deadline of one offset commit, including finding the group coordinator and
    /// retries; when it passes, the commit fails with a timeout.
    ///
    /// Property `commit.timeout.ms`; default 10 s.
    pub fn commit_timeout(mut self, timeout: Duration) -> Self {
        self.commit_timeout = timeout;
        self
    }

    /// How many checkpoints' offsets are kept while waiting for those checkpoints to complete.
    ///
    /// A checkpoint that the application never reports complete would otherwise keep its
    /// offsets forever. When one more would exceed the limit, the oldest pending checkpoint is
    /// dropped; its offsets are not committed, and a later completed checkpoint's commit covers
    /// them. Must be at least 1.
    ///
    /// Property `max.pending.checkpoints`; default 100.
    pub fn max_pending_checkpoints(mut self, count: usize) -> Self {
        self.max_pending_checkpoints = count;
        self
    }

    /// How long closing the consumer waits for outstanding work, such as a final commit or
    /// leaving the group, before giving up on it. Zero does not wait.
    ///
    /// Property `close.timeout.ms`; default 10 s.
    pub fn close_timeout(mut self, timeout: Duration) -> Self {
        self.close_timeout = timeout;
        self
    }

    /// The static membership id (KIP-345): a restarted member with the same id takes its old
    /// place in the group without a rebalance. Needs [`group_id`](Self::group_id); must not be
    /// empty. Takes effect in subscribe mode.
    ///
    /// Property `group.instance.id`; default unset.
    pub fn group_instance_id(mut self, id: impl Into<String>) -> Self {
        self.group_instance_id = Some(id.into());
        self
    }

    /// The group membership protocol. Takes effect in subscribe mode.
    ///
    /// Property `group.protocol` (`classic` or `consumer`); default `classic`.
    pub fn group_protocol(mut self, protocol: GroupProtocol) -> Self {
        self.group_protocol = protocol;
        self
    }

    /// The assignment strategies this member supports, preferred first. Must not be empty or
    /// repeat a strategy, and may not be set with [`GroupProtocol::Consumer`], where the
    /// broker assigns partitions. Takes effect in subscribe mode.
    ///
    /// Property `partition.assignment.strategy` (comma-separated `range`, `roundrobin`,
    /// `cooperative-sticky`, or the Java class names); default `range,cooperative-sticky`, as in
    /// the Java client.
    pub fn partition_assignment_strategy(
        mut self,
        strategies: impl IntoIterator<Item = AssignmentStrategy>,
    ) -> Self {
        self.partition_assignment_strategy = Some(strategies.into_iter().collect());
        self
    }

    /// How long the group waits to hear from a member before evicting it. May not be set with
    /// [`GroupProtocol::Consumer`], where the broker's `group.consumer.session.timeout.ms`
    /// applies. Takes effect in subscribe mode.
    ///
    /// Property `session.timeout.ms`; default 45 s.
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = Some(timeout);
        self
    }

    /// The time between heartbeats; must be shorter than
    /// [`session_timeout`](Self::session_timeout). May not be set with
    /// [`GroupProtocol::Consumer`], where the broker sets the interval. Takes effect in
    /// subscribe mode.
    ///
    /// Property `heartbeat.interval.ms`; default 3 s.
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = Some(interval);
        self
    }

    /// The longest allowed gap between polls: a member that does not poll for this long
    /// leaves its group so that its partitions move to a live member. Takes effect in
    /// subscribe mode.
    ///
    /// Property `max.poll.interval.ms`; default 5 min.
    pub fn max_poll_interval(mut self, interval: Duration) -> Self {
        self.max_poll_interval = interval;
        self
    }

    /// Checks the settings and makes the configuration.
    ///
    /// Checked here, in addition to the per-setting limits in the [module docs](self):
    /// - at least one bootstrap server, each a valid `host:port`;
    /// - `fetch.min.bytes` ≤ `fetch.max.bytes`;
    /// - `max.response.size` ≥ `fetch.max.bytes` + 1 MiB;
    /// - `buffer.max.bytes` ≥ `max.partition.fetch.bytes`;
    /// - `fetch.max.wait.ms` < `request.timeout.ms`;
    /// - `reconnect.backoff.ms` ≤ `reconnect.backoff.max.ms`;
    /// - a commit mode that commits (`on_checkpoints`, `periodic`) has a `group.id`;
    /// - `enable.auto.commit`, if set, agrees with an explicit `commit.mode`;
    /// - `group.instance.id` has a `group.id`;
    /// - `heartbeat.interval.ms` < `session.timeout.ms`;
    /// - with `group.protocol=consumer`, none of `partition.assignment.strategy`,
    ///   `session.timeout.ms` and `heartbeat.interval.ms` is set (the broker owns them, as the
    ///   Java client also insists);
    /// - every time is at least 1 ms (except `fetch.max.wait.ms` and `close.timeout.ms`, which
    ///   may be zero) and at most `i32::MAX` ms.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for the first violated rule, naming the property it is about.
    pub fn build(self) -> Result<ConsumerConfig> {
        if self.bootstrap_servers.is_empty() {
            return Err(Error::config(
                "bootstrap.servers",
                "no brokers given; expected at least one host:port, e.g. localhost:9092",
            ));
        }
        for address in &self.bootstrap_servers {
            parse_broker_address(address)
                .map_err(|reason| Error::config("bootstrap.servers", reason))?;
        }
        check_protocol_string("client.id", &self.client_id)?;

        check_fetch_bytes("fetch.max.bytes", self.fetch_max_bytes)?;
        check_fetch_bytes("max.partition.fetch.bytes", self.max_partition_fetch_bytes)?;
        if self.fetch_min_bytes > self.fetch_max_bytes {
            return Err(Error::config(
                "fetch.min.bytes",
                format!(
                    "{} exceeds fetch.max.bytes ({}): the broker would wait for more data than it may send",
                    self.fetch_min_bytes, self.fetch_max_bytes
                ),
            ));
        }
        check_time("fetch.max.wait.ms", self.fetch_max_wait, Duration::ZERO)?;
        check_time(
            "request.timeout.ms",
            self.request_timeout,
            Duration::from_millis(1),
        )?;
        if self.request_timeout <= self.fetch_max_wait {
            return Err(Error::config(
                "request.timeout.ms",
                format!(
                    "{:?} must be longer than fetch.max.wait.ms ({:?}): a fetch may wait that long on the broker before it answers",
                    self.request_timeout, self.fetch_max_wait
                ),
            ));
        }

        // The fetch byte counts are at most i32::MAX here, so the sum cannot overflow on any
        // platform with a usize of 32 bits or more.
        let min_response_size = (self.fetch_max_bytes as usize).saturating_add(RESPONSE_HEADROOM);
        if self.max_response_size < min_response_size {
            return Err(Error::config(
                "max.response.size",
                format!(
                    "{} is too small for fetch.max.bytes ({}): it must be at least {min_response_size} (fetch.max.bytes + 1 MiB for headers)",
                    self.max_response_size, self.fetch_max_bytes
                ),
            ));
        }
        if self.max_response_size > i32::MAX as usize {
            return Err(Error::config(
                "max.response.size",
                format!(
                    "{} exceeds {} (frame lengths are 32-bit signed)",
                    self.max_response_size,
                    i32::MAX
                ),
            ));
        }
        if self.buffer_max_bytes < self.max_partition_fetch_bytes as usize {
            return Err(Error::config(
                "buffer.max.bytes",
                format!(
                    "{} is smaller than max.partition.fetch.bytes ({}): one partition's fetch must fit into an empty buffer",
                    self.buffer_max_bytes, self.max_partition_fetch_bytes
                ),
            ));
        }

        if !(1..=16).contains(&self.fetch_connections_per_broker) {
            return Err(Error::config(
                "fetch.connections.per.broker",
                format!("{} is outside 1..=16", self.fetch_connections_per_broker),
            ));
        }

        let positive = Duration::from_millis(1);
        check_time("metadata.max.age.ms", self.metadata_max_age, positive)?;
        check_time("reconnect.backoff.ms", self.reconnect_backoff, positive)?;
        check_time(
            "reconnect.backoff.max.ms",
            self.reconnect_backoff_max,
            positive,
        )?;
        if self.reconnect_backoff > self.reconnect_backoff_max {
            return Err(Error::config(
                "reconnect.backoff.ms",
                format!(
                    "{:?} exceeds reconnect.backoff.max.ms ({:?})",
                    self.reconnect_backoff, self.reconnect_backoff_max
                ),
            ));
        }
        check_time("retry.backoff.ms", self.retry_backoff, positive)?;
        check_time(
            "socket.connection.setup.timeout.ms",
            self.connect_timeout,
            positive,
        )?;

        if let Some(group_id) = &self.group_id {
            check_identifier(
                "group.id",
                group_id,
                "leave it unset to run without a group",
            )?;
        }
        let commit_mode = self.resolve_commit_mode()?;
        if let CommitMode::Periodic(interval) = commit_mode {
            check_time("auto.commit.interval.ms", interval, positive)?;
        }
        if commit_mode != CommitMode::Disabled && self.group_id.is_none() {
            return Err(Error::config(
                "group.id",
                format!(
                    "commit mode {} needs group.id; set group.id, or set commit.mode=disabled to run without commits",
                    commit_mode.property_value()
                ),
            ));
        }
        check_time("commit.timeout.ms", self.commit_timeout, positive)?;
        if self.max_pending_checkpoints == 0 {
            return Err(Error::config(
                "max.pending.checkpoints",
                "0 must be at least 1: the offsets of a checkpoint are kept until it completes",
            ));
        }
        check_time("close.timeout.ms", self.close_timeout, Duration::ZERO)?;

        if let Some(id) = &self.group_instance_id {
            check_identifier(
                "group.instance.id",
                id,
                "leave it unset for dynamic membership",
            )?;
            if self.group_id.is_none() {
                return Err(Error::config(
                    "group.instance.id",
                    "static membership needs group.id",
                ));
            }
        }
        if self.group_protocol == GroupProtocol::Consumer {
            let explicit = [
                (
                    "partition.assignment.strategy",
                    self.partition_assignment_strategy.is_some(),
                ),
                ("session.timeout.ms", self.session_timeout.is_some()),
                ("heartbeat.interval.ms", self.heartbeat_interval.is_some()),
            ];
            if let Some((key, _)) = explicit.into_iter().find(|&(_, set)| set) {
                return Err(Error::config(
                    key,
                    "cannot be set with group.protocol=consumer: the broker controls it (see the broker's group.consumer.* settings)",
                ));
            }
        }
        let partition_assignment_strategy = self
            .partition_assignment_strategy
            .unwrap_or_else(|| default::ASSIGNMENT_STRATEGY.to_vec());
        check_strategies(&partition_assignment_strategy)?;
        let session_timeout = self.session_timeout.unwrap_or(default::SESSION_TIMEOUT);
        let heartbeat_interval = self
            .heartbeat_interval
            .unwrap_or(default::HEARTBEAT_INTERVAL);
        check_time("session.timeout.ms", session_timeout, positive)?;
        check_time("heartbeat.interval.ms", heartbeat_interval, positive)?;
        if heartbeat_interval >= session_timeout {
            return Err(Error::config(
                "heartbeat.interval.ms",
                format!(
                    "{heartbeat_interval:?} must be shorter than session.timeout.ms ({session_timeout:?})"
                ),
            ));
        }
        check_time("max.poll.interval.ms", self.max_poll_interval, positive)?;

        Ok(ConsumerConfig {
            bootstrap_servers: self.bootstrap_servers,
            client_id: self.client_id,
            fetch_max_bytes: self.fetch_max_bytes,
            max_partition_fetch_bytes: self.max_partition_fetch_bytes,
            fetch_max_wait: self.fetch_max_wait,
            fetch_min_bytes: self.fetch_min_bytes,
            auto_offset_reset: self.auto_offset_reset,
            restore_out_of_range: self.restore_out_of_range,
            request_timeout: self.request_timeout,
            max_response_size: self.max_response_size,
            buffer_max_bytes: self.buffer_max_bytes,
            isolation_level: self.isolation_level,
            fetch_connections_per_broker: self.fetch_connections_per_broker,
            check_crcs: self.check_crcs,
            metadata_max_age: self.metadata_max_age,
            reconnect_backoff: self.reconnect_backoff,
            reconnect_backoff_max: self.reconnect_backoff_max,
            retry_backoff: self.retry_backoff,
            connect_timeout: self.connect_timeout,
            group_id: self.group_id,
            commit_mode,
            commit_timeout: self.commit_timeout,
            max_pending_checkpoints: self.max_pending_checkpoints,
            close_timeout: self.close_timeout,
            group_instance_id: self.group_instance_id,
            group_protocol: self.group_protocol,
            partition_assignment_strategy,
            session_timeout,
            heartbeat_interval,
            max_poll_interval: self.max_poll_interval,
        })
    }

    /// Reconciles `commit.mode`, `enable.auto.commit` and `auto.commit.interval.ms`.
    fn resolve_commit_mode(&self) -> Result<CommitMode> {
        let kind = match (self.commit_mode, self.enable_auto_commit) {
            (None, Some(true)) | (Some(CommitModeKind::Periodic), Some(true)) => {
                CommitModeKind::Periodic
            }
            (Some(kind), Some(true)) => {
                return Err(Error::config(
                    "enable.auto.commit",
                    format!(
                        "true conflicts with commit.mode={}; set only one of them",
                        kind.property_value()
                    ),
                ));
            }
            (Some(CommitModeKind::Periodic), Some(false)) => {
                return Err(Error::config(
                    "enable.auto.commit",
                    "false conflicts with commit.mode=periodic; set only one of them",
                ));
            }
            (Some(kind), None | Some(false)) => kind,
            (None, None | Some(false)) => CommitModeKind::OnCheckpoints,
        };
        Ok(match kind {
            CommitModeKind::Disabled => CommitMode::Disabled,
            CommitModeKind::OnCheckpoints => CommitMode::OnCheckpoints,
            CommitModeKind::Periodic => CommitMode::Periodic(
                self.auto_commit_interval
                    .unwrap_or(default::AUTO_COMMIT_INTERVAL),
            ),
        })
    }
}

impl Default for ConsumerConfigBuilder {
    fn default() -> Self {
        Self {
            bootstrap_servers: Vec::new(),
            client_id: default::CLIENT_ID.to_owned(),
            fetch_max_bytes: default::FETCH_MAX_BYTES,
            max_partition_fetch_bytes: default::MAX_PARTITION_FETCH_BYTES,
            fetch_max_wait: default::FETCH_MAX_WAIT,
            fetch_min_bytes: default::FETCH_MIN_BYTES,
            auto_offset_reset: OffsetReset::default(),
            restore_out_of_range: OffsetReset::default(),
            request_timeout: default::REQUEST_TIMEOUT,
            max_response_size: default::MAX_RESPONSE_SIZE,
            buffer_max_bytes: default::BUFFER_MAX_BYTES,
            isolation_level: IsolationLevel::default(),
            fetch_connections_per_broker: default::FETCH_CONNECTIONS_PER_BROKER,
            check_crcs: true,
            metadata_max_age: default::METADATA_MAX_AGE,
            reconnect_backoff: default::RECONNECT_BACKOFF,
            reconnect_backoff_max: default::RECONNECT_BACKOFF_MAX,
            retry_backoff: default::RETRY_BACKOFF,
            connect_timeout: default::CONNECT_TIMEOUT,
            group_id: None,
            commit_mode: None,
            auto_commit_interval: None,
            enable_auto_commit: None,
            commit_timeout: default::COMMIT_TIMEOUT,
            max_pending_checkpoints: default::MAX_PENDING_CHECKPOINTS,
            close_timeout: default::CLOSE_TIMEOUT,
            group_instance_id: None,
            group_protocol: GroupProtocol::default(),
            partition_assignment_strategy: None,
            session_timeout: None,
            heartbeat_interval: None,
            max_poll_interval: default::MAX_POLL_INTERVAL,
        }
    }
}

/// When the consumer commits offsets to its group.
#[non_exhaustive]
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
pub enum CommitMode {
    /// Never commit. Positions live only in the application's checkpointed state, and the
    /// group shows no progress (no consumer lag in monitoring). Needs no `group.id`.
    Disabled,
    /// Commit a checkpoint's offsets when the application reports that checkpoint complete.
    ///
    /// The committed offsets then always match a completed checkpoint. They are not needed to
    /// restore (the checkpoint holds the positions) but show progress in monitoring and serve as
    /// a start position when there is no checkpoint to restore from.
    #[default]
    OnCheckpoints,
    /// Commit the consumed positions every given interval, like the Java client's
    /// `enable.auto.commit`. The committed offsets are not aligned with checkpoints: after a
    /// failure they may be ahead of or behind the restored state.
    Periodic(Duration),
}

impl CommitMode {
    /// The `commit.mode` property value.
    fn property_value(self) -> &'static str {
        match self {
            Self::Disabled => CommitModeKind::Disabled.property_value(),
            Self::OnCheckpoints => CommitModeKind::OnCheckpoints.property_value(),
            Self::Periodic(_) => CommitModeKind::Periodic.property_value(),
        }
    }
}

/// [`CommitMode`] without the period, which comes from `auto.commit.interval.ms`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum CommitModeKind {
    Disabled,
    OnCheckpoints,
    Periodic,
}

impl CommitModeKind {
    /// The `commit.mode` property value.
    fn property_value(self) -> &'static str {
        match self {
            Self::Disabled => "disabled",
            Self::OnCheckpoints => "on_checkpoints",
            Self::Periodic => "periodic",
        }
    }
}

/// What to do when the consumer has no valid offset to read a partition from.
///
/// See [`ConsumerConfigBuilder::auto_offset_reset`] for why the default is
/// [`Error`](Self::Error).
#[non_exhaustive]
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
pub enum OffsetReset {
    /// Move to the log start offset: read everything still kept. Property value `earliest`.
    Earliest,
    /// Fail with [`Error::OffsetOutOfRange`] and let the
    /// application decide. Property value `none` (alias `error`).
    #[default]
    Error,
    /// Move to the log end offset: read only records written from now on. Property value
    /// `latest`.
    Latest,
}

impl fmt::Display for OffsetReset {
    /// The property value: `earliest`, `none` or `latest`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Earliest => "earliest",
            Self::Error => "none",
            Self::Latest => "latest",
        })
    }
}

/// Which records of transactional producers a fetch returns.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
pub enum IsolationLevel {
    /// Only records of committed transactions (and non-transactional records), up to the last
    /// stable offset. Property value `read_committed`.
    ReadCommitted,
    /// Every record up to the high watermark, including those of aborted and open
    /// transactions. Property value `read_uncommitted`.
    #[default]
    ReadUncommitted,
}

impl IsolationLevel {
    /// The value of the Fetch and ListOffsets requests' `isolation_level` field: 0 for
    /// [`ReadUncommitted`](Self::ReadUncommitted), 1 for [`ReadCommitted`](Self::ReadCommitted).
    pub const fn as_i8(self) -> i8 {
        match self {
            Self::ReadCommitted => 1,
            Self::ReadUncommitted => 0,
        }
    }
}

impl fmt::Display for IsolationLevel {
    /// The property value: `read_committed` or `read_uncommitted`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ReadCommitted => "read_committed",
            Self::ReadUncommitted => "read_uncommitted",
        })
    }
}

/// How the consumer takes part in its group in subscribe mode.
#[non_exhaustive]
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
pub enum GroupProtocol {
    /// JoinGroup/SyncGroup with client-side assignment, supported by every broker. Property
    /// value `classic`.
    #[default]
    Classic,
    /// The ConsumerGroupHeartbeat protocol of KIP-848 (Kafka 4.0+): the broker assigns
    /// partitions and sets session timeout and heartbeat interval. Property value `consumer`.
    Consumer,
}

impl fmt::Display for GroupProtocol {
    /// The property value: `classic` or `consumer`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Classic => "classic",
            Self::Consumer => "consumer",
        })
    }
}

/// A client-side partition assignment strategy of the classic group protocol.
#[non_exhaustive]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum AssignmentStrategy {
    /// Incremental sticky assignment: members keep their partitions across rebalances and
    /// give up only those that move (KIP-429). Property value `cooperative-sticky`.
    CooperativeSticky,
    /// Per topic, contiguous ranges of partitions to each member. Property value `range`.
    Range,
    /// All partitions of all topics dealt out in turn. Property value `roundrobin`.
    RoundRobin,
}

impl fmt::Display for AssignmentStrategy {
    /// The property value: `cooperative-sticky`, `range` or `roundrobin`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::CooperativeSticky => "cooperative-sticky",
            Self::Range => "range",
            Self::RoundRobin => "roundrobin",
        })
    }
}

/// Splits a comma-separated list, trimming each entry; empty entries are errors.
fn parse_list<'a>(key: &str, value: &'a str) -> Result<Vec<&'a str>> {
    if value.is_empty() {
        return Err(Error::config(
            key,
            "empty value; expected a comma-separated list",
        ));
    }
    value
        .split(',')
        .map(|entry| {
            let entry = entry.trim();
            if entry.is_empty() {
                Err(Error::config(
                    key,
                    format!("\"{value}\" has an empty entry; expected a comma-separated list"),
                ))
            } else {
                Ok(entry)
            }
        })
        .collect()
}

/// Checks a broker address, `host:port` or `[ipv6]:port`, and returns it unchanged.
///
/// On failure, returns the reason, which names the address.
fn parse_broker_address(address: &str) -> std::result::Result<&str, String> {
    const EXPECTED: &str = "expected host:port, e.g. localhost:9092 or [::1]:9092";
    let fail = |why: &str| Err(format!("\"{address}\" {why}; {EXPECTED}"));
    if address.contains("://") {
        return fail("has a scheme prefix");
    }
    let Some((host, port)) = address.rsplit_once(':') else {
        return fail("has no port");
    };
    if let Some(bracketed) = host.strip_prefix('[') {
        let Some(v6) = bracketed.strip_suffix(']') else {
            return fail("has an unclosed '['");
        };
        if v6.parse::<Ipv6Addr>().is_err() {
            return fail("has an invalid IPv6 address");
        }
    } else if host.contains(':') {
        return fail("looks like an IPv6 address without brackets");
    } else if host.is_empty() {
        return fail("has no host");
    } else if !host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
    {
        return fail("has a host with characters other than letters, digits, '-', '.' and '_'");
    }
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return fail("has no numeric port");
    }
    match port.parse::<u16>() {
        Ok(1..) => Ok(address),
        _ => fail("has a port outside 1..=65535"),
    }
}

/// Parses a non-negative whole number, with errors that say what was expected.
fn parse_number<T: FromStr>(key: &str, value: &str, expected: &str) -> Result<T> {
    let reason = if value.is_empty() {
        format!("empty value; expected {expected}")
    } else if value.starts_with('-') {
        format!("\"{value}\" is negative; expected {expected}")
    } else if !value.bytes().all(|b| b.is_ascii_digit()) {
        format!("\"{value}\" is not a whole number; expected {expected}")
    } else {
        // Only digits, so the parse fails only on overflow.
        match value.parse() {
            Ok(number) => return Ok(number),
            Err(_) => format!("\"{value}\" is too large; expected {expected}"),
        }
    };
    Err(Error::config(key, reason))
}

/// Parses a byte count.
fn parse_bytes<T: FromStr>(key: &str, value: &str) -> Result<T> {
    parse_number(key, value, "a number of bytes, e.g. 1048576")
}

/// Parses whole milliseconds.
fn parse_ms(key: &str, value: &str) -> Result<Duration> {
    parse_number(key, value, "whole milliseconds, e.g. 500").map(Duration::from_millis)
}

/// Parses one of the given names, ignoring ASCII case.
fn parse_choice<T: Copy>(key: &str, value: &str, choices: &[(&str, T)]) -> Result<T> {
    if let Some(&(_, choice)) = choices
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(value))
    {
        return Ok(choice);
    }
    let names: Vec<&str> = choices.iter().map(|&(name, _)| name).collect();
    Err(Error::config(
        key,
        format!("\"{value}\" is not one of {}", names.join(", ")),
    ))
}

/// Parses a strategy by its short name or its Java class name.
fn parse_assignment_strategy(key: &str, name: &str) -> Result<AssignmentStrategy> {
    let short = name
        .strip_prefix("org.apache.kafka.clients.consumer.")
        .unwrap_or(name);
    match short {
        "StickyAssignor" => Err(Error::config(
            key,
            format!("\"{name}\" (eager sticky) is not supported; use cooperative-sticky"),
        )),
        "RangeAssignor" => Ok(AssignmentStrategy::Range),
        "RoundRobinAssignor" => Ok(AssignmentStrategy::RoundRobin),
        "CooperativeStickyAssignor" => Ok(AssignmentStrategy::CooperativeSticky),
        _ => parse_choice(
            key,
            name,
            &[
                ("range", AssignmentStrategy::Range),
                ("roundrobin", AssignmentStrategy::RoundRobin),
                ("cooperative-sticky", AssignmentStrategy::CooperativeSticky),
            ],
        ),
    }
}

/// The error for a property name `set` does not accept.
fn unknown_property(key: &str) -> Error {
    let reason = if key.starts_with("ssl.") || key.starts_with("sasl.") {
        "not supported: this consumer connects with PLAINTEXT only (no TLS, no SASL)".to_owned()
    } else if matches!(key, "key.deserializer" | "value.deserializer") {
        "not supported: records are delivered as bytes; deserialize them in the application"
            .to_owned()
    } else if let Some(known) = closest_property(key) {
        format!("unknown property; did you mean `{known}`?")
    } else {
        "unknown property".to_owned()
    };
    Error::config(key, reason)
}

/// The known property nearest to `key`, if it is close enough to be a likely typo.
fn closest_property(key: &str) -> Option<&'static str> {
    let key = key.to_ascii_lowercase();
    PROPERTIES
        .iter()
        .map(|&known| (edit_distance(&key, known), known))
        .min()
        .filter(|&(distance, _)| distance <= 3 && distance * 3 <= key.len())
        .map(|(_, known)| known)
}

/// Levenshtein distance over bytes.
fn edit_distance(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.as_bytes().iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(diagonal + 1).min(row[j] + 1);
        }
    }
    row[b.len()]
}

/// Checks a byte count that goes into an `int32` request field and must be positive.
fn check_fetch_bytes(key: &str, bytes: u32) -> Result<()> {
    if bytes == 0 || bytes > i32::MAX as u32 {
        return Err(Error::config(
            key,
            format!("{bytes} is outside 1..={}", i32::MAX),
        ));
    }
    Ok(())
}

/// Checks that a time is within `min..=MAX_TIME`.
fn check_time(key: &str, time: Duration, min: Duration) -> Result<()> {
    if time < min {
        return Err(Error::config(
            key,
            format!("{time:?} is too short; it must be at least {min:?}"),
        ));
    }
    if time > MAX_TIME {
        return Err(Error::config(
            key,
            format!("{time:?} is too long; it must be at most {} ms", i32::MAX),
        ));
    }
    Ok(())
}

/// Checks that a string fits the protocol's `int16` length prefix.
fn check_protocol_string(key: &str, value: &str) -> Result<()> {
    if value.len() > MAX_PROTOCOL_STRING {
        return Err(Error::config(
            key,
            format!(
                "{} bytes long; the protocol allows at most {MAX_PROTOCOL_STRING}",
                value.len()
            ),
        ));
    }
    Ok(())
}

/// Checks a group or instance id: not empty, and fits the protocol.
fn check_identifier(key: &str, value: &str, if_empty: &str) -> Result<()> {
    if value.is_empty() {
        return Err(Error::config(key, format!("must not be empty; {if_empty}")));
    }
    check_protocol_string(key, value)
}

/// Checks an assignment strategy list: not empty, no repeats.
fn check_strategies(strategies: &[AssignmentStrategy]) -> Result<()> {
    const KEY: &str = "partition.assignment.strategy";
    if strategies.is_empty() {
        return Err(Error::config(
            KEY,
            "no strategy given; expected e.g. range,cooperative-sticky",
        ));
    }
    for (i, strategy) in strategies.iter().enumerate() {
        if strategies[..i].contains(strategy) {
            return Err(Error::config(KEY, format!("{strategy} is listed twice")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::error::ConfigError;

    /// The smallest builder that builds.
    fn minimal() -> ConsumerConfigBuilder {
        ConsumerConfig::builder()
            .bootstrap_servers(["localhost:9092"])
            .group_id("g")
    }

    /// Builds from properties, on top of the minimal settings.
    fn with(properties: &[(&str, &str)]) -> Result<ConsumerConfig> {
        properties
            .iter()
            .try_fold(minimal(), |builder, &(key, value)| builder.set(key, value))?
            .build()
    }

    /// The `ConfigError` inside an error, or a panic.
    fn config_error(result: Result<impl fmt::Debug>) -> ConfigError {
        match result {
            Err(Error::Config(error)) => error,
            other => panic!("expected a configuration error, got {other:?}"),
        }
    }

    /// Asserts a configuration error about `key` whose reason contains every fragment.
    #[track_caller]
    fn assert_rejects(result: Result<impl fmt::Debug>, key: &str, fragments: &[&str]) {
        let error = config_error(result);
        assert_eq!(error.key, key, "{error}");
        for fragment in fragments {
            assert!(
                error.reason.contains(fragment),
                "{error:?} lacks {fragment:?}"
            );
        }
    }

    #[test]
    fn defaults() {
        let config = minimal().build().unwrap();
        assert_eq!(config.bootstrap_servers(), ["localhost:9092"]);
        assert_eq!(config.client_id(), "kafka-source");
        assert_eq!(config.fetch_max_bytes(), 52_428_800);
        assert_eq!(config.max_partition_fetch_bytes(), 1_048_576);
        assert_eq!(config.fetch_max_wait(), Duration::from_millis(500));
        assert_eq!(config.fetch_min_bytes(), 1);
        assert_eq!(config.auto_offset_reset(), OffsetReset::Error);
        assert_eq!(config.restore_out_of_range(), OffsetReset::Error);
        assert_eq!(config.request_timeout(), Duration::from_secs(30));
        assert_eq!(config.max_response_size(), 100 * 1024 * 1024);
        assert_eq!(config.buffer_max_bytes(), 64 * 1024 * 1024);
        assert_eq!(config.isolation_level(), IsolationLevel::ReadUncommitted);
        assert!(config.check_crcs());
        assert_eq!(config.fetch_connections_per_broker(), 2);
        assert_eq!(config.metadata_max_age(), Duration::from_secs(300));
        assert_eq!(config.reconnect_backoff(), Duration::from_millis(50));
        assert_eq!(config.reconnect_backoff_max(), Duration::from_secs(1));
        assert_eq!(config.retry_backoff(), Duration::from_millis(100));
        assert_eq!(config.connect_timeout(), Duration::from_secs(10));
        assert_eq!(config.group_id(), Some("g"));
        assert_eq!(config.commit_mode(), CommitMode::OnCheckpoints);
        assert_eq!(config.commit_timeout(), Duration::from_secs(10));
        assert_eq!(config.max_pending_checkpoints(), 100);
        assert_eq!(config.close_timeout(), Duration::from_secs(10));
        assert_eq!(config.group_instance_id(), None);
        assert_eq!(config.group_protocol(), GroupProtocol::Classic);
        assert_eq!(
            config.partition_assignment_strategy(),
            [
                AssignmentStrategy::Range,
                AssignmentStrategy::CooperativeSticky
            ]
        );
        assert_eq!(config.session_timeout(), Duration::from_secs(45));
        assert_eq!(config.heartbeat_interval(), Duration::from_secs(3));
        assert_eq!(config.max_poll_interval(), Duration::from_secs(300));
    }

    #[test]
    fn builds_without_group_when_commits_are_disabled() {
        let config = ConsumerConfig::builder()
            .bootstrap_servers(["localhost:9092"])
            .commit_mode(CommitMode::Disabled)
            .build()
            .unwrap();
        assert_eq!(config.group_id(), None);
        assert_eq!(config.commit_mode(), CommitMode::Disabled);
    }

    /// A non-default value for every property, and the typed builder giving the same config.
    fn every_property() -> (Vec<(&'static str, &'static str)>, ConsumerConfigBuilder) {
        let properties = vec![
            (
                "bootstrap.servers",
                " a.example:9092 , [::1]:9093,10.0.0.1:1 ",
            ),
            ("client.id", "billing-1"),
            ("socket.connection.setup.timeout.ms", "2000"),
            ("request.timeout.ms", "40000"),
            ("reconnect.backoff.ms", "20"),
            ("reconnect.backoff.max.ms", "5000"),
            ("retry.backoff.ms", "250"),
            ("metadata.max.age.ms", "60000"),
            ("max.response.size", "20971520"),
            ("security.protocol", "plaintext"),
            ("fetch.max.bytes", "10485760"),
            ("max.partition.fetch.bytes", "2097152"),
            ("fetch.min.bytes", "1024"),
            ("fetch.max.wait.ms", "100"),
            ("isolation.level", "READ_COMMITTED"),
            ("auto.offset.reset", "earliest"),
            ("restore.offset.out.of.range", "latest"),
            ("buffer.max.bytes", "33554432"),
            ("fetch.connections.per.broker", "3"),
            ("check.crcs", "false"),
            ("group.id", "billing"),
            ("commit.mode", "periodic"),
            ("enable.auto.commit", "true"),
            ("auto.commit.interval.ms", "1500"),
            ("commit.timeout.ms", "3000"),
            ("max.pending.checkpoints", "7"),
            ("close.timeout.ms", "0"),
            ("group.instance.id", "billing-host-1"),
            ("group.protocol", "classic"),
            (
                "partition.assignment.strategy",
                "cooperative-sticky, org.apache.kafka.clients.consumer.RoundRobinAssignor",
            ),
            ("session.timeout.ms", "30000"),
            ("heartbeat.interval.ms", "1000"),
            ("max.poll.interval.ms", "600000"),
        ];
        let typed = ConsumerConfig::builder()
            .bootstrap_servers(["a.example:9092", "[::1]:9093", "10.0.0.1:1"])
            .client_id("billing-1")
            .connect_timeout(Duration::from_secs(2))
            .request_timeout(Duration::from_secs(40))
            .reconnect_backoff(Duration::from_millis(20))
            .reconnect_backoff_max(Duration::from_secs(5))
            .retry_backoff(Duration::from_millis(250))
            .metadata_max_age(Duration::from_secs(60))
            .max_response_size(20 << 20)
            .fetch_max_bytes(10 << 20)
            .max_partition_fetch_bytes(2 << 20)
            .fetch_min_bytes(1024)
            .fetch_max_wait(Duration::from_millis(100))
            .isolation_level(IsolationLevel::ReadCommitted)
            .auto_offset_reset(OffsetReset::Earliest)
            .restore_out_of_range(OffsetReset::Latest)
            .buffer_max_bytes(32 << 20)
            .fetch_connections_per_broker(3)
            .check_crcs(false)
            .group_id("billing")
            .commit_mode(CommitMode::Periodic(Duration::from_millis(1500)))
            .commit_timeout(Duration::from_secs(3))
            .max_pending_checkpoints(7)
            .close_timeout(Duration::ZERO)
            .group_instance_id("billing-host-1")
            .group_protocol(GroupProtocol::Classic)
            .partition_assignment_strategy([
                AssignmentStrategy::CooperativeSticky,
                AssignmentStrategy::RoundRobin,
            ])
            .session_timeout(Duration::from_secs(30))
            .heartbeat_interval(Duration::from_secs(1))
            .max_poll_interval(Duration::from_secs(600));
        (properties, typed)
    }

    #[test]
    fn every_known_property_is_covered() {
        let (properties, _) = every_property();
        let keys: Vec<&str> = properties.iter().map(|&(key, _)| key).collect();
        assert_eq!(keys, PROPERTIES);
    }

    #[test]
    fn each_property_parses() {
        let (properties, _) = every_property();
        for &(key, value) in &properties {
            ConsumerConfig::builder()
                .set(key, value)
                .unwrap_or_else(|e| panic!("{key}={value}: {e}"));
        }
        let config = ConsumerConfigBuilder::from_properties(properties)
            .unwrap()
            .build()
            .unwrap();
        assert_eq!(
            config.bootstrap_servers(),
            ["a.example:9092", "[::1]:9093", "10.0.0.1:1"]
        );
        assert_eq!(config.client_id(), "billing-1");
        assert_eq!(config.connect_timeout(), Duration::from_secs(2));
        assert_eq!(config.request_timeout(), Duration::from_secs(40));
        assert_eq!(config.reconnect_backoff(), Duration::from_millis(20));
        assert_eq!(config.reconnect_backoff_max(), Duration::from_secs(5));
        assert_eq!(config.retry_backoff(), Duration::from_millis(250));
        assert_eq!(config.metadata_max_age(), Duration::from_secs(60));
        assert_eq!(config.max_response_size(), 20 << 20);
        assert_eq!(config.fetch_max_bytes(), 10 << 20);
        assert_eq!(config.max_partition_fetch_bytes(), 2 << 20);
        assert_eq!(config.fetch_min_bytes(), 1024);
        assert_eq!(config.fetch_max_wait(), Duration::from_millis(100));
        assert_eq!(config.isolation_level(), IsolationLevel::ReadCommitted);
        assert_eq!(config.auto_offset_reset(), OffsetReset::Earliest);
        assert_eq!(config.buffer_max_bytes(), 32 << 20);
        assert_eq!(config.fetch_connections_per_broker(), 3);
        assert_eq!(config.group_id(), Some("billing"));
        assert_eq!(
            config.commit_mode(),
            CommitMode::Periodic(Duration::from_millis(1500))
        );
        assert_eq!(config.commit_timeout(), Duration::from_secs(3));
        assert_eq!(config.max_pending_checkpoints(), 7);
        assert_eq!(config.close_timeout(), Duration::ZERO);
        assert_eq!(config.group_instance_id(), Some("billing-host-1"));
        assert_eq!(config.group_protocol(), GroupProtocol::Classic);
        assert_eq!(
            config.partition_assignment_strategy(),
            [
                AssignmentStrategy::CooperativeSticky,
                AssignmentStrategy::RoundRobin
            ]
        );
        assert_eq!(config.session_timeout(), Duration::from_secs(30));
        assert_eq!(config.heartbeat_interval(), Duration::from_secs(1));
        assert_eq!(config.max_poll_interval(), Duration::from_secs(600));
    }

    #[test]
    fn typed_and_properties_give_equal_configs() {
        let (properties, typed) = every_property();
        let typed = typed.build().unwrap();
        let from_vec = ConsumerConfigBuilder::from_properties(properties.clone())
            .unwrap()
            .build()
            .unwrap();
        assert_eq!(typed, from_vec);

        // Reversed order and a HashMap (arbitrary order) give the same result.
        let reversed = ConsumerConfigBuilder::from_properties(properties.iter().rev().copied())
            .unwrap()
            .build()
            .unwrap();
        assert_eq!(typed, reversed);
        let map: HashMap<String, String> = properties
            .iter()
            .map(|&(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let from_map = ConsumerConfigBuilder::from_properties(&map)
            .unwrap()
            .build()
            .unwrap();
        assert_eq!(typed, from_map);

        // Defaults agree too.
        let minimal_properties = ConsumerConfigBuilder::from_properties([
            ("bootstrap.servers", "localhost:9092"),
            ("group.id", "g"),
        ])
        .unwrap()
        .build()
        .unwrap();
        assert_eq!(minimal().build().unwrap(), minimal_properties);
    }

    #[test]
    fn choices_and_aliases() {
        for (value, reset) in [
            ("earliest", OffsetReset::Earliest),
            ("latest", OffsetReset::Latest),
            ("none", OffsetReset::Error),
            ("error", OffsetReset::Error),
            ("Latest", OffsetReset::Latest),
        ] {
            assert_eq!(
                with(&[("auto.offset.reset", value)])
                    .unwrap()
                    .auto_offset_reset(),
                reset
            );
        }
        for (value, level) in [
            ("read_uncommitted", IsolationLevel::ReadUncommitted),
            ("read_committed", IsolationLevel::ReadCommitted),
        ] {
            assert_eq!(
                with(&[("isolation.level", value)])
                    .unwrap()
                    .isolation_level(),
                level
            );
        }
        for (value, mode) in [
            ("on_checkpoints", CommitMode::OnCheckpoints),
            ("disabled", CommitMode::Disabled),
            ("periodic", CommitMode::Periodic(Duration::from_secs(5))),
        ] {
            assert_eq!(with(&[("commit.mode", value)]).unwrap().commit_mode(), mode);
        }
        assert_eq!(
            with(&[("group.protocol", "CONSUMER")])
                .unwrap()
                .group_protocol(),
            GroupProtocol::Consumer
        );
        assert_eq!(
            with(&[("partition.assignment.strategy", "range,RoundRobin")])
                .unwrap()
                .partition_assignment_strategy(),
            [AssignmentStrategy::Range, AssignmentStrategy::RoundRobin]
        );
        assert_eq!(
            with(&[("partition.assignment.strategy", "CooperativeStickyAssignor")])
                .unwrap()
                .partition_assignment_strategy(),
            [AssignmentStrategy::CooperativeSticky]
        );
    }

    #[test]
    fn display_gives_property_values() {
        assert_eq!(OffsetReset::Error.to_string(), "none");
        assert_eq!(IsolationLevel::ReadCommitted.to_string(), "read_committed");
        assert_eq!(GroupProtocol::Consumer.to_string(), "consumer");
        assert_eq!(
            AssignmentStrategy::CooperativeSticky.to_string(),
            "cooperative-sticky"
        );
        for reset in [
            OffsetReset::Earliest,
            OffsetReset::Error,
            OffsetReset::Latest,
        ] {
            let parsed = with(&[("auto.offset.reset", &reset.to_string())]).unwrap();
            assert_eq!(parsed.auto_offset_reset(), reset);
        }
    }

    #[test]
    fn isolation_level_wire_values() {
        assert_eq!(IsolationLevel::ReadUncommitted.as_i8(), 0);
        assert_eq!(IsolationLevel::ReadCommitted.as_i8(), 1);
    }

    #[test]
    fn unknown_key_is_named() {
        let error = config_error(ConsumerConfig::builder().set("no.such.thing", "1"));
        assert_eq!(error.key, "no.such.thing");
        assert_eq!(error.reason, "unknown property");
        assert!(Error::Config(error).to_string().contains("no.such.thing"));
    }

    #[test]
    fn unknown_key_suggests_the_nearest() {
        assert_rejects(
            ConsumerConfig::builder().set("fetch.max.byte", "1"),
            "fetch.max.byte",
            &["did you mean `fetch.max.bytes`?"],
        );
        assert_rejects(
            ConsumerConfig::builder().set("bootstrap-servers", "a:1"),
            "bootstrap-servers",
            &["`bootstrap.servers`"],
        );
        assert_rejects(
            ConsumerConfig::builder().set("GROUP.ID", "g"),
            "GROUP.ID",
            &["`group.id`"],
        );
        assert_rejects(
            ConsumerConfig::builder().set("fetch.max.wait", "1"),
            "fetch.max.wait",
            &["`fetch.max.wait.ms`"],
        );
        // Too far from anything to guess.
        let error = config_error(ConsumerConfig::builder().set("compression.type", "lz4"));
        assert!(!error.reason.contains("did you mean"), "{error}");
    }

    #[test]
    fn unsupported_keys_say_why() {
        assert_rejects(
            ConsumerConfig::builder().set("ssl.truststore.location", "x"),
            "ssl.truststore.location",
            &["TLS"],
        );
        assert_rejects(
            ConsumerConfig::builder().set("sasl.mechanism", "PLAIN"),
            "sasl.mechanism",
            &["SASL"],
        );
        assert_rejects(
            ConsumerConfig::builder().set("value.deserializer", "x"),
            "value.deserializer",
            &["bytes"],
        );
        assert_rejects(
            ConsumerConfig::builder().set("security.protocol", "SSL"),
            "security.protocol",
            &["\"SSL\"", "PLAINTEXT"],
        );
    }

    #[test]
    fn malformed_numbers() {
        let b = ConsumerConfig::builder;
        assert_rejects(
            b().set("fetch.max.bytes", "lots"),
            "fetch.max.bytes",
            &["\"lots\"", "not a whole number", "bytes"],
        );
        assert_rejects(
            b().set("fetch.max.bytes", "-1"),
            "fetch.max.bytes",
            &["\"-1\"", "negative"],
        );
        assert_rejects(
            b().set("fetch.max.bytes", "4294967296"),
            "fetch.max.bytes",
            &["too large"],
        );
        assert_rejects(
            b().set("fetch.max.bytes", ""),
            "fetch.max.bytes",
            &["empty"],
        );
        assert_rejects(
            b().set("fetch.max.bytes", "1e6"),
            "fetch.max.bytes",
            &["\"1e6\""],
        );
        assert_rejects(
            b().set("fetch.max.bytes", "+5"),
            "fetch.max.bytes",
            &["\"+5\""],
        );
        assert_rejects(
            b().set("request.timeout.ms", "30s"),
            "request.timeout.ms",
            &["\"30s\"", "milliseconds"],
        );
        assert_rejects(
            b().set("session.timeout.ms", "-100"),
            "session.timeout.ms",
            &["negative"],
        );
        assert_rejects(
            b().set("max.pending.checkpoints", "many"),
            "max.pending.checkpoints",
            &["count"],
        );
        assert_rejects(
            b().set("enable.auto.commit", "yes"),
            "enable.auto.commit",
            &["\"yes\"", "true, false"],
        );
        assert_rejects(
            b().set("auto.offset.reset", "smallest"),
            "auto.offset.reset",
            &["\"smallest\"", "earliest, latest, none"],
        );
        assert_rejects(
            b().set("isolation.level", "committed"),
            "isolation.level",
            &["read_uncommitted, read_committed"],
        );
        assert_rejects(
            b().set("commit.mode", "always"),
            "commit.mode",
            &["on_checkpoints, disabled, periodic"],
        );
        assert_rejects(
            b().set("group.protocol", "share"),
            "group.protocol",
            &["classic, consumer"],
        );
        assert_rejects(
            b().set("partition.assignment.strategy", "sticky"),
            "partition.assignment.strategy",
            &["\"sticky\""],
        );
        assert_rejects(
            b().set("partition.assignment.strategy", "StickyAssignor"),
            "partition.assignment.strategy",
            &["cooperative-sticky"],
        );
        assert_rejects(
            b().set("partition.assignment.strategy", "range,,roundrobin"),
            "partition.assignment.strategy",
            &["empty entry"],
        );
    }

    #[test]
    fn malformed_bootstrap_servers() {
        let set = |value| ConsumerConfig::builder().set("bootstrap.servers", value);
        assert_rejects(set(""), "bootstrap.servers", &["empty"]);
        assert_rejects(set("a:9092,"), "bootstrap.servers", &["empty entry"]);
        assert_rejects(
            set("localhost"),
            "bootstrap.servers",
            &["\"localhost\"", "no port", "host:port"],
        );
        assert_rejects(
            set("localhost:0"),
            "bootstrap.servers",
            &["\"localhost:0\"", "1..=65535"],
        );
        assert_rejects(set("localhost:65536"), "bootstrap.servers", &["1..=65535"]);
        assert_rejects(
            set("localhost:99999999999"),
            "bootstrap.servers",
            &["1..=65535"],
        );
        assert_rejects(
            set("localhost:http"),
            "bootstrap.servers",
            &["numeric port"],
        );
        assert_rejects(set("localhost:"), "bootstrap.servers", &["numeric port"]);
        assert_rejects(set(":9092"), "bootstrap.servers", &["no host"]);
        assert_rejects(set("::1:9092"), "bootstrap.servers", &["brackets"]);
        assert_rejects(set("[::1:9092"), "bootstrap.servers", &["unclosed"]);
        assert_rejects(set("[not-v6]:9092"), "bootstrap.servers", &["IPv6"]);
        assert_rejects(set("PLAINTEXT://a:9092"), "bootstrap.servers", &["scheme"]);
        assert_rejects(set("a b:9092"), "bootstrap.servers", &["characters"]);
        // Accepted forms.
        let config = with(&[(
            "bootstrap.servers",
            "[::1]:9092,[fe80::1]:65535,kafka-0.kafka_svc.local:9092",
        )])
        .unwrap();
        assert_eq!(config.bootstrap_servers().len(), 3);

        // Typed input is checked by build.
        assert_rejects(
            ConsumerConfig::builder().group_id("g").build(),
            "bootstrap.servers",
            &["at least one"],
        );
        assert_rejects(
            minimal().bootstrap_servers(Vec::<String>::new()).build(),
            "bootstrap.servers",
            &["at least one"],
        );
        assert_rejects(
            minimal().bootstrap_servers(["ok:1", "bad:0"]).build(),
            "bootstrap.servers",
            &["\"bad:0\""],
        );
        assert_rejects(
            minimal().bootstrap_servers([" padded:9092"]).build(),
            "bootstrap.servers",
            &["characters"],
        );
    }

    #[test]
    fn byte_limits() {
        assert_rejects(
            minimal().fetch_max_bytes(0).build(),
            "fetch.max.bytes",
            &["1..=2147483647"],
        );
        assert_rejects(
            minimal().fetch_max_bytes(u32::MAX).build(),
            "fetch.max.bytes",
            &["1..=2147483647"],
        );
        assert_rejects(
            minimal().max_partition_fetch_bytes(0).build(),
            "max.partition.fetch.bytes",
            &["1..="],
        );
        assert_rejects(
            minimal()
                .fetch_max_bytes(1000)
                .fetch_min_bytes(1001)
                .build(),
            "fetch.min.bytes",
            &["1001", "fetch.max.bytes (1000)"],
        );
        minimal()
            .fetch_max_bytes(1000)
            .fetch_min_bytes(1000)
            .build()
            .unwrap();
        minimal().fetch_min_bytes(0).build().unwrap();

        let fetch = 10 << 20;
        assert_rejects(
            minimal()
                .fetch_max_bytes(fetch)
                .max_response_size(fetch as usize + (1 << 20) - 1)
                .build(),
            "max.response.size",
            &["too small", "fetch.max.bytes"],
        );
        minimal()
            .fetch_max_bytes(fetch)
            .max_response_size(fetch as usize + (1 << 20))
            .build()
            .unwrap();
        assert_rejects(
            minimal().max_response_size(i32::MAX as usize + 1).build(),
            "max.response.size",
            &["32-bit"],
        );

        assert_rejects(
            minimal()
                .max_partition_fetch_bytes(4 << 20)
                .buffer_max_bytes((4 << 20) - 1)
                .build(),
            "buffer.max.bytes",
            &["max.partition.fetch.bytes"],
        );
        // A budget below fetch.max.bytes is allowed.
        let config = minimal().buffer_max_bytes(1 << 20).build().unwrap();
        assert!(config.buffer_max_bytes() < config.fetch_max_bytes() as usize);
    }

    #[test]
    fn fetch_connection_limits() {
        for bad in [0, 17] {
            assert_rejects(
                minimal().fetch_connections_per_broker(bad).build(),
                "fetch.connections.per.broker",
                &[&bad.to_string(), "1..=16"],
            );
        }
        for good in [1, 16] {
            let config = minimal()
                .fetch_connections_per_broker(good)
                .build()
                .unwrap();
            assert_eq!(config.fetch_connections_per_broker(), good);
        }
        let err = ConsumerConfigBuilder::default()
            .set("fetch.connections.per.broker", "256")
            .unwrap_err();
        assert!(err.to_string().contains("too large"), "{err}");
    }

    #[test]
    fn time_limits() {
        assert_rejects(
            minimal().reconnect_backoff(Duration::from_secs(2)).build(),
            "reconnect.backoff.ms",
            &["reconnect.backoff.max.ms"],
        );
        minimal()
            .reconnect_backoff(Duration::from_secs(1))
            .reconnect_backoff_max(Duration::from_secs(1))
            .build()
            .unwrap();
        assert_rejects(
            minimal().fetch_max_wait(Duration::from_secs(30)).build(),
            "request.timeout.ms",
            &["fetch.max.wait.ms"],
        );
        assert_rejects(
            minimal()
                .session_timeout(Duration::from_secs(10))
                .heartbeat_interval(Duration::from_secs(10))
                .build(),
            "heartbeat.interval.ms",
            &["session.timeout.ms"],
        );
        // The default heartbeat (3 s) is checked against an explicit session timeout too.
        assert_rejects(
            with(&[("session.timeout.ms", "2000")]),
            "heartbeat.interval.ms",
            &[],
        );

        // Zero where a time must be positive, from either route.
        for key in [
            "socket.connection.setup.timeout.ms",
            "request.timeout.ms",
            "reconnect.backoff.ms",
            "reconnect.backoff.max.ms",
            "retry.backoff.ms",
            "metadata.max.age.ms",
            "commit.timeout.ms",
            "session.timeout.ms",
            "heartbeat.interval.ms",
            "max.poll.interval.ms",
        ] {
            assert_rejects(with(&[(key, "0")]), key, &["at least 1ms"]);
        }
        assert_rejects(
            with(&[
                ("commit.mode", "periodic"),
                ("auto.commit.interval.ms", "0"),
            ]),
            "auto.commit.interval.ms",
            &["at least"],
        );
        assert_rejects(
            minimal()
                .commit_mode(CommitMode::Periodic(Duration::ZERO))
                .build(),
            "auto.commit.interval.ms",
            &["at least"],
        );
        assert_rejects(
            minimal().retry_backoff(Duration::from_micros(500)).build(),
            "retry.backoff.ms",
            &["500µs"],
        );
        // Zero is allowed where it means "do not wait".
        let config = with(&[("fetch.max.wait.ms", "0"), ("close.timeout.ms", "0")]).unwrap();
        assert_eq!(config.fetch_max_wait(), Duration::ZERO);

        // Too long.
        assert_rejects(
            minimal().metadata_max_age(Duration::MAX).build(),
            "metadata.max.age.ms",
            &["at most 2147483647 ms"],
        );
        assert_rejects(
            with(&[("close.timeout.ms", "2147483648")]),
            "close.timeout.ms",
            &["at most"],
        );
        with(&[("close.timeout.ms", "2147483647")]).unwrap();
    }

    #[test]
    fn commit_mode_needs_group() {
        let no_group = || ConsumerConfig::builder().bootstrap_servers(["localhost:9092"]);
        assert_rejects(
            no_group().build(),
            "group.id",
            &[
                "commit mode on_checkpoints needs group.id",
                "commit.mode=disabled",
            ],
        );
        assert_rejects(
            no_group()
                .commit_mode(CommitMode::Periodic(Duration::from_secs(1)))
                .build(),
            "group.id",
            &["commit mode periodic needs group.id"],
        );
        assert_rejects(
            ConsumerConfigBuilder::from_properties([
                ("bootstrap.servers", "localhost:9092"),
                ("enable.auto.commit", "true"),
            ])
            .unwrap()
            .build(),
            "group.id",
            &["periodic"],
        );
        no_group()
            .commit_mode(CommitMode::Disabled)
            .build()
            .unwrap();
        assert_rejects(minimal().group_id("").build(), "group.id", &["empty"]);
    }

    #[test]
    fn enable_auto_commit_mapping() {
        let mode = |properties: &[(&str, &str)]| with(properties).map(|c| c.commit_mode());
        assert_eq!(
            mode(&[("enable.auto.commit", "true")]).unwrap(),
            CommitMode::Periodic(Duration::from_secs(5))
        );
        // The interval applies whichever comes first.
        let interval = CommitMode::Periodic(Duration::from_millis(250));
        assert_eq!(
            mode(&[
                ("enable.auto.commit", "TRUE"),
                ("auto.commit.interval.ms", "250")
            ])
            .unwrap(),
            interval
        );
        assert_eq!(
            mode(&[
                ("auto.commit.interval.ms", "250"),
                ("enable.auto.commit", "true")
            ])
            .unwrap(),
            interval
        );
        assert_eq!(
            mode(&[("enable.auto.commit", "true"), ("commit.mode", "periodic")]).unwrap(),
            CommitMode::Periodic(Duration::from_secs(5))
        );
        // false keeps the configured mode.
        assert_eq!(
            mode(&[("enable.auto.commit", "false")]).unwrap(),
            CommitMode::OnCheckpoints
        );
        assert_eq!(
            mode(&[("enable.auto.commit", "false"), ("commit.mode", "disabled")]).unwrap(),
            CommitMode::Disabled
        );
        // The interval alone does not turn periodic commits on.
        assert_eq!(
            mode(&[("auto.commit.interval.ms", "250")]).unwrap(),
            CommitMode::OnCheckpoints
        );
        // Contradictions fail, in either order.
        for properties in [
            [
                ("enable.auto.commit", "true"),
                ("commit.mode", "on_checkpoints"),
            ],
            [("commit.mode", "disabled"), ("enable.auto.commit", "true")],
            [("enable.auto.commit", "false"), ("commit.mode", "periodic")],
        ] {
            assert_rejects(
                mode(&properties),
                "enable.auto.commit",
                &["conflicts with commit.mode"],
            );
        }
        // Mixing typed and property routes.
        let config = minimal()
            .set("enable.auto.commit", "true")
            .unwrap()
            .commit_mode(CommitMode::Periodic(Duration::from_secs(2)))
            .build()
            .unwrap();
        assert_eq!(
            config.commit_mode(),
            CommitMode::Periodic(Duration::from_secs(2))
        );
    }

    #[test]
    fn group_membership_settings() {
        assert_rejects(
            ConsumerConfig::builder()
                .bootstrap_servers(["localhost:9092"])
                .commit_mode(CommitMode::Disabled)
                .group_instance_id("host-1")
                .build(),
            "group.instance.id",
            &["needs group.id"],
        );
        assert_rejects(
            minimal().group_instance_id("").build(),
            "group.instance.id",
            &["empty"],
        );
        assert_rejects(
            minimal().partition_assignment_strategy([]).build(),
            "partition.assignment.strategy",
            &["no strategy"],
        );
        assert_rejects(
            with(&[("partition.assignment.strategy", "range,roundrobin,range")]),
            "partition.assignment.strategy",
            &["range is listed twice"],
        );
        // The consumer protocol leaves these to the broker.
        let consumer = || minimal().group_protocol(GroupProtocol::Consumer);
        consumer()
            .max_poll_interval(Duration::from_secs(60))
            .build()
            .unwrap();
        assert_rejects(
            consumer().session_timeout(Duration::from_secs(30)).build(),
            "session.timeout.ms",
            &["group.protocol=consumer"],
        );
        assert_rejects(
            consumer()
                .heartbeat_interval(Duration::from_secs(1))
                .build(),
            "heartbeat.interval.ms",
            &["group.protocol=consumer"],
        );
        assert_rejects(
            with(&[
                ("group.protocol", "consumer"),
                ("partition.assignment.strategy", "range"),
            ]),
            "partition.assignment.strategy",
            &["group.protocol=consumer"],
        );
    }

    #[test]
    fn protocol_string_lengths() {
        let long = "x".repeat(MAX_PROTOCOL_STRING + 1);
        assert_rejects(
            minimal().client_id(long.clone()).build(),
            "client.id",
            &["32767"],
        );
        assert_rejects(minimal().group_id(long).build(), "group.id", &["32767"]);
        minimal().client_id("").build().unwrap();
    }

    #[test]
    fn values_are_trimmed_and_last_setting_wins() {
        let config = with(&[
            ("fetch.max.bytes", " 2000000 "),
            ("fetch.max.bytes", "3000000"),
        ])
        .unwrap();
        assert_eq!(config.fetch_max_bytes(), 3_000_000);
        let config = with(&[("group.id", "  billing\t")]).unwrap();
        assert_eq!(config.group_id(), Some("billing"));
    }

    #[test]
    fn edit_distances() {
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("group.id", "group.id"), 0);
        assert_eq!(edit_distance("fetch.max.byte", "fetch.max.bytes"), 1);
    }
}
