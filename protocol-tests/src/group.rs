//! Running group members in tests: subscribed consumers on tasks of their own, with every
//! assignment change and record recorded, and the checks that ownership never overlaps and no
//! record is lost.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use kafka_source::{Consumer, ConsumerConfig, RebalanceListener, Revocation, TopicPartition};
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// An ownership change of one member, in the order they happened (one shared log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The member got these partitions.
    Assigned(String, Vec<TopicPartition>),
    /// The member gave these up (it still owned them until this point).
    Revoked(String, Vec<TopicPartition>),
    /// The member lost these.
    Lost(String, Vec<TopicPartition>),
}

/// Wall-clock milliseconds since the Unix epoch: the time base of [`GroupLog`], shared by every
/// process on the machine (the Java members print `System.currentTimeMillis()`).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Change {
    /// The member the change belongs to.
    pub fn member(&self) -> &str {
        match self {
            Change::Assigned(m, _) | Change::Revoked(m, _) | Change::Lost(m, _) => m,
        }
    }

    /// Order among changes of the same millisecond: an ownership ends before another starts.
    /// A new owner is only assigned a partition after the old owner gave it up and the group
    /// went through another round trip (cooperative and eager rebalances, and KIP-848's
    /// revocation acknowledgement alike), so this only resolves the clock's resolution.
    fn rank(&self) -> u8 {
        match self {
            Change::Revoked(..) | Change::Lost(..) => 0,
            Change::Assigned(..) => 1,
        }
    }
}

/// What all members of a test saw.
#[derive(Debug, Default)]
pub struct GroupLog {
    /// Ownership changes, ordered by their wall-clock time in milliseconds (see
    /// [`GroupLog::push`]); members in other processes report them with a delay, so add them
    /// through `push`, which keeps the order.
    pub changes: Vec<(u64, Change)>,
    /// Records by partition and offset: how many times each was handed out.
    pub records: BTreeMap<TopicPartition, BTreeMap<i64, u32>>,
}

impl GroupLog {
    /// Adds a change that happened at `at_ms` (see [`now_ms`]) in time order: after every
    /// change of an earlier millisecond; within a millisecond after the same member's changes
    /// (one member reports in order) and otherwise after the ends of ownership and before the
    /// starts.
    pub fn push(&mut self, at_ms: u64, change: Change) {
        let key = (at_ms, change.rank());
        let mut i = self.changes.partition_point(|(t, c)| (*t, c.rank()) <= key);
        if let Some(last_own) = self
            .changes
            .iter()
            .rposition(|(t, c)| *t == at_ms && c.member() == change.member())
        {
            i = i.max(last_own + 1);
        }
        self.changes.insert(i, (at_ms, change));
    }

    /// Who owns what after the log's changes.
    pub fn owners(&self) -> BTreeMap<TopicPartition, BTreeSet<String>> {
        let mut owners: BTreeMap<TopicPartition, BTreeSet<String>> = BTreeMap::new();
        for (_, c) in &self.changes {
            match c {
                Change::Assigned(m, tps) => {
                    for tp in tps {
                        owners.entry(tp.clone()).or_default().insert(m.clone());
                    }
                }
                Change::Revoked(m, tps) | Change::Lost(m, tps) => {
                    for tp in tps {
                        owners.entry(tp.clone()).or_default().remove(m);
                    }
                }
            }
        }
        owners
    }

    /// Panics if a partition was ever owned by two members at once, among members that
    /// report revocations (`ignore`: members that were killed and never report again). An
    /// ownership that ends in `Lost` is exempt: the member learns of the loss at its next
    /// poll, after the group may have moved on.
    pub fn assert_no_overlap(&self, ignore: &BTreeSet<String>) {
        let mut owners: BTreeMap<TopicPartition, BTreeSet<String>> = BTreeMap::new();
        for (i, (at, c)) in self.changes.iter().enumerate() {
            match c {
                Change::Assigned(m, tps) => {
                    for tp in tps {
                        let o = owners.entry(tp.clone()).or_default();
                        o.insert(m.clone());
                        let live: Vec<_> = o
                            .iter()
                            .filter(|x| !ignore.contains(*x) && !self.ends_lost(i, x, tp))
                            .collect();
                        assert!(
                            live.len() <= 1,
                            "{tp} owned by {live:?} at once (at {at} ms); log: {:#?}",
                            self.changes
                        );
                    }
                }
                Change::Revoked(m, tps) | Change::Lost(m, tps) => {
                    for tp in tps {
                        owners.entry(tp.clone()).or_default().remove(m);
                    }
                }
            }
        }
    }

