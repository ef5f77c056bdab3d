//! Offers, polls, coordinator and commit answers, and timeouts → the commit state machine.
#![no_main]

use kafka_source::fuzzing::{CommitOp, commit_machine};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|ops: Vec<CommitOp>| commit_machine(&ops));
