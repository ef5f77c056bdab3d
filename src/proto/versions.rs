//! API version negotiation: our window per API, intersected with what each broker offers.
//!
//! Windows are checked against each request type's own `VERSIONS` (not
//! `ApiKey::valid_versions()`, which overstates OffsetCommit and OffsetFetch in kafka-protocol
//! 0.18). The chosen version is `min(broker max, our max)`, and must not fall below
//! `max(broker min, our min)`.

use std::collections::HashMap;

use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, ConsumerGroupHeartbeatRequest, FetchRequest,
    FindCoordinatorRequest, HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest,
    ListOffsetsRequest, MetadataRequest, OffsetCommitRequest, OffsetFetchRequest, SyncGroupRequest,
};
use kafka_protocol::protocol::Request;

/// Our supported window for one API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    pub(crate) api: ApiKey,
    pub(crate) min: i16,
    pub(crate) max: i16,
}

const fn window<R: Request>(api: ApiKey, min: i16, max: i16) -> Window {
    // Clamp to what the crate can encode and decode.
    let lo = if min > R::VERSIONS.min {
        min
    } else {
        R::VERSIONS.min
    };
    let hi = if max < R::VERSIONS.max {
        max
    } else {
        R::VERSIONS.max
    };
    Window {
        api,
        min: lo,
        max: hi,
    }
}

/// Metadata v10+ carries topic ids; v12+ can ask by id.
pub(crate) const METADATA: Window = window::<MetadataRequest>(ApiKey::Metadata, 10, 13);
/// Fetch v12 addresses topics by name (Kafka 3.0), v13+ by id; v18 only with 4.1 brokers.
pub(crate) const FETCH: Window = window::<FetchRequest>(ApiKey::Fetch, 12, 18);
/// ListOffsets v6 is the first flexible version; v7 adds MAX_TIMESTAMP.
pub(crate) const LIST_OFFSETS: Window = window::<ListOffsetsRequest>(ApiKey::ListOffsets, 6, 10);
/// FindCoordinator v4+ is the batched shape; v3 is single-key.
pub(crate) const FIND_COORDINATOR: Window =
    window::<FindCoordinatorRequest>(ApiKey::FindCoordinator, 3, 6);
/// OffsetCommit v9 is required for KIP-848 member epochs.
pub(crate) const OFFSET_COMMIT: Window = window::<OffsetCommitRequest>(ApiKey::OffsetCommit, 7, 9);
/// OffsetFetch v8+ is the `groups[]` shape.
pub(crate) const OFFSET_FETCH: Window = window::<OffsetFetchRequest>(ApiKey::OffsetFetch, 7, 9);

/// JoinGroup v5 carries `group_instance_id` (KIP-345); v8 adds `reason`; v9 `skip_assignment`.
#[allow(dead_code)] // the group protocols use it
pub(crate) const JOIN_GROUP: Window = window::<JoinGroupRequest>(ApiKey::JoinGroup, 5, 9);
/// SyncGroup v5 names the protocol type and name (KIP-559).
#[allow(dead_code)] // the group protocols use it
pub(crate) const SYNC_GROUP: Window = window::<SyncGroupRequest>(ApiKey::SyncGroup, 5, 5);
/// Heartbeat v4 is the flexible version with `group_instance_id`.
#[allow(dead_code)] // the group protocols use it
pub(crate) const HEARTBEAT: Window = window::<HeartbeatRequest>(ApiKey::Heartbeat, 4, 4);
/// LeaveGroup v3+ is the batched `members[]` shape; v5 adds `reason`.
#[allow(dead_code)] // the group protocols use it
pub(crate) const LEAVE_GROUP: Window = window::<LeaveGroupRequest>(ApiKey::LeaveGroup, 3, 5);
/// ConsumerGroupHeartbeat (KIP-848, Kafka 4.0+); v1 adds `subscribed_topic_regex`.
#[allow(dead_code)] // the group protocols use it
pub(crate) const CONSUMER_GROUP_HEARTBEAT: Window =
    window::<ConsumerGroupHeartbeatRequest>(ApiKey::ConsumerGroupHeartbeat, 0, 1);

/// The versions one broker offers, from its ApiVersions response.
#[derive(Clone, Debug, Default)]
pub(crate) struct BrokerVersions {
    ranges: HashMap<i16, (i16, i16)>,
}

impl BrokerVersions {
    pub(crate) fn from_response(resp: &ApiVersionsResponse) -> Self {
        let ranges = resp
            .api_keys
            .iter()
            .map(|k| (k.api_key, (k.min_version, k.max_version)))
            .collect();
        Self { ranges }
    }

    /// The broker's range for an API, if it offers it.
    pub(crate) fn range(&self, api: ApiKey) -> Option<(i16, i16)> {
        self.ranges.get(&(api as i16)).copied()
    }

    /// The version to use for `w`, or the broker's range when there is no overlap
    /// (`None` if the broker does not offer the API at all).
    pub(crate) fn choose(&self, w: Window) -> Result<i16, Option<(i16, i16)>> {
        let Some((bmin, bmax)) = self.range(w.api) else {
            return Err(None);
        };
        let chosen = bmax.min(w.max);
        if chosen < bmin.max(w.min) {
            return Err(Some((bmin, bmax)));
        }
        Ok(chosen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::api_versions_response::ApiVersion;

    fn broker(ranges: &[(ApiKey, i16, i16)]) -> BrokerVersions {
        let resp = ApiVersionsResponse::default().with_api_keys(
            ranges
                .iter()
                .map(|(k, lo, hi)| {
                    ApiVersion::default()
                        .with_api_key(*k as i16)
                        .with_min_version(*lo)
                        .with_max_version(*hi)
                })
                .collect(),
        );
        BrokerVersions::from_response(&resp)
    }

    #[test]
    fn windows_respect_the_crate() {
        // kafka-protocol 0.18 encodes OffsetCommit/OffsetFetch only up to v9.
        assert_eq!(OFFSET_COMMIT.max, 9);
        assert_eq!(OFFSET_FETCH.max, 9);
        assert_eq!(FETCH.min, 12);
        const { assert!(FETCH.max >= 17) };
    }

    #[test]
    fn choose_picks_highest_common() {
        let b = broker(&[(ApiKey::Fetch, 4, 17), (ApiKey::Metadata, 0, 9)]);
        assert_eq!(b.choose(FETCH), Ok(17));
        // Broker max below our min: no overlap, the broker's range is reported.
        assert_eq!(b.choose(METADATA), Err(Some((0, 9))));
        assert_eq!(b.choose(LIST_OFFSETS), Err(None));
        let newer = broker(&[(ApiKey::Fetch, 4, 99)]);
        assert_eq!(newer.choose(FETCH), Ok(FETCH.max));
        // Broker min above our max.
        let future = broker(&[(ApiKey::Fetch, 40, 99)]);
        assert_eq!(future.choose(FETCH), Err(Some((40, 99))));
    }
}
