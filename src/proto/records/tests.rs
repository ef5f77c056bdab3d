//! Batches are built with kafka-protocol's `RecordBatchEncoder` (every codec) and decoded here;
//! hostile variants are patched bytes with their CRC fixed, so the checks behind the CRC run.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression as KpCompression, Record as KpRecord, RecordBatchDecoder, RecordBatchEncoder,
    RecordEncodeOptions, TimestampType as KpTimestampType,
};

use super::*;
use crate::types::Record;

const CODECS: [(KpCompression, Compression); 5] = [
    (KpCompression::None, Compression::None),
    (KpCompression::Gzip, Compression::Gzip),
    (KpCompression::Snappy, Compression::Snappy),
    (KpCompression::Lz4, Compression::Lz4),
    (KpCompression::Zstd, Compression::Zstd),
];

const ATTRIBUTES_OFFSET: usize = 21;
const RECORD_COUNT_OFFSET: usize = 57;
pub(crate) const LAST_OFFSET_DELTA_OFFSET: usize = 23;

type Header<'a> = (&'a str, Option<&'a [u8]>);

pub(crate) fn record(
    offset: i64,
    timestamp: i64,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: &[Header<'_>],
) -> KpRecord {
    let mut record = KpRecord {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: 7,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: KpTimestampType::Creation,
        offset,
        // Consecutive sequences keep the records in one batch.
        sequence: i32::try_from(offset).unwrap(),
        timestamp,
        key: key.map(Bytes::copy_from_slice),
        value: value.map(Bytes::copy_from_slice),
        headers: Default::default(),
    };
    for (name, value) in headers {
        record.headers.insert(
            StrBytes::from_string((*name).to_owned()),
            value.map(Bytes::copy_from_slice),
        );
    }
    record
}

/// A mix of what records can hold: keys, null keys, null and empty values, headers with null
/// values, and timestamps before and after the first.
fn sample_records(base_offset: i64) -> Vec<KpRecord> {
    vec![
        record(
            base_offset,
            1_700_000_000_000,
            Some(b"k0"),
            Some(b"value zero"),
            &[],
        ),
        record(
            base_offset + 1,
            1_700_000_000_005,
            None,
            Some(b"no key"),
            &[("h1", Some(b"v1"))],
        ),
        record(
            base_offset + 2,
            1_699_999_999_990,
            Some(b"tombstone"),
            None,
            &[],
        ),
        record(
            base_offset + 3,
            1_700_000_000_001,
            Some(b""),
            Some(b""),
            &[("a", Some(b"")), ("null", None), ("c", Some(b"ccc"))],
        ),
        record(
            base_offset + 4,
            1_700_000_000_002,
            Some(&[0xff; 300]),
            Some(&[7; 1000]),
            &[],
        ),
    ]
}

pub(crate) fn encode(records: &[KpRecord], codec: KpCompression) -> Bytes {
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        records,
        &RecordEncodeOptions {
            version: 2,
            compression: codec,
        },
    )
    .unwrap();
    buf.freeze()
}

/// Recomputes a patched batch's CRC.
fn fix_crc(batch: &mut [u8]) {
    let crc = crc32c::crc32c(&batch[CRC_START..]);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
}

/// Sets a batch's length field to its actual length.
fn fix_length(batch: &mut [u8]) {
    let len = i32::try_from(batch.len() - LOG_OVERHEAD).unwrap();
    batch[8..12].copy_from_slice(&len.to_be_bytes());
}

/// Applies `f` to a copy of `batch`, then fixes its length and CRC.
pub(crate) fn patched(batch: &[u8], f: impl FnOnce(&mut Vec<u8>)) -> Bytes {
    let mut bytes = batch.to_vec();
    f(&mut bytes);
    fix_length(&mut bytes);
    fix_crc(&mut bytes);
    Bytes::from(bytes)
}

fn set_attributes(batch: &mut [u8], attributes: i16) {
    batch[ATTRIBUTES_OFFSET..ATTRIBUTES_OFFSET + 2].copy_from_slice(&attributes.to_be_bytes());
}

/// Replaces the records payload with `payload` and sets the codec.
fn with_payload(batch: &[u8], codec: i16, payload: &[u8]) -> Bytes {
    patched(batch, |b| {
        b.truncate(BATCH_HEADER_LEN);
        b.extend_from_slice(payload);
        let attributes = i16::from_be_bytes([b[21], b[22]]);
        set_attributes(b, (attributes & !CODEC_MASK) | codec);
    })
}

fn split(records: Bytes) -> (Vec<RecordBatch>, usize) {
    let mut iter = BatchIter::new(records);
    let batches = iter.by_ref().collect::<Result<Vec<_>, _>>().unwrap();
    (batches, iter.remaining_bytes())
}

fn decode_all(records: Bytes) -> Result<Records, ProtocolViolation> {
    let mut out = Records::new();
    for batch in BatchIter::new(records) {
        decode_batch(&batch?, &DecodeLimits::default(), &mut out)?;
    }
    Ok(out)
}

fn decode_one(batch: Bytes) -> Result<Records, ProtocolViolation> {
    let mut out = Records::new();
    decode_batch(
        &RecordBatch::new(batch)?,
        &DecodeLimits::default(),
        &mut out,
    )?;
    Ok(out)
}

fn headers_of<'a>(record: &Record<'a>) -> Vec<(&'a [u8], Option<&'a [u8]>)> {
    record.headers().collect()
}

fn assert_matches(decoded: &Records, expected: &[KpRecord]) {
    assert_eq!(decoded.len(), expected.len());
    for (got, want) in decoded.iter().zip(expected) {
        assert_eq!(got.offset, want.offset);
        assert_eq!(got.timestamp, want.timestamp);
        assert_eq!(got.timestamp_type, TimestampType::CreateTime);
        assert_eq!(got.key, want.key.as_deref());
        assert_eq!(got.value, want.value.as_deref());
        assert_eq!(got.leader_epoch, want.partition_leader_epoch);
        let want_headers: Vec<_> = want
            .headers
            .iter()
            .map(|(k, v)| (k.as_bytes(), v.as_deref()))
            .collect();
        assert_eq!(got.header_count(), want_headers.len());
        assert_eq!(headers_of(&got), want_headers);
    }
}

fn points_into(slice: &[u8], buf: &[u8]) -> bool {
    let range = buf.as_ptr_range();
    range.contains(&slice.as_ptr()) && slice.as_ptr_range().end <= range.end
}

