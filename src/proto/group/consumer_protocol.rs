//! The Java client's ConsumerProtocol bytes: the member metadata in JoinGroup
//! (`ConsumerProtocolSubscription`) and the member assignment in SyncGroup
//! (`ConsumerProtocolAssignment`).
//!
//! Both are an `i16` version followed by the struct at that version, in the non-flexible
//! encoding: `i32` array counts, `i16` string lengths (-1 for null), `i32` byte lengths (-1 for
//! null). Versions 0 to 3 exist; a newer version is read as version 3, because new versions only
//! append fields (and only then are bytes after the known fields ignored). We write version 3,
//! as the Java client does.
//!
//! Hand-written rather than kafka-protocol's decoders, which size their allocations by the
//! element counts on the wire: here every count is checked against the bytes left before
//! anything is allocated, and malformed bytes give a [`ConsumerProtocolError`] with the offset.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};

use crate::assignor::{MemberAssignment, Subscription};
use crate::error::ProtocolViolation;
use crate::types::TopicPartition;

/// The newest version we know, and the one we write.
pub(crate) const VERSION: i16 = 3;

/// Which of the two messages an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `ConsumerProtocolSubscription`, the JoinGroup member metadata.
    Subscription,
    /// `ConsumerProtocolAssignment`, the SyncGroup member assignment.
    Assignment,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Subscription => "ConsumerProtocolSubscription",
            Self::Assignment => "ConsumerProtocolAssignment",
        })
    }
}

/// Bytes that are not a valid message, or a value that cannot be encoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind} at byte {offset}: {reason}")]
pub(crate) struct ConsumerProtocolError {
    /// The message.
    pub(crate) kind: Kind,
    /// Where the offending field starts (for encoding: the output position).
    pub(crate) offset: usize,
    /// What was wrong.
    pub(crate) reason: Reason,
}

/// What was wrong, for [`ConsumerProtocolError`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Reason {
    /// A count or length claims more than the bytes left.
    #[error("{field}: {count} elements cannot fit in the {remaining} bytes left")]
    CountTooLarge {
        /// The field.
        field: &'static str,
        /// The count on the wire.
        count: i32,
        /// The bytes left after the count.
        remaining: usize,
    },
    /// A string was not UTF-8.
    #[error("{field}: invalid UTF-8")]
    InvalidUtf8 {
        /// The field.
        field: &'static str,
    },
    /// A negative length or count where null is not allowed (or below -1 where it is).
    #[error("{field}: invalid length {len}")]
    NegativeLength {
        /// The field.
        field: &'static str,
        /// The length on the wire.
        len: i32,
    },
    /// A value too large for its length prefix (encoding only).
    #[error("{field}: {len} bytes or elements do not fit the length prefix")]
    TooLong {
        /// The field.
        field: &'static str,
        /// The length of the value.
        len: usize,
    },
    /// Bytes left after the last field of a version we know.
    #[error("{0} bytes after the end of the message")]
    TrailingBytes(usize),
    /// The input ended inside a field.
    #[error("{field}: needs {needed} bytes, {remaining} left")]
    Truncated {
        /// The field.
        field: &'static str,
        /// The bytes the field needs.
        needed: usize,
        /// The bytes left.
        remaining: usize,
    },
    /// A negative version.
    #[error("unsupported version {0}")]
    UnsupportedVersion(i16),
}

impl From<ConsumerProtocolError> for ProtocolViolation {
    fn from(e: ConsumerProtocolError) -> Self {
        Self::Unexpected(e.to_string())
    }
}

/// Encodes a subscription at [`VERSION`]: topics sorted, owned partitions sorted and grouped by
/// topic, as the Java client writes them.
///
/// # Errors
///
/// A string longer than 32767 bytes, or more than `i32::MAX` elements or bytes.
pub(crate) fn encode_subscription(s: &Subscription) -> Result<Bytes, ConsumerProtocolError> {
    encode_subscription_at(s, VERSION)
}

