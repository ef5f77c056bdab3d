//! Arbitrary bytes as a partition's `records` field: split into batches, check and decode each.
#![no_main]

use kafka_source::records::{AbortedTransactions, BatchIter, DecodeLimits, decode_batch};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut out = kafka_source::Records::new();
    let limits = DecodeLimits::new(1 << 20);
    let mut filter = AbortedTransactions::new([(1, 0), (2, 5)]);
    for batch in BatchIter::new(bytes::Bytes::copy_from_slice(data)) {
        let Ok(batch) = batch else { break };
        let _ = filter.classify(&batch);
        let _ = decode_batch(&batch, &limits, &mut out);
        for record in &out {
            for header in record.headers() {
                std::hint::black_box(header);
            }
        }
        out.clear();
    }
});
