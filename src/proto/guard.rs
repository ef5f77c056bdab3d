//! A structural check of response bodies, run before kafka-protocol decodes them.
//!
//! kafka-protocol 0.18 sizes a decoded array with `Vec::with_capacity(count)`, the count taken
//! from the wire before any element is read. A response of a few bytes that claims billions of
//! elements makes the process try to allocate tens of gigabytes, and a failed allocation aborts
//! the process: no `Result` reports it. The same goes for lengths of strings decoded into owned
//! buffers.
//!
//! This module walks a response body with a small static schema per API (its fields, the
//! versions each exists in, the tagged fields it knows) and rejects, before anything is
//! allocated:
//!
//! - an array whose element count cannot fit in the bytes left, given the smallest encoding of
//!   one element (`count * min_size(element) <= remaining`);
//! - a string, bytes or records field longer than the bytes left, or with a negative length
//!   other than the null marker;
//! - a tagged field whose declared size exceeds the bytes left, or (for a tagged field we know)
//!   differs from the size of its contents;
//! - a varint longer than five bytes or above `u32::MAX`, and a body cut short.
//!
//! The walk reads exactly what kafka-protocol's decoder reads, in the same order, so every count
//! the decoder sees has been checked. It never looks inside a `records` field beyond its length,
//! so the cost on the fetch path is a few hundred bytes of headers per response, independent of
//! the data. Trailing bytes after the body are left alone (as the decoder does).
//!
//! Layouts follow Apache Kafka's message schemas (`clients/src/main/resources/common/message/
//! *Response.json`) for the versions in our windows (`versions.rs`).

use kafka_protocol::messages::ApiKey;

use crate::error::ProtocolViolation;

/// Fields that exist in every version from the first.
const ALL: (i16, i16) = (0, i16::MAX);

