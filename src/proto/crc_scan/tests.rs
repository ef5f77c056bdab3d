use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::FetchResponse;
use kafka_protocol::messages::TopicName;
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::protocol::{Encodable, StrBytes};
use kafka_protocol::records::Compression as KpCompression;
use uuid::Uuid;

use super::*;
use crate::proto::records::tests::{encode, record};
use crate::proto::versions;

/// `n` batches of `per` records each, from `offset`.
fn batches(offset: i64, n: usize, per: usize) -> Vec<Bytes> {
    (0..n)
        .map(|b| {
            let base = offset + (b * per) as i64;
            let records: Vec<_> = (0..per)
                .map(|i| {
                    let o = base + i as i64;
                    record(o, 1_000 + o, Some(b"key"), Some(&[o as u8; 100]), &[])
                })
                .collect();
            encode(&records, KpCompression::None)
        })
        .collect()
}

fn concat(parts: &[Bytes]) -> Bytes {
    let mut out = BytesMut::new();
    for p in parts {
        out.extend_from_slice(p);
    }
    out.freeze()
}

/// A batch whose CRC field no longer matches its bytes.
fn corrupt(batch: &Bytes) -> Bytes {
    let mut b = batch.to_vec();
    b[CRC_OFFSET] ^= 0x55;
    Bytes::from(b)
}

/// A Fetch response body at `v` holding the records of `partitions` (one topic each side of
/// the given split), and the response header before it (flexible header: correlation id and
/// an empty tagged-field section).
fn response(v: i16, partitions: &[Option<Bytes>]) -> Bytes {
    let part = |p: usize, records: &Option<Bytes>| {
        PartitionData::default()
            .with_partition_index(p as i32)
            .with_high_watermark(1_000)
            .with_last_stable_offset(1_000)
            .with_log_start_offset(0)
            .with_aborted_transactions(Some(vec![
                AbortedTransaction::default()
                    .with_producer_id(kafka_protocol::messages::ProducerId(9))
                    .with_first_offset(3),
            ]))
            .with_records(records.clone())
    };
    let half = partitions.len() / 2;
    let topic = |name: &'static str, id: u128, parts: Vec<PartitionData>| {
        let t = FetchableTopicResponse::default().with_partitions(parts);
        if v >= 13 {
            t.with_topic_id(Uuid::from_u128(id))
        } else {
            t.with_topic(TopicName(StrBytes::from_static_str(name)))
        }
    };
    let first = partitions[..half]
        .iter()
        .enumerate()
        .map(|(p, r)| part(p, r))
        .collect();
    let second = partitions[half..]
        .iter()
        .enumerate()
        .map(|(p, r)| part(p, r))
        .collect();
    let r = FetchResponse::default()
        .with_session_id(0)
        .with_responses(vec![topic("a", 1, first), topic("b", 2, second)]);
    // The response header: a correlation id, and from v12 an empty tagged-field section.
    let mut body = BytesMut::from(&[0, 0, 0, 42][..]);
    if v >= 12 {
        body.extend_from_slice(&[0]);
    }
    r.encode(&mut body, v).unwrap();
    body.freeze()
}

/// The scan of `body` fed in pieces of `step` bytes (then whole).
fn scan(v: i16, body: &Bytes, step: usize) -> Checked {
    let mut s = CrcScan::fetch(v);
    let mut n = 0;
    while n < body.len() {
        n = (n + step).min(body.len());
        s.advance(&body[..n]);
    }
    s.finish(body)
}

/// Where each of `wanted` starts in `body` (each occurs once), with its CRC.
fn positions(body: &[u8], wanted: &[&Bytes]) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = wanted
        .iter()
        .map(|b| {
            let at = body
                .windows(b.len())
                .position(|w| w == &b[..])
                .expect("the batch is in the body");
            let crc = u32::from_be_bytes(b[CRC_OFFSET..CRC_OFFSET + 4].try_into().unwrap());
            (at as u32, crc)
        })
        .collect();
    out.sort_unstable();
    out
}

fn all(checked: &Checked, body: &Bytes) -> Vec<(u32, u32)> {
    checked.within(body)
}

#[test]
fn every_complete_batch_is_checked_however_the_bytes_arrive() {
    let good = batches(0, 3, 20);
    let other = batches(500, 2, 7);
    let bad = corrupt(&batches(900, 1, 5)[0]);
    let tail = batches(1_000, 2, 9);
    // A partial last batch, as a broker cuts at max.partition.fetch.bytes.
    let cut = tail[1].slice(..tail[1].len() / 2);
    let partitions = [
        Some(concat(&good)),
        None,
        Some(concat(&[other[0].clone(), bad.clone(), other[1].clone()])),
        Some(Bytes::new()),
        Some(concat(&[tail[0].clone(), cut])),
    ];
    for v in versions::FETCH.min..=versions::FETCH.max {
        let body = response(v, &partitions);
        let want = positions(
            &body,
            &[&good[0], &good[1], &good[2], &other[0], &other[1], &tail[0]],
        );
        for step in [1, 7, 61, 64, 1_000, 4_096, body.len()] {
            let checked = scan(v, &body, step);
            assert_eq!(all(&checked, &body), want, "v{v}, pieces of {step} bytes");
        }
    }
}

#[test]
fn positions_are_given_within_each_slice_of_the_frame() {
    let good = batches(0, 2, 10);
    let v = versions::FETCH.max;
    let body = response(v, &[Some(concat(&good)), Some(concat(&good))]);
    let checked = scan(v, &body, 512);
    let first = body
        .windows(good[0].len())
        .position(|w| w == &good[0][..])
        .unwrap();
    let records = body.slice(first..first + good[0].len() + good[1].len());
    let crc = |b: &Bytes| u32::from_be_bytes(b[CRC_OFFSET..CRC_OFFSET + 4].try_into().unwrap());
    assert_eq!(
        checked.within(&records),
        vec![(0, crc(&good[0])), (good[0].len() as u32, crc(&good[1]))]
    );
    // Not a slice of this frame: nothing is taken as checked.
    let copy = Bytes::copy_from_slice(&records);
    assert_eq!(checked.within(&copy), vec![]);
    assert!(Checked::default().within(&records).is_empty());
}

/// Hostile or garbled bytes never panic, and anything recorded is a batch whose CRC matches its
/// bytes at that position.
#[test]
fn garbled_responses_yield_only_true_checks() {
    let good = batches(0, 4, 12);
    let v = versions::FETCH.max;
    let body = response(v, &[Some(concat(&good)), Some(concat(&good[1..]))]);
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for round in 0..2_000 {
        let mut b = body.to_vec();
        for _ in 0..1 + round % 8 {
            let at = next() as usize % b.len();
            b[at] = next() as u8;
        }
        if round % 5 == 0 {
            b.truncate(next() as usize % b.len());
        }
        let b = Bytes::from(b);
        let checked = scan(v, &b, 1 + next() as usize % 3_000);
        for (at, crc) in all(&checked, &b) {
            let at = at as usize;
            let len = i32::from_be_bytes(b[at + 8..at + 12].try_into().unwrap()) as usize;
            let batch = &b[at..at + LOG_OVERHEAD + len];
            assert_eq!(i8::from_be_bytes([batch[MAGIC_OFFSET]]), MAGIC_V2);
            assert_eq!(
                crc,
                u32::from_be_bytes(batch[CRC_OFFSET..CRC_OFFSET + 4].try_into().unwrap())
            );
            assert_eq!(crc32c::crc32c(&batch[CRC_START..]), crc, "round {round}");
        }
    }
}