#[test]
fn round_trip_every_codec() {
    for (kp, codec) in CODECS {
        let expected = sample_records(1000);
        let bytes = encode(&expected, kp);
        let (batches, trailing) = split(bytes.clone());
        assert_eq!((batches.len(), trailing), (1, 0), "{codec:?}");
        let header = batches[0].header();
        assert_eq!(header.compression(), Some(codec));
        assert_eq!(header.base_offset, 1000);
        assert_eq!(header.last_offset_delta, 4);
        assert_eq!(header.next_offset(), 1005);
        assert_eq!(header.last_offset(), 1004);
        assert_eq!(header.record_count, 5);
        assert_eq!(header.size(), bytes.len());
        assert_eq!(header.partition_leader_epoch, 7);
        assert_eq!(header.base_timestamp, 1_699_999_999_990);
        assert_eq!(header.max_timestamp, 1_700_000_000_005);
        assert_eq!(header.timestamp_type(), TimestampType::CreateTime);
        assert!(!header.is_transactional() && !header.is_control() && !header.has_producer_id());

        let mut out = Records::new();
        decode_batch(&batches[0], &DecodeLimits::default(), &mut out).unwrap();
        assert_matches(&out, &expected);
    }
}

#[test]
fn decode_appends_to_out() {
    let first = encode(&sample_records(0), KpCompression::None);
    let second = encode(&sample_records(5), KpCompression::Lz4);
    let mut all = BytesMut::new();
    all.put_slice(&first);
    all.put_slice(&second);
    let decoded = decode_all(all.freeze()).unwrap();
    let offsets: Vec<i64> = decoded.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, (0..10).collect::<Vec<_>>());
}

#[test]
fn agrees_with_kafka_protocol_decoder() {
    for (kp, codec) in CODECS {
        let bytes = encode(&sample_records(42), kp);
        let theirs = RecordBatchDecoder::decode(&mut bytes.clone())
            .unwrap()
            .records;
        let ours = decode_all(bytes).unwrap();
        assert_eq!(ours.len(), theirs.len(), "{codec:?}");
        for (a, b) in ours.iter().zip(&theirs) {
            assert_eq!(a.offset, b.offset);
            assert_eq!(a.timestamp, b.timestamp);
            assert_eq!(a.key, b.key.as_deref());
            assert_eq!(a.value, b.value.as_deref());
            assert_eq!(a.leader_epoch, b.partition_leader_epoch);
            let theirs: Vec<_> = b
                .headers
                .iter()
                .map(|(k, v)| (k.as_bytes(), v.as_deref()))
                .collect();
            assert_eq!(headers_of(&a), theirs);
        }
    }
}

#[test]
fn uncompressed_records_are_slices_of_the_input() {
    let bytes = encode(&sample_records(0), KpCompression::None);
    let decoded = decode_all(bytes.clone()).unwrap();
    for record in &decoded {
        for part in [&record.key, &record.value].into_iter().flatten() {
            if !part.is_empty() {
                assert!(points_into(part, &bytes));
            }
        }
        for (name, value) in record.headers() {
            assert!(name.is_empty() || points_into(name, &bytes));
            assert!(value.is_none_or(|v| v.is_empty() || points_into(v, &bytes)));
        }
    }
    let (batches, _) = split(bytes.clone());
    assert!(points_into(batches[0].as_bytes(), &bytes));

    let compressed = encode(&sample_records(0), KpCompression::Zstd);
    let decoded = decode_all(compressed.clone()).unwrap();
    let value = decoded.first().and_then(|r| r.value).unwrap();
    assert!(!points_into(value, &compressed));
    // An owned handle shares the decoded bytes.
    let record = decoded.first().unwrap();
    assert_eq!(record.value_bytes().unwrap().as_ptr(), value.as_ptr());
    assert_eq!(
        record.key_bytes().as_deref(),
        record.key,
        "key_bytes is the key"
    );
}

#[test]
fn partial_tail_is_ignored() {
    let batches: Vec<Bytes> = (0..3)
        .map(|i| encode(&sample_records(i * 5), KpCompression::None))
        .collect();
    let mut all = BytesMut::new();
    for b in &batches {
        all.put_slice(b);
    }
    let all = all.freeze();
    let third = batches[2].len();
    for cut in [1, 10, third - 12, third - 11, third - 20, third - 1] {
        let (got, trailing) = split(all.slice(..all.len() - cut));
        assert_eq!(got.len(), 2, "cut {cut}");
        assert_eq!(trailing, third - cut, "cut {cut}");
    }
    // The first batch is incomplete and nothing is complete: the batch is too large to fetch.
    let (got, trailing) = split(all.slice(..batches[0].len() - 1));
    assert!(got.is_empty());
    assert_eq!(trailing, batches[0].len() - 1);
    let (got, trailing) = split(Bytes::new());
    assert_eq!((got.len(), trailing), (0, 0));
    // A complete batch is taken as one by `RecordBatch::new`, a partial one is not.
    assert!(RecordBatch::new(batches[0].clone()).is_ok());
    assert!(RecordBatch::new(batches[0].slice(..batches[0].len() - 1)).is_err());
    assert!(RecordBatch::new(all.clone()).is_err());
}

#[test]
fn crc_mismatch_is_detected() {
    let bytes = encode(&sample_records(3), KpCompression::None);
    let mut corrupt = bytes.to_vec();
    let last = corrupt.len() - 5;
    corrupt[last] ^= 0x01;
    let err = decode_all(Bytes::from(corrupt)).unwrap_err();
    assert!(
        matches!(err, ProtocolViolation::Crc { base_offset: 3, stored, computed } if stored != computed)
    );
    // Headers are covered too (from the attributes on).
    let mut corrupt = bytes.to_vec();
    corrupt[ATTRIBUTES_OFFSET + 1] ^= 0x08;
    assert!(matches!(
        decode_all(Bytes::from(corrupt)),
        Err(ProtocolViolation::Crc { .. })
    ));
}

