//! Test support for kafka-source.
