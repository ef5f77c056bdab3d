use super::*;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::api_versions_response::{
    ApiVersion, FinalizedFeatureKey, SupportedFeatureKey,
};
use kafka_protocol::messages::consumer_group_heartbeat_response::{Assignment, TopicPartitions};
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, EpochEndOffset, FetchableTopicResponse, LeaderIdAndEpoch, NodeEndpoint,
    PartitionData, SnapshotId,
};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{
    ApiVersionsResponse, BrokerId, ConsumerGroupHeartbeatResponse, FetchResponse,
    FindCoordinatorResponse, GroupId, HeartbeatResponse, JoinGroupResponse, LeaveGroupResponse,
    ListOffsetsResponse, MetadataResponse, OffsetCommitResponse, OffsetFetchResponse,
    SyncGroupResponse, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, Message, StrBytes};
use uuid::Uuid;

use crate::proto::frame::decode_body;
use crate::proto::versions::{self, Window};

fn s(x: &'static str) -> StrBytes {
    StrBytes::from_static_str(x)
}

fn topic(x: &'static str) -> TopicName {
    TopicName(s(x))
}

/// An unknown tagged field, added to structs in flexible versions to check it is skipped.
fn unknown_tag() -> std::collections::BTreeMap<i32, Bytes> {
    [(77, Bytes::from_static(b"future field"))].into()
}

fn encode<T: Encodable>(msg: &T, version: i16) -> Option<Bytes> {
    let mut buf = BytesMut::new();
    msg.encode(&mut buf, version).ok()?;
    Some(buf.freeze())
}

