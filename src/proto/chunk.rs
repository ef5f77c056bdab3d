//! Turning one partition's fetched bytes into what is handed to the application: decode,
//! drop what is below the fetch position, and skip transaction markers and (under
//! `read_committed`) aborted transactions.
//!
//! A chunk is decoded in pieces of whole batches, each ending once it holds about `soft_cap`
//! decompressed bytes or [`PIECE_RECORDS`] records, so a highly compressed fetch never inflates
//! into memory all at once (memory held is the fetched bytes plus one piece), and what the
//! application reads was decoded just before.

use bytes::Bytes;

use crate::config::IsolationLevel;
use crate::error::ProtocolViolation;
use crate::proto::fetch::{Chunk, Lease};
use crate::proto::records::{
    AbortedTransactions, BatchAction, BatchIter, Compression, DecodeLimits, decode_batch_before,
};
use crate::types::{Entry, Records, TopicPartition};

/// The records a piece holds before it is cut, at the end of the batch that reaches it. Small
/// enough that a piece's entries (16 KiB) and the bytes they point into are still in the core's
/// caches when the application's loop reads them right after decoding, and that the first
/// records of a fetch are handed out after one piece is decoded rather than the whole fetch.
/// `Consumer::poll`'s docs quote this number ("about 512 records at a time"); change both.
pub(crate) const PIECE_RECORDS: usize = 512;

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
    /// The chunk's length in bytes.
    pub(crate) raw_len: usize,
    fetch_offset: i64,
    /// The position after the whole chunk.
    end_offset: i64,
    /// The position after what was decoded so far.
    position: i64,
    batches: BatchIter,
    /// Batches whose CRC the read loop checked: `(position in the chunk, CRC)`, in order.
    checked: Vec<(u32, u32)>,
    /// The first of `checked` not yet passed.
    next_checked: usize,
    filter: AbortedTransactions,
    done: bool,
    /// The chunk's lease, until the consumer takes it with the last piece.
    lease: Option<Lease>,
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
            checked: chunk.checked,
            next_checked: 0,
            filter,
            done: false,
            lease: chunk.lease,
        }
    }

    /// [`Chunk::detach`] for the rest of the chunk.
    pub(crate) fn detach(&mut self, lease: impl FnOnce(usize) -> Lease) {
        self.batches.detach();
        self.lease = Some(lease(self.batches.remaining_bytes()));
    }

    /// The chunk's lease, once it is done (`None` before, and after the first call): the
    /// consumer keeps it with the last piece until that piece is handed out.
    pub(crate) fn take_lease(&mut self) -> Option<Lease> {
        if self.done { self.lease.take() } else { None }
    }

    /// True once every batch was decoded (or an error ended the chunk).
    pub(crate) fn is_done(&self) -> bool {
        self.done
    }

    /// Decodes batches until the piece holds `soft_cap` decompressed bytes or `max_records`
    /// records (at least one batch with records), or the chunk ends. A batch is not split, so
    /// its last batch may take a piece past either. `limits` cap one batch's decompressed size
    /// and say whether CRCs are checked.
    pub(crate) fn next_piece(
        &mut self,
        limits: &DecodeLimits,
        soft_cap: usize,
        max_records: usize,
    ) -> Piece {
        let mut p = Piece::default();
        // Room for the piece's records at once, rather than growing batch by batch.
        p.records.entries.reserve(
            self.batches
                .records_ahead((soft_cap / size_of::<Entry>() + 1).min(max_records)),
        );
        while !self.done {
            let at = self.raw_len - self.batches.remaining_bytes();
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
            let segments = p.records.segments.len();
            let limits = if self.was_checked(at, header.crc) {
                limits.with_check_crc(false)
            } else {
                *limits
            };
            if let Err(v) =
                decode_batch_before(&batch, &limits, &mut p.records, self.batches.rest())
            {
                self.fail(&mut p, v);
                break;
            }
            if header.base_offset < self.fetch_offset {
                // The position as an offset delta of this batch (positive here).
                let first = self.fetch_offset - header.base_offset;
                let below = p.records.entries[start..]
                    .iter()
                    .take_while(|r| i64::from(r.offset_delta) < first)
                    .count();
                p.records.entries.drain(start..start + below);
            }
            if p.records.entries.len() == start {
                // Nothing of this batch is handed out (compaction left only records below the
                // position): its payload is not kept either.
                p.records.segments.truncate(segments);
            } else if header.compression().is_some_and(|c| c != Compression::None) {
                // The records hold the whole decompressed payload.
                p.decompressed_bytes += p.records.segments.last().map_or(0, |s| s.bytes.len());
            }
            self.position = self.position.max(next);
            if !p.records.is_empty()
                && (p.records.len() >= max_records
                    || p.decompressed_bytes + payload(&p.records) >= soft_cap)
            {
                break;
            }
        }
        p.next_offset = self.position;
        p
    }

    /// True if the read loop checked the CRC of the batch at `at` and found `crc`: the very
    /// bytes the decoder would check, so their CRC need not be computed again.
    fn was_checked(&mut self, at: usize, crc: u32) -> bool {
        while let Some(&(pos, stored)) = self.checked.get(self.next_checked) {
            match (pos as usize).cmp(&at) {
                std::cmp::Ordering::Less => self.next_checked += 1,
                std::cmp::Ordering::Equal => {
                    self.next_checked += 1;
                    return stored == crc;
                }
                std::cmp::Ordering::Greater => return false,
            }
        }
        false
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

#[cfg(test)]
mod tests {
    use kafka_protocol::records::Compression as KpCompression;

    use super::*;
    use crate::proto::records::tests::{LAST_OFFSET_DELTA_OFFSET, encode, patched, record};

    /// Offsets 0..=9 were written in one batch and compaction kept 0..=2: the batch's last
    /// offset delta still says 9.
    fn compacted(codec: KpCompression) -> Bytes {
        let value = [7u8; 500];
        let records: Vec<_> = (0..3)
            .map(|offset| record(offset, 1_700_000_000_000 + offset, None, Some(&value), &[]))
            .collect();
        patched(&encode(&records, codec), |b| {
            b[LAST_OFFSET_DELTA_OFFSET..LAST_OFFSET_DELTA_OFFSET + 4]
                .copy_from_slice(&9i32.to_be_bytes());
        })
    }

    fn piece_from(records: Bytes, fetch_offset: i64, next_offset: i64) -> Piece {
        piece_checked(records, Vec::new(), fetch_offset, next_offset)
    }

    fn piece_checked(
        records: Bytes,
        checked: Vec<(u32, u32)>,
        fetch_offset: i64,
        next_offset: i64,
    ) -> Piece {
        let mut cursor = cursor_over(records, checked, fetch_offset, next_offset);
        let piece = cursor.next_piece(&DecodeLimits::default(), usize::MAX, usize::MAX);
        assert!(cursor.is_done());
        piece
    }

    /// A cursor over one chunk of partition t-0 (read_uncommitted).
    fn cursor_over(
        records: Bytes,
        checked: Vec<(u32, u32)>,
        fetch_offset: i64,
        next_offset: i64,
    ) -> ChunkCursor {
        let chunk = Chunk {
            checked,
            tp: TopicPartition::new("t", 0),
            generation: 0,
            fetch_offset,
            records,
            next_offset,
            aborted: Vec::new(),
            lease: None,
        };
        ChunkCursor::new(chunk, IsolationLevel::ReadUncommitted)
    }

    /// An uncompressed batch of the three records `base..base + 3`.
    fn three_records(base: i64) -> Bytes {
        let records: Vec<_> = (base..base + 3)
            .map(|o| record(o, 1_000 + o, None, Some(b"v"), &[]))
            .collect();
        encode(&records, KpCompression::None)
    }

    /// Two batches of three records from offset 0, the second's stored CRC wrong (its records
    /// intact), and the CRC each now holds.
    fn second_crc_wrong() -> (Bytes, usize, [u32; 2]) {
        let first = three_records(0);
        let mut second = three_records(3).to_vec();
        second[17] ^= 0x55;
        let crc = |b: &[u8]| u32::from_be_bytes(b[17..21].try_into().unwrap());
        let crcs = [crc(&first), crc(&second)];
        let at = first.len();
        let mut all = first.to_vec();
        all.extend_from_slice(&second);
        (Bytes::from(all), at, crcs)
    }

    /// A batch the read loop checked at that position with that CRC is not checked again: here
    /// one whose CRC is wrong, so the skip shows.
    #[test]
    fn a_batch_checked_on_arrival_is_not_checked_again() {
        let (records, at, crcs) = second_crc_wrong();
        let at = at as u32;
        let piece = piece_checked(records.clone(), vec![(0, crcs[0]), (at, crcs[1])], 0, 6);
        assert!(piece.error.is_none(), "{:?}", piece.error);
        assert_eq!(piece.records.len(), 6);
        // Without the entry the CRC is checked, and refused.
        let piece = piece_checked(records, vec![(0, crcs[0])], 0, 6);
        assert!(
            matches!(
                piece.error,
                Some(ProtocolViolation::Crc { base_offset: 3, .. })
            ),
            "{:?}",
            piece.error
        );
        assert_eq!(piece.records.len(), 3);
    }

    /// An entry at another position, or with another CRC than the batch's header holds, does
    /// not count for the batch.
    #[test]
    fn a_check_counts_only_at_its_position_with_its_crc() {
        let (records, at, crcs) = second_crc_wrong();
        let at = at as u32;
        for checked in [
            vec![(at, crcs[1] ^ 1)],
            vec![(at - 1, crcs[1])],
            vec![(at + 1, crcs[1])],
            vec![(0, crcs[1])],
        ] {
            let piece = piece_checked(records.clone(), checked.clone(), 0, 6);
            assert!(
                matches!(
                    piece.error,
                    Some(ProtocolViolation::Crc { base_offset: 3, .. })
                ),
                "{checked:?}: {:?}",
                piece.error
            );
        }
    }

    #[test]
    fn a_batch_with_every_record_below_the_position_keeps_no_payload() {
        for codec in [KpCompression::None, KpCompression::Lz4] {
            // The position is 5.
            let piece = piece_from(compacted(codec), 5, 10);
            assert!(piece.error.is_none(), "{codec:?}: {:?}", piece.error);
            assert!(piece.records.is_empty(), "{codec:?}");
            assert!(piece.records.segments.is_empty(), "{codec:?}");
            assert_eq!(piece.decompressed_bytes, 0, "{codec:?}");
            assert_eq!(piece.next_offset, 10, "{codec:?}");
        }
    }

    #[test]
    fn a_batch_with_records_at_the_position_keeps_its_payload() {
        for codec in [KpCompression::None, KpCompression::Lz4] {
            // The position is 2.
            let piece = piece_from(compacted(codec), 2, 10);
            assert!(piece.error.is_none(), "{codec:?}: {:?}", piece.error);
            let offsets: Vec<i64> = piece.records.iter().map(|r| r.offset).collect();
            assert_eq!(offsets, [2], "{codec:?}");
            assert_eq!(piece.records.segments.len(), 1, "{codec:?}");
            let payload = piece.records.segments[0].bytes.len();
            match codec {
                KpCompression::None => assert_eq!(piece.decompressed_bytes, 0),
                _ => assert_eq!(piece.decompressed_bytes, payload, "{codec:?}"),
            }
            assert_eq!(piece.next_offset, 10, "{codec:?}");
        }
    }

    /// A piece ends at the end of the batch that brings it to `max_records` records; a batch is
    /// never split, so a batch larger than the cap is a piece of its own.
    #[test]
    fn a_piece_ends_with_the_batch_that_reaches_the_record_cap() {
        let records = Bytes::from([three_records(0), three_records(3), three_records(6)].concat());
        let cases: [(usize, &[(i64, i64)]); 4] = [
            (4, &[(0, 6), (6, 9)]),
            (3, &[(0, 3), (3, 6), (6, 9)]),
            (1, &[(0, 3), (3, 6), (6, 9)]),
            (7, &[(0, 9)]),
        ];
        for (max_records, want) in cases {
            let mut cursor = cursor_over(records.clone(), Vec::new(), 0, 9);
            let mut pieces = Vec::new();
            while !cursor.is_done() {
                let piece = cursor.next_piece(&DecodeLimits::default(), usize::MAX, max_records);
                assert!(piece.error.is_none(), "{max_records}: {:?}", piece.error);
                let offsets: Vec<i64> = piece.records.iter().map(|r| r.offset).collect();
                if offsets.is_empty() {
                    assert_eq!(piece.next_offset, 9, "{max_records}: only the end is empty");
                    continue;
                }
                assert_eq!(
                    piece.next_offset,
                    offsets[offsets.len() - 1] + 1,
                    "{max_records}"
                );
                pieces.push(offsets);
            }
            let want: Vec<Vec<i64>> = want.iter().map(|&(a, b)| (a..b).collect()).collect();
            assert_eq!(pieces, want, "max_records {max_records}");
        }
    }
}
