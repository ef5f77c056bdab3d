//! Record batches, for callers that fetch for themselves (benches, tools, other clients): split
//! a partition's fetched `records` bytes into batches, verify and decompress them, and decode
//! their records as zero-copy slices; and the `read_committed` filter for aborted transactions.
//!
//! The consumer uses the same code; it is re-exported here unchanged.
//!
//! ```
//! use bytes::Bytes;
//! use kafka_source::records::{BatchIter, DecodeLimits, decode_batch};
//!
//! # fn main() -> Result<(), kafka_source::ProtocolViolation> {
//! let records = Bytes::new(); // a partition's `records` from a FetchResponse
//! let mut position = 0;
//! let mut out = kafka_source::Records::new();
//! let mut batches = BatchIter::new(records);
//! for batch in &mut batches {
//!     let batch = batch?;
//!     decode_batch(&batch, &DecodeLimits::default(), &mut out)?;
//!     position = batch.header().next_offset();
//! }
//! // `batches.remaining_bytes()` is the size of a partial batch at the end, if any.
//! # let _ = position;
//! # Ok(())
//! # }
//! ```

pub use crate::proto::records::{
    AbortedTransactions, BatchAction, BatchHeader, BatchIter, Compression, ControlType,
    DecodeLimits, RecordBatch, control_type, decode_batch,
};

/// One CRC-32C implementation: the checksum of a byte slice.
#[doc(hidden)]
pub type Crc32cFn = fn(&[u8]) -> u32;

/// The CRC-32C implementations the decoder chooses between, by name, each as the decoder runs
/// it: for the decode bench, which times them side by side.
#[doc(hidden)]
pub fn crc32c_implementations() -> [(&'static str, Crc32cFn); 3] {
    use crate::proto::records::{CrcImpl, crc32c_by};
    [
        ("crc32c", |b| crc32c_by(CrcImpl::Instruction, b)),
        ("crc-fast-fused", |b| crc32c_by(CrcImpl::Fused, b)),
        ("crc-fast-carryless", |b| crc32c_by(CrcImpl::Carryless, b)),
    ]
}

/// Checks the structure of a FetchResponse `body` (after the response header) at `version`
/// before it is handed to kafka-protocol's decoder.
///
/// kafka-protocol 0.18 reserves memory for an array from the element count on the wire before
/// decoding an element, so a few bytes claiming billions of elements abort the process. This
/// walk rejects every array count, string, bytes or records length that cannot fit in the bytes
/// left, without reading the record data itself. The consumer runs the same check on every
/// response it decodes.
pub fn check_fetch_response(body: &[u8], version: i16) -> Result<(), crate::ProtocolViolation> {
    crate::proto::guard::check_response(kafka_protocol::messages::ApiKey::Fetch, version, body, 0)
}