/// Non-trivial responses of every type we decode, at `version` (fields a version does not have
/// are left at their defaults, which kafka-protocol's encoder requires).
fn sample(api: ApiKey, v: i16) -> Option<Bytes> {
    let flex = |from: i16| {
        if v >= from {
            unknown_tag()
        } else {
            Default::default()
        }
    };
    match api {
        ApiKey::ApiVersions => {
            let mut r = ApiVersionsResponse::default()
                .with_error_code(0)
                .with_api_keys(
                    (0..5)
                        .map(|k| {
                            ApiVersion::default()
                                .with_api_key(k)
                                .with_min_version(0)
                                .with_max_version(k + 3)
                                .with_unknown_tagged_fields(flex(3))
                        })
                        .collect(),
                )
                .with_throttle_time_ms(if v >= 1 { 7 } else { 0 })
                .with_unknown_tagged_fields(flex(3));
            if v >= 3 {
                r = r
                    .with_supported_features(vec![
                        SupportedFeatureKey::default()
                            .with_name(s("metadata.version"))
                            .with_min_version(1)
                            .with_max_version(27),
                        SupportedFeatureKey::default().with_name(s("kraft.version")),
                    ])
                    .with_finalized_features_epoch(12)
                    .with_finalized_features(vec![
                        FinalizedFeatureKey::default()
                            .with_name(s("metadata.version"))
                            .with_max_version_level(27)
                            .with_min_version_level(27),
                    ])
                    .with_zk_migration_ready(true);
            }
            encode(&r, v)
        }
        ApiKey::Metadata => {
            let part = |p: i32| {
                MetadataResponsePartition::default()
                    .with_partition_index(p)
                    .with_leader_id(BrokerId(p + 1))
                    .with_leader_epoch(if v >= 7 { 4 } else { -1 })
                    .with_replica_nodes(vec![BrokerId(1), BrokerId(2), BrokerId(3)])
                    .with_isr_nodes(vec![BrokerId(1), BrokerId(2)])
                    .with_offline_replicas(if v >= 5 { vec![BrokerId(3)] } else { vec![] })
                    .with_unknown_tagged_fields(flex(9))
            };
            let t = |name: &'static str, id: u128| {
                MetadataResponseTopic::default()
                    .with_name(Some(topic(name)))
                    .with_topic_id(if v >= 10 {
                        Uuid::from_u128(id)
                    } else {
                        Uuid::nil()
                    })
                    .with_is_internal(v >= 1 && id == 2)
                    .with_partitions(vec![part(0), part(1), part(2)])
                    .with_topic_authorized_operations(if v >= 8 { 0x0ff8 } else { i32::MIN })
            };
            let r = MetadataResponse::default()
                .with_throttle_time_ms(if v >= 3 { 1 } else { 0 })
                .with_brokers(vec![
                    MetadataResponseBroker::default()
                        .with_node_id(BrokerId(1))
                        .with_host(s("127.0.0.1"))
                        .with_port(9092)
                        .with_rack(if v >= 1 { Some(s("rack-a")) } else { None }),
                    MetadataResponseBroker::default()
                        .with_node_id(BrokerId(2))
                        .with_host(s("broker-2.example"))
                        .with_port(9093),
                ])
                .with_cluster_id(if v >= 2 { Some(s("cluster")) } else { None })
                .with_controller_id(BrokerId(if v >= 1 { 1 } else { -1 }))
                .with_topics(vec![t("events", 1), t("__consumer_offsets", 2)])
                .with_cluster_authorized_operations(if (8..=10).contains(&v) {
                    0x0ff8
                } else {
                    i32::MIN
                })
                .with_unknown_tagged_fields(flex(9));
            encode(&r, v)
        }
        ApiKey::Fetch => {
            let part = |p: i32, records: Option<Bytes>| {
                let mut d = PartitionData::default()
                    .with_partition_index(p)
                    .with_high_watermark(100)
                    .with_last_stable_offset(90)
                    .with_log_start_offset(if v >= 5 { 3 } else { -1 })
                    .with_aborted_transactions(Some(vec![
                        AbortedTransaction::default()
                            .with_producer_id(kafka_protocol::messages::ProducerId(5))
                            .with_first_offset(10),
                        AbortedTransaction::default()
                            .with_producer_id(kafka_protocol::messages::ProducerId(6))
                            .with_first_offset(20),
                    ]))
                    .with_preferred_read_replica(BrokerId(if v >= 11 { 2 } else { -1 }))
                    .with_records(records)
                    .with_unknown_tagged_fields(flex(12));
                if v >= 12 {
                    d = d
                        .with_diverging_epoch(
                            EpochEndOffset::default().with_epoch(3).with_end_offset(77),
                        )
                        .with_current_leader(
                            LeaderIdAndEpoch::default()
                                .with_leader_id(BrokerId(2))
                                .with_leader_epoch(9),
                        )
                        .with_snapshot_id(SnapshotId::default().with_end_offset(5).with_epoch(1));
                }
                d
            };
            let t = |name: &'static str, id: u128| {
                FetchableTopicResponse::default()
                    .with_topic(if v <= 12 {
                        topic(name)
                    } else {
                        Default::default()
                    })
                    .with_topic_id(if v >= 13 {
                        Uuid::from_u128(id)
                    } else {
                        Uuid::nil()
                    })
                    .with_partitions(vec![
                        part(0, Some(Bytes::from(vec![0xab; 300]))),
                        part(1, None),
                        part(2, Some(Bytes::new())),
                    ])
                    .with_unknown_tagged_fields(flex(12))
            };
            let mut r = FetchResponse::default()
                .with_throttle_time_ms(3)
                .with_error_code(0)
                .with_session_id(if v >= 7 { 99 } else { 0 })
                .with_responses(vec![t("a", 1), t("b", 2)])
                .with_unknown_tagged_fields(flex(12));
            if v >= 16 {
                r = r.with_node_endpoints(vec![
                    NodeEndpoint::default()
                        .with_node_id(BrokerId(2))
                        .with_host(s("127.0.0.1"))
                        .with_port(9093)
                        .with_rack(Some(s("r"))),
                ]);
            }
            encode(&r, v)
        }
        ApiKey::ListOffsets => {
            let part = |p: i32| {
                ListOffsetsPartitionResponse::default()
                    .with_partition_index(p)
                    .with_timestamp(-1)
                    .with_offset(1000 + i64::from(p))
                    .with_leader_epoch(if v >= 4 { 2 } else { -1 })
                    .with_unknown_tagged_fields(flex(6))
            };
            let r = ListOffsetsResponse::default()
                .with_throttle_time_ms(if v >= 2 { 5 } else { 0 })
                .with_topics(vec![
                    ListOffsetsTopicResponse::default()
                        .with_name(topic("events"))
                        .with_partitions(vec![part(0), part(1)]),
                    ListOffsetsTopicResponse::default()
                        .with_name(topic("other"))
                        .with_partitions(vec![part(0).with_error_code(3)]),
                ]);
            encode(&r, v)
        }
        ApiKey::FindCoordinator => {
            let mut r = FindCoordinatorResponse::default().with_throttle_time_ms(if v >= 1 {
                2
            } else {
                0
            });
            if v <= 3 {
                r = r
                    .with_error_code(15)
                    .with_error_message(if v >= 1 {
                        Some(s("not yet"))
                    } else {
                        Some(s(""))
                    })
                    .with_node_id(BrokerId(1))
                    .with_host(s("127.0.0.1"))
                    .with_port(9092);
            } else {
                r = r.with_coordinators(vec![
                    Coordinator::default()
                        .with_key(s("group"))
                        .with_node_id(BrokerId(1))
                        .with_host(s("127.0.0.1"))
                        .with_port(9092)
                        .with_error_message(None)
                        .with_unknown_tagged_fields(unknown_tag()),
                    Coordinator::default()
                        .with_key(s("other"))
                        .with_node_id(BrokerId(-1))
                        .with_error_code(15)
                        .with_error_message(Some(s("loading"))),
                ]);
            }
            encode(&r.with_unknown_tagged_fields(flex(3)), v)
        }
        ApiKey::OffsetCommit => {
            let t = |name: &'static str, id: u128| {
                OffsetCommitResponseTopic::default()
                    .with_name(if v <= 9 {
                        topic(name)
                    } else {
                        Default::default()
                    })
                    .with_topic_id(if v >= 10 {
                        Uuid::from_u128(id)
                    } else {
                        Uuid::nil()
                    })
                    .with_partitions(vec![
                        OffsetCommitResponsePartition::default().with_partition_index(0),
                        OffsetCommitResponsePartition::default()
                            .with_partition_index(1)
                            .with_error_code(25)
                            .with_unknown_tagged_fields(flex(8)),
                    ])
            };
            let r = OffsetCommitResponse::default()
                .with_throttle_time_ms(if v >= 3 { 4 } else { 0 })
                .with_topics(vec![t("a", 1), t("b", 2)]);
            encode(&r, v)
        }
        ApiKey::OffsetFetch => {
            let mut r =
                OffsetFetchResponse::default().with_throttle_time_ms(if v >= 3 { 4 } else { 0 });
            if v <= 7 {
                let p = |i: i32| {
                    OffsetFetchResponsePartition::default()
                        .with_partition_index(i)
                        .with_committed_offset(40 + i64::from(i))
                        .with_committed_leader_epoch(if v >= 5 { 3 } else { -1 })
                        .with_metadata(Some(s("meta")))
                        .with_unknown_tagged_fields(flex(6))
                };
                r = r
                    .with_topics(vec![
                        OffsetFetchResponseTopic::default()
                            .with_name(topic("a"))
                            .with_partitions(vec![p(0), p(1)]),
                    ])
                    .with_error_code(0);
            } else {
                let p = |i: i32| {
                    OffsetFetchResponsePartitions::default()
                        .with_partition_index(i)
                        .with_committed_offset(40 + i64::from(i))
                        .with_committed_leader_epoch(3)
                        .with_metadata(if i == 0 { None } else { Some(s("m")) })
                };
                r = r.with_groups(vec![
                    OffsetFetchResponseGroup::default()
                        .with_group_id(GroupId(s("g")))
                        .with_topics(vec![
                            OffsetFetchResponseTopics::default()
                                .with_name(if v <= 9 {
                                    topic("a")
                                } else {
                                    Default::default()
                                })
                                .with_topic_id(if v >= 10 {
                                    Uuid::from_u128(1)
                                } else {
                                    Uuid::nil()
                                })
                                .with_partitions(vec![p(0), p(1)])
                                .with_unknown_tagged_fields(unknown_tag()),
                        ]),
                    OffsetFetchResponseGroup::default()
                        .with_group_id(GroupId(s("h")))
                        .with_error_code(16),
                ]);
            }
            encode(&r.with_unknown_tagged_fields(flex(6)), v)
        }
        ApiKey::JoinGroup => {
            let m = |id: &'static str| {
                JoinGroupResponseMember::default()
                    .with_member_id(s(id))
                    .with_group_instance_id(if v >= 5 { Some(s("instance")) } else { None })
                    .with_metadata(Bytes::from_static(b"\x00\x03subscription"))
                    .with_unknown_tagged_fields(flex(6))
            };
            let r = JoinGroupResponse::default()
                .with_throttle_time_ms(if v >= 2 { 1 } else { 0 })
                .with_generation_id(4)
                .with_protocol_type(if v >= 7 { Some(s("consumer")) } else { None })
                .with_protocol_name(Some(s("range")))
                .with_leader(s("m-1"))
                .with_skip_assignment(false)
                .with_member_id(s("m-1"))
                .with_members(vec![m("m-1"), m("m-2")]);
            encode(&r, v)
        }
        ApiKey::SyncGroup => {
            let r = SyncGroupResponse::default()
                .with_throttle_time_ms(if v >= 1 { 1 } else { 0 })
                .with_protocol_type(if v >= 5 { Some(s("consumer")) } else { None })
                .with_protocol_name(if v >= 5 { Some(s("range")) } else { None })
                .with_assignment(Bytes::from_static(b"\x00\x03assignment bytes"))
                .with_unknown_tagged_fields(flex(4));
            encode(&r, v)
        }
        ApiKey::Heartbeat => {
            let r = HeartbeatResponse::default()
                .with_throttle_time_ms(if v >= 1 { 1 } else { 0 })
                .with_error_code(27)
                .with_unknown_tagged_fields(flex(4));
            encode(&r, v)
        }
        ApiKey::LeaveGroup => {
            let mut r =
                LeaveGroupResponse::default().with_throttle_time_ms(if v >= 1 { 1 } else { 0 });
            if v >= 3 {
                r = r.with_members(vec![
                    MemberResponse::default()
                        .with_member_id(s("m-1"))
                        .with_group_instance_id(None),
                    MemberResponse::default()
                        .with_member_id(s("m-2"))
                        .with_group_instance_id(Some(s("i-2")))
                        .with_error_code(25)
                        .with_unknown_tagged_fields(flex(4)),
                ]);
            }
            encode(&r, v)
        }
        ApiKey::ConsumerGroupHeartbeat => {
            let r = ConsumerGroupHeartbeatResponse::default()
                .with_member_id(Some(s("member")))
                .with_member_epoch(5)
                .with_heartbeat_interval_ms(3000)
                .with_assignment(Some(Assignment::default().with_topic_partitions(vec![
                        TopicPartitions::default()
                            .with_topic_id(Uuid::from_u128(1))
                            .with_partitions(vec![0, 1, 2])
                            .with_unknown_tagged_fields(unknown_tag()),
                        TopicPartitions::default().with_topic_id(Uuid::from_u128(2)),
                    ])))
                .with_unknown_tagged_fields(unknown_tag());
            encode(&r, v)
        }
        _ => None,
    }
}

