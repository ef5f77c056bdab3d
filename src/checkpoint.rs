//! Checkpoint-aligned commits: the state a checkpoint stores, the pending checkpoints, and the
//! handle a checkpoint thread uses to say a checkpoint completed.
//!
//! The protocol, as in Apache Flink's Kafka source:
//!
//! 1. At a checkpoint barrier the consuming side calls
//!    [`Consumer::snapshot_state`](crate::Consumer::snapshot_state): for every assigned partition,
//!    the offset after the last record handed to the application. The application stores the
//!    returned [`SourceState`] in its checkpoint; the consumer keeps the offsets as *pending*
//!    under the checkpoint id.
//! 2. When the checkpoint is durable, any thread calls
//!    [`CheckpointHandle::notify_checkpoint_complete`]. That id's offsets (and nothing older) go
//!    to the network loop through a latest-wins mailbox, which wakes the loop even while a
//!    fetch is parked on the broker; the loop sends one OffsetCommit to the group coordinator on
//!    a connection of its own.
//! 3. On restart the application calls [`Consumer::restore`](crate::Consumer::restore) with the
//!    state of its last completed checkpoint. Restored offsets always win: Kafka's committed
//!    offsets only show progress to the outside world.
//!
//! Every commit ends in exactly one [`CommitOutcome`], and the counters in [`CommitStats`] add
//! up: each completed checkpoint is acknowledged, failed, timed out or superseded.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::error::Error;
use crate::handover::Handover;
use crate::types::TopicPartition;

/// The version [`SourceState`] is written with.
pub const SOURCE_STATE_VERSION: u32 = 1;

/// What a checkpoint stores for this source: per partition, the next offset to read.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SourceState {
    /// The layout version ([`SOURCE_STATE_VERSION`] when written by this crate).
    pub version: u32,
    /// The checkpoint this state belongs to.
    pub checkpoint_id: u64,
    /// One entry per assigned partition.
    pub partitions: Vec<PartitionOffset>,
}

/// A partition's position in a [`SourceState`].
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PartitionOffset {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The next offset to read: every record below it was handed to the application.
    pub next_offset: i64,
    /// The leader epoch of the last record handed out (-1 if unknown), committed with the
    /// offset so that a restart can detect log truncation.
    pub leader_epoch: i32,
}

impl SourceState {
    /// The offsets as a map.
    pub fn offsets(&self) -> BTreeMap<TopicPartition, i64> {
        self.partitions
            .iter()
            .map(|p| {
                (
                    TopicPartition::new(p.topic.as_str(), p.partition),
                    p.next_offset,
                )
            })
            .collect()
    }
}

/// Offsets to commit: next offset and leader epoch per partition.
pub type Offsets = BTreeMap<TopicPartition, (i64, i32)>;

/// How a commit ended.
#[derive(Debug)]
#[non_exhaustive]
pub enum Outcome {
    /// The coordinator stored every offset.
    Acked,
    /// The coordinator refused, or an error that retrying within the deadline could not fix.
    /// Partitions that were stored anyway are in [`CommitStats::last_acked`].
    Failed(Error),
    /// A newer completed checkpoint replaced it before it was sent.
    Superseded,
    /// No acknowledgement before `commit.timeout.ms`.
    TimedOut,
    /// Subscribe mode: every partition of the commit had been revoked or lost before it could
    /// be sent, so nothing was committed (a member never commits partitions it does not own).
    NotOwned,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Acked => f.write_str("acked"),
            Self::Failed(e) => write!(f, "failed: {e}"),
            Self::Superseded => f.write_str("superseded"),
            Self::TimedOut => f.write_str("timed out"),
            Self::NotOwned => f.write_str("not owned"),
        }
    }
}

/// The end of one commit.
#[derive(Debug)]
pub struct CommitOutcome {
    /// The checkpoint whose offsets these are (`None` for periodic and closing commits).
    pub checkpoint_id: Option<u64>,
    /// The offsets (next offset to read per partition).
    pub offsets: Arc<Offsets>,
    /// How it ended.
    pub outcome: Outcome,
    /// From the checkpoint's completion to the outcome.
    pub latency: Duration,
}

