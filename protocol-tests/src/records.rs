//! The records the Java producer writes, computed in Rust, so tests can check what they consume.

/// Key of record `i`: its decimal form in UTF-8.
pub fn expected_key(i: u64) -> Vec<u8> {
    i.to_string().into_bytes()
}

/// Value of record `i`: `size` bytes, byte `j` = `(i * 31 + j * 7) & 0xff`.
pub fn expected_value(i: u64, size: usize) -> Vec<u8> {
    let base = i.wrapping_mul(31);
    (0..size as u64)
        .map(|j| (base.wrapping_add(j.wrapping_mul(7)) & 0xff) as u8)
        .collect()
}

/// CRC32 (IEEE, as `java.util.zip.CRC32`) of `key` followed by `value`, widened to `u64`. The
/// producer's checksum is the wrapping sum of this over the committed records.
pub fn record_checksum(key: &[u8], value: &[u8]) -> u64 {
    let mut h = crc32fast::Hasher::new();
    h.update(key);
    h.update(value);
    u64::from(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_follow_the_formula() {
        assert_eq!(expected_value(0, 4), vec![0, 7, 14, 21]);
        assert_eq!(expected_value(9, 3), vec![23, 30, 37]);
        // 37 * 31 = 1147 = 0x47b -> low byte 0x7b; j = 40 adds 280.
        assert_eq!(expected_value(37, 41)[40], ((1147 + 280) & 0xff) as u8);
        assert_eq!(expected_key(42), b"42".to_vec());
    }

    #[test]
    fn checksum_is_ieee_crc32() {
        // The standard CRC-32 check value.
        assert_eq!(record_checksum(b"1234", b"56789"), 0xCBF4_3926);
        assert_eq!(record_checksum(b"", b""), 0);
    }
}
