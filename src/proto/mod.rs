//! Sans-IO protocol core: no sockets, no clock, no tasks.
//!
//! Everything here is a pure function or a state machine fed with responses and `now`.

pub(crate) mod chunk;
pub(crate) mod commit;
pub(crate) mod crc_scan;
pub(crate) mod fetch;
pub(crate) mod frame;
pub(crate) mod group;
pub(crate) mod guard;
pub(crate) mod metadata;
pub(crate) mod records;
pub(crate) mod recovery;
pub(crate) mod versions;