/// Decodes `body` with kafka-protocol's decoder for `api`, through the guard.
fn decode(api: ApiKey, body: Bytes, v: i16) -> Result<(), crate::proto::frame::DecodeError> {
    fn d<T: Decodable>(
        api: ApiKey,
        body: Bytes,
        v: i16,
    ) -> Result<(), crate::proto::frame::DecodeError> {
        decode_body::<T>(api, body, v, 0).map(|_| ())
    }
    match api {
        ApiKey::ApiVersions => d::<ApiVersionsResponse>(api, body, v),
        ApiKey::Metadata => d::<MetadataResponse>(api, body, v),
        ApiKey::Fetch => d::<FetchResponse>(api, body, v),
        ApiKey::ListOffsets => d::<ListOffsetsResponse>(api, body, v),
        ApiKey::FindCoordinator => d::<FindCoordinatorResponse>(api, body, v),
        ApiKey::OffsetCommit => d::<OffsetCommitResponse>(api, body, v),
        ApiKey::OffsetFetch => d::<OffsetFetchResponse>(api, body, v),
        ApiKey::JoinGroup => d::<JoinGroupResponse>(api, body, v),
        ApiKey::SyncGroup => d::<SyncGroupResponse>(api, body, v),
        ApiKey::Heartbeat => d::<HeartbeatResponse>(api, body, v),
        ApiKey::LeaveGroup => d::<LeaveGroupResponse>(api, body, v),
        ApiKey::ConsumerGroupHeartbeat => d::<ConsumerGroupHeartbeatResponse>(api, body, v),
        other => panic!("no decoder for {other:?}"),
    }
}

