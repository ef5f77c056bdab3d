//! Arbitrary bytes as ConsumerProtocol member metadata and as a member assignment.
#![no_main]

use kafka_source::fuzzing::consumer_protocol;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| consumer_protocol(data));
