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

/// The CRC-32C implementations the decoder chooses between, each by its name and as the
/// decoder runs it: for the decode bench, which times them side by side.
#[doc(hidden)]
pub fn crc32c_implementations() -> impl Iterator<Item = (&'static str, impl Fn(&[u8]) -> u32)> {
    use crate::proto::records::{CrcImpl, crc32c_by};
    CrcImpl::ALL
        .into_iter()
        .map(|imp| (imp.name(), move |bytes: &[u8]| crc32c_by(imp, bytes)))
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
