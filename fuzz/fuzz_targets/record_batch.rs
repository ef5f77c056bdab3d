//! Arbitrary bytes as a partition's `records` field: split into batches, check and decode each,
//! with the fast record reader checked against the general one.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kafka_source::fuzzing::record_batch(data));
