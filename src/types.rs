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

/// One Kafka record, borrowed from its [`Records`]: the key, value and headers are slices of the
/// fetched bytes (or of the decompressed batch), so reading a record copies nothing and counts
/// no references. [`key_bytes`](Self::key_bytes) and [`value_bytes`](Self::value_bytes) give
/// owned zero-copy handles that outlive the batch.
#[derive(Clone, Copy)]
pub struct Record<'a> {
    /// The record's offset in its partition.
    pub offset: i64,
    /// Milliseconds since the Unix epoch.
    pub timestamp: i64,
    /// How the timestamp was set.
    pub timestamp_type: TimestampType,
    /// The key, `None` for a null key.
    pub key: Option<&'a [u8]>,
    /// The value, `None` for a null value (a tombstone).
    pub value: Option<&'a [u8]>,
    /// The leader epoch of the batch the record came in (-1 if unknown).
    pub leader_epoch: i32,
    /// Where in `buffer` the record's header count starts; read the headers with
    /// [`Record::headers`].
    headers_at: usize,
    /// The buffer `key`, `value` and `headers` point into.
    buffer: &'a Bytes,
}

impl<'a> Record<'a> {
    /// The record's headers in order: name and value (`None` for a null value).
    ///
    /// The encoding was checked when the batch was decoded, so iteration yields exactly
    /// [`header_count`](Self::header_count) entries.
    pub fn headers(&self) -> impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)> + 'a {
        crate::proto::records::HeaderIter::counted(self.headers_tail())
    }

    /// The number of headers.
    pub fn header_count(&self) -> usize {
        crate::proto::records::HeaderIter::counted(self.headers_tail()).len()
    }

    /// The buffer from the record's header count on (and the records after it, which reading
    /// the headers never reaches).
    fn headers_tail(&self) -> &'a [u8] {
        let buffer: &'a [u8] = self.buffer;
        buffer.get(self.headers_at..).unwrap_or_default()
    }

    /// The key as an owned, zero-copy handle on the fetched bytes (it keeps them alive).
    pub fn key_bytes(&self) -> Option<Bytes> {
        self.key.map(|k| self.buffer.slice_ref(k))
    }

    /// The value as an owned, zero-copy handle on the fetched bytes (it keeps them alive).
    pub fn value_bytes(&self) -> Option<Bytes> {
        self.value.map(|v| self.buffer.slice_ref(v))
    }
}

impl PartialEq for Record<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.offset == other.offset
            && self.timestamp == other.timestamp
            && self.timestamp_type == other.timestamp_type
            && self.key == other.key
            && self.value == other.value
            && self.leader_epoch == other.leader_epoch
            && self.headers().eq(other.headers())
    }
}

impl Eq for Record<'_> {}

impl fmt::Debug for Record<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Record")
            .field("offset", &self.offset)
            .field("timestamp", &self.timestamp)
            .field("timestamp_type", &self.timestamp_type)
            .field("key", &self.key.map(Escaped))
            .field("value", &self.value.map(Escaped))
            .field("leader_epoch", &self.leader_epoch)
            .field("header_count", &self.header_count())
            .finish()
    }
}

/// Bytes shown as a byte string literal.
struct Escaped<'a>(&'a [u8]);

impl fmt::Debug for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "b\"{}\"", self.0.escape_ascii())
    }
}

/// A null key, value or header value in a [`Span`].
const NULL_LEN: u32 = u32::MAX;

/// Where a key or value lies in its segment; a null one keeps the position after its length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) start: u32,
    /// [`NULL_LEN`] for null.
    pub(crate) len: u32,
}

impl Span {
    /// A null key or value whose length ends at `start`.
    pub(crate) const fn null_at(start: u32) -> Self {
        Self {
            start,
            len: NULL_LEN,
        }
    }

    /// The position after the key or value (after the length, if null).
    #[inline]
    pub(crate) fn end(self) -> usize {
        let len = if self.len == NULL_LEN { 0 } else { self.len };
        self.start as usize + len as usize
    }

    #[inline]
    pub(crate) fn get(self, buf: &[u8]) -> Option<&[u8]> {
        if self.len == NULL_LEN {
            return None;
        }
        let start = self.start as usize;
        buf.get(start..start + self.len as usize)
    }
}

/// One decoded record: 32 bytes, pointing into a segment. Its headers follow its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) timestamp: i64,
    /// The offset less the segment's base offset (`0..=i32::MAX`).
    pub(crate) offset_delta: u32,
    pub(crate) segment: u32,
    pub(crate) key: Span,
    pub(crate) value: Span,
}

