//! Turning one partition's fetched bytes into the batch handed to the application: decode,
//! drop what is below the fetch position, and skip transaction markers and (under
//! `read_committed`) aborted transactions.

use bytes::Bytes;

use crate::config::IsolationLevel;
use crate::error::ProtocolViolation;
use crate::proto::records::{
    AbortedTransactions, BatchAction, BatchIter, DecodeLimits, decode_batch,
};
use crate::types::Record;

/// The outcome of decoding a chunk.
#[derive(Debug, Default)]
pub(crate) struct Decoded {
    /// Records for the application, in offset order.
    pub(crate) records: Vec<Record>,
    /// Bytes of decompressed payload the records point into (0 for uncompressed data).
    pub(crate) decompressed_bytes: usize,
    /// A malformed batch: the offset it starts at (nothing from it on was handed out) and what
    /// was wrong.
    pub(crate) error: Option<(i64, ProtocolViolation)>,
}

/// Decodes the complete batches of one fetch. `limit` caps the decompressed bytes of the whole
/// chunk.
pub(crate) fn decode_chunk(
    data: Bytes,
    fetch_offset: i64,
    aborted: &[(i64, i64)],
    isolation: IsolationLevel,
    limit: usize,
) -> Decoded {
    let mut filter = match isolation {
        IsolationLevel::ReadCommitted => AbortedTransactions::new(aborted.iter().copied()),
        // Only transaction markers are skipped; aborted records are delivered, as in Java.
        IsolationLevel::ReadUncommitted => AbortedTransactions::new([]),
    };
    let mut d = Decoded::default();
    // Where the next batch starts, as far as the position goes.
    let mut position = fetch_offset;
    for item in BatchIter::new(data) {
        let batch = match item {
            Ok(b) => b,
            Err(v) => {
                d.error = Some((position, v));
                return d;
            }
        };
        let header = *batch.header();
        let next = header.next_offset();
        if next <= fetch_offset {
            continue; // wholly before the position (a re-sent compressed batch)
        }
        match filter.classify(&batch) {
            Ok(BatchAction::Deliver) => {}
            Ok(BatchAction::SkipAborted | BatchAction::SkipControl) => {
                position = position.max(next);
                continue;
            }
            Err(v) => {
                d.error = Some((position, v));
                return d;
            }
        }
        let start = d.records.len();
        let left = limit.saturating_sub(d.decompressed_bytes);
        if let Err(v) = decode_batch(&batch, &DecodeLimits::new(left), &mut d.records) {
            d.error = Some((position, v));
            return d;
        }
        if header
            .compression()
            .is_some_and(|c| c != crate::proto::records::Compression::None)
        {
            d.decompressed_bytes += d.records[start..]
                .iter()
                .map(|r| {
                    r.key.as_ref().map_or(0, |k| k.len())
                        + r.value.as_ref().map_or(0, |v| v.len())
                        + r.headers.len()
                })
                .sum::<usize>();
        }
        if header.base_offset < fetch_offset {
            let below = d.records[start..]
                .iter()
                .take_while(|r| r.offset < fetch_offset)
                .count();
            d.records.drain(start..start + below);
        }
        position = position.max(next);
    }
    d
}
