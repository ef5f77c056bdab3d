//! The sticky algorithm of the Java client's `AbstractStickyAssignor`, with the cooperative
//! adjustment of its `CooperativeStickyAssignor`.
//!
//! Members are numbered in the order of their ids and topics in the order of their names (both
//! as Java's `String.compareTo` orders them), and a partition is `(topic number, partition)`, so
//! sorting partitions sorts them as Java's comparators do. Where Java iterates a `HashMap` or
//! `HashSet` and the order matters, we iterate in that sorted order instead.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use super::{AssignorError, GroupMember, java_cmp};
use crate::types::TopicPartition;

/// A member: its index in the members sorted by id.
type Member = usize;
/// A partition: (topic index in the sorted topics, partition).
type P = (usize, i32);

/// Java's `DEFAULT_GENERATION`.
const NO_GENERATION: i32 = -1;

/// The input, numbered.
struct Ctx<'a> {
    /// Members sorted by id.
    members: Vec<&'a GroupMember>,
    /// Assignable topics (subscribed by someone, with partitions), sorted by name, and their
    /// partition counts.
    topics: Vec<(Arc<str>, i32)>,
    /// Each member's subscribed assignable topics, in subscription order, without repeats.
    subscribed: Vec<Vec<usize>>,
    /// Each member's owned partitions (those of assignable topics only) and generation, as
    /// Java's `CooperativeStickyAssignor.memberData` reads them.
    member_data: Vec<(Vec<P>, Option<i32>)>,
}

/// Computes the assignment: each member's id and partitions (sorted), for members that get any.
pub(super) fn assign<'a>(
    partitions_per_topic: &BTreeMap<String, i32>,
    members: &'a [GroupMember],
) -> Result<Vec<(&'a str, Vec<TopicPartition>)>, AssignorError> {
    if members.is_empty() {
        return Ok(Vec::new());
    }
    let ctx = Ctx::new(partitions_per_topic, members);
    let owned = resolve_claims(&ctx);
    let (mut assignment, transferring) = if owned.all_equal {
        let mut c = Constrained::new(&ctx, &owned.multi);
        c.assign_owned(&owned.owned);
        c.fill()?;
        (c.assignment, c.transferring)
    } else {
        let mut g = General::new(&ctx, owned.owned);
        let prev = g.previous_assignment(owned.max_generation);
        g.build(&prev);
        let transferring = transfers(&ctx, &g.current);
        (g.current, transferring)
    };
    // Cooperative: a partition moving between members is left out until its owner revoked it.
    for (p, m) in transferring {
        if let Some(ps) = assignment.get_mut(m) {
            ps.retain(|q| *q != p);
        }
    }
    Ok(ctx
        .members
        .iter()
        .zip(assignment)
        .map(|(member, mut ps)| {
            ps.sort_unstable();
            let tps = ps
                .into_iter()
                .filter_map(|(t, p)| {
                    let (topic, _) = ctx.topics.get(t)?;
                    Some(TopicPartition {
                        topic: Arc::clone(topic),
                        partition: p,
                    })
                })
                .collect();
            (member.member_id.as_str(), tps)
        })
        .collect())
}

