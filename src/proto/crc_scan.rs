//! Checking the CRC of a Fetch response's record batches while the response arrives.
//!
//! A response of several MiB is decoded after its last byte is read, by which time its first
//! bytes have left the cache: the CRC pass then costs a fetch from memory per cache line, more
//! than the arithmetic. The read loop instead hands each new part of the frame to a
//! [`CrcScan`], which checks every batch that is complete by then, while its bytes are still
//! warm from the kernel's copy, and records where each checked batch starts and its CRC. The
//! decoder skips the CRC of a batch only if one was recorded at that very position with that
//! very CRC ([`Checked`]): whatever the scan did or missed, a batch whose CRC was not computed
//! over its own bytes is checked as before.

use bytes::Bytes;
use kafka_protocol::messages::ApiKey;

use crate::proto::guard;
use crate::proto::records::{
    BATCH_HEADER_LEN, CRC_OFFSET, CRC_START, LOG_OVERHEAD, MAGIC_OFFSET, MAGIC_V2, batch_crc32c,
};

/// Where the scan of one response stands.
#[derive(Debug)]
pub(crate) struct CrcScan {
    version: i16,
    /// The records fields seen so far, `(start, len)` in the frame. A field found in a prefix
    /// of the frame stays the same as the frame grows (its length prefix is in), so they are
    /// looked for again only once every one found so far is done with.
    fields: Vec<(usize, usize)>,
    /// The field being walked: the earlier ones are done.
    field: usize,
    /// The next batch's position in the frame.
    at: usize,
    checked: Vec<(u32, u32)>,
}

impl CrcScan {
    /// A scan of a Fetch response body at `version`.
    pub(crate) fn fetch(version: i16) -> Self {
        Self {
            version,
            fields: Vec::new(),
            field: 0,
            at: 0,
            checked: Vec::new(),
        }
    }

    /// Checks the batches that `frame`, the frame received so far (after its length prefix;
    /// it only grows from call to call), holds complete and that were not checked before.
    pub(crate) fn advance(&mut self, frame: &[u8]) {
        loop {
            if self.field >= self.fields.len() {
                // Walking the response's structure again is needed only for fields that begin
                // in bytes that came since: while one spans many reads (one partition's
                // megabyte), it is not walked again per read.
                self.fields.clear();
                guard::bytes_fields(ApiKey::Fetch, self.version, frame, &mut self.fields);
            }
            let Some(&(start, len)) = self.fields.get(self.field) else {
                return;
            };
            let end = start.saturating_add(len);
            self.at = self.at.max(start);
            if !self.walk(frame, end) {
                return;
            }
            self.field += 1;
        }
    }

    /// Walks the batches of a records field ending at `end` (in the frame) from `self.at`:
    /// `true` once the field is done with, `false` if it waits for more bytes.
    fn walk(&mut self, frame: &[u8], end: usize) -> bool {
        loop {
            if end - self.at < BATCH_HEADER_LEN {
                // No whole batch fits any more: a partial last batch, or nothing.
                return true;
            }
            let Some(head) = frame.get(self.at..self.at + BATCH_HEADER_LEN) else {
                return false;
            };
            let batch_length = i32::from_be_bytes([head[8], head[9], head[10], head[11]]);
            let Some(total) = usize::try_from(batch_length)
                .ok()
                .and_then(|l| l.checked_add(LOG_OVERHEAD))
                .filter(|&t| t >= BATCH_HEADER_LEN && t <= end - self.at)
            else {
                // Malformed or cut by the broker: the decoder has the last word.
                return true;
            };
            if i8::from_be_bytes([head[MAGIC_OFFSET]]) != MAGIC_V2 {
                return true;
            }
            let Some(batch) = frame.get(self.at..self.at + total) else {
                return false;
            };
            let stored = u32::from_be_bytes([
                batch[CRC_OFFSET],
                batch[CRC_OFFSET + 1],
                batch[CRC_OFFSET + 2],
                batch[CRC_OFFSET + 3],
            ]);
            if batch_crc32c(&batch[CRC_START..]) == stored
                && let Ok(at) = u32::try_from(self.at)
            {
                self.checked.push((at, stored));
            }
            self.at += total;
        }
    }

    /// What was checked, for the frame the scan read, now `frame`.
    pub(crate) fn finish(self, frame: &Bytes) -> Checked {
        Checked {
            base: frame.as_ptr() as usize,
            len: frame.len(),
            batches: self.checked,
        }
    }
}

/// The batches of one response whose CRC was checked on arrival: `(position in the frame,
/// CRC)`, in order of position.
#[derive(Debug, Default, Clone)]
pub(crate) struct Checked {
    /// Where the frame's bytes are, to place a slice of them.
    base: usize,
    len: usize,
    batches: Vec<(u32, u32)>,
}

impl Checked {
    /// The checked batches within `records`, a slice of the frame, as positions in `records`;
    /// nothing if `records` is not a slice of the frame.
    pub(crate) fn within(&self, records: &Bytes) -> Vec<(u32, u32)> {
        let start = (records.as_ptr() as usize).wrapping_sub(self.base);
        let Some(end) = start.checked_add(records.len()) else {
            return Vec::new();
        };
        if self.batches.is_empty() || end > self.len {
            return Vec::new();
        }
        let (Ok(start), Ok(end)) = (u32::try_from(start), u32::try_from(end)) else {
            return Vec::new();
        };
        let from = self.batches.partition_point(|&(at, _)| at < start);
        self.batches[from..]
            .iter()
            .take_while(|&&(at, _)| at < end)
            .map(|&(at, crc)| (at - start, crc))
            .collect()
    }
}

#[cfg(test)]
mod tests;
