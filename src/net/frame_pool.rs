//! Receive buffers of large frames, kept for the connection's next frames once every view of
//! their frame is dropped.
//!
//! A fetch response is read into an allocation of its own size. An allocation that large is
//! usually served by fresh pages (glibc maps allocations above its mmap threshold, and returns
//! the top of its heap to the kernel when it grows past the trim threshold), so every response
//! paid a page fault, and the zeroing of a page, per 4 KiB it received. A buffer taken from
//! here is already mapped.
//!
//! The fetch budget counts a frame's length, not its buffer's capacity, so a spare more than a
//! sixteenth larger than the frame it is taken for is first shrunk to the frame's size (the
//! allocator takes the tail back; a mapped buffer's tail pages go back to the kernel). At most
//! [`SPARE_BUFFERS`] buffers of at most [`MAX_POOLED`] bytes wait here per connection; a full
//! pool lets its oldest spare go, so spares follow the sizes the connection sees now.

use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

/// How many freed buffers a connection keeps: one for the frame being read while the
/// application still holds the one before, one more for a response that arrives early.
const SPARE_BUFFERS: usize = 2;

/// Frames below this size are not worth a buffer of their own: the heap serves them from
/// memory it already holds.
const MIN_POOLED: usize = 64 * 1024;

/// Buffers above this size are freed, not kept.
const MAX_POOLED: usize = 16 << 20;

/// A connection's spare receive buffers.
#[derive(Debug, Default)]
pub(crate) struct FramePool {
    spare: Mutex<Vec<Vec<u8>>>,
}

impl FramePool {
    /// An empty buffer with room for at least `capacity` bytes, at most a sixteenth more: the
    /// most recent spare large enough, shrunk if need be, otherwise a new allocation.
    pub(crate) fn take(&self, capacity: usize) -> Vec<u8> {
        if capacity >= MIN_POOLED {
            let found = {
                let mut spare = self.spare.lock();
                let at = spare.iter().rposition(|buf| buf.capacity() >= capacity);
                at.map(|at| spare.remove(at))
            };
            if let Some(mut buf) = found {
                if buf.capacity() > capacity + capacity / 16 {
                    buf.shrink_to(capacity);
                }
                return buf;
            }
        }
        Vec::with_capacity(capacity)
    }

    /// `frame`'s bytes as [`Bytes`] whose buffer returns to this pool when the last view of
    /// it is dropped.
    pub(crate) fn frame(self: &Arc<Self>, frame: Vec<u8>) -> Bytes {
        if frame.capacity() < MIN_POOLED || frame.capacity() > MAX_POOLED {
            return Bytes::from(frame);
        }
        Bytes::from_owner(Pooled {
            buf: frame,
            pool: Arc::clone(self),
        })
    }

    fn put(&self, mut buf: Vec<u8>) {
        buf.clear();
        let oldest = {
            let mut spare = self.spare.lock();
            spare.push(buf);
            (spare.len() > SPARE_BUFFERS).then(|| spare.remove(0))
        };
        // Freed outside the lock.
        drop(oldest);
    }

    #[cfg(test)]
    pub(crate) fn spare_capacities(&self) -> Vec<usize> {
        self.spare.lock().iter().map(Vec::capacity).collect()
    }
}

/// A frame's buffer on its way back to its pool.
struct Pooled {
    buf: Vec<u8>,
    pool: Arc<FramePool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.put(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(pool: &FramePool, len: usize, byte: u8) -> Vec<u8> {
        let mut buf = pool.take(len);
        buf.resize(len, byte);
        buf
    }

    #[test]
    fn a_dropped_frame_lends_its_buffer_to_the_next() {
        let pool = Arc::new(FramePool::default());
        let first = pool.frame(filled(&pool, 100_000, 1));
        let at = first.as_ptr();
        // Views keep the buffer: it returns with the last of them.
        let view = first.slice(10..20);
        drop(first);
        assert!(pool.spare_capacities().is_empty());
        assert_eq!(view, [1u8; 10][..]);
        drop(view);
        assert_eq!(pool.spare_capacities().len(), 1);
        let second = pool.frame(filled(&pool, 99_000, 2));
        assert_eq!(second.as_ptr(), at, "the spare buffer is reused");
        assert!(second.iter().all(|&b| b == 2));
        assert!(pool.spare_capacities().is_empty());
    }

    #[test]
    fn the_pool_keeps_a_bounded_number_of_buffers_of_bounded_size() {
        let pool = Arc::new(FramePool::default());
        let frames: Vec<Bytes> = (1..=5)
            .map(|i| pool.frame(filled(&pool, i * MIN_POOLED, 0)))
            .collect();
        drop(frames);
        // The last two returned stay; the older ones were let go.
        assert_eq!(pool.spare_capacities(), [4 * MIN_POOLED, 5 * MIN_POOLED]);

        // Too small or too large: freed, never kept.
        let pool = Arc::new(FramePool::default());
        drop(pool.frame(filled(&pool, MIN_POOLED - 1, 0)));
        drop(pool.frame(filled(&pool, MAX_POOLED + 1, 0)));
        assert!(pool.spare_capacities().is_empty());
    }

    #[test]
    fn a_frame_takes_a_spare_of_about_its_size() {
        let pool = Arc::new(FramePool::default());
        drop(pool.frame(filled(&pool, 4 * MIN_POOLED, 0)));
        assert_eq!(pool.spare_capacities(), [4 * MIN_POOLED]);
        // Too small for the frame: not used, and kept for a frame it fits.
        let bigger = pool.take(5 * MIN_POOLED);
        assert!(bigger.capacity() >= 5 * MIN_POOLED);
        assert_eq!(pool.spare_capacities(), [4 * MIN_POOLED]);
        // Up to a sixteenth larger than the frame: used as it is.
        let close = 4 * MIN_POOLED - 100;
        assert_eq!(pool.take(close).capacity(), 4 * MIN_POOLED);
        assert!(pool.spare_capacities().is_empty());
        // Larger still: used, shrunk to the frame (the budget counts the frame, not the
        // buffer).
        drop(pool.frame(bigger));
        let small = pool.take(2 * MIN_POOLED);
        assert_eq!(small.capacity(), 2 * MIN_POOLED);
        assert!(pool.spare_capacities().is_empty());
        // Small frames never take a spare.
        drop(pool.frame(small));
        assert_eq!(pool.take(100).capacity(), 100);
        assert_eq!(pool.spare_capacities(), [2 * MIN_POOLED]);
    }
}
