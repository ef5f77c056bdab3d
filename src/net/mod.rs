//! IO shell.