#[test]
fn unsupported_magic_is_an_error() {
    let bytes = encode(&sample_records(9), KpCompression::None);
    for magic in [0u8, 1, 3, 0xff] {
        let mut old = bytes.to_vec();
        old[MAGIC_OFFSET] = magic;
        let expected = ProtocolViolation::UnsupportedMagic {
            base_offset: 9,
            magic: i8::from_be_bytes([magic]),
        };
        let mut iter = BatchIter::new(Bytes::from(old.clone()));
        assert_eq!(iter.next(), Some(Err(expected.clone())));
        assert_eq!(iter.next(), None, "the iterator ends after an error");
        // Checked as soon as the magic byte is there, as Java does.
        let mut iter = BatchIter::new(Bytes::from(old).slice(..20));
        assert_eq!(iter.next(), Some(Err(expected)));
    }
    // A legacy message set may be shorter than a v2 header: still reported as its magic.
    let mut legacy = bytes[..40].to_vec();
    legacy[8..12].copy_from_slice(&28i32.to_be_bytes());
    legacy[MAGIC_OFFSET] = 1;
    assert!(matches!(
        BatchIter::new(Bytes::from(legacy)).next(),
        Some(Err(ProtocolViolation::UnsupportedMagic { magic: 1, .. }))
    ));
}

#[test]
fn insane_batch_lengths_are_errors() {
    let bytes = encode(&sample_records(9), KpCompression::None);
    for length in [i32::MIN, -1, 0, 48] {
        let mut bad = bytes.to_vec();
        bad[8..12].copy_from_slice(&length.to_be_bytes());
        let err = BatchIter::new(Bytes::from(bad))
            .next()
            .unwrap()
            .unwrap_err();
        assert!(
            matches!(err, ProtocolViolation::Batch { base_offset: 9, .. }),
            "{length}: {err}"
        );
    }
    // Huge but positive: a partial batch, not an error.
    let mut big = bytes.to_vec();
    big[8..12].copy_from_slice(&i32::MAX.to_be_bytes());
    let (got, trailing) = split(Bytes::from(big));
    assert_eq!((got.len(), trailing), (0, bytes.len()));
}

#[test]
fn hostile_offsets_are_errors() {
    let bytes = encode(&sample_records(0), KpCompression::None);
    let negative_delta = patched(&bytes, |b| {
        b[23..27].copy_from_slice(&(-1i32).to_be_bytes())
    });
    assert!(matches!(
        BatchIter::new(negative_delta).next(),
        Some(Err(ProtocolViolation::Batch { .. }))
    ));
    let overflow = patched(&bytes, |b| {
        b[0..8].copy_from_slice(&(i64::MAX - 2).to_be_bytes())
    });
    assert!(matches!(
        BatchIter::new(overflow).next(),
        Some(Err(ProtocolViolation::Batch { .. }))
    ));
    // A record whose offset delta is past the batch's last offset.
    let short_delta = patched(&bytes, |b| b[23..27].copy_from_slice(&2i32.to_be_bytes()));
    let err = decode_one(short_delta).unwrap_err();
    assert!(err.to_string().contains("offset delta 3"), "{err}");
}

#[test]
fn truncated_record_is_an_error() {
    let bytes = encode(&sample_records(0), KpCompression::None);
    for cut in [1, 2, 3, 500, 1000] {
        let truncated = patched(&bytes, |b| b.truncate(b.len() - cut));
        let err = decode_one(truncated).unwrap_err();
        assert!(
            matches!(&err, ProtocolViolation::Batch { base_offset: 0, reason } if reason.contains("record 4 of 5")),
            "cut {cut}: {err}"
        );
    }
    // Compressed: the payload decompresses, but holds a cut record.
    let plain = encode(&sample_records(0), KpCompression::None);
    let payload = &plain[BATCH_HEADER_LEN..plain.len() - 1];
    let gzip = with_payload(&plain, 1, &gzip_members(&[payload]));
    assert!(decode_one(gzip).is_err());
}

#[test]
fn record_count_must_match() {
    let bytes = encode(&sample_records(0), KpCompression::None);
    for (count, what) in [
        (4, "bytes follow the last of 4 records"),
        (6, "record 5 of 6"),
        (i32::MAX, "record 5 of 2147483647"),
        (-1, "negative record count"),
        (i32::MIN, "negative record count"),
    ] {
        let bad = patched(&bytes, |b| {
            b[RECORD_COUNT_OFFSET..RECORD_COUNT_OFFSET + 4].copy_from_slice(&count.to_be_bytes())
        });
        let batch = RecordBatch::new(bad).unwrap();
        let mut out = decode_all(bytes.clone()).unwrap();
        let before = out.clone();
        let err = decode_batch(&batch, &DecodeLimits::default(), &mut out).unwrap_err();
        assert!(err.to_string().contains(what), "{count}: {err}");
        assert_eq!(out, before, "out is left as it was");
        assert_eq!(out.segments.len(), 1, "no segment is added");
        // A hostile count reserves no more than the bytes could hold.
        assert!(out.entries.capacity() <= 2 * (5 + bytes.len() / MIN_RECORD_LEN));
    }
}

#[test]
fn empty_batch_moves_the_position() {
    // Compaction can empty a batch; it keeps its last offset delta.
    let bytes = encode(&sample_records(100), KpCompression::None);
    for codec in [0, 1, 4] {
        let empty = patched(&bytes, |b| {
            b.truncate(BATCH_HEADER_LEN);
            b[RECORD_COUNT_OFFSET..RECORD_COUNT_OFFSET + 4].copy_from_slice(&0i32.to_be_bytes());
            set_attributes(b, codec);
        });
        let (batches, _) = split(empty);
        assert_eq!(batches[0].header().next_offset(), 105);
        let mut out = Records::new();
        decode_batch(&batches[0], &DecodeLimits::default(), &mut out).unwrap();
        assert!(out.is_empty());
    }
}

#[test]
fn unknown_codec_is_an_error() {
    let bytes = encode(&sample_records(0), KpCompression::None);
    let bad = patched(&bytes, |b| set_attributes(b, 5));
    assert_eq!(
        RecordBatch::new(bad.clone())
            .unwrap()
            .header()
            .compression(),
        None
    );
    let err = decode_one(bad).unwrap_err();
    assert!(
        err.to_string().contains("unknown compression codec 5"),
        "{err}"
    );
}

/// A batch of one record whose value is `size` zero bytes.
fn zeros_batch(size: usize, codec: KpCompression) -> Bytes {
    encode(&[record(0, 0, None, Some(&vec![0; size]), &[])], codec)
}

