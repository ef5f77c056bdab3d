//! Record batches (format v2, "magic 2"): split a partition's fetched `records` bytes into
//! batches, verify and decompress them, and decode their records as zero-copy slices; plus the
//! `read_committed` filter for aborted transactions. Sans-IO: bytes in, records out.
//!
//! It does not decide which records to hand out: records before the fetch position are the
//! caller's to skip, and the position moves to [`BatchHeader::next_offset`] after every batch,
//! whatever the batch held.
//!
//! # Zero-copy
//!
//! An uncompressed batch's keys, values and headers are [`Bytes`] slices of the fetched bytes:
//! decoding allocates nothing per record beyond the caller's `Vec<Record>`. A compressed batch
//! is decompressed into one new buffer, and its records are slices of that.
//!
//! # Hostile input
//!
//! Nothing here panics on any input. Lengths and counts are checked against the bytes that are
//! there before anything is allocated or sliced; decompressed output is capped by
//! [`DecodeLimits`].
//!
//! # References
//!
//! * Kafka protocol guide, "Record Batch": <https://kafka.apache.org/documentation/#recordbatch>
//! * KIP-74 (a fetch may end with a partial batch), KIP-98 (transactions, control batches),
//!   KIP-32 (`LogAppendTime`)
//! * Java: `ByteBufferLogInputStream.nextBatch`, `DefaultRecordBatch`, `DefaultRecord.readFrom`,
//!   `ControlRecordType`, `CompletedFetch` (aborted-transaction filtering)

mod codec;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::iter::FusedIterator;
use std::ops::Range;

use bytes::Bytes;

use crate::error::ProtocolViolation;
use crate::types::{Entry, Records, Segment, Span, TimestampType};

/// `baseOffset` (i64) and `batchLength` (i32): the bytes before what `batchLength` counts.
pub(crate) const LOG_OVERHEAD: usize = 12;
/// The v2 batch header, from `baseOffset` to `recordCount`; the records follow.
pub(crate) const BATCH_HEADER_LEN: usize = 61;
/// The smallest `batchLength`: a header without records.
const MIN_BATCH_LENGTH: i32 = (BATCH_HEADER_LEN - LOG_OVERHEAD) as i32;
/// Where the magic byte is, from the start of the batch.
pub(crate) const MAGIC_OFFSET: usize = 16;
/// Where the stored CRC-32C is, from the start of the batch.
pub(crate) const CRC_OFFSET: usize = 17;
/// Where the CRC-32C's coverage starts (the attributes), from the start of the batch.
pub(crate) const CRC_START: usize = 21;
/// The only batch format this module reads.
pub(crate) const MAGIC_V2: i8 = 2;
/// The smallest encoded record: length, attributes, timestamp delta, offset delta, key length,
/// value length and header count, one byte each.
const MIN_RECORD_LEN: usize = 7;
/// Attribute bits 0–2: the compression codec.
const CODEC_MASK: i16 = 0x07;
/// Attribute bit 3: the timestamps are the broker's append time.
const LOG_APPEND_TIME_FLAG: i16 = 1 << 3;
/// Attribute bit 4: the batch belongs to a transaction.
const TRANSACTIONAL_FLAG: i16 = 1 << 4;
/// Attribute bit 5: the batch holds a control record (a transaction marker).
const CONTROL_FLAG: i16 = 1 << 5;
/// How large a control batch's decompressed payload may be; real ones hold one ~20-byte record.
const CONTROL_BATCH_LIMIT: usize = 64 * 1024;

/// A batch's compression codec (attribute bits 0–2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Compression {
    /// Not compressed: records are slices of the fetched bytes.
    None,
    /// gzip (one or more members).
    Gzip,
    /// Snappy, in Java's xerial framing or raw.
    Snappy,
    /// LZ4, in the standard LZ4 frame format.
    Lz4,
    /// Zstandard.
    Zstd,
}

impl Compression {
    /// The codec for a batch's attributes, or `None` for an unknown codec id (5–7).
    pub fn from_attributes(attributes: i16) -> Option<Self> {
        match attributes & CODEC_MASK {
            0 => Some(Self::None),
            1 => Some(Self::Gzip),
            2 => Some(Self::Snappy),
            3 => Some(Self::Lz4),
            4 => Some(Self::Zstd),
            _ => None,
        }
    }
}

/// The fixed 61-byte header of a v2 record batch, as sent (all fields big-endian on the wire).
///
/// A header from [`BatchIter`] or [`RecordBatch::new`] has been checked: its magic is 2,
/// `batch_length` covers at least the header, `last_offset_delta` is not negative, and
/// [`next_offset`](Self::next_offset) does not overflow. The CRC is checked when the batch is
/// decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchHeader {
    /// The offset of the batch's first record (as written; compaction may have removed it).
    pub base_offset: i64,
    /// The batch's size in bytes after this field: the whole batch is `12 + batch_length`.
    pub batch_length: i32,
    /// The leader epoch when the batch was appended, or -1.
    pub partition_leader_epoch: i32,
    /// The format version; always 2 here.
    pub magic: i8,
    /// CRC-32C of everything from `attributes` to the end of the batch.
    pub crc: u32,
    /// Codec (bits 0–2), timestamp type (bit 3), transactional (bit 4), control (bit 5),
    /// delete horizon (bit 6).
    pub attributes: i16,
    /// The last offset in the batch minus `base_offset`; kept when compaction removes records.
    pub last_offset_delta: i32,
    /// The first record's timestamp; record timestamps are deltas from it.
    pub base_timestamp: i64,
    /// The largest timestamp in the batch; every record's timestamp under `LogAppendTime`.
    pub max_timestamp: i64,
    /// The idempotent or transactional producer's id, or -1.
    pub producer_id: i64,
    /// The producer's epoch, or -1.
    pub producer_epoch: i16,
    /// The first record's sequence number, or -1.
    pub base_sequence: i32,
    /// How many records the batch holds, as written.
    pub record_count: i32,
}

impl BatchHeader {
    /// Reads the header at the start of `buf`, without checking it; `None` if `buf` is shorter
    /// than a header.
    fn read(buf: &[u8]) -> Option<Self> {
        let mut r = BigEndian(buf);
        Some(Self {
            base_offset: i64::from_be_bytes(r.take()?),
            batch_length: i32::from_be_bytes(r.take()?),
            partition_leader_epoch: i32::from_be_bytes(r.take()?),
            magic: i8::from_be_bytes(r.take()?),
            crc: u32::from_be_bytes(r.take()?),
            attributes: i16::from_be_bytes(r.take()?),
            last_offset_delta: i32::from_be_bytes(r.take()?),
            base_timestamp: i64::from_be_bytes(r.take()?),
            max_timestamp: i64::from_be_bytes(r.take()?),
            producer_id: i64::from_be_bytes(r.take()?),
            producer_epoch: i16::from_be_bytes(r.take()?),
            base_sequence: i32::from_be_bytes(r.take()?),
            record_count: i32::from_be_bytes(r.take()?),
        })
    }