/// Encodes a subscription at `version` (0 to 3); fields newer than `version` are left out.
pub(crate) fn encode_subscription_at(
    s: &Subscription,
    version: i16,
) -> Result<Bytes, ConsumerProtocolError> {
    let mut w = Writer::new(Kind::Subscription);
    w.buf.put_i16(version);
    let mut topics: Vec<&str> = s.topics.iter().map(String::as_str).collect();
    topics.sort_unstable();
    w.count("topics", topics.len())?;
    for t in topics {
        w.string("topics", t)?;
    }
    w.nullable_bytes("user_data", s.user_data.as_deref())?;
    if version >= 1 {
        let mut owned: Vec<&TopicPartition> = s.owned_partitions.iter().collect();
        owned.sort_unstable();
        let groups = group_by_topic(owned.into_iter());
        w.topic_partitions("owned_partitions", &groups)?;
    }
    if version >= 2 {
        w.buf.put_i32(s.generation_id);
    }
    if version >= 3 {
        w.nullable_string("rack_id", s.rack_id.as_deref())?;
    }
    Ok(w.buf.freeze())
}

/// Decodes a subscription (any version; newer than 3 is read as 3).
///
/// # Errors
///
/// Truncated input, a negative version, a bad length or count, invalid UTF-8, or bytes after
/// the last field of a version we know.
pub(crate) fn decode_subscription(buf: &Bytes) -> Result<Subscription, ConsumerProtocolError> {
    let mut r = Reader::new(buf, Kind::Subscription);
    let version = r.version()?;
    let n = r.count("topics", 2)?;
    let mut topics = Vec::with_capacity(n);
    for _ in 0..n {
        topics.push(r.string("topics")?);
    }
    let user_data = r.nullable_bytes("user_data")?;
    let owned_partitions = if version >= 1 {
        r.topic_partitions("owned_partitions")?
    } else {
        Vec::new()
    };
    let generation_id = if version >= 2 {
        r.i32("generation_id")?
    } else {
        -1
    };
    let rack_id = if version >= 3 {
        r.nullable_string("rack_id")?
            .filter(|rack| !rack.is_empty())
    } else {
        None
    };
    r.finish(version)?;
    Ok(Subscription {
        topics,
        user_data,
        owned_partitions,
        generation_id,
        rack_id,
    })
}

/// Encodes an assignment at [`VERSION`]. Partitions are grouped by topic, topics in the order of
/// their first partition, partitions in the order given (as the Java client does).
///
/// # Errors
///
/// A topic name longer than 32767 bytes, or more than `i32::MAX` elements or bytes.
pub(crate) fn encode_assignment(a: &MemberAssignment) -> Result<Bytes, ConsumerProtocolError> {
    encode_assignment_at(a, VERSION)
}

/// Encodes an assignment at `version` (0 to 3, all the same body).
pub(crate) fn encode_assignment_at(
    a: &MemberAssignment,
    version: i16,
) -> Result<Bytes, ConsumerProtocolError> {
    let mut w = Writer::new(Kind::Assignment);
    w.buf.put_i16(version);
    let groups = group_by_topic(a.partitions.iter());
    w.topic_partitions("assigned_partitions", &groups)?;
    w.nullable_bytes("user_data", a.user_data.as_deref())?;
    Ok(w.buf.freeze())
}

/// Decodes an assignment (any version; newer than 3 is read as 3).
///
/// # Errors
///
/// As [`decode_subscription`].
pub(crate) fn decode_assignment(buf: &Bytes) -> Result<MemberAssignment, ConsumerProtocolError> {
    let mut r = Reader::new(buf, Kind::Assignment);
    let version = r.version()?;
    let partitions = r.topic_partitions("assigned_partitions")?;
    let user_data = r.nullable_bytes("user_data")?;
    r.finish(version)?;
    Ok(MemberAssignment {
        partitions,
        user_data,
    })
}