#[test]
fn decompression_limit_is_enforced() {
    let size = 1 << 20;
    let plain = zeros_batch(size, KpCompression::None);
    let payload_len = plain.len() - BATCH_HEADER_LEN;
    for (kp, codec) in CODECS.into_iter().skip(1) {
        let bytes = zeros_batch(size, kp);
        assert!(bytes.len() < size / 20, "{codec:?} compresses zeros");
        let batch = RecordBatch::new(bytes).unwrap();
        let mut out = Records::new();
        for limit in [0, 1000, 64 * 1024, payload_len - 1] {
            let err = decode_batch(&batch, &DecodeLimits::new(limit), &mut out).unwrap_err();
            assert_eq!(
                err,
                ProtocolViolation::DecompressionLimit {
                    base_offset: 0,
                    limit
                },
                "{codec:?}"
            );
        }
        decode_batch(&batch, &DecodeLimits::new(payload_len), &mut out).unwrap();
        assert_eq!(
            out.first().and_then(|r| r.value).map(<[u8]>::len),
            Some(size)
        );
    }
    // Uncompressed batches allocate nothing and are not limited.
    let mut out = Records::new();
    decode_batch(
        &RecordBatch::new(plain).unwrap(),
        &DecodeLimits::new(0),
        &mut out,
    )
    .unwrap();
}

#[test]
fn log_append_time_uses_max_timestamp() {
    for (kp, _) in CODECS {
        let bytes = encode(&sample_records(0), kp);
        let attributes = i16::from_be_bytes([bytes[21], bytes[22]]);
        let stamped = patched(&bytes, |b| {
            set_attributes(b, attributes | LOG_APPEND_TIME_FLAG)
        });
        let (batches, _) = split(stamped);
        assert_eq!(
            batches[0].header().timestamp_type(),
            TimestampType::LogAppendTime
        );
        let mut out = Records::new();
        decode_batch(&batches[0], &DecodeLimits::default(), &mut out).unwrap();
        for record in &out {
            assert_eq!(record.timestamp, 1_700_000_000_005);
            assert_eq!(record.timestamp_type, TimestampType::LogAppendTime);
        }
    }
}

fn marker(offset: i64, producer_id: i64, kind: u8, codec: KpCompression) -> Bytes {
    let mut r = record(
        offset,
        5,
        Some(&[0, 0, 0, kind]),
        Some(&[0, 0, 0, 0, 0, 3]),
        &[],
    );
    r.control = true;
    r.transactional = true;
    r.producer_id = producer_id;
    r.producer_epoch = 1;
    encode(&[r], codec)
}

fn transactional(offset: i64, producer_id: i64, n: i64) -> Bytes {
    let records: Vec<_> = (offset..offset + n)
        .map(|o| {
            let mut r = record(o, 5, None, Some(b"v"), &[]);
            r.transactional = true;
            r.producer_id = producer_id;
            r.producer_epoch = 1;
            r
        })
        .collect();
    encode(&records, KpCompression::None)
}

fn one_batch(bytes: Bytes) -> RecordBatch {
    RecordBatch::new(bytes).unwrap()
}

#[test]
fn control_batches_are_recognised() {
    for (kp, _) in CODECS {
        let abort = one_batch(marker(10, 3, 0, kp));
        assert!(abort.header().is_control() && abort.header().is_transactional());
        assert_eq!(abort.header().producer_id, 3);
        assert_eq!(control_type(&abort), Ok(Some(ControlType::Abort)));
        let commit = one_batch(marker(10, 3, 1, kp));
        assert_eq!(control_type(&commit), Ok(Some(ControlType::Commit)));
        // Other control records (KRaft's) are not transaction markers.
        let other = one_batch(marker(10, 3, 3, kp));
        assert_eq!(control_type(&other), Ok(None));
    }
    assert_eq!(control_type(&one_batch(transactional(0, 3, 2))), Ok(None));

    let mut short = record(0, 5, Some(&[0, 0]), None, &[]);
    short.control = true;
    let short = one_batch(encode(&[short], KpCompression::None));
    assert!(matches!(
        control_type(&short),
        Err(ProtocolViolation::Batch { .. })
    ));
    let mut corrupt = marker(10, 3, 0, KpCompression::None).to_vec();
    let last = corrupt.len() - 1;
    corrupt[last] ^= 1;
    assert!(matches!(
        control_type(&one_batch(Bytes::from(corrupt))),
        Err(ProtocolViolation::Crc { .. })
    ));

    assert_eq!(
        ControlType::from_key(&[0, 0, 0, 0]),
        Some(ControlType::Abort)
    );
    assert_eq!(
        ControlType::from_key(&[0, 0, 0, 1, 9]),
        Some(ControlType::Commit)
    );
    assert_eq!(ControlType::from_key(&[0, 0, 0]), None);
    assert_eq!(ControlType::from_key(&[0xff, 0xff, 0, 0]), None);
}

/// A header for the filter: only the fields it reads matter.
fn txn_header(
    base_offset: i64,
    last_offset_delta: i32,
    producer_id: i64,
    transactional: bool,
    control: bool,
) -> BatchHeader {
    let mut attributes = 0;
    if transactional {
        attributes |= TRANSACTIONAL_FLAG;
    }
    if control {
        attributes |= CONTROL_FLAG;
    }
    BatchHeader {
        base_offset,
        batch_length: 49,
        partition_leader_epoch: 0,
        magic: 2,
        crc: 0,
        attributes,
        last_offset_delta,
        base_timestamp: 0,
        max_timestamp: 0,
        producer_id,
        producer_epoch: 0,
        base_sequence: 0,
        record_count: last_offset_delta + 1,
    }
}

#[test]
fn aborted_transaction_is_skipped_until_its_marker() {
    let mut filter = AbortedTransactions::new([(1, 0)]);
    assert_eq!(
        filter.action(&txn_header(0, 1, 1, true, false), None),
        BatchAction::SkipAborted
    );
    assert_eq!(
        filter.action(&txn_header(2, 1, 1, true, false), None),
        BatchAction::SkipAborted
    );
    assert_eq!(
        filter.action(&txn_header(4, 0, 1, true, true), Some(ControlType::Abort)),
        BatchAction::SkipControl
    );
    // The producer's next transaction is not in the aborted list.
    assert_eq!(
        filter.action(&txn_header(5, 1, 1, true, false), None),
        BatchAction::Deliver
    );
    assert_eq!(
        filter.action(&txn_header(7, 0, 1, true, true), Some(ControlType::Commit)),
        BatchAction::SkipControl
    );
}