/// Commit counters, and the last offsets the coordinator acknowledged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Commits the coordinator acknowledged.
    pub succeeded: u64,
    /// Commits that failed.
    pub failed: u64,
    /// Commits replaced by a newer checkpoint before they were sent.
    pub superseded: u64,
    /// Commits with no acknowledgement in time.
    pub timed_out: u64,
    /// Subscribe mode: commits with nothing left to send, every partition revoked or lost.
    pub not_owned: u64,
    /// Completions for checkpoint ids that were unknown or already subsumed (no commit).
    pub unknown_checkpoint: u64,
    /// Pending checkpoints dropped because more than `max.pending.checkpoints` were pending.
    pub dropped_pending: u64,
    /// Outcomes dropped because nobody read [`CommitOutcomes`] and its queue was full.
    pub dropped_outcomes: u64,
    /// Per partition, the last offset the coordinator acknowledged.
    pub last_acked: BTreeMap<TopicPartition, i64>,
}

/// A commit on its way to the network loop.
#[derive(Debug)]
pub(crate) struct CommitRequest {
    pub(crate) checkpoint_id: Option<u64>,
    pub(crate) offsets: Arc<Offsets>,
    pub(crate) created: std::time::Instant,
}

/// Checkpoint id → offsets, oldest first, at most `cap` entries.
#[derive(Debug)]
pub(crate) struct PendingCheckpoints {
    cap: usize,
    entries: BTreeMap<u64, Arc<Offsets>>,
}

/// What completing a checkpoint did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Completion {
    /// Commit these offsets; `subsumed` older entries were dropped with it.
    Commit(Arc<Offsets>, usize),
    /// The id is not pending (never snapshotted, aborted, dropped, or subsumed).
    Unknown,
}

