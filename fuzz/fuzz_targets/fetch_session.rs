//! A byte string read as a sequence of fetch-path events → the fetch state machine, driven as
//! the network loop drives it, with every chunk it hands out decoded as the consumer does.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kafka_source::fuzzing::fetch_session(data));
