//! Decompression of a batch's records payload, with a hard cap on the output size.
//!
//! Every codec is pure Rust. Streaming codecs (gzip, LZ4, zstd) are read into a buffer that
//! never grows past `limit + 1` bytes; snappy declares its output sizes up front, so those are
//! checked against the limit before anything is allocated.

use std::io::{self, Read};

use bytes::Bytes;

use super::Compression;

/// Why a payload could not be decompressed.
#[derive(Debug)]
pub(super) enum CodecError {
    /// The output would exceed the limit.
    Limit,
    /// The payload is not valid for its codec.
    Corrupt(String),
}

/// The first 8 bytes of a stream written by Java's `SnappyOutputStream` (snappy-java's
/// "xerial" framing): `0x82 "SNAPPY" 0`, followed by an `i32` version and an `i32` compatible
/// version.
const XERIAL_MAGIC: [u8; 8] = [0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];
/// The xerial header: magic, version, compatible version.
const XERIAL_HEADER_LEN: usize = 16;
/// The oldest xerial stream version snappy-java reads.
const XERIAL_MIN_VERSION: i32 = 1;
/// The smallest first allocation for a streamed codec's output.
const MIN_GUESS: usize = 4 * 1024;
/// How much larger than the compressed payload the first allocation is.
const GUESS_RATIO: usize = 4;

/// Decompresses `payload` with `codec`, producing at most `limit` bytes. An uncompressed
/// payload is returned as it is, whatever its size: it allocates nothing.
pub(super) fn decompress(
    codec: Compression,
    payload: Bytes,
    limit: usize,
) -> Result<Bytes, CodecError> {
    let input = &payload[..];
    let out = match codec {
        Compression::None => return Ok(payload),
        Compression::Gzip => streamed(
            flate2::bufread::MultiGzDecoder::new(input),
            input.len(),
            limit,
        )?,
        Compression::Snappy => snappy(input, limit)?,
        Compression::Lz4 => lz4(input, limit)?,
        Compression::Zstd => zstd(input, limit)?,
    };
    Ok(Bytes::from(out))
}

/// Reads all of a decoder's output, at most `limit` bytes, into a new buffer.
fn streamed(reader: impl Read, input_len: usize, limit: usize) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::new();
    read_capped(reader, &mut out, input_len, limit)?;
    shrink(&mut out);
    Ok(out)
}

/// Appends everything `reader` produces to `out`, failing with [`CodecError::Limit`] as soon as
/// `out` would hold more than `limit` bytes.
///
/// The buffer grows by doubling, starting from a guess based on the input size, and its
/// capacity never exceeds `limit + 1`: the one extra byte tells "exactly `limit`" from "more".
fn read_capped(
    mut reader: impl Read,
    out: &mut Vec<u8>,
    input_len: usize,
    limit: usize,
) -> Result<(), CodecError> {
    let hard = limit.saturating_add(1);
    let mut filled = out.len();
    loop {
        if filled == out.len() {
            if filled >= hard {
                out.truncate(limit);
                return Err(CodecError::Limit);
            }
            let want = if filled == 0 {
                input_len.saturating_mul(GUESS_RATIO).max(MIN_GUESS)
            } else {
                filled.saturating_mul(2)
            };
            let new_len = want.max(filled.saturating_add(1)).min(hard);
            out.reserve_exact(new_len.saturating_sub(out.len()));
            out.resize(new_len, 0);
        }
        let dst = out.get_mut(filled..).unwrap_or_default();
        match reader.read(dst) {
            Ok(0) => {
                out.truncate(filled);
                return Ok(());
            }
            // `min` guards against a reader that claims more than it was given.
            Ok(n) => filled = filled.saturating_add(n).min(out.len()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                out.truncate(filled);
                return Err(CodecError::Corrupt(e.to_string()));
            }
        }
    }
}

/// Gives back memory when the doubling overshot by more than a quarter: the records keep the
/// buffer alive, and the consumer budgets memory by record bytes.
fn shrink(out: &mut Vec<u8>) {
    if out.capacity() - out.len() > out.len() / 4 {
        out.shrink_to_fit();
    }
}

/// LZ4 frame format: one or more frames.
fn lz4(input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::new();
    let mut decoder = lz4_flex::frame::FrameDecoder::new(input);
    loop {
        let before = decoder.get_ref().len();
        // The decoder reports the end of each frame as the end of input, and reads the next
        // frame's header when asked again.
        read_capped(&mut decoder, &mut out, input.len(), limit)?;
        let left = decoder.get_ref().len();
        if left == 0 {
            break;
        }
        if left == before {
            return Err(CodecError::Corrupt(format!(
                "lz4: {left} bytes after the last frame"
            )));
        }
    }
    shrink(&mut out);
    Ok(out)
}

