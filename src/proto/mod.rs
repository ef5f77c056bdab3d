//! Sans-IO protocol core.

pub(crate) mod records;