#[test]
fn committed_and_other_producers_are_delivered() {
    // Producer 1 aborts (first offset 0); producer 2's interleaved transaction commits.
    let mut filter = AbortedTransactions::new([(1, 0)]);
    assert_eq!(
        filter.action(&txn_header(0, 0, 1, true, false), None),
        BatchAction::SkipAborted
    );
    assert_eq!(
        filter.action(&txn_header(1, 0, 2, true, false), None),
        BatchAction::Deliver
    );
    assert_eq!(
        filter.action(&txn_header(2, 0, 1, true, false), None),
        BatchAction::SkipAborted
    );
    assert_eq!(
        filter.action(&txn_header(3, 0, 2, true, true), Some(ControlType::Commit)),
        BatchAction::SkipControl
    );
    assert_eq!(
        filter.action(&txn_header(4, 0, 1, true, true), Some(ControlType::Abort)),
        BatchAction::SkipControl
    );
    // Idempotent but not transactional, or no producer id at all: always delivered.
    assert_eq!(
        filter.action(&txn_header(5, 0, 1, false, false), None),
        BatchAction::Deliver
    );
    assert_eq!(
        filter.action(&txn_header(6, 0, -1, false, false), None),
        BatchAction::Deliver
    );
}

#[test]
fn aborted_transaction_starts_when_its_first_offset_is_reached() {
    // The aborted transaction of producer 1 starts at 10; its earlier batches were committed.
    let mut filter = AbortedTransactions::new([(1, 10), (1, 20)]);
    assert_eq!(
        filter.action(&txn_header(0, 4, 1, true, false), None),
        BatchAction::Deliver
    );
    assert_eq!(
        filter.action(&txn_header(5, 0, 1, true, true), Some(ControlType::Commit)),
        BatchAction::SkipControl
    );
    // A batch whose range reaches offset 10 starts it.
    assert_eq!(
        filter.action(&txn_header(6, 4, 1, true, false), None),
        BatchAction::SkipAborted
    );
    assert_eq!(
        filter.action(&txn_header(11, 0, 1, true, true), Some(ControlType::Abort)),
        BatchAction::SkipControl
    );
    assert_eq!(
        filter.action(&txn_header(12, 7, 1, true, false), None),
        BatchAction::Deliver
    );
    assert_eq!(
        filter.action(&txn_header(20, 0, 1, true, false), None),
        BatchAction::SkipAborted
    );
}

#[test]
fn no_aborted_transactions_skips_only_control() {
    let mut filter = AbortedTransactions::default();
    assert_eq!(
        filter.action(&txn_header(0, 0, 1, true, false), None),
        BatchAction::Deliver
    );
    assert_eq!(
        filter.action(&txn_header(1, 0, 1, true, true), Some(ControlType::Abort)),
        BatchAction::SkipControl
    );
    assert_eq!(
        filter.action(&txn_header(2, 0, -1, false, false), None),
        BatchAction::Deliver
    );
}

#[test]
fn classify_reads_markers_from_batches() {
    let mut all = BytesMut::new();
    for part in [
        transactional(0, 1, 3),
        transactional(3, 2, 2),
        marker(5, 1, 0, KpCompression::None),
        marker(6, 2, 1, KpCompression::Gzip),
        transactional(7, 1, 2),
        encode(&sample_records(9), KpCompression::Snappy),
    ] {
        all.put_slice(&part);
    }
    let mut filter = AbortedTransactions::new([(1, 0)]);
    let mut actions = Vec::new();
    let mut position = 0;
    for batch in BatchIter::new(all.freeze()) {
        let batch = batch.unwrap();
        actions.push(filter.classify(&batch).unwrap());
        position = batch.header().next_offset();
    }
    use BatchAction::*;
    assert_eq!(
        actions,
        [
            SkipAborted,
            Deliver,
            SkipControl,
            SkipControl,
            Deliver,
            Deliver
        ]
    );
    assert_eq!(position, 14);
}

fn gzip_members(parts: &[&[u8]]) -> Vec<u8> {
    use std::io::Write;
    let mut out = Vec::new();
    for part in parts {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(part).unwrap();
        out.extend_from_slice(&encoder.finish().unwrap());
    }
    out
}

fn xerial(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01".to_vec();
    for part in parts {
        let block = snap::raw::Encoder::new().compress_vec(part).unwrap();
        out.extend_from_slice(&u32::try_from(block.len()).unwrap().to_be_bytes());
        out.extend_from_slice(&block);
    }
    out
}

#[test]
fn codec_framings_that_java_writes() {
    let expected = sample_records(0);
    let plain = encode(&expected, KpCompression::None);
    let payload = &plain[BATCH_HEADER_LEN..];
    let (a, b) = payload.split_at(700);
    let raw_snappy = snap::raw::Encoder::new().compress_vec(payload).unwrap();
    let concatenated_xerial = [xerial(&[a]), xerial(&[b])].concat();
    let zstd_frames = [
        ruzstd::encoding::compress_to_vec(a, ruzstd::encoding::CompressionLevel::Fastest),
        // A skippable frame between the two.
        vec![0x50, 0x2a, 0x4d, 0x18, 3, 0, 0, 0, 1, 2, 3],
        ruzstd::encoding::compress_to_vec(b, ruzstd::encoding::CompressionLevel::Fastest),
    ]
    .concat();
    let lz4_frames = [a, b]
        .iter()
        .flat_map(|part| {
            let mut encoder = lz4_flex::frame::FrameEncoder::new(Vec::new());
            std::io::Write::write_all(&mut encoder, part).unwrap();
            encoder.finish().unwrap()
        })
        .collect::<Vec<u8>>();
    for (name, codec, payload) in [
        ("raw snappy", 2, raw_snappy),
        ("xerial, several blocks", 2, xerial(&[a, b])),
        ("concatenated xerial streams", 2, concatenated_xerial),
        ("gzip members", 1, gzip_members(&[a, b])),
        ("zstd frames", 4, zstd_frames),
        ("lz4 frames", 3, lz4_frames),
    ] {
        let decoded = decode_one(with_payload(&plain, codec, &payload))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_matches(&decoded, &expected);
    }
    // Garbage in every codec is an error, not a panic.
    for codec in 1..=4 {
        let err = decode_one(with_payload(
            &plain,
            codec,
            b"\x82SNAPPY\x00\x00\x00\x00\x00garbage",
        ))
        .unwrap_err();
        assert!(err.to_string().contains("cannot decompress"), "{err}");
    }
}