    /// Checks what the splitter promises about a header: its offsets do not overflow.
    fn check(&self) -> Result<(), ProtocolViolation> {
        if self.last_offset_delta < 0 {
            return Err(self.violation(format!(
                "negative last offset delta {}",
                self.last_offset_delta
            )));
        }
        if self
            .base_offset
            .checked_add(i64::from(self.last_offset_delta))
            .and_then(|last| last.checked_add(1))
            .is_none()
        {
            return Err(self.violation(format!(
                "base offset plus last offset delta {} overflows",
                self.last_offset_delta
            )));
        }
        Ok(())
    }

    /// The offset to fetch after this batch: `base_offset + last_offset_delta + 1`.
    ///
    /// Move the fetch position here after every batch, even one whose records were all skipped
    /// or removed by compaction, or the same batch is fetched again forever.
    pub fn next_offset(&self) -> i64 {
        self.last_offset().saturating_add(1)
    }

    /// The offset of the batch's last record as written: `base_offset + last_offset_delta`.
    pub fn last_offset(&self) -> i64 {
        self.base_offset
            .saturating_add(i64::from(self.last_offset_delta))
    }

    /// The batch's total size in bytes, `12 + batch_length`.
    pub fn size(&self) -> usize {
        usize::try_from(self.batch_length)
            .unwrap_or(0)
            .saturating_add(LOG_OVERHEAD)
    }

    /// The compression codec, or `None` for an unknown codec id.
    pub fn compression(&self) -> Option<Compression> {
        Compression::from_attributes(self.attributes)
    }

    /// Whether record timestamps were set by the producer or by the broker.
    pub fn timestamp_type(&self) -> TimestampType {
        if self.attributes & LOG_APPEND_TIME_FLAG != 0 {
            TimestampType::LogAppendTime
        } else {
            TimestampType::CreateTime
        }
    }

    /// True if the batch belongs to a transaction.
    pub fn is_transactional(&self) -> bool {
        self.attributes & TRANSACTIONAL_FLAG != 0
    }

    /// True if the batch holds a control record (a transaction marker), which is never handed
    /// to the application.
    pub fn is_control(&self) -> bool {
        self.attributes & CONTROL_FLAG != 0
    }

    /// True if an idempotent or transactional producer wrote the batch.
    pub fn has_producer_id(&self) -> bool {
        self.producer_id >= 0
    }

    fn violation(&self, reason: String) -> ProtocolViolation {
        ProtocolViolation::Batch {
            base_offset: self.base_offset,
            reason,
        }
    }
}

/// One complete record batch: its checked header and its bytes, a zero-copy slice of the
/// fetched `records`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordBatch {
    header: BatchHeader,
    /// The whole batch, from `baseOffset` to its last byte.
    bytes: Bytes,
}

impl RecordBatch {
    /// Takes `bytes` as exactly one complete batch.
    ///
    /// # Errors
    ///
    /// [`ProtocolViolation::UnsupportedMagic`] for a format other than v2;
    /// [`ProtocolViolation::Batch`] if `bytes` is not exactly one batch or its offsets overflow.
    pub fn new(bytes: Bytes) -> Result<Self, ProtocolViolation> {
        match next_batch_len(&bytes)? {
            Some(len) if len == bytes.len() => Self::from_complete(bytes),
            found => Err(ProtocolViolation::Batch {
                base_offset: bytes
                    .first_chunk::<8>()
                    .map_or(-1, |b| i64::from_be_bytes(*b)),
                reason: match found {
                    Some(len) => format!("batch is {len} bytes but {} were given", bytes.len()),
                    None => format!("{} bytes are not a complete batch", bytes.len()),
                },
            }),
        }
    }

    /// `bytes` is one batch, as measured by [`next_batch_len`].
    fn from_complete(bytes: Bytes) -> Result<Self, ProtocolViolation> {
        let header = BatchHeader::read(&bytes).ok_or_else(|| ProtocolViolation::Batch {
            base_offset: -1,
            reason: format!("{} bytes are too short for a batch header", bytes.len()),
        })?;
        header.check()?;
        Ok(Self { header, bytes })
    }

    /// The batch's header.
    pub fn header(&self) -> &BatchHeader {
        &self.header
    }

    /// The batch's bytes, header included.
    pub fn as_bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The batch's bytes, header included.
    pub fn into_bytes(self) -> Bytes {
        self.bytes
    }

    /// Checks the CRC-32C over the attributes to the end of the batch.
    ///
    /// # Errors
    ///
    /// [`ProtocolViolation::Crc`] if it does not match the header's.
    pub fn verify_crc(&self) -> Result<(), ProtocolViolation> {
        let computed = batch_crc32c(self.bytes.get(CRC_START..).unwrap_or_default());
        if computed == self.header.crc {
            Ok(())
        } else {
            Err(ProtocolViolation::Crc {
                base_offset: self.header.base_offset,
                stored: self.header.crc,
                computed,
            })
        }
    }

    /// The records payload after the header, compressed or not.
    fn payload(&self) -> Bytes {
        if self.bytes.len() > BATCH_HEADER_LEN {
            self.bytes.slice(BATCH_HEADER_LEN..)
        } else {
            Bytes::new()
        }
    }

    /// The records payload, decompressed (at most `limit` bytes) if the batch is compressed.
    fn records_payload(&self, limit: usize) -> Result<Bytes, ProtocolViolation> {
        let header = &self.header;
        let codec = header.compression().ok_or_else(|| {
            header.violation(format!(
                "unknown compression codec {}",
                header.attributes & CODEC_MASK
            ))
        })?;
        codec::decompress(codec, self.payload(), limit).map_err(|e| match e {
            codec::CodecError::Limit => ProtocolViolation::DecompressionLimit {
                base_offset: header.base_offset,
                limit,
            },
            codec::CodecError::Corrupt(why) => {
                header.violation(format!("cannot decompress {codec:?} payload: {why}"))
            }
        })
    }
}

/// Splits a partition's fetched `records` bytes into complete batches, as zero-copy slices.
///
/// A fetch response may end with a partial batch (the broker cuts the log at the size limit);
/// the iterator stops before it and [`remaining_bytes`](Self::remaining_bytes) tells its size.
/// If the first batch is already incomplete and nothing was yielded, the batch is larger than
/// the fetch size: the caller must fetch more at once (Java reports `RecordTooLargeException`
/// in that case).
///
/// After an error the iterator ends: the rest of the bytes cannot be trusted.
#[derive(Clone, Debug)]
pub struct BatchIter {
    rest: Bytes,
    done: bool,
}

impl BatchIter {
    /// Iterates over the batches in a partition's `records` field.
    pub fn new(records: Bytes) -> Self {
        Self {
            rest: records,
            done: false,
        }
    }

    /// The bytes not yet yielded. Once the iterator has returned `None`, this is the size of the
    /// partial batch at the end that was ignored (0 if the bytes ended with a complete batch);
    /// after an error, the bytes from the malformed batch on.
    pub fn remaining_bytes(&self) -> usize {
        self.rest.len()
    }

