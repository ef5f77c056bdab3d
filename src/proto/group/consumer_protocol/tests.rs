use kafka_protocol::messages::TopicName;
use kafka_protocol::messages::consumer_protocol_assignment::{
    ConsumerProtocolAssignment, TopicPartition as KpAssigned,
};
use kafka_protocol::messages::consumer_protocol_subscription::{
    ConsumerProtocolSubscription, TopicPartition as KpOwned,
};
use kafka_protocol::protocol::{Encodable, StrBytes};

use super::*;

fn tp(t: &str, p: i32) -> TopicPartition {
    TopicPartition::new(t, p)
}

fn full_subscription() -> Subscription {
    let mut s = Subscription::new(["beta", "alpha", "gamma"]);
    s.user_data = Some(Bytes::from_static(b"\x00\x00\x00\x07"));
    s.owned_partitions = vec![tp("beta", 2), tp("alpha", 1), tp("beta", 0), tp("alpha", 0)];
    s.generation_id = 7;
    s.rack_id = Some("rack-a".into());
    s
}

/// What a subscription looks like after encoding at `version`: fields newer than it are gone,
/// topics and owned partitions are sorted.
fn at_version(s: &Subscription, version: i16) -> Subscription {
    let mut out = s.clone();
    out.topics.sort();
    out.owned_partitions.sort();
    if version < 1 {
        out.owned_partitions.clear();
    }
    if version < 2 {
        out.generation_id = -1;
    }
    if version < 3 {
        out.rack_id = None;
    }
    out
}

fn subscriptions() -> Vec<Subscription> {
    let mut nulls = Subscription::new(["t"]);
    nulls.generation_id = -1;
    let mut empty_data = Subscription::new(Vec::<String>::new());
    empty_data.user_data = Some(Bytes::new());
    empty_data.owned_partitions = vec![tp("x", 3)];
    let mut unicode = Subscription::new(["ünïcödé", "a"]);
    unicode.rack_id = Some("机架".into());
    unicode.generation_id = i32::MAX;
    vec![
        full_subscription(),
        nulls,
        empty_data,
        unicode,
        Subscription::default(),
    ]
}

fn assignments() -> Vec<MemberAssignment> {
    let mut with_data = MemberAssignment::new(vec![tp("b", 1), tp("a", 0), tp("b", 0)]);
    with_data.user_data = Some(Bytes::from_static(b"opaque"));
    vec![
        MemberAssignment::default(),
        with_data,
        MemberAssignment::new(vec![tp("only", 5)]),
        MemberAssignment {
            partitions: Vec::new(),
            user_data: Some(Bytes::new()),
        },
    ]
}

/// kafka-protocol's encoding of the same subscription, with the version prefix.
fn reference_subscription(s: &Subscription, version: i16) -> Bytes {
    let mut topics = s.topics.clone();
    topics.sort();
    let mut owned = s.owned_partitions.clone();
    owned.sort();
    let mut owned_kp: Vec<KpOwned> = Vec::new();
    for p in owned {
        match owned_kp.last_mut() {
            Some(last) if *last.topic.0 == *p.topic => last.partitions.push(p.partition),
            _ => owned_kp.push(
                KpOwned::default()
                    .with_topic(TopicName(StrBytes::from_string(p.topic.to_string())))
                    .with_partitions(vec![p.partition]),
            ),
        }
    }
    let msg = ConsumerProtocolSubscription::default()
        .with_topics(topics.into_iter().map(StrBytes::from_string).collect())
        .with_user_data(s.user_data.clone())
        .with_owned_partitions(owned_kp)
        .with_generation_id(s.generation_id)
        .with_rack_id(s.rack_id.clone().map(StrBytes::from_string));
    let mut buf = BytesMut::new();
    buf.put_i16(version);
    msg.encode(&mut buf, version).unwrap();
    buf.freeze()
}

