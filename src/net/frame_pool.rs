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
//! [`SPARE_BUFFERS`] buffers of at most [`MAX_POOLED`] bytes wait here, for all of a consumer's
//! connections; a full pool lets its oldest spare go, so spares follow the sizes the
//! connections see now. The network loop counts the spares against the fetch budget, and lets
//! them go when they would leave the budget no room for a fetch.

use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

/// How many freed buffers a consumer keeps: one for the frame being read while the
/// application still holds the one before, one more for a response that arrives early.
const SPARE_BUFFERS: usize = 2;

/// Frames below this size are not worth a buffer of their own: the heap serves them from
/// memory it already holds.
const MIN_POOLED: usize = 64 * 1024;

/// Buffers above this size are freed, not kept.
pub(crate) const MAX_POOLED: usize = 16 << 20;

/// Frames of at least this size (and at most [`MAX_POOLED`]) are read into an anonymous mapping
/// of their own, whose whole huge pages are advised to be backed by transparent huge pages: a
/// page fault then maps and zeroes 2 MiB at once instead of 4 KiB, so a frame of 4 MiB costs
/// two faults rather than 1,024. Only the pages the frame's bytes reach are ever touched, so a
/// length prefix alone still commits no memory ahead of the bytes that arrived (a huge page at
/// most), and the frame's last, partial huge page stays in small pages.
#[cfg(target_os = "linux")]
const MAPPED_MIN: usize = HUGE_PAGE;

/// The size and alignment of a transparent huge page (x86-64, and arm64 with 4 KiB pages).
#[cfg(target_os = "linux")]
const HUGE_PAGE: usize = 2 << 20;

/// A frame's receive buffer: on the heap, or (large frames on Linux) a mapping of its own.
#[derive(Debug)]
pub(crate) struct FrameBuf(Buf);

#[derive(Debug)]
enum Buf {
    Heap(Vec<u8>),
    #[cfg(target_os = "linux")]
    Mapped {
        /// The frame's length and a huge page more, so that the frame can start on a huge
        /// page's boundary (the bytes before it are never touched, and so never backed).
        map: memmap2::MmapMut,
        /// Where the frame starts in `map`: the first huge page boundary.
        start: usize,
        /// The frame length it was made for.
        cap: usize,
        /// Bytes of the frame read so far, from `start`.
        len: usize,
    },
}

/// Where the next read of a frame goes.
pub(crate) enum ReadInto<'a> {
    /// A heap buffer: read into its spare capacity (at most the frame's missing bytes).
    Heap(&'a mut Vec<u8>),
    /// The rest of a mapping, whose length is the frame's: `read` bytes are added to `filled`.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    Mapped {
        /// The mapping past the bytes read so far.
        room: &'a mut [u8],
        /// The count of bytes read so far.
        filled: &'a mut usize,
    },
}

impl Default for FrameBuf {
    fn default() -> Self {
        Self(Buf::Heap(Vec::new()))
    }
}

impl FrameBuf {
    /// An empty heap buffer with room for `capacity` bytes.
    pub(crate) fn heap(capacity: usize) -> Self {
        Self(Buf::Heap(Vec::with_capacity(capacity)))
    }

    /// Room for a frame of `len` bytes in a mapping of its own that starts on a huge page's
    /// boundary, its whole huge pages advised to use transparent huge pages; `None` if the
    /// system grants no mapping.
    #[cfg(target_os = "linux")]
    fn mapped(len: usize) -> Option<Self> {
        let map = memmap2::MmapMut::map_anon(len.checked_add(HUGE_PAGE)?).ok()?;
        let addr = map.as_ptr() as usize;
        let start = addr.next_multiple_of(HUGE_PAGE) - addr;
        let whole = len / HUGE_PAGE * HUGE_PAGE;
        // Only advice: without transparent huge pages the mapping works as it is.
        let _ = map.advise_range(memmap2::Advice::HugePage, start, whole);
        Some(Self(Buf::Mapped {
            map,
            start,
            cap: len,
            len: 0,
        }))
    }

    /// The bytes read so far.
    pub(crate) fn len(&self) -> usize {
        match &self.0 {
            Buf::Heap(v) => v.len(),
            #[cfg(target_os = "linux")]
            Buf::Mapped { len, .. } => *len,
        }
    }

    /// How many bytes fit without growing.
    pub(crate) fn capacity(&self) -> usize {
        match &self.0 {
            Buf::Heap(v) => v.capacity(),
            #[cfg(target_os = "linux")]
            Buf::Mapped { cap, .. } => *cap,
        }
    }