    /// The bytes not yet yielded.
    pub(crate) fn rest(&self) -> &[u8] {
        &self.rest
    }

    /// Moves the bytes not yet yielded into a buffer of their own, so that the iterator no
    /// longer holds the memory of the bytes it was made from.
    pub(crate) fn detach(&mut self) {
        self.rest = Bytes::copy_from_slice(&self.rest);
    }

    /// How many records the complete uncompressed batches ahead hold, counted batch by batch
    /// until `limit` is reached, for sizing what they decode into: each batch's record count as
    /// written, but no more than its bytes could hold. Whole batches are counted, as a piece
    /// takes them, so the count passes `limit` by the records of the batch that reaches it. The
    /// count stops at the first compressed, partial or malformed batch (the iterator reports a
    /// malformed one).
    pub(crate) fn records_ahead(&self, limit: usize) -> usize {
        let mut buf: &[u8] = &self.rest;
        let mut total = 0usize;
        while total < limit {
            let (Ok(Some(len)), Some(header)) = (next_batch_len(buf), BatchHeader::read(buf))
            else {
                break;
            };
            if header.compression() != Some(Compression::None) {
                break;
            }
            let count = usize::try_from(header.record_count).unwrap_or(0);
            total += records_that_fit(count, len - BATCH_HEADER_LEN);
            buf = &buf[len..];
        }
        total
    }
}

impl Iterator for BatchIter {
    type Item = Result<RecordBatch, ProtocolViolation>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let batch = match next_batch_len(&self.rest) {
            Ok(Some(len)) => RecordBatch::from_complete(self.rest.split_to(len)),
            Ok(None) => {
                self.done = true;
                return None;
            }
            Err(e) => Err(e),
        };
        if batch.is_err() {
            self.done = true;
        }
        Some(batch)
    }
}

impl FusedIterator for BatchIter {}

/// The size of the complete batch at the start of `buf`, or `None` if `buf` is empty or ends
/// within that batch. Like Java's `ByteBufferLogInputStream.nextBatch`, the length and the magic
/// are checked as soon as they are there, even for a partial batch.
fn next_batch_len(buf: &[u8]) -> Result<Option<usize>, ProtocolViolation> {
    let mut r = BigEndian(buf);
    let (Some(base_offset), Some(batch_length)) = (
        r.take().map(i64::from_be_bytes),
        r.take().map(i32::from_be_bytes),
    ) else {
        return Ok(None);
    };
    // The magic first: a v0/v1 message set may legitimately be shorter than a v2 header.
    if let Some(&magic) = buf.get(MAGIC_OFFSET) {
        let magic = i8::from_be_bytes([magic]);
        if magic != MAGIC_V2 {
            return Err(ProtocolViolation::UnsupportedMagic { base_offset, magic });
        }
    }
    if batch_length < MIN_BATCH_LENGTH {
        return Err(ProtocolViolation::Batch {
            base_offset,
            reason: format!(
                "batch length {batch_length} is shorter than a batch header ({MIN_BATCH_LENGTH})"
            ),
        });
    }
    let len = usize::try_from(batch_length)
        .ok()
        .and_then(|l| l.checked_add(LOG_OVERHEAD))
        .ok_or_else(|| ProtocolViolation::Batch {
            base_offset,
            reason: format!("batch length {batch_length} does not fit in memory"),
        })?;
    Ok((buf.len() >= len).then_some(len))
}

/// What decoding a batch may allocate, and whether it checks the batch's CRC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DecodeLimits {
    /// The most bytes a compressed batch may inflate to. The consumer passes its whole
    /// `buffer.max.bytes`, not what is left of it, so that a valid batch never fails because
    /// other data waits to be polled; a batch over it fails with
    /// [`ProtocolViolation::DecompressionLimit`]. Uncompressed batches allocate nothing and are
    /// not limited.
    pub max_decompressed_bytes: usize,
    /// Check each batch's CRC-32C before decoding it (the consumer's `check.crcs`); `true`
    /// unless set otherwise with [`with_check_crc`](Self::with_check_crc).
    pub check_crc: bool,
}

impl DecodeLimits {
    /// The default for [`max_decompressed_bytes`](Self::max_decompressed_bytes): 64 MiB.
    pub const DEFAULT_MAX_DECOMPRESSED_BYTES: usize = 64 * 1024 * 1024;

    /// Limits with this cap on a batch's decompressed size; CRCs are checked.
    pub const fn new(max_decompressed_bytes: usize) -> Self {
        Self {
            max_decompressed_bytes,
            check_crc: true,
        }
    }

    /// The same limits, with the CRC check on or off. Without it every structural check still
    /// holds, so bytes changed in transit can still yield records whose keys, values or
    /// headers differ from what was written, but never a panic or an unbounded allocation.
    pub const fn with_check_crc(mut self, check_crc: bool) -> Self {
        self.check_crc = check_crc;
        self
    }
}

impl Default for DecodeLimits {
    fn default() -> Self {
        Self::new(Self::DEFAULT_MAX_DECOMPRESSED_BYTES)
    }
}

/// Decodes every record of `batch` and appends them to `out`, in the batch's order.
///
/// Checks the CRC (unless `limits.check_crc` is off), decompresses if needed (at most
/// `limits.max_decompressed_bytes`), and checks every record against the bytes that are there
/// and the header's `record_count`. Keys, values and headers are slices of the fetched bytes
/// (uncompressed) or of one decompressed buffer. Nothing is skipped: control records and
/// records before the fetch position are appended too. A batch with `record_count == 0` yields
/// nothing and is not decompressed (as in Java).
///
/// # Errors
///
/// [`ProtocolViolation::Crc`], [`ProtocolViolation::DecompressionLimit`], or
/// [`ProtocolViolation::Batch`] saying which record was malformed and how. On error, `out` is
/// left as it was.
pub fn decode_batch(
    batch: &RecordBatch,
    limits: &DecodeLimits,
    out: &mut Records,
) -> Result<(), ProtocolViolation> {
    decode_batch_with(batch, limits, out, true, &[])
}

/// [`decode_batch`] of a batch that `following` follows in its buffer (for a fetch response,
/// the partition's bytes after it). They are never read: the decoder only asks the CPU to bring
/// them into cache ahead of their own decoding, as it does for the batch's next records.
pub(crate) fn decode_batch_before(
    batch: &RecordBatch,
    limits: &DecodeLimits,
    out: &mut Records,
    following: &[u8],
) -> Result<(), ProtocolViolation> {
    decode_batch_with(batch, limits, out, true, following)
}

/// [`decode_batch`] with only the general record reader, for checking the fast path against.
#[cfg(any(test, fuzzing))]
pub(crate) fn decode_batch_general(
    batch: &RecordBatch,
    limits: &DecodeLimits,
    out: &mut Records,
) -> Result<(), ProtocolViolation> {
    decode_batch_with(batch, limits, out, false, &[])
}

