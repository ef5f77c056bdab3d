//! The consumer-group pieces that are pure data: the ConsumerProtocol bytes exchanged in
//! JoinGroup and SyncGroup.

pub(crate) mod consumer_protocol;