    /// The bytes read so far.
    pub(crate) fn as_slice(&self) -> &[u8] {
        match &self.0 {
            Buf::Heap(v) => v,
            #[cfg(target_os = "linux")]
            Buf::Mapped {
                map, start, len, ..
            } => &map[*start..*start + *len],
        }
    }

    /// Appends `bytes`, which must fit a mapping's length (a heap buffer grows).
    pub(crate) fn extend_from_slice(&mut self, bytes: &[u8]) {
        match &mut self.0 {
            Buf::Heap(v) => v.extend_from_slice(bytes),
            #[cfg(target_os = "linux")]
            Buf::Mapped {
                map, start, len, ..
            } => {
                let at = *start + *len;
                map[at..at + bytes.len()].copy_from_slice(bytes);
                *len += bytes.len();
            }
        }
    }

    /// Room for `additional` more bytes: a heap buffer grows by exactly that much; a mapping
    /// already has its frame's length.
    pub(crate) fn reserve_exact(&mut self, additional: usize) {
        if let Buf::Heap(v) = &mut self.0 {
            v.reserve_exact(additional);
        }
    }

    /// Where the next read goes.
    pub(crate) fn read_into(&mut self) -> ReadInto<'_> {
        match &mut self.0 {
            Buf::Heap(v) => ReadInto::Heap(v),
            #[cfg(target_os = "linux")]
            Buf::Mapped {
                map,
                start,
                cap,
                len,
            } => ReadInto::Mapped {
                room: &mut map[*start + *len..*start + *cap],
                filled: len,
            },
        }
    }

    fn clear(&mut self) {
        match &mut self.0 {
            Buf::Heap(v) => v.clear(),
            #[cfg(target_os = "linux")]
            Buf::Mapped { len, .. } => *len = 0,
        }
    }

    fn is_mapped(&self) -> bool {
        !matches!(self.0, Buf::Heap(_))
    }

    /// Where a mapped frame's first byte goes.
    #[cfg(all(test, target_os = "linux"))]
    fn mapped_start(&self) -> Option<usize> {
        match &self.0 {
            Buf::Heap(_) => None,
            Buf::Mapped { map, start, .. } => Some(map.as_ptr() as usize + start),
        }
    }
}

impl AsRef<[u8]> for FrameBuf {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

/// A consumer's spare receive buffers.
#[derive(Debug, Default)]
pub(crate) struct FramePool {
    spare: Mutex<Vec<FrameBuf>>,
}

impl FramePool {
    /// What is left of `room`, the fetch budget not yet taken, once the spare buffers are
    /// counted: they are kept while there is room beside them, and let go when they would take
    /// all of it (the next frame then reads into fresh pages), so that they never hold fetching
    /// back.
    pub(crate) fn room_beside(&self, room: usize) -> usize {
        let mut spare = self.spare.lock();
        let bytes: usize = spare.iter().map(FrameBuf::capacity).sum();
        if bytes < room {
            return room - bytes;
        }
        let gone = std::mem::take(&mut *spare);
        drop(spare);
        // Freed outside the lock.
        drop(gone);
        room
    }

    /// An empty buffer for a frame of `len` bytes, or for its first `len` bytes if it is larger
    /// (`whole` false; such a buffer is on the heap and grows). It has room for at least `len`
    /// bytes, at most a sixteenth more: the most recent spare of the right kind large enough
    /// (a heap spare shrunk if need be), otherwise a new one.
    pub(crate) fn take(&self, len: usize, whole: bool) -> FrameBuf {
        #[cfg(target_os = "linux")]
        let mapped = whole && (MAPPED_MIN..=MAX_POOLED).contains(&len);
        #[cfg(not(target_os = "linux"))]
        let mapped = {
            let _ = whole;
            false
        };
        if len >= MIN_POOLED {
            let fits = |buf: &FrameBuf| {
                buf.is_mapped() == mapped
                    && buf.capacity() >= len
                    // A mapping cannot shrink: only one close to the frame's size will do.
                    && (!mapped || buf.capacity() <= len + len / 16)
            };
            let (found, unfit) = {
                let mut spare = self.spare.lock();
                match spare.iter().rposition(fits) {
                    Some(at) => (Some(spare.remove(at)), Vec::new()),
                    // A new buffer is about to be made: the spare mappings this frame cannot
                    // use go first, rather than stay mapped beside it (a heap spare that is
                    // too small stays: the heap reuses its memory anyway).
                    None => {
                        let (unfit, keep) = spare.drain(..).partition(FrameBuf::is_mapped);
                        *spare = keep;
                        (None, unfit)
                    }
                }
            };
            // Unmapped outside the lock.
            drop(unfit);
            if let Some(mut buf) = found {
                if let Buf::Heap(v) = &mut buf.0
                    && v.capacity() > len + len / 16
                {
                    v.shrink_to(len);
                }
                return buf;
            }
        }
        #[cfg(target_os = "linux")]
        if mapped && let Some(buf) = FrameBuf::mapped(len) {
            return buf;
        }
        FrameBuf::heap(len)
    }