/// [`decode_batch`], trying [`RecordBase::read_short_as`] on each record first if `fast`;
/// `following` as in [`decode_batch_before`].
#[inline(always)]
fn decode_batch_with(
    batch: &RecordBatch,
    limits: &DecodeLimits,
    out: &mut Records,
    fast: bool,
    following: &[u8],
) -> Result<(), ProtocolViolation> {
    if limits.check_crc {
        batch.verify_crc()?;
    }
    let header = &batch.header;
    let count = usize::try_from(header.record_count)
        .map_err(|_| header.violation(format!("negative record count {}", header.record_count)))?;
    if count == 0 {
        return Ok(());
    }
    let data = batch.records_payload(limits.max_decompressed_bytes)?;
    // Spans are 32-bit, and a length of `u32::MAX` means null.
    if u32::try_from(data.len()).map_or(true, |len| len == u32::MAX) {
        return Err(header.violation(format!(
            "{} bytes of records do not fit 32-bit positions",
            data.len()
        )));
    }
    let segment = u32::try_from(out.segments.len())
        .map_err(|_| header.violation("more than 2^32 batches in one piece".to_owned()))?;
    let start = out.entries.len();
    let payload = Payload {
        data: &data,
        // The bytes after a compressed batch do not follow its decompressed records.
        following: if header.compression() == Some(Compression::None) {
            following
        } else {
            &[]
        },
    };
    match decode_records(header, payload, count, segment, &mut out.entries, fast) {
        Ok(()) => {
            out.segments.push(Segment {
                bytes: data,
                base_offset: header.base_offset,
                leader_epoch: header.partition_leader_epoch,
                timestamp_type: header.timestamp_type(),
            });
            Ok(())
        }
        Err(e) => {
            out.entries.truncate(start);
            Err(e)
        }
    }
}

/// A batch's record count as written, capped at what `payload_len` bytes of records could hold:
/// what sizing for its records may trust of a hostile count.
fn records_that_fit(count: usize, payload_len: usize) -> usize {
    count.min(payload_len / MIN_RECORD_LEN)
}

/// Decodes exactly `count` records filling all of `data`.
///
/// If `fast`, each record is first offered to [`RecordBase::read_short_as`], which reads the
/// common shapes with fewer checks per byte; whatever it declines, the general [`read_record`]
/// reads and judges, so errors and their messages are the general reader's.
#[inline(always)]
fn decode_records(
    header: &BatchHeader,
    payload: Payload<'_>,
    count: usize,
    segment: u32,
    out: &mut Vec<Entry>,
    fast: bool,
) -> Result<(), ProtocolViolation> {
    let base = RecordBase::new(header);
    // The timestamp's source is chosen here, once per batch, for every record the short reader
    // takes.
    if base.log_append_time {
        decode_records_as::<true>(header, base, payload, count, segment, out, fast)
    } else {
        decode_records_as::<false>(header, base, payload, count, segment, out, fast)
    }
}

/// [`decode_records`] for a batch whose `log_append_time` is `APPEND`.
#[inline(always)]
fn decode_records_as<const APPEND: bool>(
    header: &BatchHeader,
    base: RecordBase,
    payload: Payload<'_>,
    count: usize,
    segment: u32,
    out: &mut Vec<Entry>,
    fast: bool,
) -> Result<(), ProtocolViolation> {
    let data = payload.data;
    // A hostile count must not reserve more than the bytes could hold.
    let fit = records_that_fit(count, data.len());
    out.reserve(fit);
    let mut cursor = Cursor::new(data);
    // The records the short reader takes, from the first on, are written into slots made for
    // them: no capacity check and no length update per record. (A count the bytes cannot hold
    // is malformed; the loop below says how.) A small batch gets its slots in `out` itself; a
    // larger one fills a buffer on the stack, which stays in the L1 cache, and copies each
    // buffer full to `out`: slots made in `out` first would write each entry's memory twice.
    let mut done = 0;
    if fast && count == fit {
        if count <= FILL_CHUNK {
            // The bytes after a small batch are asked for before its records.
            prefetch_following(payload);
            let start = out.len();
            out.resize(start + count, Entry::EMPTY);
            (done, cursor.pos) = base.fill_short::<APPEND>(data, 0, segment, &mut out[start..]);
            out.truncate(start + done);
        } else {
            let mut slots = [Entry::EMPTY; FILL_CHUNK];
            // Whether the bytes after the payload have been asked for yet: once, as the records
            // come within `PREFETCH_AHEAD` of the payload's end.
            let mut following_asked = payload.following.is_empty();
            loop {
                let want = (count - done).min(FILL_CHUNK);
                if !following_asked && cursor.pos + PREFETCH_AHEAD >= data.len() {
                    prefetch_following(payload);
                    following_asked = true;
                }
                let (filled, pos) =
                    base.fill_short::<APPEND>(data, cursor.pos, segment, &mut slots[..want]);
                out.extend_from_slice(&slots[..filled]);
                done += filled;
                cursor.pos = pos;
                if filled < want || done == count {
                    break;
                }
            }
        }
    }
    for i in done..count {
        let short = if fast {
            base.read_short_as::<APPEND>(data, cursor.pos, segment)
        } else {
            None
        };
        if let Some((record, next)) = short {
            cursor.pos = next;
            out.push(record);
            continue;
        }
        let record = read_record(&base, segment, &mut cursor)
            .map_err(|why| header.violation(format!("record {i} of {count}: {why}")))?;
        out.push(record);
    }
    if cursor.remaining() != 0 {
        return Err(header.violation(format!(
            "{} bytes follow the last of {count} records",
            cursor.remaining()
        )));
    }
    Ok(())
}

/// Reads one record at the cursor (Java `DefaultRecord.readFrom`). Positions are below
/// `u32::MAX`: [`decode_batch`] checked the buffer's length.
#[inline(always)]
fn read_record(base: &RecordBase, segment: u32, cursor: &mut Cursor<'_>) -> Result<Entry, String> {
    let len = cursor.varint().ok_or("truncated length")?;
    let body = usize::try_from(len)
        .ok()
        .and_then(|len| cursor.take(len))
        .ok_or_else(|| {
            format!(
                "length {len} runs past the batch ({} bytes left)",
                cursor.remaining()
            )
        })?;
    let mut r = cursor.within(&body);
    let _attributes = r.u8().ok_or("truncated attributes")?;
    let timestamp_delta = r.varlong().ok_or("truncated timestamp delta")?;
    let offset_delta = r.varint().ok_or("truncated offset delta")?;
    let key = r
        .nullable_bytes("key")?
        .map_or_else(|| null_at(r.pos), span);
    let value = r
        .nullable_bytes("value")?
        .map_or_else(|| null_at(r.pos), span);
    let header_count = r.varint().ok_or("truncated header count")?;
    let header_count =
        u32::try_from(header_count).map_err(|_| format!("negative header count {header_count}"))?;
    for h in 0..header_count {
        let key_len = r.varint().ok_or("truncated header key length")?;
        if usize::try_from(key_len)
            .ok()
            .and_then(|len| r.take(len))
            .is_none()
        {
            return Err(format!(
                "header {h} key length {key_len} is negative or runs past the record"
            ));
        }
        r.nullable_bytes("header value")?;
    }
    if r.remaining() != 0 {
        return Err(format!(
            "{} bytes follow the fields of a {len}-byte record",
            r.remaining()
        ));
    }

    let (offset_delta, timestamp) = base
        .place(base.log_append_time, offset_delta, timestamp_delta)
        .ok_or_else(|| base.misplaced(offset_delta, timestamp_delta))?;
    Ok(Entry {
        timestamp,
        offset_delta,
        segment,
        key,
        value,
    })
}

