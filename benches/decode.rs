//! Fetch-path decode cost: a ~1 MiB `FetchResponse` (one partition, ~16 KiB batches of ~100-byte
//! JSON-like values) per codec, checked by the structural guard, decoded from `Bytes`, split into
//! batches, and every batch decoded into reused `Records`; the guard alone; and the CRC-32C
//! implementations the decoder chooses between (`crc32c` group). Throughput is counted in
//! uncompressed record-batch bytes, the same for every codec. kafka-protocol's own
//! `RecordBatchDecoder` runs on the same bytes as a baseline (its lz4 and zstd are the C
//! libraries).
//!
//! An instrumented global allocator (`stats_alloc`) prints allocations per record for each codec before the
//! measurements.
//!
//! `cargo bench --bench decode -- --warm-up-time 1 --measurement-time 3`

use std::alloc::System;
use std::hint::black_box;

use bytes::{Bytes, BytesMut};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kafka_protocol::messages::FetchResponse;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::protocol::{Decodable, Encodable};
use kafka_protocol::records::{
    Compression as KpCompression, Record as KpRecord, RecordBatchDecoder, RecordBatchEncoder,
    RecordEncodeOptions, TimestampType,
};
use kafka_source::Records;
use kafka_source::records::{
    BatchIter, DecodeLimits, check_fetch_response, crc32c_implementations, decode_batch,
};
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

/// The system allocator, instrumented: counts allocations and reallocations.
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Allocations and reallocations so far.
fn allocations() -> u64 {
    let s = GLOBAL.stats();
    (s.allocations + s.reallocations) as u64
}

/// A FetchResponse version a Kafka 3.5+ broker answers with.
const FETCH_VERSION: i16 = 16;
/// The records field's target size.
const TARGET_BYTES: usize = 1 << 20;
/// Records per batch: about the producer's default 16 KiB `batch.size` at ~115 bytes a record.
const RECORDS_PER_BATCH: usize = 140;

const CODECS: [(&str, KpCompression); 5] = [
    ("none", KpCompression::None),
    ("gzip", KpCompression::Gzip),
    ("snappy", KpCompression::Snappy),
    ("lz4", KpCompression::Lz4),
    ("zstd", KpCompression::Zstd),
];

/// A ~100-byte value that compresses like real event data: fixed field names, varying values.
fn value(i: u64) -> Bytes {
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let events = ["click", "view", "purchase", "scroll", "login"];
    let event = events[(next() % 5) as usize];
    let text = format!(
        r#"{{"id":{i},"user":"user-{}","event":"{event}","ts":{},"session":"{:016x}","v":{}}}"#,
        next() % 10_000,
        1_700_000_000_000 + i * 3,
        next(),
        next() % 1000,
    );
    Bytes::from(text)
}

/// Batches of about 16 KiB until the records field reaches ~1 MiB uncompressed; returns the
/// records field for `codec` and the uncompressed size of the same records.
fn records(codec: KpCompression) -> (Bytes, usize, usize) {
    let mut plain = 0;
    let mut out = BytesMut::new();
    let mut offset = 0i64;
    let mut count = 0;
    while plain < TARGET_BYTES {
        let batch: Vec<KpRecord> = (0..RECORDS_PER_BATCH as i64)
            .map(|i| KpRecord {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 3,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: TimestampType::Creation,
                offset: offset + i,
                sequence: i32::try_from(offset + i).unwrap(),
                timestamp: 1_700_000_000_000 + offset + i,
                key: Some(Bytes::from(format!("key-{:08}", offset + i))),
                value: Some(value((offset + i) as u64)),
                headers: Default::default(),
            })
            .collect();
        for (c, buf) in [(KpCompression::None, None), (codec, Some(&mut out))] {
            let mut encoded = BytesMut::new();
            RecordBatchEncoder::encode(
                &mut encoded,
                &batch,
                &RecordEncodeOptions {
                    version: 2,
                    compression: c,
                },
            )
            .unwrap();
            match buf {
                Some(buf) => buf.extend_from_slice(&encoded),
                None => plain += encoded.len(),
            }
        }
        offset += RECORDS_PER_BATCH as i64;
        count += RECORDS_PER_BATCH;
    }
    (out.freeze(), plain, count)
}

fn fetch_response(records: Bytes) -> Bytes {
    let partition = PartitionData::default()
        .with_partition_index(0)
        .with_high_watermark(1 << 40)
        .with_last_stable_offset(1 << 40)
        .with_log_start_offset(0)
        .with_records(Some(records));
    let response = FetchResponse::default()
        .with_session_id(7)
        .with_responses(vec![
            FetchableTopicResponse::default()
                .with_topic_id(uuid::Uuid::from_u128(0x1234_5678))
                .with_partitions(vec![partition]),
        ]);
    let mut buf = BytesMut::new();
    response.encode(&mut buf, FETCH_VERSION).unwrap();
    buf.freeze()
}