impl<'a> Ctx<'a> {
    fn new(partitions_per_topic: &BTreeMap<String, i32>, members: &'a [GroupMember]) -> Self {
        let mut sorted: Vec<&GroupMember> = members.iter().collect();
        sorted.sort_by(|a, b| java_cmp(&a.member_id, &b.member_id));
        let wanted: BTreeSet<&str> = sorted
            .iter()
            .flat_map(|m| m.subscription.topics.iter().map(String::as_str))
            .collect();
        let mut topics: Vec<(Arc<str>, i32)> = partitions_per_topic
            .iter()
            .filter(|(t, n)| **n > 0 && wanted.contains(t.as_str()))
            .map(|(t, n)| (Arc::from(t.as_str()), *n))
            .collect();
        topics.sort_by(|a, b| java_cmp(&a.0, &b.0));
        let index: HashMap<&str, usize> = topics
            .iter()
            .enumerate()
            .map(|(i, (t, _))| (&**t, i))
            .collect();
        let subscribed = sorted
            .iter()
            .map(|m| {
                let mut seen = HashSet::new();
                m.subscription
                    .topics
                    .iter()
                    .filter_map(|t| index.get(t.as_str()).copied())
                    .filter(|t| seen.insert(*t))
                    .collect()
            })
            .collect();
        let member_data = sorted
            .iter()
            .map(|m| {
                let s = &m.subscription;
                let owned = s
                    .owned_partitions
                    .iter()
                    .filter_map(|tp| {
                        let t = *index.get(&*tp.topic)?;
                        let count = topics.get(t)?.1;
                        (0..count)
                            .contains(&tp.partition)
                            .then_some((t, tp.partition))
                    })
                    .collect();
                (owned, generation(s))
            })
            .collect();
        Self {
            members: sorted,
            topics,
            subscribed,
            member_data,
        }
    }

    fn count(&self, topic: usize) -> i32 {
        self.topics.get(topic).map_or(0, |t| t.1)
    }

    /// All partitions of these topics, topic by topic.
    fn partitions_of(&self, topics: impl IntoIterator<Item = usize>) -> Vec<P> {
        topics
            .into_iter()
            .flat_map(|t| (0..self.count(t)).map(move |p| (t, p)))
            .collect()
    }

    fn total(&self) -> usize {
        self.topics
            .iter()
            .map(|t| t.1.unsigned_abs() as usize)
            .sum()
    }
}

/// A member's generation as `CooperativeStickyAssignor.memberData` reads it: the
/// subscription's (version 2+) if set, else the big-endian `i32` at the start of the user data
/// (-1 if the user data is shorter), else none.
fn generation(s: &crate::assignor::Subscription) -> Option<i32> {
    if s.generation_id >= 0 {
        return Some(s.generation_id);
    }
    let data = s.user_data.as_ref()?;
    Some(
        data.first_chunk::<4>()
            .map_or(NO_GENERATION, |b| i32::from_be_bytes(*b)),
    )
}

/// The owned partitions after resolving conflicting claims (`allSubscriptionsEqual` in Java).
struct Claims {
    /// Whether all members subscribe to the same topics.
    all_equal: bool,
    /// Each member's owned partitions that survive.
    owned: Vec<Vec<P>>,
    /// Partitions claimed by several members of the same generation (nobody keeps them).
    multi: HashSet<P>,
    /// The highest generation of any member.
    max_generation: i32,
}

fn resolve_claims(ctx: &Ctx<'_>) -> Claims {
    let first: BTreeSet<&str> = topic_set(ctx.members[0]);
    let all_equal = ctx.members.iter().all(|m| topic_set(m) == first);
    let mut owned: Vec<Vec<P>> = vec![Vec::new(); ctx.members.len()];
    let mut multi = HashSet::new();
    let mut max_generation = NO_GENERATION;
    let mut owner: HashMap<P, Member> = HashMap::new();
    for (m, (partitions, generation)) in ctx.member_data.iter().enumerate() {
        let generation = generation.unwrap_or(NO_GENERATION);
        max_generation = max_generation.max(generation);
        for &p in partitions {
            let Some(&other) = owner.get(&p) else {
                owned[m].push(p);
                owner.insert(p, m);
                continue;
            };
            // As in Java, the other claim's generation is its subscription's, not the one read
            // from user data.
            let other_generation = ctx.members[other]
                .subscription
                .generation_id
                .max(NO_GENERATION);
            if generation == other_generation {
                multi.insert(p);
                remove_first(&mut owned[other], p);
                owner.insert(p, m);
            } else if generation > other_generation {
                owned[m].push(p);
                remove_first(&mut owned[other], p);
                owner.insert(p, m);
            }
        }
    }
    Claims {
        all_equal,
        owned,
        multi,
        max_generation,
    }
}

fn topic_set(m: &GroupMember) -> BTreeSet<&str> {
    m.subscription.topics.iter().map(String::as_str).collect()
}