/// kafka-protocol's encoding of the same assignment (topics in order of first appearance).
fn reference_assignment(a: &MemberAssignment, version: i16) -> Bytes {
    let mut topics: Vec<KpAssigned> = Vec::new();
    for p in &a.partitions {
        match topics.iter_mut().find(|t| *t.topic.0 == *p.topic) {
            Some(t) => t.partitions.push(p.partition),
            None => topics.push(
                KpAssigned::default()
                    .with_topic(TopicName(StrBytes::from_string(p.topic.to_string())))
                    .with_partitions(vec![p.partition]),
            ),
        }
    }
    let msg = ConsumerProtocolAssignment::default()
        .with_assigned_partitions(topics)
        .with_user_data(a.user_data.clone());
    let mut buf = BytesMut::new();
    buf.put_i16(version);
    msg.encode(&mut buf, version).unwrap();
    buf.freeze()
}

#[test]
fn subscription_round_trips_at_every_version() {
    for s in subscriptions() {
        for version in 0..=VERSION {
            let bytes = encode_subscription_at(&s, version).unwrap();
            assert_eq!(i16::from_be_bytes([bytes[0], bytes[1]]), version);
            let back = decode_subscription(&bytes).unwrap();
            assert_eq!(back, at_version(&s, version), "v{version}");
        }
    }
}

#[test]
fn assignment_round_trips_at_every_version() {
    for a in assignments() {
        for version in 0..=VERSION {
            let bytes = encode_assignment_at(&a, version).unwrap();
            let back = decode_assignment(&bytes).unwrap();
            let mut want = a.clone();
            // Grouped by topic in order of first appearance.
            want.partitions.sort_by_key(|p| {
                a.partitions
                    .iter()
                    .position(|q| q.topic == p.topic)
                    .unwrap()
            });
            assert_eq!(back, want, "v{version}");
        }
    }
}

#[test]
fn subscription_bytes_match_kafka_protocol() {
    for s in subscriptions() {
        for version in 0..=VERSION {
            assert_eq!(
                encode_subscription_at(&s, version).unwrap(),
                reference_subscription(&s, version),
                "{s:?} v{version}"
            );
        }
        assert_eq!(
            encode_subscription(&s).unwrap(),
            reference_subscription(&s, 3)
        );
    }
}

#[test]
fn assignment_bytes_match_kafka_protocol() {
    for a in assignments() {
        for version in 0..=VERSION {
            assert_eq!(
                encode_assignment_at(&a, version).unwrap(),
                reference_assignment(&a, version),
                "{a:?} v{version}"
            );
        }
        assert_eq!(encode_assignment(&a).unwrap(), reference_assignment(&a, 3));
    }
}

#[test]
fn decodes_kafka_protocol_bytes() {
    for s in subscriptions() {
        for version in 0..=VERSION {
            let bytes = reference_subscription(&s, version);
            assert_eq!(
                decode_subscription(&bytes).unwrap(),
                at_version(&s, version)
            );
        }
    }
}

#[test]
fn subscription_known_bytes() {
    let mut s = Subscription::new(["t"]);
    s.owned_partitions = vec![tp("t", 1)];
    s.generation_id = 2;
    let bytes = encode_subscription(&s).unwrap();
    let want: &[u8] = &[
        0, 3, // version
        0, 0, 0, 1, 0, 1, b't', // topics
        0xff, 0xff, 0xff, 0xff, // user_data: null
        0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 1, 0, 0, 0, 1, // owned_partitions
        0, 0, 0, 2, // generation_id
        0xff, 0xff, // rack_id: null
    ];
    assert_eq!(&bytes[..], want);
}

#[test]
fn newer_versions_read_as_v3_ignoring_trailing_bytes() {
    let s = full_subscription();
    let mut bytes = BytesMut::from(&encode_subscription(&s).unwrap()[..]);
    bytes[0..2].copy_from_slice(&4i16.to_be_bytes());
    bytes.put_slice(b"future fields");
    assert_eq!(
        decode_subscription(&bytes.freeze()).unwrap(),
        at_version(&s, 3)
    );

    let a = MemberAssignment::new(vec![tp("a", 1)]);
    let mut bytes = BytesMut::from(&encode_assignment(&a).unwrap()[..]);
    bytes[0..2].copy_from_slice(&i16::MAX.to_be_bytes());
    bytes.put_slice(&[1, 2, 3]);
    assert_eq!(decode_assignment(&bytes.freeze()).unwrap(), a);
}