/// The path under test: check the response's structure, decode it, split, decode every batch.
fn decode_response(frame: &Bytes, out: &mut Records) -> usize {
    decode_response_with(frame, out, &DecodeLimits::default())
}

fn decode_response_with(frame: &Bytes, out: &mut Records, limits: &DecodeLimits) -> usize {
    check_fetch_response(frame, FETCH_VERSION).unwrap();
    let response = FetchResponse::decode(&mut frame.clone(), FETCH_VERSION).unwrap();
    out.clear();
    for topic in &response.responses {
        for partition in &topic.partitions {
            let Some(records) = &partition.records else {
                continue;
            };
            for batch in BatchIter::new(records.clone()) {
                decode_batch(&batch.unwrap(), limits, out).unwrap();
            }
        }
    }
    out.len()
}

/// The baseline: kafka-protocol's decoder on the same batches.
fn decode_response_kafka_protocol(frame: &Bytes) -> usize {
    let response = FetchResponse::decode(&mut frame.clone(), FETCH_VERSION).unwrap();
    let mut n = 0;
    for topic in &response.responses {
        for partition in &topic.partitions {
            let mut records = partition.records.clone().unwrap_or_default();
            for set in RecordBatchDecoder::decode_all(&mut records).unwrap() {
                n += set.records.len();
                black_box(set);
            }
        }
    }
    n
}

fn bench(c: &mut Criterion) {
    let mut cases = Vec::new();
    for (name, codec) in CODECS {
        let (records, plain, count) = records(codec);
        let frame = fetch_response(records.clone());
        let batches = BatchIter::new(records.clone()).count();

        let mut out = Records::new();
        assert_eq!(decode_response(&frame, &mut out), count);
        let before = allocations();
        decode_response(&frame, &mut out);
        let ours = allocations() - before;
        let before = allocations();
        assert_eq!(decode_response_kafka_protocol(&frame), count);
        let theirs = allocations() - before;
        println!(
            "{name:>6}: {count} records in {batches} batches, records field {} bytes ({plain} uncompressed), \
             frame {} bytes; allocs/record {:.3} ({ours} per response; kafka-protocol {:.3})",
            records.len(),
            frame.len(),
            ours as f64 / count as f64,
            theirs as f64 / count as f64,
        );
        cases.push((name, frame, plain));
    }

    let mut group = c.benchmark_group("fetch_decode");
    for (name, frame, plain) in &cases {
        group.throughput(Throughput::Bytes(*plain as u64));
        let mut out = Records::new();
        group.bench_function(format!("kafka-source/{name}"), |b| {
            b.iter(|| black_box(decode_response(black_box(frame), &mut out)))
        });
        group.bench_function(format!("kafka-protocol/{name}"), |b| {
            b.iter(|| black_box(decode_response_kafka_protocol(black_box(frame))))
        });
    }
    // The uncompressed response again with `check.crcs=false`: the records alone, without
    // the CRC.
    let (_, frame, plain) = &cases[0];
    group.throughput(Throughput::Bytes(*plain as u64));
    let mut out = Records::new();
    let unverified = DecodeLimits::default().with_check_crc(false);
    group.bench_function("kafka-source/none-unverified", |b| {
        b.iter(|| {
            black_box(decode_response_with(
                black_box(frame),
                &mut out,
                &unverified,
            ))
        })
    });
    group.finish();

    // The structural check alone, on the uncompressed response (its cost does not depend on
    // the codec: it reads the records field's length, not its bytes).
    let mut group = c.benchmark_group("fetch_check");
    let (_, frame, plain) = &cases[0];
    group.throughput(Throughput::Bytes(*plain as u64));
    group.bench_function("check_fetch_response", |b| {
        b.iter(|| check_fetch_response(black_box(frame), FETCH_VERSION).unwrap())
    });
    group.finish();

    // The CRC-32C implementations the consumer chooses between, side by side on this CPU: it
    // times them once when it is created (except with AVX-512 and VPCLMULQDQ, where it takes
    // `crc-fast`'s fused code untimed) and keeps the fastest.
    let mut group = c.benchmark_group("crc32c");
    for size in [1usize << 10, 16 << 10, 256 << 10, 1 << 20] {
        let data: Vec<u8> = (0..size).map(|i| (i * 7 + i / 13) as u8).collect();
        let reference = crc32c::crc32c(&data);
        group.throughput(Throughput::Bytes(size as u64));
        for (name, crc) in crc32c_implementations() {
            assert_eq!(crc(&data), reference, "{name}");
            group.bench_function(format!("{name}/{size}"), |b| {
                b.iter(|| crc(black_box(&data)))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