/// zstd: one or more frames (skippable frames are skipped), as Java's `ZstdInputStream` reads.
fn zstd(input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
    use ruzstd::decoding::StreamingDecoder;
    use ruzstd::decoding::errors::{FrameDecoderError, ReadFrameHeaderError};

    let mut out = Vec::new();
    let mut rest = input;
    while !rest.is_empty() {
        match StreamingDecoder::new(&mut rest) {
            Ok(decoder) => read_capped(decoder, &mut out, input.len(), limit)?,
            Err(FrameDecoderError::ReadFrameHeaderError(ReadFrameHeaderError::SkipFrame {
                length,
                ..
            })) => {
                rest = usize::try_from(length)
                    .ok()
                    .and_then(|skip| rest.get(skip..))
                    .ok_or_else(|| {
                        CodecError::Corrupt("zstd skippable frame runs past the payload".into())
                    })?;
            }
            Err(e) => return Err(CodecError::Corrupt(format!("zstd: {e}"))),
        }
    }
    shrink(&mut out);
    Ok(out)
}

/// Snappy: Java's xerial framing when the payload starts with its magic, raw snappy otherwise
/// (what snappy-java's `SnappyInputStream` does).
fn snappy(input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
    if input.len() >= XERIAL_HEADER_LEN && input.starts_with(&XERIAL_MAGIC) {
        return xerial(input, limit);
    }
    let len = snap::raw::decompress_len(input)
        .map_err(|e| CodecError::Corrupt(format!("snappy: {e}")))?;
    if len > limit {
        return Err(CodecError::Limit);
    }
    let mut out = vec![0; len];
    let n = snap::raw::Decoder::new()
        .decompress(input, &mut out)
        .map_err(|e| CodecError::Corrupt(format!("snappy: {e}")))?;
    out.truncate(n);
    Ok(out)
}

/// Xerial framing: the header, then `[i32 length][raw snappy block]` chunks. A further header may
/// follow a chunk (concatenated streams). Two passes: sum the blocks' declared sizes and check
/// them against the limit, then decompress into one buffer of exactly that size.
fn xerial(input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
    let mut total: usize = 0;
    for block in XerialBlocks::new(input) {
        let len = snap::raw::decompress_len(block?)
            .map_err(|e| CodecError::Corrupt(format!("snappy block: {e}")))?;
        total = total.saturating_add(len);
        if total > limit {
            return Err(CodecError::Limit);
        }
    }
    let mut out = vec![0; total];
    let mut filled = 0;
    let mut decoder = snap::raw::Decoder::new();
    for block in XerialBlocks::new(input) {
        let dst = out.get_mut(filled..).unwrap_or_default();
        let n = decoder
            .decompress(block?, dst)
            .map_err(|e| CodecError::Corrupt(format!("snappy block: {e}")))?;
        filled = filled.saturating_add(n);
    }
    out.truncate(filled);
    Ok(out)
}

/// The compressed blocks of a xerial stream.
struct XerialBlocks<'a> {
    rest: &'a [u8],
    /// Set after an error, so the iterator ends.
    failed: bool,
}

impl<'a> XerialBlocks<'a> {
    fn new(input: &'a [u8]) -> Self {
        Self {
            rest: input,
            failed: false,
        }
    }

    /// Checks and skips a xerial header at the start of `rest`.
    fn header(&mut self) -> Result<(), CodecError> {
        let bad = || CodecError::Corrupt("snappy: bad xerial header".into());
        let (header, rest) = self
            .rest
            .split_first_chunk::<XERIAL_HEADER_LEN>()
            .ok_or_else(bad)?;
        let (magic, version) = header.split_first_chunk::<8>().ok_or_else(bad)?;
        let version = version
            .first_chunk::<4>()
            .map(|v| i32::from_be_bytes(*v))
            .ok_or_else(bad)?;
        if *magic != XERIAL_MAGIC || version < XERIAL_MIN_VERSION {
            return Err(bad());
        }
        self.rest = rest;
        Ok(())
    }

    fn next_block(&mut self) -> Result<Option<&'a [u8]>, CodecError> {
        loop {
            if self.rest.is_empty() {
                return Ok(None);
            }
            if self.rest.starts_with(&XERIAL_MAGIC[..4]) {
                // A chunk length never starts with 0x82 (it would be negative): another stream.
                self.header()?;
                continue;
            }
            let (len, rest) = self.rest.split_first_chunk::<4>().ok_or_else(|| {
                CodecError::Corrupt("snappy: truncated xerial block length".into())
            })?;
            let len = u32::from_be_bytes(*len);
            let (block, rest) = usize::try_from(len)
                .ok()
                .and_then(|len| rest.split_at_checked(len))
                .ok_or_else(|| {
                    CodecError::Corrupt(format!(
                        "snappy: xerial block of {len} bytes runs past the payload"
                    ))
                })?;
            self.rest = rest;
            return Ok(Some(block));
        }
    }
}

impl<'a> Iterator for XerialBlocks<'a> {
    type Item = Result<&'a [u8], CodecError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        match self.next_block() {
            Ok(block) => block.map(Ok),
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}