/// A field's wire type. Strings, bytes and arrays use the compact (varint) encoding in the
/// message's flexible versions and the classic one (i16/i32 length) before.
#[derive(Clone, Copy, Debug)]
enum Ty {
    I16,
    I32,
    I64,
    Uuid,
    Bool,
    /// A string, nullable or not.
    Str,
    /// Bytes or records, nullable or not; never looked into.
    Bytes,
    /// An array of structs.
    Array(&'static Struct),
    /// An array of int32.
    I32Array,
    /// A nullable struct: an i8 marker (1 = present) and the struct.
    OptStruct(&'static Struct),
    /// A struct inline (only as a tagged field).
    Struct(&'static Struct),
}

#[derive(Debug)]
struct Field {
    name: &'static str,
    ty: Ty,
    /// The versions the field exists in, inclusive.
    versions: (i16, i16),
    /// In flexible versions, a tagged field with this tag instead of a positional one.
    tag: Option<u32>,
}

#[derive(Debug)]
struct Struct {
    fields: &'static [Field],
}

/// One response type's layout.
#[derive(Debug)]
struct Schema {
    api: ApiKey,
    /// The versions this schema describes.
    versions: (i16, i16),
    /// The first flexible (compact encodings, tagged fields) version.
    flexible_from: i16,
    body: Struct,
}

const fn f(name: &'static str, ty: Ty, versions: (i16, i16)) -> Field {
    Field {
        name,
        ty,
        versions,
        tag: None,
    }
}

const fn tagged(tag: u32, name: &'static str, ty: Ty, versions: (i16, i16)) -> Field {
    Field {
        name,
        ty,
        versions,
        tag: Some(tag),
    }
}

const fn from(v: i16) -> (i16, i16) {
    (v, i16::MAX)
}

const fn upto(v: i16) -> (i16, i16) {
    (0, v)
}

use Ty::{Bool, Bytes, I16, I32, I32Array, I64, Str, Uuid};

// ---- ApiVersions (flexible from v3; its response header is always v0) ----

const API_VERSION: Struct = Struct {
    fields: &[
        f("api_key", I16, ALL),
        f("min_version", I16, ALL),
        f("max_version", I16, ALL),
    ],
};
const SUPPORTED_FEATURE: Struct = Struct {
    fields: &[
        f("name", Str, from(3)),
        f("min_version", I16, from(3)),
        f("max_version", I16, from(3)),
    ],
};
const FINALIZED_FEATURE: Struct = Struct {
    fields: &[
        f("name", Str, from(3)),
        f("max_version_level", I16, from(3)),
        f("min_version_level", I16, from(3)),
    ],
};
const API_VERSIONS: Schema = Schema {
    api: ApiKey::ApiVersions,
    versions: (0, 4),
    flexible_from: 3,
    body: Struct {
        fields: &[
            f("error_code", I16, ALL),
            f("api_keys", Ty::Array(&API_VERSION), ALL),
            f("throttle_time_ms", I32, from(1)),
            tagged(
                0,
                "supported_features",
                Ty::Array(&SUPPORTED_FEATURE),
                from(3),
            ),
            tagged(1, "finalized_features_epoch", I64, from(3)),
            tagged(
                2,
                "finalized_features",
                Ty::Array(&FINALIZED_FEATURE),
                from(3),
            ),
            tagged(3, "zk_migration_ready", Bool, from(3)),
        ],
    },
};

// ---- Metadata (flexible from v9) ----

const METADATA_BROKER: Struct = Struct {
    fields: &[
        f("node_id", I32, ALL),
        f("host", Str, ALL),
        f("port", I32, ALL),
        f("rack", Str, from(1)),
    ],
};
const METADATA_PARTITION: Struct = Struct {
    fields: &[
        f("error_code", I16, ALL),
        f("partition_index", I32, ALL),
        f("leader_id", I32, ALL),
        f("leader_epoch", I32, from(7)),
        f("replica_nodes", I32Array, ALL),
        f("isr_nodes", I32Array, ALL),
        f("offline_replicas", I32Array, from(5)),
    ],
};
const METADATA_TOPIC: Struct = Struct {
    fields: &[
        f("error_code", I16, ALL),
        f("name", Str, ALL),
        f("topic_id", Uuid, from(10)),
        f("is_internal", Bool, from(1)),
        f("partitions", Ty::Array(&METADATA_PARTITION), ALL),
        f("topic_authorized_operations", I32, from(8)),
    ],
};
const METADATA: Schema = Schema {
    api: ApiKey::Metadata,
    versions: (0, 13),
    flexible_from: 9,
    body: Struct {
        fields: &[
            f("throttle_time_ms", I32, from(3)),
            f("brokers", Ty::Array(&METADATA_BROKER), ALL),
            f("cluster_id", Str, from(2)),
            f("controller_id", I32, from(1)),
            f("topics", Ty::Array(&METADATA_TOPIC), ALL),
            f("cluster_authorized_operations", I32, (8, 10)),
            f("error_code", I16, from(13)),
        ],
    },
};

// ---- Fetch (flexible from v12) ----

const ABORTED_TRANSACTION: Struct = Struct {
    fields: &[f("producer_id", I64, ALL), f("first_offset", I64, ALL)],
};
const EPOCH_END_OFFSET: Struct = Struct {
    fields: &[f("epoch", I32, from(12)), f("end_offset", I64, from(12))],
};
const LEADER_ID_AND_EPOCH: Struct = Struct {
    fields: &[
        f("leader_id", I32, from(12)),
        f("leader_epoch", I32, from(12)),
    ],
};
const SNAPSHOT_ID: Struct = Struct {
    fields: &[f("end_offset", I64, ALL), f("epoch", I32, ALL)],
};
const FETCH_PARTITION: Struct = Struct {
    fields: &[
        f("partition_index", I32, ALL),
        f("error_code", I16, ALL),
        f("high_watermark", I64, ALL),
        f("last_stable_offset", I64, ALL),
        f("log_start_offset", I64, from(5)),
        tagged(
            0,
            "diverging_epoch",
            Ty::Struct(&EPOCH_END_OFFSET),
            from(12),
        ),
        tagged(
            1,
            "current_leader",
            Ty::Struct(&LEADER_ID_AND_EPOCH),
            from(12),
        ),
        tagged(2, "snapshot_id", Ty::Struct(&SNAPSHOT_ID), from(12)),
        f("aborted_transactions", Ty::Array(&ABORTED_TRANSACTION), ALL),
        f("preferred_read_replica", I32, from(11)),
        f("records", Bytes, ALL),
    ],
};
const FETCH_TOPIC: Struct = Struct {
    fields: &[
        f("topic", Str, upto(12)),
        f("topic_id", Uuid, from(13)),
        f("partitions", Ty::Array(&FETCH_PARTITION), ALL),
    ],
};
const NODE_ENDPOINT: Struct = Struct {
    fields: &[
        f("node_id", I32, from(16)),
        f("host", Str, from(16)),
        f("port", I32, from(16)),
        f("rack", Str, from(16)),
    ],
};
const FETCH: Schema = Schema {
    api: ApiKey::Fetch,
    versions: (4, 18),
    flexible_from: 12,
    body: Struct {
        fields: &[
            f("throttle_time_ms", I32, ALL),
            f("error_code", I16, from(7)),
            f("session_id", I32, from(7)),
            f("responses", Ty::Array(&FETCH_TOPIC), ALL),
            tagged(0, "node_endpoints", Ty::Array(&NODE_ENDPOINT), from(16)),
        ],
    },
};

// ---- ListOffsets (flexible from v6) ----

const LIST_OFFSETS_PARTITION: Struct = Struct {
    fields: &[
        f("partition_index", I32, ALL),
        f("error_code", I16, ALL),
        f("timestamp", I64, ALL),
        f("offset", I64, ALL),
        f("leader_epoch", I32, from(4)),
    ],
};
const LIST_OFFSETS_TOPIC: Struct = Struct {
    fields: &[
        f("name", Str, ALL),
        f("partitions", Ty::Array(&LIST_OFFSETS_PARTITION), ALL),
    ],
};
const LIST_OFFSETS: Schema = Schema {
    api: ApiKey::ListOffsets,
    versions: (1, 10),
    flexible_from: 6,
    body: Struct {
        fields: &[
            f("throttle_time_ms", I32, from(2)),
            f("topics", Ty::Array(&LIST_OFFSETS_TOPIC), ALL),
        ],
    },
};

// ---- FindCoordinator (flexible from v3; v4+ batched) ----

const COORDINATOR: Struct = Struct {
    fields: &[
        f("key", Str, from(4)),
        f("node_id", I32, from(4)),
        f("host", Str, from(4)),
        f("port", I32, from(4)),
        f("error_code", I16, from(4)),
        f("error_message", Str, from(4)),
    ],
};
const FIND_COORDINATOR: Schema = Schema {
    api: ApiKey::FindCoordinator,
    versions: (0, 6),
    flexible_from: 3,
    body: Struct {
        fields: &[
            f("throttle_time_ms", I32, from(1)),
            f("error_code", I16, upto(3)),
            f("error_message", Str, (1, 3)),
            f("node_id", I32, upto(3)),
            f("host", Str, upto(3)),
            f("port", I32, upto(3)),
            f("coordinators", Ty::Array(&COORDINATOR), from(4)),
        ],
    },
};

// ---- OffsetCommit (flexible from v8) ----

const OFFSET_COMMIT_PARTITION: Struct = Struct {
    fields: &[f("partition_index", I32, ALL), f("error_code", I16, ALL)],
};
const OFFSET_COMMIT_TOPIC: Struct = Struct {
    fields: &[
        f("name", Str, upto(9)),
        f("topic_id", Uuid, from(10)),
        f("partitions", Ty::Array(&OFFSET_COMMIT_PARTITION), ALL),
    ],
};
const OFFSET_COMMIT: Schema = Schema {
    api: ApiKey::OffsetCommit,
    versions: (2, 10),
    flexible_from: 8,
    body: Struct {
        fields: &[
            f("throttle_time_ms", I32, from(3)),
            f("topics", Ty::Array(&OFFSET_COMMIT_TOPIC), ALL),
        ],
    },
};

// ---- OffsetFetch (flexible from v6; v8+ is the `groups` shape) ----

const OFFSET_FETCH_PARTITION_V7: Struct = Struct {
    fields: &[
        f("partition_index", I32, ALL),
        f("committed_offset", I64, ALL),
        f("committed_leader_epoch", I32, (5, 7)),
        f("metadata", Str, ALL),
        f("error_code", I16, ALL),
    ],
};
const OFFSET_FETCH_TOPIC_V7: Struct = Struct {
    fields: &[
        f("name", Str, ALL),
        f("partitions", Ty::Array(&OFFSET_FETCH_PARTITION_V7), ALL),
    ],
};
const OFFSET_FETCH_PARTITION_V8: Struct = Struct {
    fields: &[
        f("partition_index", I32, ALL),
        f("committed_offset", I64, ALL),
        f("committed_leader_epoch", I32, ALL),
        f("metadata", Str, ALL),
        f("error_code", I16, ALL),
    ],
};
const OFFSET_FETCH_TOPIC_V8: Struct = Struct {
    fields: &[
        f("name", Str, (8, 9)),
        f("topic_id", Uuid, from(10)),
        f("partitions", Ty::Array(&OFFSET_FETCH_PARTITION_V8), ALL),
    ],
};
const OFFSET_FETCH_GROUP: Struct = Struct {
    fields: &[
        f("group_id", Str, ALL),
        f("topics", Ty::Array(&OFFSET_FETCH_TOPIC_V8), ALL),
        f("error_code", I16, ALL),
    ],
};
const OFFSET_FETCH: Schema = Schema {
    api: ApiKey::OffsetFetch,
    versions: (1, 10),
    flexible_from: 6,
    body: Struct {
        fields: &[
            f("throttle_time_ms", I32, from(3)),
            f("topics", Ty::Array(&OFFSET_FETCH_TOPIC_V7), upto(7)),
            f("error_code", I16, (2, 7)),
            f("groups", Ty::Array(&OFFSET_FETCH_GROUP), from(8)),
        ],
    },
};

// ---- JoinGroup (flexible from v6) ----

const JOIN_GROUP_MEMBER: Struct = Struct {
    fields: &[
        f("member_id", Str, ALL),
        f("group_instance_id", Str, from(5)),
        f("metadata", Bytes, ALL),
    ],
};
const JOIN_GROUP: Schema = Schema {
    api: ApiKey::JoinGroup,
    versions: (0, 9),
    flexible_from: 6,
    body: Struct {
        fields: &[
            f("throttle_time_ms", I32, from(2)),
            f("error_code", I16, ALL),
            f("generation_id", I32, ALL),
            f("protocol_type", Str, from(7)),
            f("protocol_name", Str, ALL),
            f("leader", Str, ALL),
            f("skip_assignment", Bool, from(9)),
            f("member_id", Str, ALL),
            f("members", Ty::Array(&JOIN_GROUP_MEMBER), ALL),
        ],
    },
};

// ---- SyncGroup (flexible from v4) ----

const SYNC_GROUP: Schema = Schema {
    api: ApiKey::SyncGroup,
    versions: (0, 5),
    flexible_from: 4,
    body: Struct {
        fields: &[
            f("throttle_time_ms", I32, from(1)),
            f("error_code", I16, ALL),
            f("protocol_type", Str, from(5)),
            f("protocol_name", Str, from(5)),
            f("assignment", Bytes, ALL),
        ],
    },
};

// ---- Heartbeat (flexible from v4) ----

const HEARTBEAT: Schema = Schema {
    api: ApiKey::Heartbeat,
    versions: (0, 4),
    flexible_from: 4,
    body: Struct {
        fields: &[
            f("throttle_time_ms", I32, from(1)),
            f("error_code", I16, ALL),
        ],
    },
};

// ---- LeaveGroup (flexible from v4; v3+ lists members) ----

const LEAVE_GROUP_MEMBER: Struct = Struct {
    fields: &[
        f("member_id", Str, from(3)),
        f("group_instance_id", Str, from(3)),
        f("error_code", I16, from(3)),
    ],
};
const LEAVE_GROUP: Schema = Schema {
    api: ApiKey::LeaveGroup,
    versions: (0, 5),
    flexible_from: 4,
    body: Struct {
        fields: &[
            f("throttle_time_ms", I32, from(1)),
            f("error_code", I16, ALL),
            f("members", Ty::Array(&LEAVE_GROUP_MEMBER), from(3)),
        ],
    },
};

// ---- ConsumerGroupHeartbeat (flexible in every version) ----

const CGH_TOPIC_PARTITIONS: Struct = Struct {
    fields: &[f("topic_id", Uuid, ALL), f("partitions", I32Array, ALL)],
};
const CGH_ASSIGNMENT: Struct = Struct {
    fields: &[f("topic_partitions", Ty::Array(&CGH_TOPIC_PARTITIONS), ALL)],
};
const CONSUMER_GROUP_HEARTBEAT: Schema = Schema {
    api: ApiKey::ConsumerGroupHeartbeat,
    versions: (0, 1),
    flexible_from: 0,
    body: Struct {
        fields: &[
            f("throttle_time_ms", I32, ALL),
            f("error_code", I16, ALL),
            f("error_message", Str, ALL),
            f("member_id", Str, ALL),
            f("member_epoch", I32, ALL),
            f("heartbeat_interval_ms", I32, ALL),
            f("assignment", Ty::OptStruct(&CGH_ASSIGNMENT), ALL),
        ],
    },
};

/// Every schema, one per response type we decode.
const SCHEMAS: [&Schema; 12] = [
    &API_VERSIONS,
    &METADATA,
    &FETCH,
    &LIST_OFFSETS,
    &FIND_COORDINATOR,
    &OFFSET_COMMIT,
    &OFFSET_FETCH,
    &JOIN_GROUP,
    &SYNC_GROUP,
    &HEARTBEAT,
    &LEAVE_GROUP,
    &CONSUMER_GROUP_HEARTBEAT,
];

fn schema(api: ApiKey) -> Option<&'static Schema> {
    SCHEMAS.iter().copied().find(|s| s.api == api)
}

/// Checks the structure of a response `body` for `api` at `version` before it is decoded.
///
/// `offset` is where `body` starts in its frame (after the length prefix); error offsets are
/// frame offsets, so they can be found in a capture of the frame.
pub(crate) fn check_response(
    api: ApiKey,
    version: i16,
    body: &[u8],
    offset: usize,
) -> Result<(), ProtocolViolation> {
    walk_response(api, version, body, offset).map(|_| ())
}

/// [`check_response`], returning how many bytes the body's fields take.
fn walk_response(
    api: ApiKey,
    version: i16,
    body: &[u8],
    offset: usize,
) -> Result<usize, ProtocolViolation> {
    let malformed = |field: String, at: usize, reason: String| ProtocolViolation::Malformed {
        api,
        version,
        field,
        offset: at,
        reason,
    };
    let Some(schema) = schema(api) else {
        return Err(malformed(
            String::new(),
            offset,
            "no structural schema for this response type".into(),
        ));
    };
    if version < schema.versions.0 || version > schema.versions.1 {
        return Err(malformed(
            String::new(),
            offset,
            format!(
                "version outside the checked range v{}..=v{}",
                schema.versions.0, schema.versions.1
            ),
        ));
    }
    let mut w = Walker::new(body, version, schema, None);
    w.walk_struct(&schema.body).map(|()| w.pos).map_err(|fail| {
        let mut field = String::new();
        for seg in fail.path.iter().rev() {
            if !field.is_empty() && !matches!(seg, Seg::Index(_)) {
                field.push('.');
            }
            match seg {
                Seg::Name(n) => field.push_str(n),
                Seg::Tag(t) => field.push_str(&format!("tag {t}")),
                Seg::Index(i) => field.push_str(&format!("[{i}]")),
            }
        }
        malformed(field, offset + fail.offset, fail.reason.to_string())
    })
}

/// The bytes and records fields (`(start, len)`, `start` after the length) that begin within
/// `prefix`, the first bytes of a response frame (its header, then its body) for `api` at
/// `version`, in order, appended to `out`; positions are in the frame. The last may run past
/// the end of `prefix`. The body's walk is the one of [`check_response`] without its checks of
/// counts against the bytes left, since the rest of the body is not there yet; it stops at the
/// first field that does not fit, and at anything malformed. An API or version without a
/// schema yields nothing.
pub(crate) fn bytes_fields(
    api: ApiKey,
    version: i16,
    prefix: &[u8],
    out: &mut Vec<(usize, usize)>,
) {
    let Some(schema) = schema(api) else {
        return;
    };
    if version < schema.versions.0 || version > schema.versions.1 {
        return;
    }
    let mut w = Walker::new(prefix, version, schema, Some(std::mem::take(out)));
    // The response header: the correlation id, and in flexible versions its tagged fields.
    // A walk of a prefix ends where the bytes end: its error says nothing.
    let _ = w.skip(4).and_then(|()| {
        if w.flexible {
            w.walk_tagged(&NO_FIELDS)?;
        }
        w.walk_struct(&schema.body)
    });
    *out = w.found.unwrap_or_default();
}

/// A struct of no known fields (the response header's tagged-field section).
const NO_FIELDS: Struct = Struct { fields: &[] };

/// Where a failure was, innermost first (filled while the error propagates out).
#[derive(Debug)]
enum Seg {
    Name(&'static str),
    Tag(u32),
    Index(u32),
}

#[derive(Debug)]
enum Reason {
    Truncated {
        need: usize,
        left: usize,
    },
    BadVarint,
    NegativeLength(i64),
    LengthPastEnd {
        len: u64,
        left: usize,
    },
    CountPastEnd {
        count: u64,
        min_size: usize,
        left: usize,
    },
    TaggedSize {
        declared: u64,
        used: usize,
    },
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Truncated { need, left } => {
                write!(f, "cut short: needs {need} bytes, {left} left")
            }
            Self::BadVarint => write!(f, "varint longer than 5 bytes or above u32::MAX"),
            Self::NegativeLength(n) => write!(f, "negative length {n}"),
            Self::LengthPastEnd { len, left } => {
                write!(f, "length {len} exceeds the {left} bytes left")
            }
            Self::CountPastEnd {
                count,
                min_size,
                left,
            } => write!(
                f,
                "{count} elements of at least {min_size} bytes cannot fit in the {left} bytes left"
            ),
            Self::TaggedSize { declared, used } => write!(
                f,
                "tagged field declares {declared} bytes but its contents take {used}"
            ),
        }
    }
}

#[derive(Debug)]
struct Fail {
    offset: usize,
    reason: Reason,
    path: Vec<Seg>,
}

type Walk<T = ()> = Result<T, Box<Fail>>;

trait Within<T> {
    fn within(self, seg: Seg) -> Walk<T>;
}

impl<T> Within<T> for Walk<T> {
    #[inline]
    fn within(self, seg: Seg) -> Walk<T> {
        self.map_err(|mut e| {
            e.path.push(seg);
            e
        })
    }
}

struct Walker<'a> {
    buf: &'a [u8],
    pos: usize,
    version: i16,
    flexible: bool,
    /// `buf` is the start of a body: counts are not checked against what is left.
    prefix: bool,
    /// Where bytes fields start and how long they are, if wanted ([`bytes_fields`]).
    found: Option<Vec<(usize, usize)>>,
}