    /// True if `member`'s next change of `tp` after change `i` is `Lost`.
    fn ends_lost(&self, i: usize, member: &str, tp: &TopicPartition) -> bool {
        for (_, c) in &self.changes[i + 1..] {
            match c {
                Change::Lost(m, tps) if m == member && tps.contains(tp) => return true,
                Change::Assigned(m, tps) | Change::Revoked(m, tps)
                    if m == member && tps.contains(tp) =>
                {
                    return false;
                }
                _ => {}
            }
        }
        false
    }

    /// Distinct records handed out.
    pub fn distinct(&self) -> u64 {
        self.records.values().map(|m| m.len() as u64).sum()
    }

    /// Panics unless every offset below `end[p]` of every partition was handed out.
    pub fn assert_complete(&self, topic: &str, end: &BTreeMap<i32, i64>) {
        for (p, e) in end {
            let tp = TopicPartition::new(topic, *p);
            let seen = self.records.get(&tp);
            for o in 0..*e {
                assert!(
                    seen.is_some_and(|m| m.contains_key(&o)),
                    "{tp} offset {o} was never handed out"
                );
            }
        }
    }
}

struct Listener {
    name: String,
    log: Arc<Mutex<GroupLog>>,
}

impl RebalanceListener for Listener {
    fn on_partitions_revoked(&mut self, revocation: &mut Revocation<'_>) {
        revocation.commit_positions();
        self.log.lock().push(
            now_ms(),
            Change::Revoked(self.name.clone(), revocation.partitions().to_vec()),
        );
    }

    fn on_partitions_assigned(&mut self, assigned: &[TopicPartition]) {
        self.log.lock().push(
            now_ms(),
            Change::Assigned(self.name.clone(), assigned.to_vec()),
        );
    }

    fn on_partitions_lost(&mut self, lost: &[TopicPartition]) {
        self.log
            .lock()
            .push(now_ms(), Change::Lost(self.name.clone(), lost.to_vec()));
    }
}

enum Subscribe {
    Topics(Vec<String>),
    Pattern(String),
}

/// A subscribed consumer polling on a task of its own.
#[derive(Debug)]
pub struct Member {
    /// Its name in the log.
    pub name: String,
    stop: watch::Sender<bool>,
    /// Stalls: while set, the member does not poll.
    stall: mpsc::UnboundedSender<Duration>,
    task: JoinHandle<kafka_source::CommitStats>,
}

impl Member {
    /// Starts a member subscribed to `topics`, logging into `log`.
    pub fn start(
        name: &str,
        config: ConsumerConfig,
        topics: &[&str],
        log: &Arc<Mutex<GroupLog>>,
    ) -> Member {
        let topics: Vec<String> = topics.iter().map(|t| (*t).to_owned()).collect();
        Self::spawn(
            name,
            config,
            Subscribe::Topics(topics),
            log,
            Box::new(|_| {}),
        )
    }

    /// Like [`start`](Self::start), with `setup` run on the consumer before it subscribes
    /// (assignors, for one).
    pub fn start_with(
        name: &str,
        config: ConsumerConfig,
        topics: &[&str],
        log: &Arc<Mutex<GroupLog>>,
        setup: Box<dyn FnOnce(&mut Consumer) + Send>,
    ) -> Member {
        let topics: Vec<String> = topics.iter().map(|t| (*t).to_owned()).collect();
        Self::spawn(name, config, Subscribe::Topics(topics), log, setup)
    }

    /// Starts a member subscribed to every topic matching `pattern`.
    pub fn start_pattern(
        name: &str,
        config: ConsumerConfig,
        pattern: &str,
        log: &Arc<Mutex<GroupLog>>,
    ) -> Member {
        Self::spawn(
            name,
            config,
            Subscribe::Pattern(pattern.to_owned()),
            log,
            Box::new(|_| {}),
        )
    }