fn remove_first(v: &mut Vec<P>, p: P) {
    if let Some(i) = v.iter().position(|q| *q == p) {
        v.remove(i);
    }
}

/// Java's `ConstrainedAssignmentBuilder`, used when all members subscribe to the same topics.
struct Constrained<'c> {
    ctx: &'c Ctx<'c>,
    multi: &'c HashSet<P>,
    min_quota: usize,
    max_quota: usize,
    expected_over_min: usize,
    current_over_min: usize,
    assignment: Vec<Vec<P>>,
    assigned: HashSet<P>,
    maybe_revoked: HashMap<P, Member>,
    under_min: Vec<Member>,
    exactly_min: VecDeque<Member>,
    transferring: HashMap<P, Member>,
}

impl<'c> Constrained<'c> {
    fn new(ctx: &'c Ctx<'c>, multi: &'c HashSet<P>) -> Self {
        let (total, n) = (ctx.total(), ctx.members.len());
        Self {
            ctx,
            multi,
            min_quota: total / n,
            max_quota: total.div_ceil(n),
            expected_over_min: total % n,
            current_over_min: 0,
            assignment: vec![Vec::new(); n],
            assigned: HashSet::new(),
            maybe_revoked: HashMap::new(),
            under_min: Vec::new(),
            exactly_min: VecDeque::new(),
            transferring: HashMap::new(),
        }
    }

    /// Gives members back what they own, up to their quota.
    fn assign_owned(&mut self, owned: &[Vec<P>]) {
        for (m, owned) in owned.iter().enumerate() {
            let mut owned: Vec<P> = owned
                .iter()
                .copied()
                .filter(|p| !self.multi.contains(p))
                .collect();
            // Java sorts these by partition, then topic.
            owned.sort_unstable_by_key(|&(t, p)| (p, t));
            let keep = if owned.len() < self.min_quota {
                self.under_min.push(m);
                owned.len()
            } else if owned.len() >= self.max_quota
                && self.current_over_min < self.expected_over_min
            {
                self.current_over_min += 1;
                if self.current_over_min == self.expected_over_min {
                    self.exactly_min.clear();
                }
                self.max_quota
            } else {
                if self.current_over_min < self.expected_over_min {
                    self.exactly_min.push_back(m);
                }
                self.min_quota
            };
            for (i, p) in owned.into_iter().enumerate() {
                if i < keep {
                    self.assignment[m].push(p);
                    self.assigned.insert(p);
                } else {
                    self.maybe_revoked.insert(p, m);
                }
            }
        }
    }

    /// Deals the unassigned partitions round-robin to the members still under quota.
    fn fill(&mut self) -> Result<(), AssignorError> {
        let all = self.ctx.partitions_of(0..self.ctx.topics.len());
        let unassigned: Vec<P> = all
            .into_iter()
            .filter(|p| !self.assigned.contains(p))
            .collect();
        self.under_min.sort_unstable();
        self.exactly_min.make_contiguous().sort_unstable();
        // `next` plays Java's iterator over `under_min`: the index of the next member.
        let mut next = 0;
        for p in unassigned {
            let (m, from_under) = if let Some(&m) = self.under_min.get(next) {
                next += 1;
                (m, true)
            } else if let Some(&m) = self.under_min.first() {
                next = 1;
                (m, true)
            } else if let Some(m) = self.exactly_min.pop_front() {
                (m, false)
            } else {
                return Err(AssignorError::new(
                    "cooperative-sticky: no member left to take the remaining partitions",
                ));
            };
            let count = self.assign_new(p, m);
            if count == self.min_quota {
                if from_under && next > 0 {
                    next -= 1;
                    self.under_min.remove(next);
                }
                self.exactly_min.push_back(m);
            } else if count == self.max_quota {
                self.current_over_min += 1;
            }
        }
        if !self.under_min.is_empty() {
            let short = self
                .under_min
                .iter()
                .any(|&m| self.assignment[m].len() != self.min_quota);
            if self.current_over_min != self.expected_over_min || short {
                return Err(AssignorError::new(
                    "cooperative-sticky: ran out of partitions before every member reached its quota",
                ));
            }
        }
        Ok(())
    }

