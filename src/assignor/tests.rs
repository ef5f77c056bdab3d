use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::*;

fn tp(t: &str, p: i32) -> TopicPartition {
    TopicPartition::new(t, p)
}

fn member(id: &str, topics: &[&str]) -> GroupMember {
    GroupMember::new(id, Subscription::new(topics.iter().copied()))
}

fn owning(id: &str, topics: &[&str], owned: &[(&str, i32)], generation: i32) -> GroupMember {
    let mut m = member(id, topics);
    m.subscription.owned_partitions = owned.iter().map(|&(t, p)| tp(t, p)).collect();
    m.subscription.generation_id = generation;
    m
}

fn counts(topics: &[(&str, i32)]) -> BTreeMap<String, i32> {
    topics.iter().map(|&(t, n)| (t.to_owned(), n)).collect()
}

/// The result as `member -> ["t-0", ...]`, each member's partitions sorted.
fn flat(result: &BTreeMap<String, MemberAssignment>) -> BTreeMap<&str, Vec<String>> {
    result
        .iter()
        .map(|(m, a)| {
            let mut ps = a.partitions.clone();
            ps.sort();
            (m.as_str(), ps.iter().map(ToString::to_string).collect())
        })
        .collect()
}

fn expect(pairs: &[(&'static str, &[&str])]) -> BTreeMap<&'static str, Vec<String>> {
    pairs
        .iter()
        .map(|(m, ps)| (*m, ps.iter().map(|s| (*s).to_owned()).collect()))
        .collect()
}

#[test]
fn range_three_members_two_topics() {
    let members = [
        member("c2", &["t0", "t1"]),
        member("c1", &["t0", "t1"]),
        member("c3", &["t1", "t0"]),
    ];
    let out = RangeAssignor
        .assign(&counts(&[("t0", 3), ("t1", 4)]), &members)
        .unwrap();
    assert_eq!(
        flat(&out),
        expect(&[
            ("c1", &["t0-0", "t1-0", "t1-1"]),
            ("c2", &["t0-1", "t1-2"]),
            ("c3", &["t0-2", "t1-3"]),
        ])
    );
}

#[test]
fn range_partial_subscriptions_and_unknown_topics() {
    let members = [
        member("c1", &["t0"]),
        member("c2", &["t0", "t1", "missing"]),
        member("c3", &["t1"]),
        member("c4", &["missing"]),
    ];
    let out = RangeAssignor
        .assign(&counts(&[("t0", 3), ("t1", 4), ("empty", 0)]), &members)
        .unwrap();
    assert_eq!(
        flat(&out),
        expect(&[
            ("c1", &["t0-0", "t0-1"]),
            ("c2", &["t0-2", "t1-0", "t1-1"]),
            ("c3", &["t1-2", "t1-3"]),
            ("c4", &[]),
        ])
    );
}

#[test]
fn range_orders_static_members_first_by_instance_id() {
    let mut a = member("m-a", &["t"]);
    a.group_instance_id = Some("z".into());
    let mut b = member("m-b", &["t"]);
    b.group_instance_id = Some("a".into());
    let members = [member("m-c", &["t"]), a, member("m-0", &["t"]), b];
    let out = RangeAssignor
        .assign(&counts(&[("t", 5)]), &members)
        .unwrap();
    assert_eq!(
        flat(&out),
        expect(&[
            ("m-b", &["t-0", "t-1"]),
            ("m-a", &["t-2"]),
            ("m-0", &["t-3"]),
            ("m-c", &["t-4"]),
        ])
    );
}

#[test]
fn roundrobin_three_members_two_topics() {
    let members = [
        member("c3", &["t0", "t1"]),
        member("c1", &["t0", "t1"]),
        member("c2", &["t0", "t1"]),
    ];
    let out = RoundRobinAssignor
        .assign(&counts(&[("t0", 3), ("t1", 4)]), &members)
        .unwrap();
    assert_eq!(
        flat(&out),
        expect(&[
            ("c1", &["t0-0", "t1-0", "t1-3"]),
            ("c2", &["t0-1", "t1-1"]),
            ("c3", &["t0-2", "t1-2"]),
        ])
    );
}

/// The example in the Java client's `RoundRobinAssignor` documentation.
#[test]
fn roundrobin_unequal_subscriptions() {
    let members = [
        member("C0", &["t0"]),
        member("C1", &["t0", "t1"]),
        member("C2", &["t0", "t1", "t2"]),
    ];
    let out = RoundRobinAssignor
        .assign(&counts(&[("t0", 1), ("t1", 2), ("t2", 3)]), &members)
        .unwrap();
    assert_eq!(
        flat(&out),
        expect(&[
            ("C0", &["t0-0"]),
            ("C1", &["t1-0"]),
            ("C2", &["t1-1", "t2-0", "t2-1", "t2-2"]),
        ])
    );
}

#[test]
fn roundrobin_static_members_first() {
    let mut s = member("zz", &["t"]);
    s.group_instance_id = Some("instance".into());
    let members = [member("aa", &["t"]), s];
    let out = RoundRobinAssignor
        .assign(&counts(&[("t", 3)]), &members)
        .unwrap();
    assert_eq!(
        flat(&out),
        expect(&[("zz", &["t-0", "t-2"]), ("aa", &["t-1"])])
    );
}

#[test]
fn member_order_is_java_string_order() {
    // U+FF5E sorts after U+1F600 in UTF-16 (0xFF5E > 0xD83D), before it in UTF-8.
    assert_eq!(java_cmp("\u{FF5E}", "\u{1F600}"), Ordering::Greater);
    assert_eq!("\u{FF5E}".cmp("\u{1F600}"), Ordering::Less);
    let members = [member("\u{FF5E}", &["t"]), member("\u{1F600}", &["t"])];
    let out = RangeAssignor
        .assign(&counts(&[("t", 1)]), &members)
        .unwrap();
    assert_eq!(out["\u{1F600}"].partitions, vec![tp("t", 0)]);
}

#[test]
fn duplicate_member_ids_are_errors() {
    let members = [member("c", &["t"]), member("c", &["t"])];
    for a in [
        builtin(AssignmentStrategy::Range),
        builtin(AssignmentStrategy::RoundRobin),
        builtin(AssignmentStrategy::CooperativeSticky),
    ] {
        let e = a.assign(&counts(&[("t", 1)]), &members).unwrap_err();
        assert!(e.message().contains("\"c\""), "{e}");
        let e: crate::Error = e.into();
        assert!(e.is_fatal());
    }
}

#[test]
fn builtins_and_protocols() {
    let all = [
        AssignmentStrategy::Range,
        AssignmentStrategy::RoundRobin,
        AssignmentStrategy::CooperativeSticky,
    ];
    for s in all {
        assert_eq!(builtin(s).name(), s.to_string());
    }
    let cs = builtin(AssignmentStrategy::CooperativeSticky);
    let range = builtin(AssignmentStrategy::Range);
    assert_eq!(cs.rebalance_protocol(), RebalanceProtocol::Cooperative);
    assert_eq!(range.rebalance_protocol(), RebalanceProtocol::Eager);
    assert_eq!(
        rebalance_protocol(&[Arc::clone(&cs)]),
        RebalanceProtocol::Cooperative
    );
    assert_eq!(
        rebalance_protocol(&[range, Arc::clone(&cs)]),
        RebalanceProtocol::Eager
    );
    assert_eq!(rebalance_protocol(&[]), RebalanceProtocol::Eager);
    let topics = BTreeSet::from(["t".to_owned()]);
    assert_eq!(
        cs.subscription_user_data(&topics, 7).as_deref(),
        Some(&[0, 0, 0, 7][..])
    );
    assert_eq!(
        cs.subscription_user_data(&topics, -1).as_deref(),
        Some(&[0xff; 4][..])
    );
    assert_eq!(RangeAssignor.subscription_user_data(&topics, 7), None);
}

#[test]
fn every_member_gets_an_entry() {
    let members = [member("a", &["t"]), member("b", &["u"]), member("c", &[])];
    for s in [
        AssignmentStrategy::Range,
        AssignmentStrategy::RoundRobin,
        AssignmentStrategy::CooperativeSticky,
    ] {
        let out = builtin(s).assign(&counts(&[("t", 2)]), &members).unwrap();
        assert_eq!(out.len(), 3, "{s}");
        assert!(out["b"].partitions.is_empty() && out["c"].partitions.is_empty());
        assert_eq!(out["a"].partitions.len(), 2);
    }
    for s in [
        AssignmentStrategy::Range,
        AssignmentStrategy::RoundRobin,
        AssignmentStrategy::CooperativeSticky,
    ] {
        assert!(
            builtin(s)
                .assign(&counts(&[("t", 2)]), &[])
                .unwrap()
                .is_empty()
        );
    }
}

fn sticky(topics: &[(&str, i32)], members: &[GroupMember]) -> BTreeMap<String, MemberAssignment> {
    CooperativeStickyAssignor
        .assign(&counts(topics), members)
        .unwrap()
}

#[test]
fn sticky_initial_assignment() {
    let members = [
        member("c1", &["t0", "t1"]),
        member("c2", &["t0", "t1"]),
        member("c3", &["t0", "t1"]),
    ];
    let out = sticky(&[("t0", 3), ("t1", 4)], &members);
    assert_eq!(
        flat(&out),
        expect(&[
            ("c1", &["t0-0", "t1-0", "t1-3"]),
            ("c2", &["t0-1", "t1-1"]),
            ("c3", &["t0-2", "t1-2"]),
        ])
    );
}

#[test]
fn sticky_join_moves_one_partition_in_two_rounds() {
    let topics = [("t0", 3), ("t1", 4)];
    let mut members = vec![
        owning("c1", &["t0", "t1"], &[("t0", 0), ("t1", 0), ("t1", 3)], 1),
        owning("c2", &["t0", "t1"], &[("t0", 1), ("t1", 1)], 1),
        owning("c3", &["t0", "t1"], &[("t0", 2), ("t1", 2)], 1),
        member("c4", &["t0", "t1"]),
    ];
    // Round 1: c1 keeps two, gives up t1-3, which nobody gets yet.
    let out = sticky(&topics, &members);
    assert_eq!(
        flat(&out),
        expect(&[
            ("c1", &["t0-0", "t1-0"]),
            ("c2", &["t0-1", "t1-1"]),
            ("c3", &["t0-2", "t1-2"]),
            ("c4", &[]),
        ])
    );
    // Round 2, after c1 revoked it: c4 gets it.
    members[0].subscription.owned_partitions = vec![tp("t0", 0), tp("t1", 0)];
    for m in &mut members {
        m.subscription.generation_id = 2;
    }
    let out = sticky(&topics, &members);
    assert_eq!(out["c4"].partitions, vec![tp("t1", 3)]);
    assert_eq!(out["c1"].partitions, vec![tp("t0", 0), tp("t1", 0)]);
}

#[test]
fn sticky_newer_generation_wins_a_conflicting_claim() {
    let members = [
        owning("c1", &["t"], &[("t", 0)], 5),
        owning("c2", &["t"], &[("t", 0), ("t", 1)], 4),
    ];
    let out = sticky(&[("t", 2)], &members);
    assert_eq!(flat(&out), expect(&[("c1", &["t-0"]), ("c2", &["t-1"])]));
    // The same the other way round (and whatever the member order).
    let members = [
        owning("c2", &["t"], &[("t", 0)], 5),
        owning("c1", &["t"], &[("t", 0), ("t", 1)], 4),
    ];
    let out = sticky(&[("t", 2)], &members);
    assert_eq!(flat(&out), expect(&[("c1", &["t-1"]), ("c2", &["t-0"])]));
}

#[test]
fn sticky_same_generation_conflict_is_held_back_one_round() {
    let members = [
        owning("c1", &["t"], &[("t", 0)], 5),
        owning("c2", &["t"], &[("t", 0), ("t", 1)], 5),
    ];
    let out = sticky(&[("t", 2)], &members);
    assert_eq!(flat(&out), expect(&[("c1", &[]), ("c2", &["t-1"])]));
    let members = [
        owning("c1", &["t"], &[], 6),
        owning("c2", &["t"], &[("t", 1)], 6),
    ];
    let out = sticky(&[("t", 2)], &members);
    assert_eq!(flat(&out), expect(&[("c1", &["t-0"]), ("c2", &["t-1"])]));
}

#[test]
fn sticky_reads_the_generation_from_user_data_of_old_subscriptions() {
    // c2's subscription has no generation (version 1), but its user data says 9; c1 says 5.
    let mut c2 = owning("c2", &["t"], &[("t", 0)], -1);
    c2.subscription.user_data = Some(Bytes::from_static(&[0, 0, 0, 9]));
    let c1 = owning("c1", &["t"], &[("t", 0), ("t", 1)], 5);
    let out = sticky(&[("t", 2)], &[c1, c2]);
    assert_eq!(flat(&out), expect(&[("c1", &["t-1"]), ("c2", &["t-0"])]));
}

#[test]
fn sticky_unequal_subscriptions() {
    // c1 takes t0 and t1, c2 only t1: the general algorithm.
    let members = [member("c1", &["t0", "t1"]), member("c2", &["t1"])];
    let out = sticky(&[("t0", 2), ("t1", 2)], &members);
    assert_eq!(
        flat(&out),
        expect(&[("c1", &["t0-0", "t0-1"]), ("c2", &["t1-0", "t1-1"])])
    );
    // c1 owned t1 partitions; moving them to c2 takes two rounds.
    let members = [
        owning(
            "c1",
            &["t0", "t1"],
            &[("t0", 0), ("t0", 1), ("t1", 0), ("t1", 1)],
            3,
        ),
        member("c2", &["t1"]),
    ];
    let out = sticky(&[("t0", 2), ("t1", 2)], &members);
    assert!(out["c2"].partitions.is_empty(), "{out:?}");
    let kept = out["c1"].partitions.len();
    assert!(kept == 3 || kept == 2, "{out:?}");
}

#[test]
fn sticky_drops_claims_on_unsubscribed_topics_and_bad_partitions() {
    let members = [
        owning(
            "c1",
            &["t"],
            &[("t", 0), ("gone", 0), ("t", 99), ("t", -1)],
            2,
        ),
        owning("c2", &["t"], &[("t", 1)], 2),
    ];
    let out = sticky(&[("t", 2), ("gone", 1)], &members);
    assert_eq!(flat(&out), expect(&[("c1", &["t-0"]), ("c2", &["t-1"])]));
}

/// A small deterministic PRNG (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

/// A simulated group: what each member really owns, and its generation.
struct Sim {
    topics: BTreeMap<String, i32>,
    members: BTreeMap<String, (Vec<String>, Vec<TopicPartition>, i32)>,
    generation: i32,
}

impl Sim {
    fn subscriptions(&self) -> Vec<GroupMember> {
        self.members
            .iter()
            .map(|(id, (topics, owned, generation))| {
                let mut s = Subscription::new(topics.iter().cloned());
                s.owned_partitions = owned.clone();
                s.generation_id = *generation;
                GroupMember::new(id.clone(), s)
            })
            .collect()
    }

    /// One rebalance: checks the cooperative invariants and applies the result.
    fn round(&mut self, rng: &mut Rng) -> BTreeMap<String, MemberAssignment> {
        let mut input = self.subscriptions();
        let out = CooperativeStickyAssignor
            .assign(&self.topics, &input)
            .unwrap();
        // The member order does not matter.
        rng.shuffle(&mut input);
        assert_eq!(
            CooperativeStickyAssignor
                .assign(&self.topics, &input)
                .unwrap(),
            out
        );
        assert_eq!(out.len(), self.members.len());
        let mut seen = HashMap::new();
        for (m, a) in &out {
            let (topics, _, _) = &self.members[m];
            for p in &a.partitions {
                assert!(topics.iter().any(|t| **t == *p.topic), "{m} got {p}");
                assert!((0..self.topics[&*p.topic]).contains(&p.partition), "{p}");
                assert!(seen.insert(p.clone(), m.clone()).is_none(), "{p} twice");
                // Cooperative: never to a new member while another still owns it.
                for (other, (_, owned, _)) in &self.members {
                    assert!(
                        other == m || !owned.contains(p),
                        "{p}: {other} -> {m} in one round"
                    );
                }
            }
        }
        self.generation += 1;
        for (m, (_, owned, generation)) in &mut self.members {
            *owned = out[m].partitions.clone();
            *generation = self.generation;
        }
        out
    }

    fn all_equal(&self) -> bool {
        let mut subs = self
            .members
            .values()
            .map(|(t, _, _)| t.iter().collect::<BTreeSet<_>>());
        let first = subs.next();
        subs.all(|s| Some(s) == first)
    }

    fn owners(&self) -> HashMap<TopicPartition, String> {
        self.members
            .iter()
            .flat_map(|(m, (_, owned, _))| owned.iter().map(move |p| (p.clone(), m.clone())))
            .collect()
    }

    /// The subscribed partitions.
    fn wanted(&self) -> BTreeSet<TopicPartition> {
        self.members
            .values()
            .flat_map(|(topics, _, _)| topics.iter())
            .filter_map(|t| self.topics.get(t).map(|n| (t, *n)))
            .flat_map(|(t, n)| (0..n).map(move |p| tp(t, p)))
            .collect()
    }
}

/// The fewest partitions that must change owner when members with these counts (of valid
/// partitions) share `total` equally.
fn min_moves(owned: &[usize], total: usize) -> usize {
    let n = owned.len();
    let (min, extra) = (total / n, total % n);
    let mut sorted = owned.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    sorted
        .iter()
        .enumerate()
        .map(|(i, &c)| c.saturating_sub(min + usize::from(i < extra)))
        .sum()
}

#[test]
fn sticky_randomized_rounds() {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let names = ["a", "b", "c", "d"];
    for case in 0..60 {
        let equal = case % 2 == 0;
        let mut sim = Sim {
            topics: names
                .iter()
                .map(|t| ((*t).to_owned(), 1 + rng.below(6) as i32))
                .collect(),
            members: BTreeMap::new(),
            generation: 0,
        };
        let mut next_id = 0;
        for step in 0..12 {
            // A change: a member joins or leaves, or a topic grows.
            match rng.below(3) {
                0 | 1 if sim.members.len() < 2 || rng.below(2) == 0 => {
                    let topics: Vec<String> = if equal {
                        names.iter().map(|t| (*t).to_owned()).collect()
                    } else {
                        names
                            .iter()
                            .filter(|_| rng.below(2) == 0)
                            .map(|t| (*t).to_owned())
                            .collect()
                    };
                    // Ids sort differently from join order.
                    let id = format!("m{:02}-{next_id}", rng.below(100));
                    next_id += 1;
                    sim.members.insert(id, (topics, Vec::new(), -1));
                }
                0 | 1 => {
                    let ids: Vec<String> = sim.members.keys().cloned().collect();
                    sim.members.remove(&ids[rng.below(ids.len())]);
                }
                _ => {
                    let t = names[rng.below(names.len())];
                    *sim.topics.get_mut(t).unwrap() += 1 + rng.below(3) as i32;
                }
            }
            let before = sim.owners();
            let counts_before: Vec<usize> = if sim.all_equal() {
                let wanted = sim.wanted();
                sim.members
                    .values()
                    .map(|(_, owned, _)| owned.iter().filter(|p| wanted.contains(p)).count())
                    .collect()
            } else {
                Vec::new()
            };
            sim.round(&mut rng);
            sim.round(&mut rng);
            // Every subscribed partition is assigned after two rounds.
            let after = sim.owners();
            let wanted = sim.wanted();
            for p in &wanted {
                assert!(
                    after.contains_key(p),
                    "case {case} step {step}: {p} unassigned"
                );
            }
            if sim.all_equal() && !sim.members.is_empty() {
                // Balanced...
                let sizes: Vec<usize> = sim.members.values().map(|(_, o, _)| o.len()).collect();
                let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                assert!(hi - lo <= 1, "case {case} step {step}: {sizes:?}");
                // ... and sticky: no more partitions changed owner than balance requires.
                if !counts_before.is_empty() {
                    let moved = before
                        .iter()
                        .filter(|(p, m)| after.get(*p).is_some_and(|n| n != *m))
                        .count();
                    assert_eq!(
                        moved,
                        min_moves(&counts_before, wanted.len()),
                        "case {case} step {step}"
                    );
                }
            }
            // A third round changes nothing.
            let settled = sim.owners();
            sim.round(&mut rng);
            assert_eq!(sim.owners(), settled, "case {case} step {step}");
        }
    }
}

#[test]
fn sticky_member_order_does_not_matter() {
    let mut rng = Rng(42);
    let members = vec![
        owning("x", &["t0", "t1"], &[("t0", 0), ("t0", 1), ("t1", 2)], 3),
        owning("y", &["t0"], &[("t0", 1), ("t0", 2)], 2),
        owning("z", &["t1", "t2"], &[], -1),
        owning("w", &["t0", "t1", "t2"], &[("t2", 0)], 3),
    ];
    let topics = counts(&[("t0", 4), ("t1", 3), ("t2", 2)]);
    let want = CooperativeStickyAssignor.assign(&topics, &members).unwrap();
    for _ in 0..20 {
        let mut shuffled = members.clone();
        rng.shuffle(&mut shuffled);
        assert_eq!(
            CooperativeStickyAssignor
                .assign(&topics, &shuffled)
                .unwrap(),
            want
        );
        for a in [&RangeAssignor as &dyn Assignor, &RoundRobinAssignor] {
            assert_eq!(
                a.assign(&topics, &shuffled).unwrap(),
                a.assign(&topics, &members).unwrap()
            );
        }
    }
}