#[test]
fn varints_read_like_java() {
    fn varint(bytes: &[u8]) -> Option<i32> {
        Cursor::new(bytes).varint()
    }
    fn varlong(bytes: &[u8]) -> Option<i64> {
        Cursor::new(bytes).varlong()
    }
    assert_eq!(varint(&[0x00]), Some(0));
    assert_eq!(varint(&[0x01]), Some(-1));
    assert_eq!(varint(&[0x02]), Some(1));
    assert_eq!(varint(&[0xfe, 0xff, 0xff, 0xff, 0x0f]), Some(i32::MAX));
    assert_eq!(varint(&[0xff, 0xff, 0xff, 0xff, 0x0f]), Some(i32::MIN));
    assert_eq!(varint(&[0xff, 0xff, 0xff, 0xff, 0xff, 0x01]), None);
    assert_eq!(varint(&[0x80]), None);
    assert_eq!(varint(&[]), None);
    assert_eq!(
        varlong(&[0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]),
        Some(i64::MAX)
    );
    assert_eq!(
        varlong(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]),
        Some(i64::MIN)
    );
    assert_eq!(varlong(&[0xff; 11]), None);
}

#[test]
fn malformed_headers_stop_iteration() {
    // Counts are zigzag varints: 0x0a is 5, 0x06 is 3.
    let garbage: &[u8] = &[0x0a, 0x04, b'a', b'b', 0x7f, 0x02];
    assert_eq!(HeaderIter::counted(garbage).len(), 5);
    assert_eq!(HeaderIter::counted(garbage).count(), 0);
    let one_good: &[u8] = &[0x06, 0x02, b'a', 0x01, 0x09];
    let headers: Vec<_> = HeaderIter::counted(one_good).collect();
    assert_eq!(headers, [(&b"a"[..], None)]);
    // i32::MAX headers claimed, none there.
    assert_eq!(
        HeaderIter::counted(&[0xfe, 0xff, 0xff, 0xff, 0x0f]).count(),
        0
    );
    // A negative, truncated or missing count: no headers.
    for tail in [&[0x01][..], &[0x80], &[]] {
        assert_eq!(HeaderIter::counted(tail).len(), 0, "{tail:?}");
    }
}

#[test]
fn records_ahead_counts_whole_uncompressed_batches() {
    let plain = encode(&sample_records(0), KpCompression::None);
    let packed = encode(&sample_records(5), KpCompression::Lz4);
    let cat = |parts: &[&[u8]]| Bytes::from(parts.concat());
    let ahead = |bytes: Bytes, limit| BatchIter::new(bytes).records_ahead(limit);
    assert_eq!(ahead(cat(&[&plain, &plain]), 100), 10);
    assert_eq!(
        ahead(cat(&[&plain, &plain, &plain]), 7),
        10,
        "the count stops at the whole batch that reaches the limit"
    );
    assert_eq!(ahead(cat(&[&plain, &plain]), 5), 5);
    // The count stops at a compressed batch, and at a partial one.
    assert_eq!(ahead(cat(&[&plain, &packed, &plain]), 100), 5);
    assert_eq!(ahead(cat(&[&plain, &plain[..plain.len() - 1]]), 100), 5);
    assert_eq!(ahead(Bytes::new(), 100), 0);
    // A record count the bytes cannot hold counts as what they could hold; a negative one
    // as none.
    let claims = |count: i32| {
        patched(&plain, |b| {
            b[RECORD_COUNT_OFFSET..RECORD_COUNT_OFFSET + 4].copy_from_slice(&count.to_be_bytes());
        })
    };
    let fits = (plain.len() - BATCH_HEADER_LEN) / MIN_RECORD_LEN;
    assert_eq!(ahead(claims(i32::MAX), usize::MAX), fits);
    assert_eq!(ahead(cat(&[&claims(-1), &plain]), 100), 5);
}

#[test]
fn headers_follow_null_keys_and_values() {
    // Headers are found after the value; after a null one, right after its length.
    let records = [
        record(
            9,
            1_700_000_000_000,
            None,
            None,
            &[("a", Some(b"1")), ("n", None)],
        ),
        record(10, 1_700_000_000_001, Some(b"k"), None, &[("b", Some(b""))]),
        record(11, 1_700_000_000_002, None, Some(b"v"), &[]),
        record(12, 1_700_000_000_003, None, None, &[]),
        record(
            13,
            1_700_000_000_004,
            None,
            Some(&[1; 9000]),
            &[("long", Some(b"2"))],
        ),
    ];
    let batch = RecordBatch::new(encode(&records, KpCompression::None)).unwrap();
    for fast in [true, false] {
        let mut out = Records::new();
        let limits = DecodeLimits::default();
        if fast {
            decode_batch(&batch, &limits, &mut out).unwrap();
        } else {
            decode_batch_general(&batch, &limits, &mut out).unwrap();
        }
        assert_matches(&out, &records);
    }
}

/// xorshift64: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Runs everything that reads bytes; only panics matter.
fn exercise(records: Bytes) {
    let mut out = Records::new();
    let mut filter = AbortedTransactions::new([(1, 0), (-5, i64::MIN), (7, i64::MAX)]);
    let mut iter = BatchIter::new(records);
    for batch in iter.by_ref() {
        let Ok(batch) = batch else { break };
        let header = batch.header();
        let _ = (
            header.next_offset(),
            header.size(),
            header.compression(),
            header.timestamp_type(),
        );
        let _ = filter.classify(&batch);
        let _ = control_type(&batch);
        if decode_batch(&batch, &DecodeLimits::new(1 << 20), &mut out).is_ok() {
            for record in &out {
                assert_eq!(record.headers().count(), record.header_count());
            }
        }
        out.clear();
    }
    let _ = iter.remaining_bytes();
}

#[test]
fn mutated_batches_never_panic() {
    let mut inputs = Vec::new();
    for (kp, _) in CODECS {
        let mut all = BytesMut::new();
        all.put_slice(&encode(&sample_records(0), kp));
        all.put_slice(&marker(5, 1, 0, kp));
        all.put_slice(&encode(&sample_records(6)[..2], kp));
        inputs.push(all.freeze());
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for i in 0..10_000 {
        let input = &inputs[i % inputs.len()];
        let mut bytes = input.to_vec();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(bytes.len());
            bytes[at] = rng.next() as u8;
        }
        if rng.below(4) == 0 {
            bytes.truncate(rng.below(bytes.len() + 1));
        }
        // Half the time, fix the first batch's CRC so the checks behind it run.
        if i % 2 == 0 && bytes.len() >= BATCH_HEADER_LEN {
            let end = next_batch_len(&bytes)
                .ok()
                .flatten()
                .unwrap_or(bytes.len())
                .min(bytes.len());
            fix_crc(&mut bytes[..end]);
        }
        exercise(Bytes::from(bytes));
    }
}