/// Our windows, in the order of the `frame` fuzz target's selector byte.
fn windows() -> [Window; 12] {
    let apiv = Window {
        api: ApiKey::ApiVersions,
        min: 0,
        max: <kafka_protocol::messages::ApiVersionsRequest as Message>::VERSIONS.max,
    };
    [
        apiv,
        versions::METADATA,
        versions::FETCH,
        versions::LIST_OFFSETS,
        versions::FIND_COORDINATOR,
        versions::OFFSET_COMMIT,
        versions::OFFSET_FETCH,
        versions::JOIN_GROUP,
        versions::SYNC_GROUP,
        versions::HEARTBEAT,
        versions::LEAVE_GROUP,
        versions::CONSUMER_GROUP_HEARTBEAT,
    ]
}

/// Every version of every schema: what kafka-protocol encodes passes, the walk takes exactly
/// the encoded bytes, and the guarded decode works. Every version in our windows is covered.
#[test]
fn round_trips_every_version() {
    for schema in SCHEMAS {
        let mut covered = Vec::new();
        for v in schema.versions.0..=schema.versions.1 {
            let Some(body) = sample(schema.api, v) else {
                continue;
            };
            let used = walk_response(schema.api, v, &body, 0)
                .unwrap_or_else(|e| panic!("{:?} v{v}: {e}", schema.api));
            assert_eq!(used, body.len(), "{:?} v{v}: walk length", schema.api);
            decode(schema.api, body.clone(), v)
                .unwrap_or_else(|e| panic!("{:?} v{v}: {e}", schema.api));
            // Trailing bytes are tolerated.
            let mut longer = BytesMut::from(&body[..]);
            longer.put_slice(b"trailing");
            check_response(schema.api, v, &longer, 0).unwrap();
            // A body cut anywhere is refused by the walk (never read past its end).
            for cut in 0..body.len() {
                assert!(
                    check_response(schema.api, v, &body[..cut], 0).is_err(),
                    "{:?} v{v}: cut at {cut} accepted",
                    schema.api
                );
            }
            covered.push(v);
        }
        let w = windows()
            .into_iter()
            .find(|w| w.api == schema.api)
            .expect("a window per schema");
        for v in w.min..=w.max {
            assert!(covered.contains(&v), "{:?} v{v} not covered", schema.api);
        }
    }
}