impl PendingCheckpoints {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            entries: BTreeMap::new(),
        }
    }

    /// Records a snapshot. Returns how many old entries were dropped to stay within the cap.
    pub(crate) fn insert(&mut self, id: u64, offsets: Arc<Offsets>) -> usize {
        self.entries.insert(id, offsets);
        let mut dropped = 0;
        while self.entries.len() > self.cap {
            self.entries.pop_first();
            dropped += 1;
        }
        dropped
    }

    /// Completes `id`: its offsets are to be committed, and it and every older entry go.
    pub(crate) fn complete(&mut self, id: u64) -> Completion {
        let Some(offsets) = self.entries.remove(&id) else {
            return Completion::Unknown;
        };
        let newer = self.entries.split_off(&id);
        let subsumed = self.entries.len();
        self.entries = newer;
        Completion::Commit(offsets, subsumed)
    }

    /// Drops partitions from every pending checkpoint (they were revoked or lost): when such a
    /// checkpoint completes, only what this member still owns is committed.
    pub(crate) fn forget(&mut self, partitions: &[TopicPartition]) {
        for offsets in self.entries.values_mut() {
            if partitions.iter().any(|tp| offsets.contains_key(tp)) {
                let mut kept = (**offsets).clone();
                for tp in partitions {
                    kept.remove(tp);
                }
                *offsets = Arc::new(kept);
            }
        }
    }

    /// Aborts `id` only.
    pub(crate) fn abort(&mut self, id: u64) -> bool {
        self.entries.remove(&id).is_some()
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// State shared by the consumer, its checkpoint handles, and its network loop.
#[derive(Debug)]
pub(crate) struct CheckpointShared {
    pub(crate) enabled: bool,
    pub(crate) pending: Mutex<PendingCheckpoints>,
    pub(crate) handover: Handover<CommitRequest>,
    pub(crate) stats: Mutex<CommitStats>,
    outcomes: mpsc::Sender<CommitOutcome>,
}

impl CheckpointShared {
    pub(crate) fn new(enabled: bool, cap: usize, outcomes: mpsc::Sender<CommitOutcome>) -> Self {
        Self {
            enabled,
            pending: Mutex::new(PendingCheckpoints::new(cap)),
            handover: Handover::new(),
            stats: Mutex::new(CommitStats::default()),
            outcomes,
        }
    }

    /// Records an outcome in the counters and hands it to the application.
    pub(crate) fn report(&self, outcome: CommitOutcome) {
        {
            let mut s = self.stats.lock();
            match &outcome.outcome {
                Outcome::Acked => s.succeeded += 1,
                Outcome::Failed(_) => s.failed += 1,
                Outcome::Superseded => s.superseded += 1,
                Outcome::TimedOut => s.timed_out += 1,
                Outcome::NotOwned => s.not_owned += 1,
            }
            match &outcome.outcome {
                Outcome::Acked => {
                    tracing::debug!(checkpoint = ?outcome.checkpoint_id, latency = ?outcome.latency, "commit acknowledged")
                }
                Outcome::Superseded => {
                    tracing::info!(checkpoint = ?outcome.checkpoint_id, "commit skipped: superseded by a newer completed checkpoint")
                }
                other => {
                    tracing::warn!(checkpoint = ?outcome.checkpoint_id, outcome = %other, "commit did not succeed")
                }
            }
        }
        if self.outcomes.try_send(outcome).is_err() {
            self.stats.lock().dropped_outcomes += 1;
        }
    }

    /// Records acknowledged offsets.
    pub(crate) fn acked(&self, offsets: impl IntoIterator<Item = (TopicPartition, i64)>) {
        let mut s = self.stats.lock();
        for (tp, o) in offsets {
            s.last_acked.insert(tp, o);
        }
    }

    /// Hands a commit to the network loop; a commit it replaces is reported superseded.
    pub(crate) fn submit(&self, req: CommitRequest) {
        if let Some(old) = self.handover.publish(req) {
            self.report(CommitOutcome {
                checkpoint_id: old.checkpoint_id,
                latency: old.created.elapsed(),
                offsets: old.offsets,
                outcome: Outcome::Superseded,
            });
        }
    }
}

/// The checkpoint side's handle: cheap to clone, `Send + Sync`, and never blocks on the
/// network. Get it from [`Consumer::checkpoints`](crate::Consumer::checkpoints).
#[derive(Clone, Debug)]
pub struct CheckpointHandle {
    pub(crate) shared: Arc<CheckpointShared>,
}

impl CheckpointHandle {
    /// Checkpoint `id` is durable: commit its offsets. Older pending checkpoints are dropped
    /// with it (their offsets are covered). An unknown or already subsumed id is counted in
    /// [`CommitStats::unknown_checkpoint`] and commits nothing.
    ///
    /// Returns at once; the outcome arrives on [`CommitOutcomes`] and in [`stats`](Self::stats).
    pub fn notify_checkpoint_complete(&self, id: u64) {
        let completion = self.shared.pending.lock().complete(id);
        match completion {
            Completion::Unknown => {
                self.shared.stats.lock().unknown_checkpoint += 1;
                tracing::warn!(
                    checkpoint = id,
                    "completion for an unknown or already subsumed checkpoint; nothing committed"
                );
            }
            Completion::Commit(offsets, _) => {
                if !self.shared.enabled {
                    return;
                }
                self.shared.submit(CommitRequest {
                    checkpoint_id: Some(id),
                    offsets,
                    created: std::time::Instant::now(),
                });
            }
        }
    }

    /// Checkpoint `id` failed: forget its offsets (only its own).
    pub fn notify_checkpoint_aborted(&self, id: u64) {
        self.shared.pending.lock().abort(id);
    }

    /// The counters and the last acknowledged offsets.
    pub fn stats(&self) -> CommitStats {
        self.shared.stats.lock().clone()
    }

    /// How many checkpoints are pending (snapshotted, neither completed nor aborted).
    pub fn pending(&self) -> usize {
        self.shared.pending.lock().len()
    }
}

/// The stream of commit outcomes, in the order commits ended. Take it once with
/// [`Consumer::commit_outcomes`](crate::Consumer::commit_outcomes). It holds up to 1024
/// outcomes; more are dropped and counted in [`CommitStats::dropped_outcomes`].
#[derive(Debug)]
pub struct CommitOutcomes {
    pub(crate) rx: mpsc::Receiver<CommitOutcome>,
}

impl CommitOutcomes {
    /// The next outcome; `None` once the consumer is gone and all were read.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn recv(&mut self) -> Option<CommitOutcome> {
        self.rx.recv().await
    }

    /// The next outcome if one is ready.
    pub fn try_recv(&mut self) -> Option<CommitOutcome> {
        self.rx.try_recv().ok()
    }

    /// The next outcome, blocking the thread (not for use inside an async runtime).
    pub fn blocking_recv(&mut self) -> Option<CommitOutcome> {
        self.rx.blocking_recv()
    }
}