#[test]
fn mutated_records_never_panic() {
    // Mutate only the records (after decompression) and re-frame them, so the record parser
    // sees every kind of garbage; also mutate compressed payloads behind a valid CRC.
    let plain = encode(&sample_records(0), KpCompression::None);
    let payload = plain[BATCH_HEADER_LEN..].to_vec();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for i in 0..10_000 {
        let mut records = payload.clone();
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(records.len());
            records[at] = match rng.below(3) {
                0 => 0xff,
                1 => 0x80 | rng.next() as u8,
                _ => rng.next() as u8,
            };
        }
        let (codec, compressed) = match i % 4 {
            0 => (0, records),
            1 => (1, gzip_members(&[&records])),
            2 => (2, xerial(&[&records])),
            _ => (
                4,
                ruzstd::encoding::compress_to_vec(
                    &records[..],
                    ruzstd::encoding::CompressionLevel::Fastest,
                ),
            ),
        };
        exercise(with_payload(&plain, codec, &compressed));
    }
    for (kp, _) in CODECS.into_iter().skip(1) {
        let bytes = encode(&sample_records(0), kp);
        for _ in 0..500 {
            let mut mutated = bytes.to_vec();
            let at = BATCH_HEADER_LEN + rng.below(mutated.len() - BATCH_HEADER_LEN);
            mutated[at] = rng.next() as u8;
            fix_crc(&mut mutated);
            exercise(Bytes::from(mutated));
        }
    }
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = Rng(0xdead_beef_cafe_f00d);
    let header = encode(&sample_records(0), KpCompression::None).slice(..BATCH_HEADER_LEN);
    for i in 0..2_000 {
        let len = rng.below(200);
        let mut bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        if i % 2 == 0 {
            // A plausible header in front of random records.
            let mut framed = header.to_vec();
            framed.append(&mut bytes);
            fix_length(&mut framed);
            fix_crc(&mut framed);
            bytes = framed;
        }
        exercise(Bytes::from(bytes));
    }
}

/// The sample records, then one whose length, value length and timestamp delta take three
/// bytes each: the fast reader declines it.
fn fast_and_slow_records() -> Bytes {
    let mut records = sample_records(100);
    records.push(record(
        105,
        1_700_000_100_000,
        None,
        Some(&[1; 9000]),
        &[("h", Some(b"v"))],
    ));
    encode(&records, KpCompression::None)
}

#[test]
fn fast_reader_takes_short_records_and_declines_long_ones() {
    let batch = one_batch(fast_and_slow_records());
    let data = batch.records_payload(usize::MAX).unwrap();
    let base = RecordBase::new(&batch.header);
    let mut general = Cursor::new(&data);
    for i in 0..6 {
        let at = general.position();
        let entry = read_record(&base, 0, &mut general).unwrap();
        // The sample records carry create times.
        match base.read_short_as::<false>(&data, at, 0) {
            Some((fast_entry, next)) => {
                assert!(i < 5, "record {i} has three-byte varints");
                assert_eq!(fast_entry, entry, "record {i}");
                assert_eq!(next, general.position(), "record {i}");
            }
            None => assert_eq!(i, 5, "record {i} has only short varints"),
        }
    }
    assert_eq!(general.remaining(), 0);
}

/// A record the short reader declines in the middle of a batch: the general reader reads it,
/// and the records after it are read as before, into the same entries the general reader alone
/// gives, after what `out` already held; under both timestamp types.
#[test]
fn a_long_record_between_short_ones_is_read_in_place() {
    let long = [2u8; 9000];
    let records: Vec<_> = (0..7)
        .map(|o| {
            let value: &[u8] = if o == 3 { &long } else { b"short" };
            record(o, 1_700_000_000_000 + o, None, Some(value), &[])
        })
        .collect();
    let bytes = encode(&records, KpCompression::None);
    let attributes = i16::from_be_bytes([bytes[21], bytes[22]]);
    let appended = patched(&bytes, |b| {
        set_attributes(b, attributes | LOG_APPEND_TIME_FLAG)
    });
    let earlier = one_batch(encode(&sample_records(100), KpCompression::None));
    for (bytes, append) in [(bytes, false), (appended, true)] {
        let batch = one_batch(bytes);
        let limits = DecodeLimits::default().with_check_crc(false);
        let (mut fast, mut general) = (Records::new(), Records::new());
        decode_batch(&earlier, &limits, &mut fast).unwrap();
        decode_batch_general(&earlier, &limits, &mut general).unwrap();
        decode_batch(&batch, &limits, &mut fast).unwrap();
        decode_batch_general(&batch, &limits, &mut general).unwrap();
        assert_eq!(fast.entries, general.entries, "log-append time {append}");
        let read: Vec<_> = fast.iter().skip(5).collect();
        assert_eq!(read.len(), 7);
        for (o, r) in (0i64..).zip(&read) {
            assert_eq!(r.offset, o);
            let timestamp = if append {
                1_700_000_000_006
            } else {
                1_700_000_000_000 + o
            };
            assert_eq!(
                r.timestamp, timestamp,
                "log-append time {append}, offset {o}"
            );
            let value: &[u8] = if o == 3 { &long } else { b"short" };
            assert_eq!(r.value, Some(value), "offset {o}");
        }
    }
}

/// Batches of more records than the short reader fills on the stack at once, with records it
/// declines before, on and after the edges of those fills: the same entries as the general
/// reader alone gives, under both timestamp types, and every record where it belongs.
#[test]
fn records_across_the_short_readers_fills_are_read_in_place() {
    use super::FILL_CHUNK;
    let long = [3u8; 9000];
    let c = FILL_CHUNK as i64;
    let shapes: [(i64, &[i64]); 6] = [
        (c, &[]),
        (c + 1, &[c]),
        (2 * c, &[c - 1, c, c + 1]),
        (2 * c + 1, &[0, 2 * c]),
        (3 * c + 7, &[1, c - 1, 2 * c, 2 * c + 1, 3 * c + 6]),
        (5 * c, &[]),
    ];
    for (count, longs) in shapes {
        let value = |o: i64| -> &[u8] { if longs.contains(&o) { &long } else { b"short" } };
        let records: Vec<_> = (0..count)
            .map(|o| record(o, 1_700_000_000_000 + o, None, Some(value(o)), &[]))
            .collect();
        let bytes = encode(&records, KpCompression::None);
        let attributes = i16::from_be_bytes([bytes[21], bytes[22]]);
        let appended = patched(&bytes, |b| {
            set_attributes(b, attributes | LOG_APPEND_TIME_FLAG)
        });
        for (bytes, append) in [(bytes, false), (appended, true)] {
            let batch = one_batch(bytes);
            let limits = DecodeLimits::default().with_check_crc(false);
            let (mut fast, mut general) = (Records::new(), Records::new());
            decode_batch(&batch, &limits, &mut fast).unwrap();
            decode_batch_general(&batch, &limits, &mut general).unwrap();
            assert_eq!(
                fast.entries, general.entries,
                "{count} records, append {append}"
            );
            assert_eq!(fast.len(), usize::try_from(count).unwrap());
            for (o, r) in (0i64..).zip(&fast) {
                assert_eq!(r.offset, o, "{count} records");
                assert_eq!(r.value, Some(value(o)), "{count} records, offset {o}");
            }
        }
    }
}

