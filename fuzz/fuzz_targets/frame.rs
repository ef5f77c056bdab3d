//! `[api, version]` then a response frame (length prefix, header, body) → length check,
//! correlation id, and the response decoder for that API and version.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kafka_source::fuzzing::frame(data));
