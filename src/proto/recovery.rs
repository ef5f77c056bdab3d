//! What to do about a Kafka error code: one table per request kind, each an exhaustive match.
//!
//! The tables follow the Java client's handling (`FetchCollector.handleInitializeErrors`,
//! `AbstractFetch.handleFetchSuccess`, `OffsetFetcherUtils.handleListOffsetResponse`), not just
//! Kafka's "retriable" flag: `UNKNOWN_TOPIC_OR_PARTITION` is retriable but wants fresh metadata,
//! `CORRUPT_MESSAGE` is flagged retriable but re-fetching the same bytes cannot help.
//! Adding a variant to `ResponseError` breaks the build here on purpose.

use kafka_protocol::error::ResponseError;

/// The action for a per-partition error code in a Fetch or ListOffsets response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FetchRecovery {
    /// The position is outside the log: apply the configured out-of-range policy.
    OutOfRange,
    /// Leadership or topic identity may have changed: refresh metadata, back off, retry.
    RefreshMetadata,
    /// A passing condition on the broker: back off and retry with the same leader.
    Backoff,
    /// Retrying cannot help: stop the partition and report the error to the application.
    Fatal,
}

/// The recovery action for a partition-level error in a Fetch or ListOffsets response.
pub(crate) fn fetch_recovery(code: ResponseError) -> FetchRecovery {
    use ResponseError as E;
    match code {
        E::OffsetOutOfRange => FetchRecovery::OutOfRange,
        E::UnknownTopicOrPartition
        | E::LeaderNotAvailable
        | E::NotLeaderOrFollower
        | E::ReplicaNotAvailable
        | E::NotController
        | E::KafkaStorageError
        | E::ListenerNotFound
        | E::FencedLeaderEpoch
        | E::OffsetNotAvailable
        | E::PreferredLeaderNotAvailable
        | E::EligibleLeadersNotAvailable
        | E::UnknownTopicId
        | E::InconsistentTopicId
        | E::FetchSessionTopicIdError
        | E::NewLeaderElected => FetchRecovery::RefreshMetadata,
        E::UnknownServerError
        | E::RequestTimedOut
        | E::NetworkException
        | E::CoordinatorLoadInProgress
        | E::CoordinatorNotAvailable
        | E::NotCoordinator
        | E::NotEnoughReplicas
        | E::NotEnoughReplicasAfterAppend
        | E::FetchSessionIdNotFound
        | E::InvalidFetchSessionEpoch
        | E::UnknownLeaderEpoch
        | E::ElectionNotNeeded
        | E::UnstableOffsetCommit
        | E::ThrottlingQuotaExceeded
        | E::ShareSessionNotFound
        | E::InvalidShareSessionEpoch
        | E::ShareSessionLimitReached => FetchRecovery::Backoff,
        E::CorruptMessage
        | E::InvalidFetchSize
        | E::BrokerNotAvailable
        | E::MessageTooLarge
        | E::StaleControllerEpoch
        | E::OffsetMetadataTooLarge
        | E::InvalidTopicException
        | E::RecordListTooLarge
        | E::InvalidRequiredAcks
        | E::IllegalGeneration
        | E::InconsistentGroupProtocol
        | E::InvalidGroupId
        | E::UnknownMemberId
        | E::InvalidSessionTimeout
        | E::RebalanceInProgress
        | E::InvalidCommitOffsetSize
        | E::TopicAuthorizationFailed
        | E::GroupAuthorizationFailed
        | E::ClusterAuthorizationFailed
        | E::InvalidTimestamp
        | E::UnsupportedSaslMechanism
        | E::IllegalSaslState
        | E::UnsupportedVersion
        | E::TopicAlreadyExists
        | E::InvalidPartitions
        | E::InvalidReplicationFactor
        | E::InvalidReplicaAssignment
        | E::InvalidConfig
        | E::InvalidRequest
        | E::UnsupportedForMessageFormat
        | E::PolicyViolation
        | E::OutOfOrderSequenceNumber
        | E::DuplicateSequenceNumber
        | E::InvalidProducerEpoch
        | E::InvalidTxnState
        | E::InvalidProducerIdMapping
        | E::InvalidTransactionTimeout
        | E::ConcurrentTransactions
        | E::TransactionCoordinatorFenced
        | E::TransactionalIdAuthorizationFailed
        | E::SecurityDisabled
        | E::OperationNotAttempted
        | E::LogDirNotFound
        | E::SaslAuthenticationFailed
        | E::UnknownProducerId
        | E::ReassignmentInProgress
        | E::DelegationTokenAuthDisabled
        | E::DelegationTokenNotFound
        | E::DelegationTokenOwnerMismatch
        | E::DelegationTokenRequestNotAllowed
        | E::DelegationTokenAuthorizationFailed
        | E::DelegationTokenExpired
        | E::InvalidPrincipalType
        | E::NonEmptyGroup
        | E::GroupIdNotFound
        | E::TopicDeletionDisabled
        | E::UnsupportedCompressionType
        | E::StaleBrokerEpoch
        | E::MemberIdRequired
        | E::GroupMaxSizeReached
        | E::FencedInstanceId
        | E::NoReassignmentInProgress
        | E::GroupSubscribedToTopic
        | E::InvalidRecord
        | E::ProducerFenced
        | E::ResourceNotFound
        | E::DuplicateResource
        | E::UnacceptableCredential
        | E::InconsistentVoterSet
        | E::InvalidUpdateVersion
        | E::FeatureUpdateFailed
        | E::PrincipalDeserializationFailure
        | E::SnapshotNotFound
        | E::PositionOutOfRange
        | E::DuplicateBrokerRegistration
        | E::BrokerIdNotRegistered
        | E::InconsistentClusterId
        | E::TransactionalIdNotFound
        | E::IneligibleReplica
        | E::OffsetMovedToTieredStorage
        | E::FencedMemberEpoch
        | E::UnreleasedInstanceId
        | E::UnsupportedAssignor
        | E::StaleMemberEpoch
        | E::MismatchedEndpointType
        | E::UnsupportedEndpointType
        | E::UnknownControllerId
        | E::UnknownSubscriptionId
        | E::TelemetryTooLarge
        | E::InvalidRegistration
        | E::TransactionAbortable
        | E::InvalidRecordState
        | E::FencedStateEpoch
        | E::InvalidVoterKey
        | E::DuplicateVoter
        | E::VoterNotFound
        | E::InvalidRegularExpression
        | E::RebootstrapRequired
        | E::StreamsInvalidTopology
        | E::StreamsInvalidTopologyEpoch
        | E::StreamsTopologyFenced => FetchRecovery::Fatal,
        // A code newer than this client: the Java client treats it as UNKNOWN_SERVER_ERROR.
        E::Unknown(_) => FetchRecovery::Backoff,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code the protocol defines, with the action we expect, row by row.
    #[test]
    fn every_fetch_code_has_its_action() {
        let rows = [
            (-1, FetchRecovery::Backoff),
            (1, FetchRecovery::OutOfRange),
            (2, FetchRecovery::Fatal),
            (3, FetchRecovery::RefreshMetadata),
            (4, FetchRecovery::Fatal),
            (5, FetchRecovery::RefreshMetadata),
            (6, FetchRecovery::RefreshMetadata),
            (7, FetchRecovery::Backoff),
            (8, FetchRecovery::Fatal),
            (9, FetchRecovery::RefreshMetadata),
            (10, FetchRecovery::Fatal),
            (11, FetchRecovery::Fatal),
            (12, FetchRecovery::Fatal),
            (13, FetchRecovery::Backoff),
            (14, FetchRecovery::Backoff),
            (15, FetchRecovery::Backoff),
            (16, FetchRecovery::Backoff),
            (17, FetchRecovery::Fatal),
            (18, FetchRecovery::Fatal),
            (19, FetchRecovery::Backoff),
            (20, FetchRecovery::Backoff),
            (21, FetchRecovery::Fatal),
            (22, FetchRecovery::Fatal),
            (23, FetchRecovery::Fatal),
            (24, FetchRecovery::Fatal),
            (25, FetchRecovery::Fatal),
            (26, FetchRecovery::Fatal),
            (27, FetchRecovery::Fatal),
            (28, FetchRecovery::Fatal),
            (29, FetchRecovery::Fatal),
            (30, FetchRecovery::Fatal),
            (31, FetchRecovery::Fatal),
            (32, FetchRecovery::Fatal),
            (33, FetchRecovery::Fatal),
            (34, FetchRecovery::Fatal),
            (35, FetchRecovery::Fatal),
            (36, FetchRecovery::Fatal),
            (37, FetchRecovery::Fatal),
            (38, FetchRecovery::Fatal),
            (39, FetchRecovery::Fatal),
            (40, FetchRecovery::Fatal),
            (41, FetchRecovery::RefreshMetadata),
            (42, FetchRecovery::Fatal),
            (43, FetchRecovery::Fatal),
            (44, FetchRecovery::Fatal),
            (45, FetchRecovery::Fatal),
            (46, FetchRecovery::Fatal),
            (47, FetchRecovery::Fatal),
            (48, FetchRecovery::Fatal),
            (49, FetchRecovery::Fatal),
            (50, FetchRecovery::Fatal),
            (51, FetchRecovery::Fatal),
            (52, FetchRecovery::Fatal),
            (53, FetchRecovery::Fatal),
            (54, FetchRecovery::Fatal),
            (55, FetchRecovery::Fatal),
            (56, FetchRecovery::RefreshMetadata),
            (57, FetchRecovery::Fatal),
            (58, FetchRecovery::Fatal),
            (59, FetchRecovery::Fatal),
            (60, FetchRecovery::Fatal),
            (61, FetchRecovery::Fatal),
            (62, FetchRecovery::Fatal),
            (63, FetchRecovery::Fatal),
            (64, FetchRecovery::Fatal),
            (65, FetchRecovery::Fatal),
            (66, FetchRecovery::Fatal),
            (67, FetchRecovery::Fatal),
            (68, FetchRecovery::Fatal),
            (69, FetchRecovery::Fatal),
            (70, FetchRecovery::Backoff),
            (71, FetchRecovery::Backoff),
            (72, FetchRecovery::RefreshMetadata),
            (73, FetchRecovery::Fatal),
            (74, FetchRecovery::RefreshMetadata),
            (75, FetchRecovery::Backoff),
            (76, FetchRecovery::Fatal),
            (77, FetchRecovery::Fatal),
            (78, FetchRecovery::RefreshMetadata),
            (79, FetchRecovery::Fatal),
            (80, FetchRecovery::RefreshMetadata),
            (81, FetchRecovery::Fatal),
            (82, FetchRecovery::Fatal),
            (83, FetchRecovery::RefreshMetadata),
            (84, FetchRecovery::Backoff),
            (85, FetchRecovery::Fatal),
            (86, FetchRecovery::Fatal),
            (87, FetchRecovery::Fatal),
            (88, FetchRecovery::Backoff),
            (89, FetchRecovery::Backoff),
            (90, FetchRecovery::Fatal),
            (91, FetchRecovery::Fatal),
            (92, FetchRecovery::Fatal),
            (93, FetchRecovery::Fatal),
            (94, FetchRecovery::Fatal),
            (95, FetchRecovery::Fatal),
            (96, FetchRecovery::Fatal),
            (97, FetchRecovery::Fatal),
            (98, FetchRecovery::Fatal),
            (99, FetchRecovery::Fatal),
            (100, FetchRecovery::RefreshMetadata),
            (101, FetchRecovery::Fatal),
            (102, FetchRecovery::Fatal),
            (103, FetchRecovery::RefreshMetadata),
            (104, FetchRecovery::Fatal),
            (105, FetchRecovery::Fatal),
            (106, FetchRecovery::RefreshMetadata),
            (107, FetchRecovery::Fatal),
            (108, FetchRecovery::RefreshMetadata),
            (109, FetchRecovery::Fatal),
            (110, FetchRecovery::Fatal),
            (111, FetchRecovery::Fatal),
            (112, FetchRecovery::Fatal),
            (113, FetchRecovery::Fatal),
            (114, FetchRecovery::Fatal),
            (115, FetchRecovery::Fatal),
            (116, FetchRecovery::Fatal),
            (117, FetchRecovery::Fatal),
            (118, FetchRecovery::Fatal),
            (119, FetchRecovery::Fatal),
            (120, FetchRecovery::Fatal),
            (121, FetchRecovery::Fatal),
            (122, FetchRecovery::Backoff),
            (123, FetchRecovery::Backoff),
            (124, FetchRecovery::Fatal),
            (125, FetchRecovery::Fatal),
            (126, FetchRecovery::Fatal),
            (127, FetchRecovery::Fatal),
            (128, FetchRecovery::Fatal),
            (129, FetchRecovery::Fatal),
            (130, FetchRecovery::Fatal),
            (131, FetchRecovery::Fatal),
            (132, FetchRecovery::Fatal),
            (133, FetchRecovery::Backoff),
        ];
        for (code, expected) in rows {
            let err = ResponseError::try_from_code(code).expect("non-zero code");
            assert_eq!(fetch_recovery(err), expected, "code {code} ({err:?})");
        }
        // Every defined code is in the table (the crate defines -1 and 1..=133).
        let listed: std::collections::HashSet<i16> = rows.iter().map(|r| r.0).collect();
        for code in (-1..=133).filter(|c| *c != 0) {
            assert!(listed.contains(&code), "code {code} missing from the table");
        }
        assert_eq!(
            fetch_recovery(ResponseError::Unknown(999)),
            FetchRecovery::Backoff
        );
    }
}