/// Groups partitions by topic: topics in order of first appearance, partitions in input order.
fn group_by_topic<'a>(
    partitions: impl Iterator<Item = &'a TopicPartition>,
) -> Vec<(&'a str, Vec<i32>)> {
    let mut groups: Vec<(&str, Vec<i32>)> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for tp in partitions {
        let i = *index.entry(&tp.topic).or_insert_with(|| {
            groups.push((&tp.topic, Vec::new()));
            groups.len() - 1
        });
        if let Some((_, ps)) = groups.get_mut(i) {
            ps.push(tp.partition);
        }
    }
    groups
}

/// Bounds-checked reads from the input.
struct Reader<'a> {
    buf: &'a Bytes,
    pos: usize,
    kind: Kind,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a Bytes, kind: Kind) -> Self {
        Self { buf, pos: 0, kind }
    }

    fn error(&self, offset: usize, reason: Reason) -> ConsumerProtocolError {
        ConsumerProtocolError {
            kind: self.kind,
            offset,
            reason,
        }
    }

    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// The next `n` bytes, as positions in `buf`.
    fn take(
        &mut self,
        field: &'static str,
        n: usize,
    ) -> Result<(usize, usize), ConsumerProtocolError> {
        let remaining = self.remaining();
        if n > remaining {
            return Err(self.error(
                self.pos,
                Reason::Truncated {
                    field,
                    needed: n,
                    remaining,
                },
            ));
        }
        let start = self.pos;
        self.pos += n;
        Ok((start, self.pos))
    }

    fn array<const N: usize>(
        &mut self,
        field: &'static str,
    ) -> Result<[u8; N], ConsumerProtocolError> {
        let (start, end) = self.take(field, N)?;
        let mut out = [0; N];
        if let Some(bytes) = self.buf.get(start..end) {
            out.copy_from_slice(bytes);
        }
        Ok(out)
    }

    fn i16(&mut self, field: &'static str) -> Result<i16, ConsumerProtocolError> {
        self.array(field).map(i16::from_be_bytes)
    }

    fn i32(&mut self, field: &'static str) -> Result<i32, ConsumerProtocolError> {
        self.array(field).map(i32::from_be_bytes)
    }

    /// The version prefix; negative versions are errors.
    fn version(&mut self) -> Result<i16, ConsumerProtocolError> {
        let version = self.i16("version")?;
        if version < 0 {
            return Err(self.error(0, Reason::UnsupportedVersion(version)));
        }
        Ok(version)
    }

    /// An array count, checked against the bytes left given each element's smallest encoding.
    fn count(
        &mut self,
        field: &'static str,
        min_size: usize,
    ) -> Result<usize, ConsumerProtocolError> {
        let at = self.pos;
        let count = self.i32(field)?;
        let Ok(n) = usize::try_from(count) else {
            return Err(self.error(at, Reason::NegativeLength { field, len: count }));
        };
        let remaining = self.remaining();
        if n.saturating_mul(min_size) > remaining {
            return Err(self.error(
                at,
                Reason::CountTooLarge {
                    field,
                    count,
                    remaining,
                },
            ));
        }
        Ok(n)
    }

    /// A string of `len` bytes starting at the current position; `at` is where its prefix was.
    fn utf8(
        &mut self,
        field: &'static str,
        len: usize,
        at: usize,
    ) -> Result<String, ConsumerProtocolError> {
        let (start, end) = self.take(field, len)?;
        let bytes = self.buf.get(start..end).unwrap_or_default();
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(self.error(at, Reason::InvalidUtf8 { field })),
        }
    }

    fn string(&mut self, field: &'static str) -> Result<String, ConsumerProtocolError> {
        let at = self.pos;
        let len = self.i16(field)?;
        let Ok(len) = usize::try_from(len) else {
            return Err(self.error(
                at,
                Reason::NegativeLength {
                    field,
                    len: i32::from(len),
                },
            ));
        };
        self.utf8(field, len, at)
    }

    fn nullable_string(
        &mut self,
        field: &'static str,
    ) -> Result<Option<String>, ConsumerProtocolError> {
        let at = self.pos;
        match self.i16(field)? {
            -1 => Ok(None),
            len if len < 0 => Err(self.error(
                at,
                Reason::NegativeLength {
                    field,
                    len: i32::from(len),
                },
            )),
            len => self.utf8(field, len.unsigned_abs().into(), at).map(Some),
        }
    }

    fn nullable_bytes(
        &mut self,
        field: &'static str,
    ) -> Result<Option<Bytes>, ConsumerProtocolError> {
        let at = self.pos;
        match self.i32(field)? {
            -1 => Ok(None),
            len if len < 0 => Err(self.error(at, Reason::NegativeLength { field, len })),
            len => {
                let (start, end) = self.take(field, len.unsigned_abs() as usize)?;
                Ok(Some(self.buf.slice(start..end)))
            }
        }
    }

    /// `[{topic: string, partitions: [i32]}]`, flattened.
    fn topic_partitions(
        &mut self,
        field: &'static str,
    ) -> Result<Vec<TopicPartition>, ConsumerProtocolError> {
        // A topic entry is at least a string length and an array count.
        let topics = self.count(field, 6)?;
        let mut out = Vec::new();
        for _ in 0..topics {
            let topic: Arc<str> = self.string(field)?.into();
            let n = self.count(field, 4)?;
            out.reserve(n);
            for _ in 0..n {
                let partition = self.i32(field)?;
                out.push(TopicPartition {
                    topic: Arc::clone(&topic),
                    partition,
                });
            }
        }
        Ok(out)
    }

    /// Rejects trailing bytes, unless the version is newer than ours (then they are fields we do
    /// not know).
    fn finish(&self, version: i16) -> Result<(), ConsumerProtocolError> {
        let remaining = self.remaining();
        if version <= VERSION && remaining > 0 {
            return Err(self.error(self.pos, Reason::TrailingBytes(remaining)));
        }
        Ok(())
    }
}

