//! Handover mailbox (placeholder).
