//! Offers, polls, coordinator and commit answers, and timeouts → the commit state machine.
#![no_main]

use arbitrary::Arbitrary;
use kafka_source::fuzzing::{CommitOp, commit_machine};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    Offer(u8),
    Poll(u16),
    FindAnswer {
        stale: bool,
        transport_error: bool,
        batched: bool,
        code: u8,
        node: i8,
        port: u16,
    },
    CommitAnswer {
        stale: bool,
        transport_error: bool,
        codes: [u8; 3],
        missing: u8,
    },
    Timeout(u16),
}

fuzz_target!(|ops: Vec<Op>| {
    let ops: Vec<CommitOp> = ops
        .into_iter()
        .map(|op| match op {
            Op::Offer(mask) => CommitOp::Offer(mask),
            Op::Poll(ms) => CommitOp::Poll(ms),
            Op::FindAnswer {
                stale,
                transport_error,
                batched,
                code,
                node,
                port,
            } => CommitOp::FindAnswer {
                stale,
                transport_error,
                batched,
                code,
                node,
                port,
            },
            Op::CommitAnswer {
                stale,
                transport_error,
                codes,
                missing,
            } => CommitOp::CommitAnswer {
                stale,
                transport_error,
                codes,
                missing,
            },
            Op::Timeout(ms) => CommitOp::Timeout(ms),
        })
        .collect();
    commit_machine(&ops);
});
