//! Turning one partition's fetched bytes into what is handed to the application: decode,
//! drop what is below the fetch position, and skip transaction markers and (under
//! `read_committed`) aborted transactions.
//!
//! A chunk is decoded in pieces of about `soft_cap` decompressed bytes, so a highly compressed
//! fetch never inflates into memory all at once: memory held is the fetched bytes plus one
//! piece.

use bytes::Bytes;

use crate::config::IsolationLevel;
use crate::error::ProtocolViolation;
use crate::proto::fetch::Chunk;
use crate::proto::records::{
    AbortedTransactions, BatchAction, BatchIter, Compression, DecodeLimits, decode_batch,
};
use crate::types::{Entry, Records, TopicPartition};

/// One piece of a chunk, ready to hand out.
#[derive(Debug, Default)]
pub(crate) struct Piece {
    /// Records for the application, in offset order.
    pub(crate) records: Records,
    /// Bytes of decompressed payload the records point into (0 for uncompressed data).
    pub(crate) decompressed_bytes: usize,
    /// The position once this piece is handed out.
    pub(crate) next_offset: i64,
    /// A malformed batch: nothing from it on was handed out, and the position stays at its
    /// start (`next_offset`).
    pub(crate) error: Option<ProtocolViolation>,
}

/// Where decoding of one chunk stands.
#[derive(Debug)]
pub(crate) struct ChunkCursor {
    pub(crate) tp: TopicPartition,
    pub(crate) generation: u64,
    /// Fetched bytes this chunk counts against the budget until it is done.
    pub(crate) raw_len: usize,
    fetch_offset: i64,
    /// The position after the whole chunk.
    end_offset: i64,
    /// The position after what was decoded so far.
    position: i64,
    batches: BatchIter,
    filter: AbortedTransactions,
    done: bool,
}

impl ChunkCursor {
    pub(crate) fn new(chunk: Chunk, isolation: IsolationLevel) -> Self {
        let filter = match isolation {
            IsolationLevel::ReadCommitted => AbortedTransactions::new(chunk.aborted),
            // Only transaction markers are skipped; aborted records are delivered, as in Java.
            IsolationLevel::ReadUncommitted => AbortedTransactions::new([]),
        };
        Self {
            tp: chunk.tp,
            generation: chunk.generation,
            raw_len: chunk.records.len(),
            fetch_offset: chunk.fetch_offset,
            end_offset: chunk.next_offset,
            position: chunk.fetch_offset,
            batches: BatchIter::new(chunk.records),
            filter,
            done: false,
        }
    }

    /// True once every batch was decoded (or an error ended the chunk).
    pub(crate) fn is_done(&self) -> bool {
        self.done
    }

    /// Decodes batches until the piece holds `soft_cap` decompressed bytes (at least one batch
    /// with records) or the chunk ends. `limits` cap one batch's decompressed size and say
    /// whether CRCs are checked.
    pub(crate) fn next_piece(&mut self, limits: &DecodeLimits, soft_cap: usize) -> Piece {
        let mut p = Piece::default();
        while !self.done {
            let Some(item) = self.batches.next() else {
                self.done = true;
                self.position = self.position.max(self.end_offset);
                break;
            };
            let batch = match item {
                Ok(b) => b,
                Err(v) => {
                    self.fail(&mut p, v);
                    break;
                }
            };
            let header = *batch.header();
            let next = header.next_offset();
            if next <= self.fetch_offset {
                continue; // wholly before the position (a re-sent compressed batch)
            }
            match self.filter.classify(&batch) {
                Ok(BatchAction::Deliver) => {}
                Ok(BatchAction::SkipAborted | BatchAction::SkipControl) => {
                    self.position = self.position.max(next);
                    continue;
                }
                Err(v) => {
                    self.fail(&mut p, v);
                    break;
                }
            }
            let start = p.records.entries.len();
            if let Err(v) = decode_batch(&batch, limits, &mut p.records) {
                self.fail(&mut p, v);
                break;
            }
            if header.compression().is_some_and(|c| c != Compression::None)
                && p.records.entries.len() > start
            {
                // The records hold the whole decompressed payload.
                p.decompressed_bytes += p.records.segments.last().map_or(0, |s| s.bytes.len());
            }
            if header.base_offset < self.fetch_offset {
                let below = p.records.entries[start..]
                    .iter()
                    .take_while(|r| r.offset < self.fetch_offset)
                    .count();
                p.records.entries.drain(start..start + below);
            }
            self.position = self.position.max(next);
            if !p.records.is_empty() && p.decompressed_bytes + payload(&p.records) >= soft_cap {
                break;
            }
        }
        p.next_offset = self.position;
        p
    }

    fn fail(&mut self, p: &mut Piece, v: ProtocolViolation) {
        self.done = true;
        p.error = Some(v);
        // Let an unread rest of the chunk go: the position stays at the bad batch.
        self.batches = BatchIter::new(Bytes::new());
    }
}

/// Memory of the record entries themselves (their keys and values are counted elsewhere: the
/// fetched chunk's bytes, or `decompressed_bytes`).
fn payload(records: &Records) -> usize {
    std::mem::size_of_val::<[Entry]>(&records.entries)
}