#[test]
fn trailing_bytes_at_known_versions_are_errors() {
    for version in 0..=VERSION {
        let mut bytes =
            BytesMut::from(&encode_subscription_at(&full_subscription(), version).unwrap()[..]);
        let end = bytes.len();
        bytes.put_u8(0);
        let e = decode_subscription(&bytes.freeze()).unwrap_err();
        assert_eq!(e.reason, Reason::TrailingBytes(1));
        assert_eq!(e.offset, end);

        let mut bytes =
            BytesMut::from(&encode_assignment_at(&assignments()[1], version).unwrap()[..]);
        bytes.put_u8(0);
        assert!(matches!(
            decode_assignment(&bytes.freeze()).unwrap_err().reason,
            Reason::TrailingBytes(1)
        ));
    }
}

#[test]
fn empty_rack_decodes_as_none() {
    let mut s = Subscription::new(["t"]);
    s.rack_id = Some(String::new());
    let bytes = encode_subscription(&s).unwrap();
    assert_eq!(decode_subscription(&bytes).unwrap().rack_id, None);
}

#[test]
fn every_truncation_is_an_error() {
    for s in subscriptions() {
        let bytes = encode_subscription(&s).unwrap();
        for len in 0..bytes.len() {
            let e = decode_subscription(&bytes.slice(..len)).unwrap_err();
            assert!(e.offset <= len, "{e}");
        }
    }
    for a in assignments() {
        let bytes = encode_assignment(&a).unwrap();
        for len in 0..bytes.len() {
            assert!(decode_assignment(&bytes.slice(..len)).is_err());
        }
    }
}

fn bytes(parts: &[&[u8]]) -> Bytes {
    Bytes::from(parts.concat())
}

#[test]
fn hostile_subscriptions() {
    let cases: Vec<(Bytes, usize, Reason)> = vec![
        (
            bytes(&[&(-1i16).to_be_bytes()]),
            0,
            Reason::UnsupportedVersion(-1),
        ),
        (
            bytes(&[&[0, 0], &(-1i32).to_be_bytes()]),
            2,
            Reason::NegativeLength {
                field: "topics",
                len: -1,
            },
        ),
        (
            bytes(&[&[0, 0], &i32::MAX.to_be_bytes(), &[0, 1, b'a']]),
            2,
            Reason::CountTooLarge {
                field: "topics",
                count: i32::MAX,
                remaining: 3,
            },
        ),
        (
            bytes(&[
                &[0, 0],
                &1i32.to_be_bytes(),
                &(-1i16).to_be_bytes(),
                &[0; 4],
            ]),
            6,
            Reason::NegativeLength {
                field: "topics",
                len: -1,
            },
        ),
        (
            bytes(&[
                &[0, 0],
                &1i32.to_be_bytes(),
                &[0, 2, 0xc3, 0x28],
                &[0xff; 4],
            ]),
            6,
            Reason::InvalidUtf8 { field: "topics" },
        ),
        (
            bytes(&[&[0, 0], &1i32.to_be_bytes(), &[0x7f, 0xff, b'a']]),
            8,
            Reason::Truncated {
                field: "topics",
                needed: 0x7fff,
                remaining: 1,
            },
        ),
        (
            bytes(&[&[0, 0], &0i32.to_be_bytes(), &(-2i32).to_be_bytes()]),
            6,
            Reason::NegativeLength {
                field: "user_data",
                len: -2,
            },
        ),
        (
            bytes(&[
                &[0, 0],
                &0i32.to_be_bytes(),
                &1000i32.to_be_bytes(),
                &[1, 2],
            ]),
            10,
            Reason::Truncated {
                field: "user_data",
                needed: 1000,
                remaining: 2,
            },
        ),
        (
            bytes(&[
                &[0, 1],
                &0i32.to_be_bytes(),
                &[0xff; 4],
                &(-1i32).to_be_bytes(),
            ]),
            10,
            Reason::NegativeLength {
                field: "owned_partitions",
                len: -1,
            },
        ),
        (
            bytes(&[
                &[0, 1],
                &0i32.to_be_bytes(),
                &[0xff; 4],
                &1i32.to_be_bytes(),
                &[0, 1, b't'],
                &0x4000_0000i32.to_be_bytes(),
                &[0; 8],
            ]),
            17,
            Reason::CountTooLarge {
                field: "owned_partitions",
                count: 0x4000_0000,
                remaining: 8,
            },
        ),
        (
            bytes(&[
                &[0, 3],
                &0i32.to_be_bytes(),
                &[0xff; 4],
                &0i32.to_be_bytes(),
                &[0, 0, 0, 1],
                &(-3i16).to_be_bytes(),
            ]),
            18,
            Reason::NegativeLength {
                field: "rack_id",
                len: -3,
            },
        ),
        (
            Bytes::new(),
            0,
            Reason::Truncated {
                field: "version",
                needed: 2,
                remaining: 0,
            },
        ),
    ];
    for (input, offset, reason) in cases {
        let e = decode_subscription(&input).unwrap_err();
        assert_eq!((e.offset, &e.reason), (offset, &reason), "{input:?}: {e}");
        assert_eq!(e.kind, Kind::Subscription);
        // The message names the field and the offset.
        assert!(e.to_string().contains(&format!("at byte {offset}")), "{e}");
    }
}

