//! The IO shell: sockets, tasks and timers. Protocol decisions live in `crate::proto`.

pub(crate) mod backoff;
pub(crate) mod connection;
pub(crate) mod driver;
pub(crate) mod frame_pool;
pub(crate) mod inflight;
pub(crate) mod pool;
