//! What a subscribed consumer hears when the group changes its assignment.
//!
//! The callbacks run inside [`Consumer::poll`](crate::Consumer::poll) (or the consumer's
//! `Stream`), on the application's task, as in the Java client. A revocation waits for the
//! application: the member does not give partitions up, and does not rejoin, until a poll has
//! run [`RebalanceListener::on_partitions_revoked`]. Heartbeats go on meanwhile, so a slow
//! application keeps its membership until `max.poll.interval.ms`.
//!
//! # Checkpoint mode and revoked partitions
//!
//! With `commit.mode=on-checkpoints`:
//!
//! * offsets of a checkpoint that **completed** before the revocation are committed (with the
//!   generation or member epoch of that moment) before the partitions go: the member waits for
//!   that commit, up to `commit.timeout.ms`, before it rejoins or acknowledges;
//! * **pending** checkpoints (snapshotted, not yet complete) lose the revoked partitions: when
//!   such a checkpoint completes later, only partitions this member still owns are committed,
//!   and a commit left with none ends as [`Outcome::NotOwned`](crate::checkpoint::Outcome);
//! * under an eager assignor (`range`, `roundrobin`) every rebalance revokes every partition,
//!   so pending checkpoints lose all of them, including those the member gets back; prefer
//!   `cooperative-sticky` (or KIP-848), which revokes only what moves. Dropping them keeps a
//!   late checkpoint from moving a partition's committed offset back after another member
//!   committed further;
//! * the application's own state still holds the revoked partitions' offsets; the next owner
//!   starts from the group's committed offsets, so a restore elsewhere must not reuse them;
//! * no commit is ever sent for a partition this member no longer owns: each OffsetCommit is
//!   built when it is sent, from the partitions owned at that moment.
//!
//! Lost partitions (the membership expired or was fenced) are never committed.

use crate::checkpoint::Offsets;
use crate::types::TopicPartition;

/// Callbacks for assignment changes. Every method has an empty default.
pub trait RebalanceListener: Send {
    /// The group takes these partitions away. Their records already handed out are the
    /// application's; records fetched and not yet handed out are dropped (the next owner reads
    /// them again from the committed offset). Call [`Revocation::commit_positions`] or
    /// [`Revocation::commit`] to commit before they go. In periodic commit mode the handed-out
    /// positions of every assigned partition are committed unless the listener asked for a
    /// commit itself, as the Java client's auto-commit does.
    fn on_partitions_revoked(&mut self, revocation: &mut Revocation<'_>) {
        let _ = revocation;
    }

    /// The group assigned these partitions (added to what this member had; possibly none).
    /// They start at the group's committed offset, at a restored checkpoint's offset if
    /// [`Consumer::restore`](crate::Consumer::restore) named them, else at `auto.offset.reset`.
    fn on_partitions_assigned(&mut self, assigned: &[TopicPartition]) {
        let _ = assigned;
    }

    /// These partitions were lost without a revocation (the session expired, the member was
    /// fenced, or `max.poll.interval.ms` passed). Another member may own them already; nothing
    /// is committed for them.
    fn on_partitions_lost(&mut self, lost: &[TopicPartition]) {
        let _ = lost;
    }
}

/// The listener that does nothing.
impl RebalanceListener for () {}

/// A revocation in progress, handed to [`RebalanceListener::on_partitions_revoked`].
#[derive(Debug)]
pub struct Revocation<'a> {
    pub(crate) partitions: &'a [TopicPartition],
    pub(crate) positions: &'a Offsets,
    pub(crate) commit: Option<Offsets>,
}

impl Revocation<'_> {
    /// The partitions being revoked.
    pub fn partitions(&self) -> &[TopicPartition] {
        self.partitions
    }

    /// The next offset `poll` would have handed out for an assigned partition (revoked or not),
    /// if any record or start position is known.
    pub fn position(&self, tp: &TopicPartition) -> Option<i64> {
        self.positions.get(tp).map(|(o, _)| *o)
    }

    /// Commits the handed-out positions of the revoked partitions before they go.
    pub fn commit_positions(&mut self) {
        let offsets = self
            .partitions
            .iter()
            .filter_map(|tp| self.positions.get(tp).map(|p| (tp.clone(), *p)))
            .collect();
        self.commit = Some(offsets);
    }

    /// Commits these offsets (next offset to read) before the partitions go. Partitions this
    /// member does not own are left out.
    pub fn commit(&mut self, offsets: impl IntoIterator<Item = (TopicPartition, i64)>) {
        let offsets = offsets
            .into_iter()
            .filter(|(tp, _)| self.positions.contains_key(tp))
            .map(|(tp, o)| (tp, (o, -1)))
            .collect();
        self.commit = Some(offsets);
    }
}