/// Every window has a schema that covers it.
#[test]
fn every_window_has_a_schema() {
    for w in windows() {
        let s = schema(w.api).unwrap_or_else(|| panic!("no schema for {:?}", w.api));
        assert!(s.versions.0 <= w.min && w.max <= s.versions.1, "{w:?}");
    }
    assert!(check_response(ApiKey::Produce, 9, &[], 0).is_err());
    assert!(check_response(ApiKey::Fetch, 19, &[0; 64], 0).is_err());
}

/// Overwrites every position of every sample with huge counts and lengths: the guard either
/// refuses the body, or kafka-protocol decodes it without a huge allocation (an allocation
/// failure would abort this test binary).
#[test]
fn huge_values_anywhere_are_refused_or_harmless() {
    let patterns: [&[u8]; 5] = [
        &[0x7f, 0xff, 0xff, 0xff],
        &[0xff, 0xff, 0xff, 0xff, 0x0f],
        &[0x80, 0x80, 0x80, 0x80, 0x08],
        &[0xff, 0xff, 0xff, 0xfe],
        &[0x00, 0x10, 0x00, 0x00],
    ];
    for w in windows() {
        for v in w.min..=w.max {
            let body = sample(w.api, v).unwrap();
            for pat in patterns {
                for at in 0..body.len() {
                    let mut b = body.to_vec();
                    let end = (at + pat.len()).min(b.len());
                    b[at..end].copy_from_slice(&pat[..end - at]);
                    let _ = decode(w.api, Bytes::from(b), v);
                }
            }
        }
    }
}

