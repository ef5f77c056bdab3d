//! Publish, take and drop on one thread → `Mailbox<Vec<u8>>` against a model `Option`.
#![no_main]

use kafka_source::fuzzing::{MailboxOp, mailbox};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|ops: Vec<MailboxOp>| mailbox(&ops));