/// What every record of a batch takes from the batch header, for both record readers.
#[derive(Clone, Copy)]
struct RecordBase {
    last_offset_delta: i32,
    /// Every record's timestamp is `max_timestamp` (log-append time).
    log_append_time: bool,
    max_timestamp: i64,
    base_timestamp: i64,
}

impl RecordBase {
    fn new(header: &BatchHeader) -> Self {
        Self {
            last_offset_delta: header.last_offset_delta,
            log_append_time: header.timestamp_type() == TimestampType::LogAppendTime,
            max_timestamp: header.max_timestamp,
            base_timestamp: header.base_timestamp,
        }
    }

    /// The offset delta and timestamp of a record with these deltas (Java
    /// `DefaultRecord.readFrom`'s checks), or `None` if they are out of range:
    /// [`misplaced`](Self::misplaced) says how. A delta within `0..=last_offset_delta` gives an
    /// offset that fits: [`BatchHeader::check`] refused every batch whose last offset overflows.
    /// `append` is the batch's `log_append_time`: the short reader passes its constant, so
    /// that the choice folds away there.
    #[inline(always)]
    fn place(&self, append: bool, offset_delta: i32, timestamp_delta: i64) -> Option<(u32, i64)> {
        if offset_delta < 0 || offset_delta > self.last_offset_delta {
            return None;
        }
        let timestamp = if append {
            self.max_timestamp
        } else {
            self.base_timestamp.checked_add(timestamp_delta)?
        };
        Some((offset_delta.unsigned_abs(), timestamp))
    }

    /// Why [`place`](Self::place) refused these deltas.
    #[cold]
    fn misplaced(&self, offset_delta: i32, timestamp_delta: i64) -> String {
        if offset_delta < 0 || offset_delta > self.last_offset_delta {
            format!(
                "offset delta {offset_delta} outside the batch's 0..={}",
                self.last_offset_delta
            )
        } else {
            format!("timestamp delta {timestamp_delta} overflows")
        }
    }

    /// Reads records with [`read_short_as`](Self::read_short_as) from `pos` in `data` into
    /// `slots` until one is declined or the slots are full: how many were read, and the position
    /// after the last. `APPEND` is the batch's `log_append_time`.
    #[inline(always)]
    fn fill_short<const APPEND: bool>(
        self,
        data: &[u8],
        mut pos: usize,
        segment: u32,
        slots: &mut [Entry],
    ) -> (usize, usize) {
        let mut filled = 0;
        for slot in slots {
            prefetch_ahead(data, pos);
            let Some((record, next)) = self.read_short_as::<APPEND>(data, pos, segment) else {
                break;
            };
            *slot = record;
            pos = next;
            filled += 1;
        }
        (filled, pos)
    }

    /// The record at `pos` and the position after it, if every varint in the record takes at
    /// most two bytes (lengths and deltas below 8192); `None` for anything else, valid or not,
    /// which [`read_record`] then reads and judges. Among such records it accepts exactly what
    /// `read_record` accepts, and yields the same entry. `APPEND` is the batch's
    /// `log_append_time`, so that the timestamp's source is chosen once per batch.
    #[inline(always)]
    fn read_short_as<const APPEND: bool>(
        self,
        data: &[u8],
        pos: usize,
        segment: u32,
    ) -> Option<(Entry, usize)> {
        let (len, p) = short_length(data, pos)?;
        let end = p + len;
        if end > data.len() {
            return None;
        }
        let body = &data[..end];
        // The record's last byte (`end` is past the length, so at least 1), which is its header
        // count when it has no headers. Loaded first: it is often on a cache line of its own,
        // and the load's wait then overlaps the reading of the fields before it, instead of
        // following it. (A record of length 0 reads its own length byte here, and fails below.)
        let last = body[end - 1];
        let p = p + 1; // attributes
        let (timestamp_delta, p) = short_varint(body, p)?;
        let (offset_delta, p) = short_varint(body, p)?;
        let (key, p) = short_bytes(body, p)?;
        let (value, p) = short_bytes(body, p)?;
        // The common shape, no headers: the record ends with their count, 0.
        let p = if p + 1 == end && last == 0 {
            end
        } else {
            let (header_count, mut p) = short_varint(body, p)?;
            let header_count = u32::try_from(header_count).ok()?;
            for _ in 0..header_count {
                let (key_len, q) = short_length(body, p)?;
                let key_end = q + key_len;
                if key_end > end {
                    return None;
                }
                p = short_bytes(body, key_end)?.1;
            }
            p
        };
        if p != end {
            return None;
        }
        let (offset_delta, timestamp) =
            self.place(APPEND, offset_delta, i64::from(timestamp_delta))?;
        Some((
            Entry {
                timestamp,
                offset_delta,
                segment,
                key,
                value,
            },
            end,
        ))
    }
}

/// How many entries the short reader fills on the stack before they are copied to the
/// records (2 KiB). In alternating end-to-end runs on one partition, 16, 64 and 256 did alike.
const FILL_CHUNK: usize = 64;

/// A batch's records, decompressed if need be, and for an uncompressed batch the bytes that
/// follow it in its buffer, which only [`prefetch_following`] looks at.
#[derive(Clone, Copy)]
struct Payload<'a> {
    data: &'a [u8],
    following: &'a [u8],
}

/// How far ahead of the record being decoded [`prefetch_ahead`] asks for the bytes.
///
/// The bytes of a large response have often left the cache by the time they are decoded (the
/// reason the CRC is checked on arrival, see `crc_scan`), and the hardware prefetcher alone
/// does not keep up with the decoder. In alternating end-to-end runs of 100-byte records, eight
/// partitions ran 1.09–1.12× as fast with it (2 KiB ahead) and one partition 1.00–1.04×; 0.5,
/// 1 and 4 KiB ahead did no better than 2 there. On an Intel Xeon (family 6 model 167), where
/// eight partitions' responses of 4 MiB outgrow the core's 2 MiB of L2, 8 KiB ahead ran eight
/// partitions 1.07×, 1.10× and 1.06× as fast as 2 KiB pair by pair (24, 60 and 60 rounds) with
/// 5–11 % less CPU per record, and one partition alike (1.00×, 80 rounds); 4 KiB 1.03× and
/// 1.08× on eight, 16 and 32 KiB no better than 8. The prefetch reaches past the batch into
/// the bytes that follow it in the response, so that the next batch's first 8 KiB are not left
/// out (half of a batch of 16 KiB, the Java producer's default size): all at once as a batch's
/// records come within 8 KiB of its end ([`prefetch_following`]), which used less CPU per
/// record than choosing between the two slices record by record (figures in the CHANGELOG).
/// Where the bytes are still in cache (the decode bench decodes one response over and over) the
/// extra instructions cost 5–15 %.
const PREFETCH_AHEAD: usize = 8192;

