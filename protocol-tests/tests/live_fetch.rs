//! The fetch path against a real Apache Kafka broker started by the harness.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kafka_source::{Consumer, Error, OffsetReset, StartPosition, TopicPartition};
use protocol_tests::consume::{config, drain, partitions, unique};
use protocol_tests::{Cluster, Compression, ProduceSpec};

/// 1,000,000 records of 100 B over 3 partitions, produced by the Java producer with `codec`:
/// every record consumed once, offsets contiguous per partition, checksum equal.
async fn million(codec: Compression) {
    let cluster = Cluster::shared();
    let _logs = cluster.dump_logs_on_panic();
    let topic = unique(&format!("million-{}", codec.as_str()));
    cluster.create_topic(&topic, 3, 1, &[]);
    let spec = ProduceSpec {
        topic: &topic,
        partitions: 3,
        count: 1_000_000,
        value_size: 100,
        compression: codec,
        ..ProduceSpec::default()
    };
    let produced = cluster.produce(&spec);
    assert_eq!(produced.produced, 1_000_000);
    assert_eq!(produced.checksum, spec.expected_checksum());

    let cfg = config(&cluster.bootstrap()).build().unwrap();
    let mut consumer = Consumer::new(cfg).unwrap();
    consumer.assign(
        partitions(&topic, 3)
            .into_iter()
            .map(|tp| (tp, StartPosition::Earliest)),
    );
    let got = drain(&mut consumer, 1_000_000, Duration::from_secs(240)).await;
    assert_eq!(got.count, 1_000_000);
    assert_eq!(got.checksum, produced.checksum, "content differs");
    got.assert_contiguous_from(&BTreeMap::new());
    let per_partition: Vec<usize> = got.offsets.values().map(Vec::len).collect();
    assert_eq!(per_partition, vec![333_334, 333_333, 333_333]);
    // Nothing more arrives: no record was handed out twice.
    let extra = tokio::time::timeout(Duration::from_millis(1500), consumer.poll()).await;
    assert!(extra.is_err(), "unexpected extra data: {extra:?}");
    consumer.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn million_records_uncompressed() {
    million(Compression::None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn million_records_gzip() {
    million(Compression::Gzip).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn million_records_snappy() {
    million(Compression::Snappy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn million_records_lz4() {
    million(Compression::Lz4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn million_records_zstd() {
    million(Compression::Zstd).await;
}

/// Each start position starts exactly where it should.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_positions() {
    let cluster = Cluster::shared();
    let _logs = cluster.dump_logs_on_panic();
    let topic = unique("start");
    cluster.create_topic(&topic, 1, 1, &[]);
    // Record i has timestamp base + i seconds; base is a day ago (brokers reject far futures).
    let base = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        - 86_400_000;
    let spec = ProduceSpec {
        topic: &topic,
        partitions: 1,
        count: 100,
        value_size: 10,
        timestamps: Some((base, 1000)),
        ..ProduceSpec::default()
    };
    cluster.produce(&spec);
    let tp = TopicPartition::new(topic.as_str(), 0);
    let cfg = config(&cluster.bootstrap()).build().unwrap();

    let first = |start: StartPosition| {
        let cfg = cfg.clone();
        let tp = tp.clone();
        async move {
            let mut c = Consumer::new(cfg).unwrap();
            c.assign([(tp.clone(), start)]);
            let pos = c.position(&tp).await.unwrap();
            let batch = tokio::time::timeout(Duration::from_secs(1), c.poll()).await;
            let first = batch
                .ok()
                .map(|b| b.unwrap().records.first().unwrap().offset);
            c.close().await;
            (pos, first)
        }
    };
    assert_eq!(first(StartPosition::Earliest).await, (0, Some(0)));
    assert_eq!(first(StartPosition::Offset(42)).await, (42, Some(42)));
    // The first record at or after base + 50.5 s is record 51.
    assert_eq!(
        first(StartPosition::Timestamp(base + 50_500)).await,
        (51, Some(51))
    );
    assert_eq!(first(StartPosition::Timestamp(base)).await, (0, Some(0)));
    // After every record: the log end, and nothing to read.
    assert_eq!(
        first(StartPosition::Timestamp(base + 10_000_000)).await,
        (100, None)
    );
    assert_eq!(first(StartPosition::Latest).await, (100, None));

    // Latest sees exactly the records produced after it was resolved.
    let mut c = Consumer::new(cfg.clone()).unwrap();
    c.assign([(tp.clone(), StartPosition::Latest)]);
    assert_eq!(c.position(&tp).await.unwrap(), 100);
    cluster.produce(&ProduceSpec {
        count: 5,
        ..spec.clone()
    });
    let got = drain(&mut c, 5, Duration::from_secs(30)).await;
    assert_eq!(got.offsets[&tp], vec![100, 101, 102, 103, 104]);
    c.close().await;
}

/// An out-of-range offset is a typed error by default, and resets when configured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_offsets() {
    let cluster = Cluster::shared();
    let _logs = cluster.dump_logs_on_panic();
    let topic = unique("oor");
    cluster.create_topic(&topic, 1, 1, &[]);
    cluster.produce(&ProduceSpec {
        topic: &topic,
        partitions: 1,
        count: 10,
        value_size: 10,
        ..ProduceSpec::default()
    });
    let tp = TopicPartition::new(topic.as_str(), 0);

    // Default policy: error.
    let cfg = config(&cluster.bootstrap()).build().unwrap();
    assert_eq!(cfg.auto_offset_reset(), OffsetReset::Error);
    let mut c = Consumer::new(cfg).unwrap();
    c.assign([(tp.clone(), StartPosition::Offset(1_000))]);
    match tokio::time::timeout(Duration::from_secs(30), c.poll()).await {
        Ok(Err(Error::OffsetOutOfRange {
            partition, offset, ..
        })) => {
            assert_eq!((partition, offset), (tp.clone(), 1_000));
        }
        other => panic!("expected OffsetOutOfRange, got {other:?}"),
    }
    // The partition stays stopped until a seek; a seek to a valid offset resumes it.
    c.seek(&tp, StartPosition::Offset(7)).unwrap();
    let got = drain(&mut c, 3, Duration::from_secs(30)).await;
    assert_eq!(got.offsets[&tp], vec![7, 8, 9]);
    c.close().await;

    // Reset to earliest.
    let cfg = config(&cluster.bootstrap())
        .auto_offset_reset(OffsetReset::Earliest)
        .build()
        .unwrap();
    let mut c = Consumer::new(cfg).unwrap();
    c.assign([(tp.clone(), StartPosition::Offset(1_000))]);
    let got = drain(&mut c, 10, Duration::from_secs(30)).await;
    assert_eq!(got.offsets[&tp], (0..10).collect::<Vec<i64>>());
    c.close().await;

    // Reset to latest: only what comes after.
    let cfg = config(&cluster.bootstrap())
        .auto_offset_reset(OffsetReset::Latest)
        .build()
        .unwrap();
    let mut c = Consumer::new(cfg).unwrap();
    c.assign([(tp.clone(), StartPosition::Offset(1_000))]);
    let early = tokio::time::timeout(Duration::from_secs(2), c.poll()).await;
    assert!(
        early.is_err(),
        "nothing should arrive before new records: {early:?}"
    );
    cluster.produce(&ProduceSpec {
        topic: &topic,
        partitions: 1,
        count: 2,
        value_size: 10,
        ..ProduceSpec::default()
    });
    let got = drain(&mut c, 2, Duration::from_secs(30)).await;
    assert_eq!(got.offsets[&tp], vec![10, 11]);
    c.close().await;
}

/// Start-up against one broker takes two connections, not three: once metadata names the node
/// at the bootstrap address, the bootstrap connection becomes its control connection, and the
/// spare opened to the same address beside it becomes its data connection. ListOffsets is sent
/// once, with the first Metadata request: on the spare once it has negotiated its versions (the
/// broker answers the two at once), and its answer is taken; only if Metadata is answered
/// before the spare is ready does it follow on the bootstrap connection. A recording proxy in
/// front of the broker counts the connections and sorts the requests and answers by
/// connection. Only each connection's own order is asserted: the proxy passes the two
/// connections' bytes in an order the client may see differently (a spare ready in the same
/// instant as the Metadata answer takes ListOffsets, which then passes the proxy after that
/// answer). ListOffsets on the spare shows it was sent ahead: one planned after the Metadata
/// answer goes to the node's control connection, the bootstrap one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_takes_over_the_bootstrap_connection_and_a_spare() {
    use kafka_protocol::messages::ApiKey;
    use protocol_tests::proxy::Passed::{Request, Response};
    use protocol_tests::proxy::RecordingProxy;

    let Some(cluster) = single_broker("start_up_takes_over_the_bootstrap_connection_and_a_spare")
    else {
        return;
    };
    let _logs = cluster.dump_logs_on_panic();
    let topic = unique("start-up");
    cluster.create_topic(&topic, 1, 1, &[]);
    let spec = ProduceSpec {
        topic: &topic,
        partitions: 1,
        count: 1_000,
        value_size: 100,
        ..ProduceSpec::default()
    };
    let produced = cluster.produce(&spec);
    assert_eq!(produced.produced, 1_000);

    let proxy = RecordingProxy::start(&cluster.bootstrap()).await;
    let cfg = config(&proxy.addr()).build().unwrap();
    let mut consumer = Consumer::new(cfg).unwrap();
    consumer.assign([(
        TopicPartition::new(topic.as_str(), 0),
        StartPosition::Earliest,
    )]);
    let got = drain(&mut consumer, 1_000, Duration::from_secs(60)).await;
    assert_eq!(got.count, 1_000);
    assert_eq!(got.checksum, produced.checksum, "content differs");
    consumer.close().await;

    assert_eq!(proxy.connections(), 2, "connections opened");
    let on_control = proxy.passed_on(0);
    let on_data = proxy.passed_on(1);
    assert_passed(
        "control",
        &on_control,
        0,
        &[
            Request(ApiKey::ApiVersions),
            Response(ApiKey::ApiVersions),
            Request(ApiKey::Metadata),
            Response(ApiKey::Metadata),
        ],
    );
    let listed = |on: &[_]| {
        on.iter()
            .filter(|p| **p == Request(ApiKey::ListOffsets))
            .count()
    };
    assert_eq!(
        listed(&on_control) + listed(&on_data),
        1,
        "ListOffsets requests: control {on_control:?}, data {on_data:?}"
    );
    if listed(&on_data) == 1 {
        // On the spare: answered before the first Fetch goes out on it, and asked before the
        // Metadata answer came in on the other connection.
        assert_passed(
            "data",
            &on_data,
            0,
            &[
                Request(ApiKey::ApiVersions),
                Response(ApiKey::ApiVersions),
                Request(ApiKey::ListOffsets),
                Response(ApiKey::ListOffsets),
                Request(ApiKey::Fetch),
            ],
        );
    } else {
        println!("the spare was not ready before the Metadata answer: ListOffsets followed it");
        assert_passed(
            "control",
            &on_control,
            4,
            &[Request(ApiKey::ListOffsets), Response(ApiKey::ListOffsets)],
        );
    }
    assert!(
        !on_control.contains(&Request(ApiKey::Fetch)),
        "a Fetch on the control connection: {on_control:?}"
    );
}

/// A broker's partitions are fetched over `fetch.connections.per.broker` data connections, each
/// Fetch carrying at most its share of them, and every record still arrives once and in order.
/// Each data connection was opened beside the bootstrap connection, before metadata was in.
/// With one connection per broker, every Fetch carries every partition, as the Java client's
/// do. A recording proxy in front of the broker counts the connections and decodes each Fetch
/// response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_brokers_partitions_are_shared_out_over_its_data_connections() {
    use kafka_protocol::messages::{ApiKey, FetchResponse};
    use kafka_protocol::protocol::Decodable as _;
    use protocol_tests::proxy::Passed::{self, Request, Response};
    use protocol_tests::proxy::RecordingProxy;

    let Some(cluster) =
        single_broker("a_brokers_partitions_are_shared_out_over_its_data_connections")
    else {
        return;
    };
    let _logs = cluster.dump_logs_on_panic();
    let topic = unique("lanes");
    cluster.create_topic(&topic, 8, 1, &[]);
    let spec = ProduceSpec {
        topic: &topic,
        partitions: 8,
        count: 80_000,
        value_size: 100,
        ..ProduceSpec::default()
    };
    let produced = cluster.produce(&spec);
    assert_eq!(produced.produced, 80_000);

    for (connections, opened, most) in [(2u8, 3, 4), (1, 2, 8)] {
        let proxy = RecordingProxy::start(&cluster.bootstrap()).await;
        let cfg = config(&proxy.addr())
            .fetch_connections_per_broker(connections)
            // Small responses, so that each data connection carries many.
            .max_partition_fetch_bytes(64 << 10)
            .build()
            .unwrap();
        let mut consumer = Consumer::new(cfg).unwrap();
        consumer.assign(
            partitions(&topic, 8)
                .into_iter()
                .map(|tp| (tp, StartPosition::Earliest)),
        );
        let got = drain(&mut consumer, 80_000, Duration::from_secs(120)).await;
        assert_eq!(got.checksum, produced.checksum, "content differs");
        got.assert_contiguous_from(&BTreeMap::new());
        assert_eq!(got.offsets.len(), 8);
        consumer.close().await;

        assert_eq!(
            proxy.connections(),
            opened,
            "connections opened with {connections} per broker"
        );
        // Per connection: the partitions each Fetch response names.
        let recorded = proxy.recorded();
        let mut fetched: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for r in &recorded {
            if r.api == ApiKey::Fetch {
                let mut body = r.frame.slice(4..);
                kafka_protocol::messages::ResponseHeader::decode(
                    &mut body,
                    r.api.response_header_version(r.version),
                )
                .unwrap();
                let resp = FetchResponse::decode(&mut body, r.version).unwrap();
                let named = resp.responses.iter().map(|t| t.partitions.len()).sum();
                fetched.entry(r.connection).or_default().push(named);
            }
        }
        // ListOffsets goes on one connection: the first spare (the spares' connects race, so
        // the proxy may number it 1 or 2), or the bootstrap connection if Metadata was
        // answered before that spare was ready (see the start-up test above).
        let mut apis = apis_per_connection(&recorded);
        let listed_on: Vec<usize> = (0..apis.len())
            .filter(|&c| apis[c].contains(&ApiKey::ListOffsets))
            .collect();
        assert_eq!(
            listed_on.len(),
            1,
            "ListOffsets on connections {listed_on:?}: {apis:?}"
        );
        for on in &mut apis {
            on.retain(|a| *a != ApiKey::ListOffsets);
        }
        let control = vec![ApiKey::ApiVersions, ApiKey::Metadata];
        let data = vec![ApiKey::ApiVersions, ApiKey::Fetch];
        let mut expected = vec![control];
        expected.resize(opened, data);
        assert_eq!(
            apis, expected,
            "APIs per connection (ListOffsets aside), in the order the proxy accepted them"
        );
        assert_eq!(fetched.len(), opened - 1, "data connections: {fetched:?}");
        // Every data connection is a spare opened beside the bootstrap connection: its
        // ApiVersions went out before the first metadata was in.
        let passed = proxy.passed();
        let at = |what: (usize, Passed)| passed.iter().position(|p| *p == what);
        let metadata_in = at((0, Response(ApiKey::Metadata))).expect("metadata answered");
        for conn in 1..opened {
            let versions_out = at((conn, Request(ApiKey::ApiVersions))).expect("ApiVersions");
            assert!(
                versions_out < metadata_in,
                "connection {conn} opened after the metadata was in: {passed:?}"
            );
        }
        for (conn, named) in &fetched {
            assert!(
                named.len() >= 5,
                "connection {conn} carried only {} fetches",
                named.len()
            );
            assert!(
                named.iter().all(|&n| (1..=most).contains(&n)),
                "connection {conn}: partitions per Fetch {named:?}, at most {most} expected"
            );
        }
        if connections == 1 {
            assert!(fetched.values().flatten().all(|&n| n == 8), "{fetched:?}");
        }
    }
}

/// Asserts that `want` passed on the `name` connection (`on`, what passed on it in order),
/// starting at its `from`th request or response.
fn assert_passed(
    name: &str,
    on: &[protocol_tests::proxy::Passed],
    from: usize,
    want: &[protocol_tests::proxy::Passed],
) {
    assert_eq!(
        on.get(from..from + want.len()),
        Some(want),
        "what passed on the {name} connection: {on:?}"
    );
}

/// The APIs answered on each of the proxy's connections, in the order first seen, by
/// connection in the order the proxy accepted them.
fn apis_per_connection(
    recorded: &[protocol_tests::proxy::Recorded],
) -> Vec<Vec<kafka_protocol::messages::ApiKey>> {
    let mut apis: BTreeMap<usize, Vec<_>> = BTreeMap::new();
    for r in recorded {
        let on = apis.entry(r.connection).or_default();
        if !on.contains(&r.api) {
            on.push(r.api);
        }
    }
    apis.into_values().collect()
}

/// The shared cluster if it has a single broker, which the recording proxy can front; `None`
/// (with a line saying that `test` is skipped) otherwise.
fn single_broker(test: &str) -> Option<&'static Cluster> {
    let cluster = Cluster::shared();
    let nodes = cluster.node_ids().len();
    if nodes != 1 {
        println!(
            "skipping {test}: the recording proxy fronts a single broker, and this cluster has {nodes}"
        );
        return None;
    }
    Some(cluster)
}