#[test]
fn hostile_assignments() {
    // A billion topics in six bytes.
    let e = decode_assignment(&bytes(&[&[0, 3], &0x3fff_ffffi32.to_be_bytes()])).unwrap_err();
    assert!(matches!(e.reason, Reason::CountTooLarge { .. }), "{e}");
    // A null (-1) topic array is not allowed.
    let e = decode_assignment(&bytes(&[&[0, 0], &(-1i32).to_be_bytes(), &[0xff; 4]])).unwrap_err();
    assert!(
        matches!(e.reason, Reason::NegativeLength { len: -1, .. }),
        "{e}"
    );
    // A null topic name.
    let e = decode_assignment(&bytes(&[
        &[0, 0],
        &1i32.to_be_bytes(),
        &(-1i16).to_be_bytes(),
        &0i32.to_be_bytes(),
        &[0xff; 4],
    ]))
    .unwrap_err();
    assert!(matches!(e.reason, Reason::NegativeLength { .. }), "{e}");
    // The converted violation keeps the message.
    let v: ProtocolViolation = e.clone().into();
    assert_eq!(v.to_string(), e.to_string());
}

#[test]
fn pseudo_random_bytes_never_panic() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let seeds: Vec<Bytes> = subscriptions()
        .iter()
        .map(|s| encode_subscription(s).unwrap())
        .chain(assignments().iter().map(|a| encode_assignment(a).unwrap()))
        .collect();
    for i in 0..20_000 {
        let seed = &seeds[i % seeds.len()];
        let mut b = seed.to_vec();
        for _ in 0..1 + next() % 4 {
            if b.is_empty() {
                break;
            }
            let at = (next() as usize) % b.len();
            b[at] = next() as u8;
        }
        let b = Bytes::from(b);
        if let Ok(s) = decode_subscription(&b) {
            let again = decode_subscription(&encode_subscription(&s).unwrap()).unwrap();
            assert_eq!(again, at_version(&s, 3));
        }
        if let Ok(a) = decode_assignment(&b) {
            let again = decode_assignment(&encode_assignment(&a).unwrap()).unwrap();
            assert_eq!(again.partitions.len(), a.partitions.len());
        }
    }
}

#[test]
fn overlong_strings_are_encode_errors() {
    let s = Subscription::new(["x".repeat(40_000)]);
    let e = encode_subscription(&s).unwrap_err();
    assert!(
        matches!(
            e.reason,
            Reason::TooLong {
                field: "topics",
                len: 40_000
            }
        ),
        "{e}"
    );
    let a = MemberAssignment::new(vec![tp(&"y".repeat(32_768), 0)]);
    assert!(encode_assignment(&a).is_err());
    // 32767 bytes is the longest that fits.
    let s = Subscription::new(["z".repeat(32_767)]);
    let back = decode_subscription(&encode_subscription(&s).unwrap()).unwrap();
    assert_eq!(back.topics, s.topics);
}