fn malformed(r: Result<(), ProtocolViolation>) -> (String, usize, String) {
    match r {
        Err(ProtocolViolation::Malformed {
            field,
            offset,
            reason,
            ..
        }) => (field, offset, reason),
        other => panic!("expected Malformed, got {other:?}"),
    }
}

fn uvarint(buf: &mut Vec<u8>, mut n: u32) {
    while n >= 0x80 {
        buf.push((n as u8) | 0x80);
        n >>= 7;
    }
    buf.push(n as u8);
}

#[test]
fn huge_counts_are_refused_with_their_field() {
    // Fetch v16: throttle, error, session, then `responses` claiming 2^32 - 2 topics.
    let mut b = vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    uvarint(&mut b, u32::MAX);
    let (field, offset, reason) = malformed(check_response(ApiKey::Fetch, 16, &b, 8));
    assert_eq!(field, "responses");
    assert_eq!(offset, 18);
    assert!(reason.contains("4294967294 elements"), "{reason}");

    // Fetch v12: one topic, one partition whose aborted_transactions claim 2^31 entries.
    let mut b = vec![0; 10];
    uvarint(&mut b, 2); // one topic
    uvarint(&mut b, 2); // name "t"
    b.push(b't');
    uvarint(&mut b, 2); // one partition
    b.extend_from_slice(&[0; 4 + 2 + 8 + 8 + 8]);
    uvarint(&mut b, 1 << 31);
    b.extend_from_slice(&[0; 64]);
    let err = check_response(ApiKey::Fetch, 12, &b, 0).unwrap_err();
    assert!(
        err.to_string().contains(
            "Fetch v12 response, field `responses[0].partitions[0].aborted_transactions`"
        ),
        "{err}"
    );
    // kafka-protocol itself would try to reserve 2^31 entries here.

    // Fetch v11 (classic encoding): a negative partitions count other than -1.
    let mut b = vec![0; 10];
    b.extend_from_slice(&1i32.to_be_bytes());
    b.extend_from_slice(&1i16.to_be_bytes());
    b.push(b't');
    b.extend_from_slice(&(-7i32).to_be_bytes());
    let (field, _, reason) = malformed(check_response(ApiKey::Fetch, 11, &b, 0));
    assert_eq!(field, "responses[0].partitions");
    assert_eq!(reason, "negative length -7");

    // Records longer than the body.
    let mut b = vec![0; 10];
    uvarint(&mut b, 2);
    uvarint(&mut b, 2);
    b.push(b't');
    uvarint(&mut b, 2);
    b.extend_from_slice(&[0; 4 + 2 + 8 + 8 + 8]);
    uvarint(&mut b, 1); // no aborted transactions
    b.extend_from_slice(&[0; 4]);
    uvarint(&mut b, 1 << 30);
    b.extend_from_slice(&[0; 100]);
    let (field, _, reason) = malformed(check_response(ApiKey::Fetch, 12, &b, 0));
    assert_eq!(field, "responses[0].partitions[0].records");
    assert!(reason.starts_with("length 1073741823 exceeds"), "{reason}");

    // Metadata v12: a partition's replica_nodes claims a million int32s in a few bytes.
    let mut b = vec![0, 0, 0, 0];
    uvarint(&mut b, 1); // no brokers
    uvarint(&mut b, 0); // null cluster id
    b.extend_from_slice(&[0, 0, 0, 1]);
    uvarint(&mut b, 2); // one topic
    b.extend_from_slice(&[0, 0]);
    uvarint(&mut b, 2);
    b.push(b't');
    b.extend_from_slice(&[0; 16 + 1]);
    uvarint(&mut b, 2); // one partition
    b.extend_from_slice(&[0; 2 + 4 + 4 + 4]);
    uvarint(&mut b, 1_000_001);
    b.extend_from_slice(&[0; 40]);
    let (field, _, reason) = malformed(check_response(ApiKey::Metadata, 12, &b, 0));
    assert_eq!(field, "topics[0].partitions[0].replica_nodes");
    assert!(
        reason.contains("1000000 elements of at least 4 bytes"),
        "{reason}"
    );

    // ApiVersions v0 (also the KIP-511 fallback shape): i32::MAX api keys.
    let mut b = vec![0, 35];
    b.extend_from_slice(&i32::MAX.to_be_bytes());
    let (field, _, _) = malformed(check_response(ApiKey::ApiVersions, 0, &b, 0));
    assert_eq!(field, "api_keys");

    // ConsumerGroupHeartbeat: the assignment's topic list.
    let mut b = vec![0; 6];
    uvarint(&mut b, 0);
    uvarint(&mut b, 0);
    b.extend_from_slice(&[0; 8]);
    b.push(1);
    uvarint(&mut b, 0x0fff_ffff);
    let (field, _, _) = malformed(check_response(ApiKey::ConsumerGroupHeartbeat, 0, &b, 0));
    assert_eq!(field, "assignment.topic_partitions");
}