/// Mutated batches, CRC unchecked so the mutations reach the record readers: decoding with
/// the fast reader first gives exactly what the general reader alone gives, the same entries
/// or the same error.
#[test]
fn fast_reader_agrees_with_the_general_reader_on_mutated_batches() {
    let small = fast_and_slow_records();
    // More records than the short reader fills on the stack at once.
    let large_records: Vec<_> = (0..3 * i64::try_from(super::FILL_CHUNK).unwrap())
        .map(|o| {
            let key = (o % 3 == 0).then_some(b"key".as_slice());
            let headers: &[Header<'_>] = if o % 50 == 7 {
                &[("h", Some(b"v"))]
            } else {
                &[]
            };
            record(o, 1_700_000_000_000 + o, key, Some(b"a value"), headers)
        })
        .collect();
    let large = encode(&large_records, KpCompression::None);
    let limits = DecodeLimits::default().with_check_crc(false);
    // Values near the varint boundaries, and any byte.
    const BYTES: [u8; 8] = [0x00, 0x01, 0x02, 0x7e, 0x7f, 0x80, 0x81, 0xff];
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (mut accepted, mut rejected) = (0, 0);
    for round in 0..30_000 {
        // Every 4th round mutates the large batch anywhere.
        let large_round = round % 4 == 3;
        let mut bytes = if large_round {
            large.to_vec()
        } else {
            small.to_vec()
        };
        // Every 8th round uses log-append time.
        if round % 8 == 0 {
            bytes[ATTRIBUTES_OFFSET + 1] |= 0x08;
        }
        // Most mutations land in the first records, where the short ones are.
        let span = if round % 2 == 0 && !large_round {
            200
        } else {
            bytes.len() - BATCH_HEADER_LEN
        };
        for _ in 0..=round % 3 {
            let r = next();
            let at = BATCH_HEADER_LEN + usize::try_from(r % span as u64).unwrap();
            let pick = usize::try_from((r >> 32) % 9).unwrap();
            bytes[at] = BYTES.get(pick).copied().unwrap_or((r >> 40) as u8);
        }
        let batch = RecordBatch::new(Bytes::from(bytes)).unwrap();
        let (mut fast, mut general) = (Records::new(), Records::new());
        let fast_result = decode_batch(&batch, &limits, &mut fast);
        let general_result = decode_batch_general(&batch, &limits, &mut general);
        match (fast_result, general_result) {
            (Ok(()), Ok(())) => {
                assert_eq!(fast.entries, general.entries, "round {round}");
                accepted += 1;
            }
            (Err(f), Err(g)) => {
                assert_eq!(f.to_string(), g.to_string(), "round {round}");
                rejected += 1;
            }
            (f, g) => panic!("round {round}: fast reader {f:?}, general reader {g:?}"),
        }
    }
    // Both outcomes are exercised often.
    assert!(
        accepted > 1_000 && rejected > 1_000,
        "{accepted} accepted, {rejected} rejected"
    );
}

/// The CRC-32C implementations the decoder chooses between agree with `crc32c`, at every
/// length up to a few cache lines and around the sizes where their code paths change, from
/// several alignments; each gives the standard check value, and so does the one in use.
#[test]
fn crc32c_implementations_agree() {
    use super::{CrcImpl, crc32c_by};
    assert_eq!(super::batch_crc32c(b"123456789"), 0xE306_9283);
    for imp in CrcImpl::ALL {
        assert_eq!(crc32c_by(imp, b"123456789"), 0xE306_9283, "{imp:?}");
        assert_eq!(crc32c_by(imp, b""), 0, "{imp:?}");
    }
    let data: Vec<u8> = (0..70_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let lengths = (0..=300).chain([
        511, 512, 513, 1023, 1024, 1025, 4095, 4096, 4097, 16_383, 16_384, 16_385, 65_536,
    ]);
    for len in lengths {
        for offset in 0..4 {
            let bytes = &data[offset..offset + len];
            let reference = crc32c::crc32c(bytes);
            for imp in CrcImpl::ALL {
                assert_eq!(
                    crc32c_by(imp, bytes),
                    reference,
                    "{imp:?}, length {len}, offset {offset}"
                );
            }
            assert_eq!(
                super::batch_crc32c(bytes),
                reference,
                "length {len}, offset {offset}"
            );
        }
    }
}

/// The bytes after a batch are only prefetched, never read: whatever follows it, and however
/// long, the batch decodes to the same records as alone, compressed or not.
#[test]
fn the_bytes_after_a_batch_do_not_change_its_records() {
    let long = [7u8; 3000];
    let records: Vec<_> = (0..200)
        .map(|o| {
            let value: &[u8] = if o % 50 == 3 { &long } else { b"value" };
            record(o, 1_700_000_000_000 + o, None, Some(value), &[])
        })
        .collect();
    let values = |r: &Records| {
        r.iter()
            .map(|r| r.value.map(<[u8]>::to_vec))
            .collect::<Vec<_>>()
    };
    // 200 records take the decoder's buffered path, 10 its path for small batches.
    for (kp, codec) in CODECS {
        for count in [200, 10] {
            let batch = one_batch(encode(&records[..count], kp));
            let limits = DecodeLimits::default();
            let mut alone = Records::new();
            decode_batch(&batch, &limits, &mut alone).unwrap();
            assert_eq!(alone.len(), count, "{codec:?}");
            for len in [0, 1, 63, 64, 8191, 8192, 8257, 20_000] {
                let following = vec![0xff; len];
                let mut before = Records::new();
                decode_batch_before(&batch, &limits, &mut before, &following).unwrap();
                assert_eq!(
                    before.entries, alone.entries,
                    "{codec:?}, {count} records, {len} bytes after"
                );
                assert_eq!(
                    values(&before),
                    values(&alone),
                    "{codec:?}, {count} records, {len} bytes after"
                );
            }
        }
    }
}