impl<'a> Walker<'a> {
    /// A walk of `buf` for `schema` at `version`; `found` collects the bytes fields if given
    /// (and then `buf` may be a prefix: counts are not checked against what is left).
    fn new(
        buf: &'a [u8],
        version: i16,
        schema: &Schema,
        found: Option<Vec<(usize, usize)>>,
    ) -> Self {
        Self {
            buf,
            pos: 0,
            version,
            flexible: version >= schema.flexible_from,
            prefix: found.is_some(),
            found,
        }
    }

    fn left(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn fail<T>(&self, at: usize, reason: Reason) -> Walk<T> {
        Err(Box::new(Fail {
            offset: at,
            reason,
            path: Vec::new(),
        }))
    }

    #[inline]
    fn take(&mut self, n: usize) -> Walk<&[u8]> {
        if self.left() < n {
            return self.fail(
                self.pos,
                Reason::Truncated {
                    need: n,
                    left: self.left(),
                },
            );
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    #[inline]
    fn skip(&mut self, n: usize) -> Walk {
        self.take(n).map(|_| ())
    }

    fn i8(&mut self) -> Walk<i8> {
        Ok(i8::from_be_bytes([self.take(1)?[0]]))
    }

    fn i16(&mut self) -> Walk<i16> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    fn i32(&mut self) -> Walk<i32> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// An unsigned varint of at most five bytes that fits in a u32 (kafka-protocol reads at
    /// most five bytes and drops higher bits; anything it would misread is refused here).
    fn uvarint(&mut self) -> Walk<u32> {
        let start = self.pos;
        let mut value: u32 = 0;
        for i in 0..5 {
            let b = self.take(1)?[0];
            if i == 4 && b > 0x0f {
                return self.fail(start, Reason::BadVarint);
            }
            value |= u32::from(b & 0x7f) << (i * 7);
            if b < 0x80 {
                return Ok(value);
            }
        }
        self.fail(start, Reason::BadVarint)
    }

    /// A length prefix: `Some(len)`, or `None` for null. `classic16` selects the i16 prefix of
    /// a classic string over the i32 prefix of classic bytes and arrays.
    fn length(&mut self, classic16: bool) -> Walk<Option<u64>> {
        let at = self.pos;
        if self.flexible {
            return Ok(match self.uvarint()? {
                0 => None,
                n => Some(u64::from(n - 1)),
            });
        }
        let n = if classic16 {
            i64::from(self.i16()?)
        } else {
            i64::from(self.i32()?)
        };
        match n {
            -1 => Ok(None),
            n if n < 0 => self.fail(at, Reason::NegativeLength(n)),
            n => Ok(Some(n as u64)),
        }
    }

    /// Skips a string or bytes field after checking its length.
    fn skip_sized(&mut self, classic16: bool) -> Walk {
        let at = self.pos;
        if let Some(len) = self.length(classic16)? {
            if let (false, Some(found)) = (classic16, self.found.as_mut()) {
                // A bytes field: where it lies, whether or not it is all there yet.
                if let Ok(len) = usize::try_from(len) {
                    found.push((self.pos, len));
                }
            }
            if len > self.left() as u64 {
                return self.fail(
                    at,
                    Reason::LengthPastEnd {
                        len,
                        left: self.left(),
                    },
                );
            }
            self.pos += len as usize;
        }
        Ok(())
    }

    /// Reads an array's count and checks that `count` elements of `min_size` bytes fit.
    fn count(&mut self, min_size: usize) -> Walk<u64> {
        let at = self.pos;
        let Some(count) = self.length(false)? else {
            return Ok(0);
        };
        let min_size = min_size.max(1);
        // A prefix walk meets the end of the bytes in the elements instead; each takes at least
        // a byte, so the walk still ends.
        if !self.prefix && count.saturating_mul(min_size as u64) > self.left() as u64 {
            return self.fail(
                at,
                Reason::CountPastEnd {
                    count,
                    min_size,
                    left: self.left(),
                },
            );
        }
        Ok(count)
    }

    fn present(&self, field: &Field) -> bool {
        self.version >= field.versions.0 && self.version <= field.versions.1
    }

    /// The smallest encoding of a struct at this version.
    fn min_size(&self, s: &Struct) -> usize {
        let fields: usize = s
            .fields
            .iter()
            .filter(|fd| self.present(fd) && !(self.flexible && fd.tag.is_some()))
            .map(|fd| self.min_size_of(fd.ty))
            .sum();
        fields + usize::from(self.flexible)
    }

    fn min_size_of(&self, ty: Ty) -> usize {
        let (len16, len32) = if self.flexible { (1, 1) } else { (2, 4) };
        match ty {
            Ty::Bool | Ty::OptStruct(_) => 1,
            Ty::I16 => 2,
            Ty::I32 => 4,
            Ty::I64 => 8,
            Ty::Uuid => 16,
            Ty::Str => len16,
            Ty::Bytes | Ty::Array(_) | Ty::I32Array => len32,
            Ty::Struct(s) => self.min_size(s),
        }
    }

    fn walk_struct(&mut self, s: &Struct) -> Walk {
        for field in s.fields {
            if !self.present(field) || (self.flexible && field.tag.is_some()) {
                continue;
            }
            self.walk(field.ty).within(Seg::Name(field.name))?;
        }
        if self.flexible {
            self.walk_tagged(s)?;
        }
        Ok(())
    }

    fn walk(&mut self, ty: Ty) -> Walk {
        match ty {
            Ty::Bool => self.skip(1),
            Ty::I16 => self.skip(2),
            Ty::I32 => self.skip(4),
            Ty::I64 => self.skip(8),
            Ty::Uuid => self.skip(16),
            Ty::Str => self.skip_sized(true),
            Ty::Bytes => self.skip_sized(false),
            Ty::I32Array => {
                let n = self.count(4)?;
                // Checked above: n * 4 fits in what is left (in a prefix walk, `skip` refuses
                // what does not).
                self.skip(usize::try_from(n).map_or(usize::MAX, |n| n.saturating_mul(4)))
            }
            Ty::Array(elem) => {
                let n = self.count(self.min_size(elem))?;
                for i in 0..n {
                    self.walk_struct(elem).within(Seg::Index(i as u32))?;
                }
                Ok(())
            }
            Ty::OptStruct(s) => {
                if self.i8()? == 1 {
                    self.walk_struct(s)?;
                }
                Ok(())
            }
            Ty::Struct(s) => self.walk_struct(s),
        }
    }

    /// The tagged-field section that ends a struct in flexible versions. A tag we know is
    /// walked as its type and must take exactly its declared size; any other is skipped by size.
    fn walk_tagged(&mut self, s: &Struct) -> Walk {
        let count = self.uvarint().within(Seg::Name("tagged fields"))?;
        for _ in 0..count {
            let tag = self.uvarint().within(Seg::Name("tagged fields"))?;
            let size_at = self.pos;
            let size = self.uvarint().within(Seg::Tag(tag))?;
            if size as usize > self.left() {
                return self
                    .fail(
                        size_at,
                        Reason::LengthPastEnd {
                            len: u64::from(size),
                            left: self.left(),
                        },
                    )
                    .within(Seg::Tag(tag));
            }
            let known = s
                .fields
                .iter()
                .find(|fd| fd.tag == Some(tag) && self.present(fd));
            match known {
                Some(field) => {
                    let start = self.pos;
                    // Only the declared bytes are visible to the field.
                    let full = self.buf;
                    self.buf = &full[..start + size as usize];
                    let walked = self.walk(field.ty).within(Seg::Name(field.name));
                    self.buf = full;
                    walked?;
                    let used = self.pos - start;
                    if used != size as usize {
                        return self
                            .fail(
                                size_at,
                                Reason::TaggedSize {
                                    declared: u64::from(size),
                                    used,
                                },
                            )
                            .within(Seg::Name(field.name));
                    }
                }
                None => self.pos += size as usize,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