impl Entry {
    /// A placeholder, overwritten before it is read.
    pub(crate) const EMPTY: Self = Self {
        timestamp: 0,
        offset_delta: 0,
        segment: 0,
        key: Span::null_at(0),
        value: Span::null_at(0),
    };
}

const _: () = assert!(size_of::<Entry>() == 32);

/// The bytes of one record batch's records (decompressed if need be), and what its records
/// share.
#[derive(Clone, Debug)]
pub(crate) struct Segment {
    pub(crate) bytes: Bytes,
    /// The batch's base offset; decoding checked that every entry's offset fits an `i64`.
    pub(crate) base_offset: i64,
    pub(crate) leader_epoch: i32,
    pub(crate) timestamp_type: TimestampType,
}

/// Records in offset order, decoded into compact entries over the fetched (or decompressed)
/// bytes they share. Iterate with `for record in &records` or [`iter`](Self::iter); each
/// [`Record`] borrows from here.
///
/// Cloning copies the entries and shares the bytes.
#[derive(Clone, Default)]
pub struct Records {
    pub(crate) entries: Vec<Entry>,
    pub(crate) segments: Vec<Segment>,
}

impl Records {
    /// No records.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the bytes the records point into into buffers of their own, so that they no
    /// longer hold the memory those were cut from; returns how many bytes that is.
    pub(crate) fn detach(&mut self) -> usize {
        let mut copied = 0;
        for s in &mut self.segments {
            s.bytes = Bytes::copy_from_slice(&s.bytes);
            copied += s.bytes.len();
        }
        copied
    }

    /// How many records there are.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True if there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The record at `index`, `None` past the end.
    #[inline]
    pub fn get(&self, index: usize) -> Option<Record<'_>> {
        self.entries.get(index).map(|e| self.view(e))
    }

    /// The first record.
    pub fn first(&self) -> Option<Record<'_>> {
        self.entries.first().map(|e| self.view(e))
    }

    /// The last record.
    pub fn last(&self) -> Option<Record<'_>> {
        self.entries.last().map(|e| self.view(e))
    }

    /// The records in offset order.
    #[inline]
    pub fn iter(&self) -> RecordIter<'_> {
        RecordIter {
            records: self,
            inner: self.entries.iter(),
        }
    }

    /// Drops every record; what they shared is released.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.segments.clear();
    }

    #[inline]
    fn view<'a>(&'a self, e: &Entry) -> Record<'a> {
        // `decode_batch` pushes an entry's segment with it, and nothing else adds entries.
        let seg = &self.segments[e.segment as usize];
        let buf: &'a [u8] = &seg.bytes;
        Record {
            offset: seg.base_offset + i64::from(e.offset_delta),
            timestamp: e.timestamp,
            timestamp_type: seg.timestamp_type,
            key: e.key.get(buf),
            value: e.value.get(buf),
            leader_epoch: seg.leader_epoch,
            headers_at: e.value.end(),
            buffer: &seg.bytes,
        }
    }
}

impl fmt::Debug for Records {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl PartialEq for Records {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Records {}

impl<'a> IntoIterator for &'a Records {
    type Item = Record<'a>;
    type IntoIter = RecordIter<'a>;

    #[inline]
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// An iterator over [`Records`].
#[derive(Clone, Debug)]
pub struct RecordIter<'a> {
    records: &'a Records,
    inner: std::slice::Iter<'a, Entry>,
}

impl<'a> Iterator for RecordIter<'a> {
    type Item = Record<'a>;

    #[inline]
    fn next(&mut self) -> Option<Record<'a>> {
        self.inner.next().map(|e| self.records.view(e))
    }

    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

impl DoubleEndedIterator for RecordIter<'_> {
    #[inline]
    fn next_back(&mut self) -> Option<Self::Item> {
        self.inner.next_back().map(|e| self.records.view(e))
    }
}

impl ExactSizeIterator for RecordIter<'_> {}

impl std::iter::FusedIterator for RecordIter<'_> {}

/// Records of one partition, in offset order, as handed out by `poll`.
#[derive(Clone, Debug)]
pub struct Batch {
    /// The partition the records belong to.
    pub partition: TopicPartition,
    /// The records, in offset order. May be empty only if the batch only moved the position
    /// (e.g. over transaction markers).
    pub records: Records,
    /// The next offset to read after this batch: what a commit of "everything up to here" stores.
    pub next_offset: i64,
}