    fn assign_new(&mut self, p: P, m: Member) -> usize {
        self.assignment[m].push(p);
        let revoked_elsewhere = self.maybe_revoked.get(&p).is_some_and(|&owner| owner != m);
        if revoked_elsewhere || self.multi.contains(&p) {
            self.transferring.insert(p, m);
        }
        self.assignment[m].len()
    }
}

/// The partitions assigned to a member other than one that owns it now (Java's
/// `computePartitionsTransferringOwnership`, for the general algorithm).
fn transfers(ctx: &Ctx<'_>, assignment: &[Vec<P>]) -> HashMap<P, Member> {
    let mut added = HashMap::new();
    let mut revoked = HashSet::new();
    for (m, assigned) in assignment.iter().enumerate() {
        let owned: HashSet<P> = ctx.member_data[m].0.iter().copied().collect();
        let assigned_set: HashSet<P> = assigned.iter().copied().collect();
        added.extend(
            assigned
                .iter()
                .filter(|p| !owned.contains(p))
                .map(|&p| (p, m)),
        );
        revoked.extend(owned.into_iter().filter(|p| !assigned_set.contains(p)));
    }
    added.retain(|p, _| revoked.contains(p));
    added
}

/// Where partitions moved during balancing (Java's `PartitionMovements`), to move a partition
/// back rather than a second one of the same topic the other way.
#[derive(Default)]
struct Movements {
    by_partition: HashMap<P, (Member, Member)>,
    by_topic: HashMap<usize, BTreeMap<(Member, Member), BTreeSet<P>>>,
}

impl Movements {
    fn remove(&mut self, p: P) -> Option<(Member, Member)> {
        let pair = self.by_partition.remove(&p)?;
        if let Some(topic) = self.by_topic.get_mut(&p.0) {
            if let Some(set) = topic.get_mut(&pair) {
                set.remove(&p);
                if set.is_empty() {
                    topic.remove(&pair);
                }
            }
            if topic.is_empty() {
                self.by_topic.remove(&p.0);
            }
        }
        Some(pair)
    }

    fn add(&mut self, p: P, pair: (Member, Member)) {
        self.by_partition.insert(p, pair);
        self.by_topic
            .entry(p.0)
            .or_default()
            .entry(pair)
            .or_default()
            .insert(p);
    }

    fn record(&mut self, p: P, old: Member, new: Member) {
        match self.remove(p) {
            Some((src, _)) if src == new => {}
            Some((src, _)) => self.add(p, (src, new)),
            None => self.add(p, (old, new)),
        }
    }

    /// The partition to move from `old` to `new` instead of `p`: one that earlier moved the
    /// other way, if any (Java takes any element of a hash set; we take the smallest).
    fn actual(&self, p: P, old: Member, new: Member) -> P {
        let Some(topic) = self.by_topic.get(&p.0) else {
            return p;
        };
        let old = self.by_partition.get(&p).map_or(old, |pair| pair.0);
        topic
            .get(&(new, old))
            .and_then(|set| set.first())
            .copied()
            .unwrap_or(p)
    }
}

/// Java's `GeneralAssignmentBuilder`, used when members subscribe to different topics.
struct General<'c> {
    ctx: &'c Ctx<'c>,
    /// Per topic, the members subscribed to it.
    consumers_of: Vec<Vec<Member>>,
    /// Per member, the current assignment.
    current: Vec<Vec<P>>,
    /// Members that cannot take part in balancing (left out of `sorted` and of the balance).
    fixed: Vec<bool>,
    owner: HashMap<P, Member>,
    /// Members ordered by the size of their assignment, then id.
    sorted: BTreeSet<(usize, Member)>,
    movements: Movements,
    revocation_required: bool,
}