    fn spawn(
        name: &str,
        config: ConsumerConfig,
        subscribe: Subscribe,
        log: &Arc<Mutex<GroupLog>>,
        setup: Box<dyn FnOnce(&mut Consumer) + Send>,
    ) -> Member {
        let (stop, mut stop_rx) = watch::channel(false);
        let (stall, mut stall_rx) = mpsc::unbounded_channel::<Duration>();
        let log2 = Arc::clone(log);
        let name2 = name.to_owned();
        let task = tokio::spawn(async move {
            let mut c = Consumer::new(config).expect("consumer");
            c.set_rebalance_listener(Listener {
                name: name2.clone(),
                log: Arc::clone(&log2),
            });
            setup(&mut c);
            match subscribe {
                Subscribe::Topics(t) => c.subscribe(t).expect("subscribe"),
                Subscribe::Pattern(p) => c.subscribe_pattern(&p).expect("subscribe"),
            }
            loop {
                if *stop_rx.borrow() {
                    break;
                }
                tokio::select! {
                    r = c.poll() => match r {
                        Ok(b) => {
                            let mut l = log2.lock();
                            let m = l.records.entry(b.partition.clone()).or_default();
                            for r in &b.records {
                                *m.entry(r.offset).or_default() += 1;
                            }
                        }
                        Err(e) => tracing::warn!(member = %name2, error = %e, "poll error"),
                    },
                    _ = stop_rx.changed() => {}
                    Some(d) = stall_rx.recv() => {
                        // The application is busy: no poll at all.
                        tokio::time::sleep(d).await;
                    }
                }
            }
            c.close().await
        });
        Member {
            name: name.to_owned(),
            stop,
            stall,
            task,
        }
    }

    /// Stops polling for `d` (the application is busy).
    pub fn stall(&self, d: Duration) {
        let _ = self.stall.send(d);
    }

    /// Closes the consumer (leaving the group) and returns its commit counters.
    pub async fn close(self) -> kafka_source::CommitStats {
        let _ = self.stop.send(true);
        self.task.await.expect("member task")
    }

    /// Drops the consumer without closing it (no LeaveGroup, no commits), as a crash would.
    pub fn abort(self) {
        self.task.abort();
    }
}

/// Waits until `check` holds for the log, or panics after `timeout` with `what`.
pub async fn wait_for(
    log: &Arc<Mutex<GroupLog>>,
    timeout: Duration,
    what: &str,
    check: impl Fn(&GroupLog) -> bool,
) {
    let deadline = Instant::now() + timeout;
    loop {
        let done = check(&log.lock());
        if done {
            return;
        }
        if Instant::now() >= deadline {
            let changes = log.lock().changes.clone();
            panic!("timed out waiting for {what}; log: {changes:#?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Like [`wait_for`], but `check` is asked of the log as it stood after each of its changes,
/// so a state the group passes through is seen even if it lasted less than the 100 ms between
/// looks (a member that learns at its next poll that it lost its partitions rejoins at once,
/// and the state between its loss and the rejoin can last a few milliseconds).
pub async fn wait_for_reached(
    log: &Arc<Mutex<GroupLog>>,
    timeout: Duration,
    what: &str,
    check: impl Fn(&GroupLog) -> bool,
) {
    wait_for(log, timeout, what, |l| {
        (1..=l.changes.len()).any(|n| {
            check(&GroupLog {
                changes: l.changes[..n].to_vec(),
                records: BTreeMap::new(),
            })
        })
    })
    .await;
}

/// True when each of `members` owns at least one partition, every partition of `topic`
/// (`0..n`) has exactly one owner among them, and nobody else owns any.
pub fn converged(log: &GroupLog, topic: &str, n: i32, members: &[&str]) -> bool {
    let owners = log.owners();
    let members: BTreeSet<String> = members.iter().map(|m| (*m).to_owned()).collect();
    let mut per_member: BTreeMap<&String, usize> = BTreeMap::new();
    for p in 0..n {
        let tp = TopicPartition::new(topic, p);
        let Some(o) = owners.get(&tp) else {
            return false;
        };
        if o.len() != 1 || !o.is_subset(&members) {
            return false;
        }
        for m in o {
            *per_member.entry(m).or_default() += 1;
        }
    }
    per_member.len() == members.len().min(n as usize)
}

/// Panics unless `group`'s committed offset of every partition of `topic` is its end offset in
/// `end`: nothing left unconsumed or uncommitted.
pub fn assert_committed_at_end(
    cluster: &crate::Cluster,
    group: &str,
    topic: &str,
    end: &BTreeMap<i32, i64>,
) {
    let committed = cluster.committed_offsets(group);
    for (p, e) in end {
        assert_eq!(
            committed.get(&(topic.to_owned(), *p)).copied().flatten(),
            Some(*e),
            "partition {p}: committed {committed:?}"
        );
    }
}
