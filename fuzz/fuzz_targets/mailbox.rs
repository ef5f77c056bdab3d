//! Publish, take and drop on one thread → `Mailbox<Vec<u8>>` against a model `Option`.
#![no_main]

use arbitrary::Arbitrary;
use kafka_source::fuzzing::{MailboxOp, mailbox};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    Publish(Vec<u8>),
    Take,
    Renew,
}

fuzz_target!(|ops: Vec<Op>| {
    let ops: Vec<MailboxOp> = ops
        .into_iter()
        .map(|op| match op {
            Op::Publish(v) => MailboxOp::Publish(v),
            Op::Take => MailboxOp::Take,
            Op::Renew => MailboxOp::Renew,
        })
        .collect();
    mailbox(&ops);
});