impl<'c> General<'c> {
    fn new(ctx: &'c Ctx<'c>, owned: Vec<Vec<P>>) -> Self {
        let mut consumers_of = vec![Vec::new(); ctx.topics.len()];
        for (m, topics) in ctx.subscribed.iter().enumerate() {
            for &t in topics {
                consumers_of[t].push(m);
            }
        }
        let owner = owned
            .iter()
            .enumerate()
            .flat_map(|(m, ps)| ps.iter().map(move |&p| (p, m)))
            .collect();
        Self {
            ctx,
            consumers_of,
            fixed: vec![false; owned.len()],
            current: owned,
            owner,
            sorted: BTreeSet::new(),
            movements: Movements::default(),
            revocation_required: false,
        }
    }

    /// Java's `prepopulateCurrentAssignments`: for each partition, the member that owned it in
    /// the newest generation older than the newest one, with that generation.
    fn previous_assignment(&self, max_generation: i32) -> HashMap<P, (Member, i32)> {
        let mut prev: HashMap<P, (Member, i32)> = HashMap::new();
        for (m, (partitions, generation)) in self.ctx.member_data.iter().enumerate() {
            let generation = match *generation {
                Some(g) if g < max_generation => g,
                None if max_generation > NO_GENERATION => NO_GENERATION,
                _ => continue,
            };
            for &p in partitions {
                match prev.get(&p) {
                    Some(&(_, g)) if generation <= g => {}
                    _ => {
                        prev.insert(p, (m, generation));
                    }
                }
            }
        }
        prev
    }

    fn subscribes(&self, m: Member, topic: usize) -> bool {
        self.ctx.subscribed[m].contains(&topic)
    }

    fn len(&self, m: Member) -> usize {
        self.current[m].len()
    }

    /// The partitions of the topics `m` subscribes to.
    fn max_size(&self, m: Member) -> usize {
        self.ctx.subscribed[m]
            .iter()
            .map(|&t| self.ctx.count(t).unsigned_abs() as usize)
            .sum()
    }

    /// The topics, fewest subscribers first, then by name; their partitions in that order.
    fn sorted_all_partitions(&self) -> Vec<P> {
        let mut topics: Vec<usize> = (0..self.ctx.topics.len()).collect();
        topics.sort_by_key(|&t| (self.consumers_of[t].len(), t));
        self.ctx.partitions_of(topics)
    }

    fn build(&mut self, prev: &HashMap<P, (Member, i32)>) {
        // Keep owned partitions of subscribed topics (claims were already limited to topics
        // that exist).
        let mut assigned = HashSet::new();
        for m in 0..self.current.len() {
            let before = self.current[m].len();
            let subscribed = &self.ctx.subscribed[m];
            self.current[m].retain(|p| subscribed.contains(&p.0));
            if self.current[m].len() != before {
                self.revocation_required = true;
            }
            assigned.extend(self.current[m].iter().copied());
        }
        let mut all = self.sorted_all_partitions();
        let mut unassigned: Vec<P> = all
            .iter()
            .copied()
            .filter(|p| !assigned.contains(p))
            .collect();
        for m in 0..self.current.len() {
            self.sorted.insert((self.len(m), m));
        }
        self.balance(prev, &mut all, &mut unassigned);
    }

    fn balance(
        &mut self,
        prev: &HashMap<P, (Member, i32)>,
        all: &mut Vec<P>,
        unassigned: &mut Vec<P>,
    ) {
        let initializing = self.sorted.last().is_none_or(|&(len, _)| len == 0);
        for &p in unassigned.iter() {
            let to = self
                .sorted
                .iter()
                .copied()
                .find(|&(_, m)| self.subscribes(m, p.0));
            if let Some((len, m)) = to {
                self.sorted.remove(&(len, m));
                self.current[m].push(p);
                self.owner.insert(p, m);
                self.sorted.insert((len + 1, m));
            }
        }

        // Only topics with two or more subscribers, and members that could change, take part.
        let movable = |t: usize| self.consumers_of[t].len() >= 2;
        all.retain(|p| movable(p.0));
        unassigned.retain(|p| movable(p.0));
        for m in 0..self.current.len() {
            let participates = self.len(m) < self.max_size(m)
                || self.current[m]
                    .iter()
                    .any(|p| self.consumers_of[p.0].len() >= 2);
            if !participates {
                self.sorted.remove(&(self.len(m), m));
                self.fixed[m] = true;
            }
        }

        let before = (self.current.clone(), self.owner.clone());
        if !self.revocation_required {
            self.reassign_all(unassigned, prev);
        }
        let reassigned = self.reassign_all(all, prev);
        if !initializing && reassigned && self.balance_score() >= score(&before.0, &self.fixed) {
            (self.current, self.owner) = before;
        }
    }