    /// `frame`'s bytes as [`Bytes`] whose buffer returns to this pool when the last view of
    /// it is dropped.
    pub(crate) fn frame(self: &Arc<Self>, frame: FrameBuf) -> Bytes {
        let frame = match frame.0 {
            Buf::Heap(v) if v.capacity() < MIN_POOLED || v.capacity() > MAX_POOLED => {
                return Bytes::from(v);
            }
            buf => FrameBuf(buf),
        };
        Bytes::from_owner(Pooled {
            buf: frame,
            pool: Arc::clone(self),
        })
    }

    fn put(&self, mut buf: FrameBuf) {
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
        self.spare.lock().iter().map(FrameBuf::capacity).collect()
    }

    #[cfg(test)]
    pub(crate) fn spare_mapped(&self) -> Vec<bool> {
        self.spare.lock().iter().map(FrameBuf::is_mapped).collect()
    }
}

/// A frame's buffer on its way back to its pool.
struct Pooled {
    buf: FrameBuf,
    pool: Arc<FramePool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        self.buf.as_slice()
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

    fn filled(pool: &FramePool, len: usize, byte: u8) -> FrameBuf {
        let mut buf = pool.take(len, true);
        buf.extend_from_slice(&vec![byte; len]);
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

    /// Spares take their capacity out of the fetch budget's room while there is room beside
    /// them; when they would take all of it, they go and leave it all.
    #[test]
    fn spares_count_against_the_room_for_fetches_or_go() {
        let pool = Arc::new(FramePool::default());
        let room = 8 * MIN_POOLED;
        let frames = [2, 3].map(|i| pool.frame(filled(&pool, i * MIN_POOLED, 0)));
        assert_eq!(
            pool.room_beside(room),
            room,
            "buffers in use are not spares"
        );
        drop(frames);
        assert_eq!(pool.spare_capacities(), [2 * MIN_POOLED, 3 * MIN_POOLED]);
        assert_eq!(pool.room_beside(room), 3 * MIN_POOLED);
        assert_eq!(pool.spare_capacities().len(), 2, "kept");
        assert_eq!(pool.room_beside(5 * MIN_POOLED), 5 * MIN_POOLED);
        assert!(pool.spare_capacities().is_empty(), "let go");
        assert_eq!(pool.room_beside(0), 0);
    }

    #[test]
    fn a_frame_takes_a_spare_of_about_its_size() {
        let pool = Arc::new(FramePool::default());
        drop(pool.frame(filled(&pool, 4 * MIN_POOLED, 0)));
        assert_eq!(pool.spare_capacities(), [4 * MIN_POOLED]);
        // Too small for the frame: not used, and kept for a frame it fits.
        let bigger = pool.take(5 * MIN_POOLED, true);
        assert!(bigger.capacity() >= 5 * MIN_POOLED);
        assert_eq!(pool.spare_capacities(), [4 * MIN_POOLED]);
        // Up to a sixteenth larger than the frame: used as it is.
        let close = 4 * MIN_POOLED - 100;
        assert_eq!(pool.take(close, true).capacity(), 4 * MIN_POOLED);
        assert!(pool.spare_capacities().is_empty());
        // Larger still: used, shrunk to the frame (the budget counts the frame, not the
        // buffer).
        drop(pool.frame(bigger));
        let small = pool.take(2 * MIN_POOLED, true);
        assert_eq!(small.capacity(), 2 * MIN_POOLED);
        assert!(pool.spare_capacities().is_empty());
        // Small frames never take a spare.
        drop(pool.frame(small));
        assert_eq!(pool.take(100, true).capacity(), 100);
        assert_eq!(pool.spare_capacities(), [2 * MIN_POOLED]);
    }

    /// Frames of 2 to 16 MiB whose whole length is known get a mapping of exactly their
    /// length, which returns to the pool and serves the next frame of about that size only;
    /// a heap spare never serves them, nor they a heap frame.
    #[cfg(target_os = "linux")]
    #[test]
    fn large_frames_are_read_into_mappings_of_their_length() {
        let pool = Arc::new(FramePool::default());
        let len = 3 << 20;
        let first = pool.frame(filled(&pool, len, 7));
        assert_eq!(first.len(), len);
        assert!(first.iter().all(|&b| b == 7));
        let at = first.as_ptr();
        drop(first);
        assert_eq!(pool.spare_mapped(), [true]);
        assert_eq!(pool.spare_capacities(), [len]);

        // Up to a sixteenth smaller: the same mapping, and only the new frame's bytes show.
        let second = pool.frame(filled(&pool, len - len / 20, 9));
        assert_eq!(second.as_ptr(), at, "the mapping is reused");
        assert_eq!(second.len(), len - len / 20);
        assert!(second.iter().all(|&b| b == 9));
        drop(second);

        // Much smaller: a mapping of its own, and the spare it could not use is let go rather
        // than kept mapped beside it.
        let smaller = pool.take(2 << 20, true);
        assert_eq!(smaller.capacity(), 2 << 20);
        assert!(smaller.is_mapped());
        assert!(pool.spare_capacities().is_empty());
        drop(pool.frame(smaller));
        assert_eq!(pool.spare_capacities(), [2 << 20]);
        let larger = pool.take(4 << 20, true);
        assert_eq!(larger.capacity(), 4 << 20);
        assert!(pool.spare_capacities().is_empty());
        let smaller = pool.take(2 << 20, true);

        // A heap frame (not a whole frame, one larger than a grow step; under 2 MiB; over the
        // pool's largest) never takes a mapped spare, and a new heap buffer lets the mapped
        // spares go too; a heap spare that is too small stays.
        drop(pool.frame(filled(&pool, MIN_POOLED, 0)));
        drop(pool.frame(pool.take(3 << 20, true)));
        assert_eq!(pool.spare_mapped(), [false, true]);
        assert!(!pool.take(len, false).is_mapped());
        assert_eq!(pool.spare_mapped(), [false]);
        drop(pool.frame(pool.take(3 << 20, true)));
        assert!(!pool.take((2 << 20) - 1, true).is_mapped());
        assert_eq!(pool.spare_mapped(), [false]);
        drop(pool.frame(pool.take(3 << 20, true)));
        assert!(!pool.take(MAX_POOLED + 1, true).is_mapped());
        assert_eq!(pool.spare_mapped(), [false]);

        // A mapped frame starts on a huge page's boundary.
        assert_eq!(smaller.mapped_start().unwrap() % HUGE_PAGE, 0);
        assert_eq!(larger.mapped_start().unwrap() % HUGE_PAGE, 0);

        // A mapped frame returns to the pool like a heap one; the oldest spare goes.
        drop(pool.frame(smaller));
        drop(pool.frame(larger));
        assert_eq!(pool.spare_capacities(), [2 << 20, 4 << 20]);
        assert_eq!(pool.spare_mapped(), [true, true]);
    }

    /// The kernel's own account (`/proc/self/smaps`): the range of a mapped frame's whole huge
    /// pages may be backed by transparent huge pages unless THP is off for the system, and its
    /// partial last huge page is not advised.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_mapped_frames_whole_huge_pages_are_eligible_for_them() {
        let Ok(mode) = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        else {
            eprintln!("skipping: this kernel has no transparent huge pages");
            return;
        };
        let thp_on = !mode.contains("[never]");
        let pool = FramePool::default();
        // Two whole huge pages, and 1 MiB and a bit of a third.
        let len = (5 << 20) + 1000;
        let frame = pool.take(len, true);
        let start = frame.mapped_start().expect("a frame of 5 MiB is mapped");
        // (eligible, flags) of the mapping that holds `addr`.
        let vma = |addr: usize| -> (bool, String) {
            let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
            let mut inside = false;
            let mut eligible = false;
            for line in smaps.lines() {
                if let Some((range, _)) = line.split_once(' ')
                    && let Some((lo, hi)) = range.split_once('-')
                    && let (Ok(lo), Ok(hi)) =
                        (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
                {
                    inside = (lo..hi).contains(&addr);
                } else if inside && let Some(e) = line.strip_prefix("THPeligible:") {
                    eligible = e.trim() == "1";
                } else if inside && let Some(f) = line.strip_prefix("VmFlags:") {
                    // The last line of a mapping's entry.
                    return (eligible, f.trim().to_owned());
                }
            }
            panic!("no mapping holds {addr:#x}");
        };
        let (eligible, flags) = vma(start);
        assert!(flags.split(' ').any(|f| f == "hg"), "advised: {flags}");
        assert_eq!(eligible, thp_on, "first huge page, THP {mode}");
        let (eligible, flags) = vma(start + (2 << 20));
        assert!(flags.split(' ').any(|f| f == "hg"), "advised: {flags}");
        assert_eq!(eligible, thp_on, "last whole huge page, THP {mode}");
        let (_, flags) = vma(start + (4 << 20));
        assert!(
            !flags.split(' ').any(|f| f == "hg"),
            "the partial last huge page is not advised: {flags}"
        );
    }
}