#[test]
fn bad_varints_and_tagged_fields_are_refused() {
    // Heartbeat v4: throttle, error code, then the tagged-field section.
    let head = [0u8, 0, 0, 0, 0, 0];
    // A six-byte varint.
    let mut b = head.to_vec();
    b.extend_from_slice(&[0x80, 0x80, 0x80, 0x80, 0x80, 0x01]);
    let (field, offset, reason) = malformed(check_response(ApiKey::Heartbeat, 4, &b, 0));
    assert_eq!((field.as_str(), offset), ("tagged fields", 6));
    assert!(reason.starts_with("varint"), "{reason}");
    // An unknown tagged field claiming more than is left.
    let mut b = head.to_vec();
    uvarint(&mut b, 1);
    uvarint(&mut b, 9);
    uvarint(&mut b, 1 << 28);
    b.extend_from_slice(&[0; 8]);
    let (field, _, reason) = malformed(check_response(ApiKey::Heartbeat, 4, &b, 0));
    assert_eq!(field, "tag 9");
    assert!(reason.contains("exceeds the 8 bytes left"), "{reason}");
    // An unknown tagged field that fits is skipped.
    let mut b = head.to_vec();
    uvarint(&mut b, 1);
    uvarint(&mut b, 9);
    uvarint(&mut b, 3);
    b.extend_from_slice(&[1, 2, 3]);
    assert_eq!(walk_response(ApiKey::Heartbeat, 4, &b, 0), Ok(b.len()));
    // A known tagged field (Fetch v16 node_endpoints) whose declared size is too small for its
    // contents: its array count is checked against the declared size, not the whole frame.
    let mut b = vec![0; 10];
    uvarint(&mut b, 1); // no topics
    uvarint(&mut b, 1); // one tagged field
    uvarint(&mut b, 0); // tag 0: node_endpoints
    uvarint(&mut b, 1); // declared size 1
    uvarint(&mut b, 3); // two endpoints...
    b.extend_from_slice(&[0; 64]); // ...that would fit in the frame, not in the field
    let (field, _, reason) = malformed(check_response(ApiKey::Fetch, 16, &b, 0));
    assert_eq!(field, "node_endpoints");
    assert!(
        reason.contains("cannot fit in the 0 bytes left"),
        "{reason}"
    );
    // Declared larger than its contents.
    let mut b = vec![0; 10];
    uvarint(&mut b, 1);
    uvarint(&mut b, 1);
    uvarint(&mut b, 0);
    uvarint(&mut b, 4);
    uvarint(&mut b, 1); // empty array: 1 byte, not 4
    b.extend_from_slice(&[0; 3]);
    let (field, _, reason) = malformed(check_response(ApiKey::Fetch, 16, &b, 0));
    assert_eq!(field, "node_endpoints");
    assert_eq!(
        reason,
        "tagged field declares 4 bytes but its contents take 1"
    );
}