/// Writes into a growing buffer, checking every length against its prefix.
struct Writer {
    buf: BytesMut,
    kind: Kind,
}

impl Writer {
    fn new(kind: Kind) -> Self {
        Self {
            buf: BytesMut::new(),
            kind,
        }
    }

    fn too_long(&self, field: &'static str, len: usize) -> ConsumerProtocolError {
        ConsumerProtocolError {
            kind: self.kind,
            offset: self.buf.len(),
            reason: Reason::TooLong { field, len },
        }
    }

    fn count(&mut self, field: &'static str, n: usize) -> Result<(), ConsumerProtocolError> {
        let n32 = i32::try_from(n).map_err(|_| self.too_long(field, n))?;
        self.buf.put_i32(n32);
        Ok(())
    }

    fn string(&mut self, field: &'static str, s: &str) -> Result<(), ConsumerProtocolError> {
        let len = i16::try_from(s.len()).map_err(|_| self.too_long(field, s.len()))?;
        self.buf.put_i16(len);
        self.buf.put_slice(s.as_bytes());
        Ok(())
    }

    fn nullable_string(
        &mut self,
        field: &'static str,
        s: Option<&str>,
    ) -> Result<(), ConsumerProtocolError> {
        match s {
            None => {
                self.buf.put_i16(-1);
                Ok(())
            }
            Some(s) => self.string(field, s),
        }
    }

    fn nullable_bytes(
        &mut self,
        field: &'static str,
        b: Option<&[u8]>,
    ) -> Result<(), ConsumerProtocolError> {
        match b {
            None => self.buf.put_i32(-1),
            Some(b) => {
                self.count(field, b.len())?;
                self.buf.put_slice(b);
            }
        }
        Ok(())
    }

    fn topic_partitions(
        &mut self,
        field: &'static str,
        groups: &[(&str, Vec<i32>)],
    ) -> Result<(), ConsumerProtocolError> {
        self.count(field, groups.len())?;
        for (topic, partitions) in groups {
            self.string(field, topic)?;
            self.count(field, partitions.len())?;
            for p in partitions {
                self.buf.put_i32(*p);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