/// Asks the CPU to bring the two cache lines [`PREFETCH_AHEAD`] bytes past `pos` of `data`
/// into cache, where `data` has them: two because a typical record spans more than one line. A
/// hint only, with no effect on what is read.
#[inline(always)]
fn prefetch_ahead(data: &[u8], pos: usize) {
    let at = pos + PREFETCH_AHEAD;
    if let Some(byte) = data.get(at) {
        prefetch(byte);
    }
    if let Some(byte) = data.get(at + 64) {
        prefetch(byte);
    }
}

/// Asks the CPU for the cache lines of the bytes after the payload that [`prefetch_ahead`]
/// would reach from the payload's records if the payload went on into them: those within
/// [`PREFETCH_AHEAD`] of the payload's end but not within it of the payload's start (for a
/// batch shorter than that, the batch before it in the response asked for those). Called once
/// per batch, as its records come within [`PREFETCH_AHEAD`] of its end, all at once: the
/// records' loop then prefetches from one slice, with no choice between two per record.
#[inline]
fn prefetch_following(payload: Payload<'_>) {
    let following = payload.following;
    let end = PREFETCH_AHEAD.min(following.len());
    let start = PREFETCH_AHEAD.saturating_sub(payload.data.len()).min(end);
    for byte in following[start..end].iter().step_by(64) {
        prefetch(byte);
    }
}

/// A prefetch of the cache line that holds `byte` (nothing where the target has none).
#[inline(always)]
fn prefetch(byte: &u8) {
    #[cfg(all(
        any(target_arch = "x86", target_arch = "x86_64"),
        target_feature = "sse"
    ))]
    safe_arch::prefetch_t0(byte);
    #[cfg(not(all(
        any(target_arch = "x86", target_arch = "x86_64"),
        target_feature = "sse"
    )))]
    let _ = byte;
}

/// A zigzag varint of one or two bytes at `pos`, and the position after it.
#[inline(always)]
fn short_varint(buf: &[u8], pos: usize) -> Option<(i32, usize)> {
    let (raw, p) = short_raw(buf, pos)?;
    Some((zigzag32(raw), p))
}

/// A varint of one or two bytes at `pos`, still zigzag-encoded, and the position after it.
#[inline(always)]
fn short_raw(buf: &[u8], pos: usize) -> Option<(u32, usize)> {
    let b0 = u32::from(*buf.get(pos)?);
    if b0 < 0x80 {
        return Some((b0, pos + 1));
    }
    let b1 = u32::from(*buf.get(pos + 1)?);
    if b1 < 0x80 {
        return Some(((b0 & 0x7f) | (b1 << 7), pos + 2));
    }
    None
}

/// A non-negative length of one or two bytes at `pos`, and the position after it.
#[inline(always)]
fn short_length(buf: &[u8], pos: usize) -> Option<(usize, usize)> {
    let (raw, p) = short_raw(buf, pos)?;
    // Zigzag: odd raw values are negative.
    (raw & 1 == 0).then_some(((raw >> 1) as usize, p))
}

/// A nullable byte string with a one- or two-byte length at `pos`, as a span.
#[inline(always)]
fn short_bytes(buf: &[u8], pos: usize) -> Option<(Span, usize)> {
    let (raw, p) = short_raw(buf, pos)?;
    // Zigzag: even raw values are lengths, 1 is -1 (null), other odd ones are negative.
    if raw & 1 != 0 {
        return (raw == 1).then_some((null_at(p), p));
    }
    let end = p + (raw >> 1) as usize;
    if end > buf.len() {
        return None;
    }
    Some((span(p..end), end))
}

/// A null span at a position of a buffer shorter than `u32::MAX` bytes.
#[expect(
    clippy::cast_possible_truncation,
    reason = "decode_batch checked that the buffer is shorter than u32::MAX"
)]
fn null_at(pos: usize) -> Span {
    Span::null_at(pos as u32)
}

/// A range of a buffer shorter than `u32::MAX` bytes as a span.
#[expect(
    clippy::cast_possible_truncation,
    reason = "decode_batch checked that the buffer is shorter than u32::MAX"
)]
fn span(range: Range<usize>) -> Span {
    Span {
        start: range.start as u32,
        len: (range.end - range.start) as u32,
    }
}

/// A record's headers, still encoded. Decoding checked them; iteration still stops at the first
/// malformed header instead of panicking.
#[derive(Clone, Debug)]
pub(crate) struct HeaderIter<'a> {
    buf: &'a [u8],
    pos: usize,
    left: u32,
}

impl<'a> HeaderIter<'a> {
    /// Iterates over the headers of a record whose bytes from its header count on start
    /// `tail`: none if the count is malformed or negative.
    pub(crate) fn counted(tail: &'a [u8]) -> Self {
        let mut r = Cursor::new(tail);
        let count = r.varint().and_then(|c| u32::try_from(c).ok());
        Self {
            buf: tail,
            pos: r.position(),
            left: count.unwrap_or(0),
        }
    }

    /// How many headers are left to read.
    pub(crate) fn len(&self) -> usize {
        self.left as usize
    }

    fn read(&mut self) -> Option<(&'a [u8], Option<&'a [u8]>)> {
        let mut r = Cursor::new(self.buf);
        r.pos = self.pos;
        let key_len = usize::try_from(r.varint()?).ok()?;
        let key = r.take(key_len)?;
        let value = r.nullable_bytes("header value").ok()?;
        self.pos = r.position();
        let buf = self.buf;
        Some((buf.get(key)?, value.and_then(|v| buf.get(v))))
    }
}

impl<'a> Iterator for HeaderIter<'a> {
    type Item = (&'a [u8], Option<&'a [u8]>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        let header = self.read();
        self.left = if header.is_some() { self.left - 1 } else { 0 };
        header
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, usize::try_from(self.left).ok())
    }
}

impl FusedIterator for HeaderIter<'_> {}

/// The kind of a transaction marker: the key of a control batch's record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ControlType {
    /// The transaction was aborted: its records must not be read under `read_committed`.
    Abort,
    /// The transaction was committed.
    Commit,
}

impl ControlType {
    /// Parses a control record's key: `i16` version, `i16` type (0 abort, 1 commit). `None` for
    /// a key too short, a negative version, or another type (KRaft's control records).
    pub fn from_key(key: &[u8]) -> Option<Self> {
        Self::parse(key).ok().flatten()
    }

    /// Like [`from_key`](Self::from_key), but a key Java rejects as corrupt is an error.
    fn parse(key: &[u8]) -> Result<Option<Self>, String> {
        let mut r = BigEndian(key);
        let (Some(version), Some(kind)) = (
            r.take().map(i16::from_be_bytes),
            r.take().map(i16::from_be_bytes),
        ) else {
            return Err(format!(
                "control record key of {} bytes is too short",
                key.len()
            ));
        };
        if version < 0 {
            return Err(format!("control record key version {version}"));
        }
        Ok(match kind {
            0 => Some(Self::Abort),
            1 => Some(Self::Commit),
            _ => None,
        })
    }
}

