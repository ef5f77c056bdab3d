//! A byte string read as a sequence of group events → the KIP-848 membership state machine.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kafka_source::fuzzing::consumer_member(data));
