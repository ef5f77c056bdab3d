//! Exponential backoff with jitter, for reconnects and retries.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// `base * 2^(attempt-1)`, capped at `max`, then spread by ±20 % so that many clients (or many
/// partitions) that failed together do not retry together.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Backoff {
    pub(crate) base: Duration,
    pub(crate) max: Duration,
}

impl Backoff {
    /// The wait before retry number `attempt` (1 = first retry).
    pub(crate) fn delay(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(20);
        let raw = self.base.saturating_mul(1u32 << exp).min(self.max);
        let jitter = (random() % 401) as f64 / 1000.0 - 0.2; // -0.2 ..= +0.2
        raw.mul_f64(1.0 + jitter)
    }
}

/// A cheap, non-cryptographic random number: enough to spread retries.
fn random() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_and_caps_within_jitter() {
        let b = Backoff {
            base: Duration::from_millis(50),
            max: Duration::from_millis(1000),
        };
        for attempt in 1..30 {
            let expected = (50u64 << (attempt - 1).min(20)).min(1000) as f64;
            let d = b.delay(attempt).as_secs_f64() * 1000.0;
            assert!(
                d >= expected * 0.79 && d <= expected * 1.21,
                "attempt {attempt}: {d} vs {expected}"
            );
        }
    }
}