/// The transaction marker a control batch holds, from its first record's key (Java
/// `ControlRecordType.parse`). `None` for a batch that is not a control batch, has no records,
/// or holds a control record other than a transaction marker.
///
/// # Errors
///
/// For a control batch: [`ProtocolViolation::Crc`], or [`ProtocolViolation::Batch`] if its first
/// record or key is malformed.
pub fn control_type(batch: &RecordBatch) -> Result<Option<ControlType>, ProtocolViolation> {
    let header = &batch.header;
    if !header.is_control() || header.record_count <= 0 {
        return Ok(None);
    }
    batch.verify_crc()?;
    let data = batch.records_payload(CONTROL_BATCH_LIMIT)?;
    // The limit keeps `data` well below `u32::MAX` bytes.
    read_record(&RecordBase::new(header), 0, &mut Cursor::new(&data))
        .and_then(|record| ControlType::parse(record.key.get(&data).unwrap_or_default()))
        .map_err(|why| header.violation(format!("control record: {why}")))
}

/// What to do with a batch under `read_committed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BatchAction {
    /// Hand its records out (from the fetch position on).
    Deliver,
    /// Skip it: it belongs to an aborted transaction.
    SkipAborted,
    /// Skip it: it is a transaction marker.
    SkipControl,
}

/// The `read_committed` filter for one partition's fetched data: which batches belong to
/// aborted transactions (Java `CompletedFetch`).
///
/// Built from the fetch response's `aborted_transactions`, then asked about every batch in
/// order. With no aborted transactions it only skips control batches, which is also what
/// `read_uncommitted` needs.
#[derive(Clone, Debug, Default)]
pub struct AbortedTransactions {
    /// Aborted transactions not yet reached, as `(first_offset, producer_id)`, lowest first.
    pending: BinaryHeap<Reverse<(i64, i64)>>,
    /// Producers whose current transaction was aborted and whose abort marker is still ahead.
    aborted: HashSet<i64>,
}

impl AbortedTransactions {
    /// A filter for aborted transactions given as `(producer_id, first_offset)`, the fields of
    /// the fetch response's `AbortedTransaction`.
    pub fn new(aborted: impl IntoIterator<Item = (i64, i64)>) -> Self {
        Self {
            pending: aborted
                .into_iter()
                .map(|(producer_id, first_offset)| Reverse((first_offset, producer_id)))
                .collect(),
            aborted: HashSet::new(),
        }
    }

    /// What to do with the next batch, given its control type (read only for control batches;
    /// see [`control_type`]). Batches must be passed in offset order, each exactly once.
    pub fn action(&mut self, header: &BatchHeader, control: Option<ControlType>) -> BatchAction {
        if header.has_producer_id() {
            let last_offset = header.last_offset();
            while let Some(&Reverse((first_offset, producer_id))) = self.pending.peek() {
                if first_offset > last_offset {
                    break;
                }
                self.pending.pop();
                self.aborted.insert(producer_id);
            }
            if header.is_control() && control == Some(ControlType::Abort) {
                // The abort marker ends the producer's aborted transaction.
                self.aborted.remove(&header.producer_id);
            } else if header.is_transactional() && self.aborted.contains(&header.producer_id) {
                return BatchAction::SkipAborted;
            }
        }
        if header.is_control() {
            BatchAction::SkipControl
        } else {
            BatchAction::Deliver
        }
    }

    /// [`action`](Self::action) for a batch, reading its control type when it is needed.
    ///
    /// # Errors
    ///
    /// Those of [`control_type`], for a malformed control batch.
    pub fn classify(&mut self, batch: &RecordBatch) -> Result<BatchAction, ProtocolViolation> {
        let header = &batch.header;
        let control = if header.is_control() && header.has_producer_id() {
            control_type(batch)?
        } else {
            None
        };
        Ok(self.action(header, control))
    }
}

/// Big-endian fixed-size reads from the front of a slice.
struct BigEndian<'a>(&'a [u8]);

impl BigEndian<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (bytes, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*bytes)
    }
}

#[expect(
    clippy::cast_possible_wrap,
    reason = "zigzag decoding reinterprets the bits"
)]
fn zigzag32(raw: u32) -> i32 {
    (raw >> 1) as i32 ^ -((raw & 1) as i32)
}

#[expect(
    clippy::cast_possible_wrap,
    reason = "zigzag decoding reinterprets the bits"
)]
fn zigzag64(raw: u64) -> i64 {
    (raw >> 1) as i64 ^ -((raw & 1) as i64)
}

/// A read position in a buffer; every read is checked and returns `None` past the end.
/// Positions are absolute (a cursor [`within`](Self::within) a range sees a prefix of the same
/// buffer), so ranges slice the buffer directly.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// A cursor over `range` of the same buffer.
    fn within(&self, range: &Range<usize>) -> Self {
        Self {
            buf: &self.buf[..range.end.min(self.buf.len())],
            pos: range.start,
        }
    }

    fn position(&self) -> usize {
        self.pos
    }

    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    #[inline]
    fn u8(&mut self) -> Option<u8> {
        let b = *self.buf.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    /// The next `len` bytes, as a range of the buffer.
    #[inline]
    fn take(&mut self, len: usize) -> Option<Range<usize>> {
        if len > self.remaining() {
            return None;
        }
        let start = self.pos;
        self.pos += len;
        Some(start..self.pos)
    }

    /// A zigzag varint of at most 5 bytes (Java `ByteUtils.readVarint`).
    #[inline(always)]
    fn varint(&mut self) -> Option<i32> {
        let first = self.u8()?;
        if first & 0x80 == 0 {
            // One byte: every length and delta below 64.
            return Some(zigzag32(u32::from(first)));
        }
        let mut raw = u32::from(first & 0x7f);
        for shift in (7..35).step_by(7) {
            let b = self.u8()?;
            raw |= u32::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(zigzag32(raw));
            }
        }
        None
    }

    /// A zigzag varlong of at most 10 bytes (Java `ByteUtils.readVarlong`).
    #[inline]
    fn varlong(&mut self) -> Option<i64> {
        let first = self.u8()?;
        if first & 0x80 == 0 {
            return Some(zigzag64(u64::from(first)));
        }
        let mut raw = u64::from(first & 0x7f);
        for shift in (7..70).step_by(7) {
            let b = self.u8()?;
            raw |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(zigzag64(raw));
            }
        }
        None
    }

    /// A varint length and that many bytes; length -1 is null.
    #[inline(always)]
    fn nullable_bytes(&mut self, what: &str) -> Result<Option<Range<usize>>, String> {
        let Some(len) = self.varint() else {
            return Err(truncated_length(what));
        };
        if len == -1 {
            return Ok(None);
        }
        match usize::try_from(len).ok().and_then(|n| self.take(n)) {
            Some(range) => Ok(Some(range)),
            None => Err(bad_length(what, len)),
        }
    }
}