/// The selector bytes of a `frame` fuzz input → the API and version it decodes.
fn frame_selector(api: u8, version: u8) -> (ApiKey, i16) {
    let w = windows()[usize::from(api) % 12];
    (w.api, w.min + i16::from(version) % (w.max - w.min + 1))
}

/// Decodes a `frame` fuzz input the way the connection does (fallback included).
fn replay_frame(data: &[u8]) -> Option<Result<(), crate::proto::frame::DecodeError>> {
    use kafka_protocol::messages::ResponseHeader;
    let [api, version, rest @ ..] = data else {
        return None;
    };
    let (api, v) = frame_selector(*api, *version);
    let mut raw = Bytes::copy_from_slice(rest.get(4..)?);
    if api == ApiKey::ApiVersions
        && crate::proto::frame::peek_error_code_after_v0_header(&raw) == Some(35)
        && v > 0
    {
        return Some(crate::proto::frame::decode_api_versions_fallback(&raw).map(|_| ()));
    }
    let hv = if api == ApiKey::ApiVersions || v < schema(api)?.flexible_from {
        0
    } else {
        1
    };
    let total = raw.len();
    if ResponseHeader::decode(&mut raw, hv).is_err() {
        return None;
    }
    let offset = total - raw.len();
    Some(
        check_response(api, v, &raw, offset)
            .map_err(crate::proto::frame::DecodeError::Violation)
            .and_then(|()| decode(api, raw, v)),
    )
}

fn fuzz_dir(sub: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz")
        .join(sub)
}

fn files(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<_> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_file())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

/// The two kafka-protocol allocation findings are refused with a typed error.
#[test]
fn fuzz_regressions_are_refused() {
    let frame = files(&fuzz_dir("regressions/frame"));
    let (_, input) = frame
        .iter()
        .find(|(n, _)| n == "oom-offset-fetch-v7-compact-array")
        .expect("regression input");
    match replay_frame(input) {
        Some(Err(crate::proto::frame::DecodeError::Violation(v))) => {
            let text = v.to_string();
            assert!(text.starts_with("OffsetFetch v7 response"), "{text}");
            assert!(text.contains("topics"), "{text}");
        }
        other => panic!("expected a violation, got {other:?}"),
    }
    let fetch = files(&fuzz_dir("regressions/fetch_response"));
    let (_, input) = fetch
        .iter()
        .find(|(n, _)| n == "oom-aborted-transactions-array")
        .expect("regression input");
    let v =
        versions::FETCH.min + i16::from(input[0]) % (versions::FETCH.max - versions::FETCH.min + 1);
    let (field, _, _) = malformed(check_response(ApiKey::Fetch, v, &input[2..], 0));
    assert!(field.ends_with("aborted_transactions"), "{field}");
}

/// Every committed seed and regression input of the `frame` and `fetch_response` targets goes
/// through the guard and the decoder without aborting, and every response captured from a
/// real broker (`real-*`) passes the guard and decodes.
#[test]
fn fuzz_inputs_replay() {
    let mut real = 0;
    for sub in ["corpus/frame", "regressions/frame"] {
        for (name, data) in files(&fuzz_dir(sub)) {
            let result = replay_frame(&data);
            if name.starts_with("real-") {
                assert!(matches!(result, Some(Ok(()))), "{name}: {result:?}");
                real += 1;
            }
        }
    }
    for sub in ["corpus/fetch_response", "regressions/fetch_response"] {
        for (name, data) in files(&fuzz_dir(sub)) {
            let [version, _, body @ ..] = &data[..] else {
                continue;
            };
            let v = versions::FETCH.min
                + i16::from(*version) % (versions::FETCH.max - versions::FETCH.min + 1);
            let result = decode(ApiKey::Fetch, Bytes::copy_from_slice(body), v);
            if name.starts_with("real-") {
                assert!(result.is_ok(), "{name}: {result:?}");
                real += 1;
            }
        }
    }
    assert!(real > 0, "the real-broker seeds are replayed");
}
