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
        // Unverified too: mutated bytes rarely keep a valid CRC, and without the check they
        // reach the record decoder.
        for check_crc in [true, false] {
            let _ = decode_batch(&batch, &limits.with_check_crc(check_crc), &mut out);
            for record in &out {
                assert_eq!(record.headers().count(), record.header_count());
            }
            out.clear();
        }
    }
});