#[cold]
fn truncated_length(what: &str) -> String {
    format!("truncated {what} length")
}

#[cold]
fn bad_length(what: &str, len: i32) -> String {
    format!("{what} length {len} is negative or runs past the record")
}

/// The CRC-32C (Castagnoli) of `bytes`, as a record batch stores it, by the implementation
/// [`prepare_batch_crc32c`] chose for this CPU.
#[inline]
pub(crate) fn batch_crc32c(bytes: &[u8]) -> u32 {
    crc32c_by(prepare_batch_crc32c(), bytes)
}

/// The CRC-32C of `bytes` by `imp`. Every implementation gives the same result for every input
/// (tested); they differ only in speed, and which is fastest depends on the CPU:
///
/// - with AVX-512 and VPCLMULQDQ, `crc-fast`'s CRC-32/ISCSI folds 512 bits at a time and is
///   about twice as fast as `crc32c`;
/// - on an AMD EPYC of family 23 (no AVX-512, a CRC32 instruction that issues once every three
///   cycles), `crc-fast`'s folding with 128-bit PCLMULQDQ alone ran at 9.4–10.0 GB/s, its
///   CRC-32/ISCSI (that folding fused with CRC32 instructions) at 7.0–7.7 and `crc32c` at
///   4.7–5.6 (16 KiB to 1 MiB);
/// - where the CRC32 instruction issues every cycle, `crc32c` or the fused code can be the
///   faster.
#[inline]
pub(crate) fn crc32c_by(imp: CrcImpl, bytes: &[u8]) -> u32 {
    // A CRC-32C is 32 bits wide: the upper half of `crc-fast`'s results is zero.
    match imp {
        CrcImpl::Fused => crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, bytes) as u32,
        CrcImpl::Carryless => crc_fast::checksum_with_params(carryless_params(), bytes) as u32,
        CrcImpl::Instruction => crc32c::crc32c(bytes),
    }
}

/// CRC-32C's parameters as custom ones, which take `crc-fast` down its generic carry-less
/// folding rather than the code it keeps for CRC-32/ISCSI by name.
fn carryless_params() -> crc_fast::CrcParams {
    static PARAMS: std::sync::OnceLock<crc_fast::CrcParams> = std::sync::OnceLock::new();
    *PARAMS.get_or_init(|| {
        crc_fast::CrcParams::new(
            "CRC-32C by carry-less folding",
            32,
            0x1EDC_6F41,
            0xFFFF_FFFF,
            true,
            0xFFFF_FFFF,
            0xE306_9283,
        )
    })
}

/// An implementation of [`batch_crc32c`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CrcImpl {
    /// `crc-fast`'s CRC-32/ISCSI: VPCLMULQDQ folding with AVX-512; otherwise carry-less
    /// folding fused with interleaved CRC32 instructions.
    Fused,
    /// `crc-fast`'s generic carry-less folding (PCLMULQDQ on x86-64), with CRC-32C's
    /// parameters.
    Carryless,
    /// `crc32c`: three interleaved streams of the CRC32 instruction (or its tables where the
    /// CPU lacks it).
    Instruction,
}

impl CrcImpl {
    /// Every implementation.
    pub(crate) const ALL: [CrcImpl; 3] = [CrcImpl::Fused, CrcImpl::Carryless, CrcImpl::Instruction];

    /// The name the decode bench and the consumer's debug log give it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            CrcImpl::Fused => "crc-fast-fused",
            CrcImpl::Carryless => "crc-fast-carryless",
            CrcImpl::Instruction => "crc32c",
        }
    }
}

/// Chooses [`batch_crc32c`]'s implementation, once per process, and returns it. The consumer
/// calls it when it is created, so that the choice is not made on a fetch response's path.
///
/// With AVX-512 (VL) and VPCLMULQDQ: [`CrcImpl::Fused`]. Otherwise, where the CPU has
/// PCLMULQDQ, the three are timed over the same 64 KiB, in turn, by the best of five runs each
/// (about 0.2 ms): no feature list tells which is fastest on a given core. [`CrcImpl::Instruction`]
/// is kept unless another ran at least [`CRC_SWITCH_MARGIN`] times as fast: a start-up timing
/// is taken while the process's other threads and the host's other vCPU do whatever they do
/// then, and on a core where two implementations are close it picks either.
pub(crate) fn prepare_batch_crc32c() -> CrcImpl {
    static CHOICE: std::sync::OnceLock<CrcImpl> = std::sync::OnceLock::new();
    *CHOICE.get_or_init(|| {
        let choice = choose_crc_impl();
        tracing::debug!(
            choice = choice.name(),
            "CRC-32C implementation for record batches"
        );
        choice
    })
}

#[cfg(target_arch = "x86_64")]
fn choose_crc_impl() -> CrcImpl {
    use std::hint::black_box;
    use std::time::{Duration, Instant};
    if std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("vpclmulqdq")
    {
        return CrcImpl::Fused;
    }
    if !std::arch::is_x86_feature_detected!("pclmulqdq") {
        return CrcImpl::Instruction;
    }
    // No implementation's speed depends on the bytes.
    let data = vec![0x5a_u8; 64 * 1024];
    let mut best = [Duration::MAX; CrcImpl::ALL.len()];
    for _ in 0..5 {
        for (imp, best) in CrcImpl::ALL.iter().zip(best.iter_mut()) {
            let t = Instant::now();
            black_box(crc32c_by(*imp, black_box(&data)));
            *best = (*best).min(t.elapsed());
        }
    }
    // Every other implementation's time counts `CRC_SWITCH_MARGIN` times over.
    let handicapped = |&(imp, time): &(CrcImpl, Duration)| {
        let time = time.as_secs_f64();
        if imp == CrcImpl::Instruction {
            time
        } else {
            time * CRC_SWITCH_MARGIN
        }
    };
    CrcImpl::ALL
        .into_iter()
        .zip(best)
        .min_by(|a, b| handicapped(a).total_cmp(&handicapped(b)))
        .map_or(CrcImpl::Instruction, |(imp, _)| imp)
}

/// How many times as fast as `crc32c` another implementation must time at start-up for
/// [`prepare_batch_crc32c`] to take it.
///
/// On an AMD EPYC of family 23, `crc-fast`'s carry-less folding ran at about twice `crc32c`'s
/// speed, and is taken. On one of family 25 model 1 (no AVX-512), `crc32c` ran 1.1–1.6× as
/// fast as the fused code in the decode bench and, forced in end-to-end runs, used 4.6 % less
/// CPU per record; yet the start-up timing picked the fused code in eight of twelve consumer
/// processes, and with the other vCPU busy put it ahead by up to 1.34× (best of five).
#[cfg(target_arch = "x86_64")]
const CRC_SWITCH_MARGIN: f64 = 1.5;

#[cfg(not(target_arch = "x86_64"))]
fn choose_crc_impl() -> CrcImpl {
    CrcImpl::Instruction
}

#[cfg(test)]
pub(crate) mod tests;