    /// Java's `performReassignments`: moves partitions until the assignment is balanced.
    fn reassign_all(&mut self, partitions: &[P], prev: &HashMap<P, (Member, i32)>) -> bool {
        let mut reassigned = false;
        // Java loops until nothing moves; the bound only guards against a cycle.
        let mut budget = partitions
            .len()
            .saturating_mul(self.current.len())
            .saturating_add(16);
        loop {
            let mut modified = false;
            for &p in partitions {
                if self.is_balanced() {
                    break;
                }
                let Some(&c) = self.owner.get(&p) else {
                    continue;
                };
                if let Some(&(pc, _)) = prev.get(&p) {
                    // Unlike Java, only back to a member that still subscribes to the topic and
                    // takes part in balancing.
                    if !self.fixed[pc] && self.subscribes(pc, p.0) && self.len(c) > self.len(pc) + 1
                    {
                        self.reassign_to(p, pc);
                        reassigned = true;
                        modified = true;
                        continue;
                    }
                }
                let better = self.consumers_of[p.0]
                    .iter()
                    .any(|&o| self.len(c) > self.len(o) + 1);
                if better {
                    let to = self
                        .sorted
                        .iter()
                        .copied()
                        .find(|&(_, m)| self.subscribes(m, p.0));
                    if let Some((_, to)) = to {
                        self.reassign_to(p, to);
                        reassigned = true;
                        modified = true;
                    }
                }
            }
            budget = budget.saturating_sub(1);
            if !modified || budget == 0 {
                return reassigned;
            }
        }
    }

    fn reassign_to(&mut self, p: P, to: Member) {
        let Some(&from) = self.owner.get(&p) else {
            return;
        };
        let p = self.movements.actual(p, from, to);
        let Some(&old) = self.owner.get(&p) else {
            return;
        };
        self.sorted.remove(&(self.len(old), old));
        self.sorted.remove(&(self.len(to), to));
        self.movements.record(p, old, to);
        remove_first(&mut self.current[old], p);
        self.current[to].push(p);
        self.owner.insert(p, to);
        for m in [old, to] {
            if !self.fixed[m] {
                self.sorted.insert((self.len(m), m));
            }
        }
    }

    /// Java's `isBalanced`: counts differ by at most one, or no partition could move to a
    /// member with fewer without leaving its owner with fewer still.
    fn is_balanced(&self) -> bool {
        let (Some(&(min, _)), Some(&(max, _))) = (self.sorted.first(), self.sorted.last()) else {
            return true;
        };
        if min + 1 >= max {
            return true;
        }
        for &(count, m) in &self.sorted {
            if count == self.max_size(m) {
                continue;
            }
            for &t in &self.ctx.subscribed[m] {
                for i in 0..self.ctx.count(t) {
                    let Some(&other) = self.owner.get(&(t, i)) else {
                        continue;
                    };
                    if other != m && !self.fixed[other] && count + 1 < self.len(other) {
                        return false;
                    }
                }
            }
        }
        true
    }

    fn balance_score(&self) -> usize {
        score(&self.current, &self.fixed)
    }
}

/// The sum, over all pairs of members taking part, of the difference of their counts.
fn score(assignment: &[Vec<P>], fixed: &[bool]) -> usize {
    let counts: Vec<usize> = assignment
        .iter()
        .zip(fixed)
        .filter(|(_, f)| !**f)
        .map(|(a, _)| a.len())
        .collect();
    let mut total = 0;
    for (i, a) in counts.iter().enumerate() {
        for b in &counts[i + 1..] {
            total += a.abs_diff(*b);
        }
    }
    total
}
