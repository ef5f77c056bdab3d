//! `[version, flags]` then a FetchResponse body → the fetch state machine → every chunk it
//! hands out decoded to its end.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kafka_source::fuzzing::fetch_response(data));