impl futures::Stream for CommitOutcomes {
    type Item = CommitOutcome;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.get_mut().rx.poll_recv(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offs(n: i64) -> Arc<Offsets> {
        Arc::new(
            [(TopicPartition::new("t", 0), (n, 0))]
                .into_iter()
                .collect(),
        )
    }

    #[test]
    fn complete_commits_that_id_and_drops_older() {
        let mut p = PendingCheckpoints::new(100);
        p.insert(1, offs(10));
        p.insert(2, offs(20));
        p.insert(3, offs(30));
        p.insert(4, offs(40));
        assert_eq!(p.complete(3), Completion::Commit(offs(30), 2));
        assert_eq!(p.len(), 1);
        assert_eq!(p.complete(1), Completion::Unknown);
        assert_eq!(p.complete(3), Completion::Unknown);
        assert_eq!(p.complete(4), Completion::Commit(offs(40), 0));
    }

    #[test]
    fn abort_drops_only_that_id() {
        let mut p = PendingCheckpoints::new(100);
        p.insert(1, offs(10));
        p.insert(2, offs(20));
        assert!(p.abort(1));
        assert!(!p.abort(1));
        assert_eq!(p.complete(1), Completion::Unknown);
        assert_eq!(p.complete(2), Completion::Commit(offs(20), 0));
    }

    #[test]
    fn cap_drops_oldest() {
        let mut p = PendingCheckpoints::new(2);
        assert_eq!(p.insert(1, offs(1)), 0);
        assert_eq!(p.insert(2, offs(2)), 0);
        assert_eq!(p.insert(3, offs(3)), 1);
        assert_eq!(p.complete(1), Completion::Unknown);
        assert_eq!(p.complete(3), Completion::Commit(offs(3), 1));
    }

    #[test]
    fn handle_counts_unknown_and_reports_superseded() {
        let (tx, mut rx) = mpsc::channel(16);
        let shared = Arc::new(CheckpointShared::new(true, 100, tx));
        let h = CheckpointHandle {
            shared: Arc::clone(&shared),
        };
        shared.pending.lock().insert(1, offs(1));
        shared.pending.lock().insert(2, offs(2));
        h.notify_checkpoint_complete(1);
        h.notify_checkpoint_complete(2); // supersedes 1, never taken by a network loop
        h.notify_checkpoint_complete(1); // subsumed
        let s = h.stats();
        assert_eq!((s.superseded, s.unknown_checkpoint), (1, 1));
        let o = rx.try_recv().unwrap();
        assert_eq!(o.checkpoint_id, Some(1));
        assert!(matches!(o.outcome, Outcome::Superseded));
        let taken = shared.handover.take().unwrap();
        assert_eq!(taken.checkpoint_id, Some(2));
        assert!(shared.handover.take().is_none());
    }

    #[test]
    fn handle_is_send_sync_clone() {
        fn check<T: Send + Sync + Clone + 'static>() {}
        check::<CheckpointHandle>();
    }
}
