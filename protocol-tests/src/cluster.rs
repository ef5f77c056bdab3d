//! Real Apache Kafka brokers for live tests: a single combined broker/controller, a three-node
//! cluster for failover tests, or an external cluster named by `KAFKA_BOOTSTRAP`.
//!
//! Every broker is a `kafka.Kafka` JVM run from the Maven jars (see [`kafka_libs`]), with a KRaft
//! static quorum, loopback-only listeners on free ports, and its data under
//! `<target>/kafka-test/<pid>-<n>-<nodes>node/`. Broker output goes to `node<i>.log` there.
//!
//! Processes are SIGKILLed when the [`Cluster`] is dropped, also while a test panics. Because a
//! `static` (see [`Cluster::shared`]) is never dropped, each broker JVM also gets a small `sh`
//! watchdog that SIGKILLs it within about a second once the test process is gone.
//!
//! ```no_run
//! use protocol_tests::cluster::{Cluster, Compression, ProduceSpec};
//!
//! let cluster = Cluster::shared();
//! let _logs = cluster.dump_logs_on_panic();
//! cluster.create_topic("orders", 3, 1, &[]);
//! let sent = cluster.produce(&ProduceSpec {
//!     topic: "orders",
//!     partitions: 3,
//!     count: 1000,
//!     compression: Compression::Lz4,
//!     ..ProduceSpec::default()
//! });
//! assert_eq!(cluster.end_offsets("orders").values().sum::<i64>(), 1000);
//! # let _ = sent;
//! ```
//!
//! Tests that kill, pause or restart nodes cannot run against an external cluster; they start with
//! `if cluster.skip_without_node_control("test name") { return; }` (or, for tests that would
//! start their own three-node cluster, `if Cluster::skip_when_external("test name") { return; }`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::{self, File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::Write as _;
use std::net::TcpListener;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

pub use crate::java::{kafka_libs, target_dir, test_root};
pub use crate::tools::{Compression, PartitionInfo, ProduceResult, ProduceSpec};

use crate::java::{JavaRun, archive_path, broker_log4j, libs_classpath};
use crate::lock::{DirLock, pid_alive};
use crate::probe::metadata_brokers;

/// How long a cluster (or a restarted node) may take to serve Metadata with all its brokers.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long `stop` waits for a controlled shutdown before it SIGKILLs.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// Data folders of dead test processes are removed once they are this old.
const STALE_DATA_AGE: Duration = Duration::from_secs(3600);

/// JVM options shared by all broker JVMs (from `kafka-run-class.sh`, plus exit on OOM).
const BROKER_JVM_OPTS: &[&str] = &[
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
];

/// The watchdog: poll the test process ($1) every second; if it is gone while the broker ($2) is
/// still there, SIGKILL the broker. It exits by itself once the broker is gone.
const WATCHDOG_SCRIPT: &str = r#"while kill -0 "$1" 2>/dev/null; do kill -0 "$2" 2>/dev/null || exit 0; sleep 1; done; kill -9 "$2" 2>/dev/null; exit 0"#;

/// A Kafka cluster for tests: started by the harness (and killed when dropped), or external.
#[derive(Debug)]
pub struct Cluster {
    bootstrap: String,
    external: bool,
    nodes: Vec<Node>,
    dir: Option<PathBuf>,
    cluster_id: Option<String>,
    ready_in: Option<Duration>,
}

#[derive(Debug)]
struct Node {
    id: i32,
    port: u16,
    controller_port: u16,
    dir: PathBuf,
    config: PathBuf,
    log: PathBuf,
    jvm_opts: Vec<String>,
    process: Mutex<Option<Running>>,
}

#[derive(Debug)]
struct Running {
    java: Child,
    watchdog: Option<Child>,
}

impl Node {
    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn process(&self) -> MutexGuard<'_, Option<Running>> {
        self.process.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The JVM's process id while it runs.
    fn pid(&self) -> Option<u32> {
        self.process().as_ref().map(|run| run.java.id())
    }
}

/// Which cluster shape to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Single,
    Three,
}

impl Cluster {
    /// The external cluster named by `KAFKA_BOOTSTRAP` (`host:port[,host:port]`), if set.
    pub fn external_bootstrap() -> Option<String> {
        std::env::var("KAFKA_BOOTSTRAP")
            .ok()
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    /// Prints a skip line and returns true when `KAFKA_BOOTSTRAP` is set, for tests that start
    /// their own cluster shape (e.g. [`Cluster::three_nodes`]) and make no sense against an
    /// external one.
    pub fn skip_when_external(test: &str) -> bool {
        match Cluster::external_bootstrap() {
            Some(b) => {
                println!(
                    "skipping {test}: it needs its own brokers and KAFKA_BOOTSTRAP={b} is set"
                );
                true
            }
            None => false,
        }
    }

    /// A single-node cluster shared by all tests of this test binary, started on first use.
    ///
    /// With `KAFKA_BOOTSTRAP` set, this is the external cluster instead.
    ///
    /// # Panics
    ///
    /// If the broker does not start; later calls panic with the same message without retrying.
    pub fn shared() -> &'static Cluster {
        static SHARED: OnceLock<Result<Cluster, String>> = OnceLock::new();
        let result = SHARED.get_or_init(|| {
            catch_unwind(AssertUnwindSafe(Cluster::single)).map_err(|payload| {
                payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "unknown panic".to_string())
            })
        });
        match result {
            Ok(cluster) => cluster,
            Err(e) => panic!("the shared Kafka cluster failed to start: {e}"),
        }
    }

    /// A fresh single-node cluster (one combined broker/controller), or the external cluster if
    /// `KAFKA_BOOTSTRAP` is set.
    ///
    /// # Panics
    ///
    /// If the broker does not serve Metadata within 120 s; the message holds its log.
    pub fn single() -> Cluster {
        match Cluster::external_bootstrap() {
            Some(bootstrap) => Cluster::external(bootstrap),
            None => Cluster::start(Shape::Single, &[]).unwrap_or_else(|e| panic!("{e}")),
        }
    }

    /// A fresh single-node cluster like [`Cluster::single`], with `properties` appended to the
    /// broker's `server.properties` (a later line overrides an earlier one), for example
    /// `("group.coordinator.append.linger.ms", "0")` for a latency benchmark. With
    /// `KAFKA_BOOTSTRAP` set, this is the external cluster and `properties` are not applied.
    ///
    /// # Panics
    ///
    /// If the broker does not serve Metadata within 120 s; the message holds its log.
    pub fn single_with_properties(properties: &[(&str, &str)]) -> Cluster {
        match Cluster::external_bootstrap() {
            Some(bootstrap) => Cluster::external(bootstrap),
            None => Cluster::start(Shape::Single, properties).unwrap_or_else(|e| panic!("{e}")),
        }
    }

    /// A fresh three-node cluster (three combined broker/controller nodes, replication factor 3
    /// and `min.insync.replicas=2` by default, fast broker fencing). Always started by the
    /// harness, also when `KAFKA_BOOTSTRAP` is set (see [`Cluster::skip_when_external`]).
    ///
    /// # Panics
    ///
    /// If the nodes do not all serve Metadata listing all three brokers within 120 s.
    pub fn three_nodes() -> Cluster {
        Cluster::start(Shape::Three, &[]).unwrap_or_else(|e| panic!("{e}"))
    }

    fn external(bootstrap: String) -> Cluster {
        Cluster {
            bootstrap,
            external: true,
            nodes: Vec::new(),
            dir: None,
            cluster_id: None,
            ready_in: None,
        }
    }

    fn start(shape: Shape, properties: &[(&str, &str)]) -> Result<Cluster, String> {
        // One cluster boots at a time per test process: JVM start-up is CPU-bound, and on a small
        // machine parallel boots take longer in total than one after the other.
        static BOOTING: Mutex<()> = Mutex::new(());
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let _booting = BOOTING.lock().unwrap_or_else(|p| p.into_inner());
        let started = Instant::now();
        let libs = kafka_libs();
        let mut jvm_opts = Vec::new();
        if let Some(archive) = broker_class_data() {
            jvm_opts.push(format!("-XX:SharedArchiveFile={}", archive.display()));
        }
        let tag = SEQ.fetch_add(1, Ordering::Relaxed).to_string();
        let mut cluster = Cluster::prepare(shape, &tag, &jvm_opts, properties)?;
        let formatted_in = started.elapsed();
        for node in &cluster.nodes {
            if let Err(e) = spawn_node(node) {
                return Err(cluster.fail(e));
            }
        }
        if let Err(e) = cluster.wait_ready(READY_TIMEOUT) {
            return Err(cluster.fail(e));
        }
        let took = started.elapsed();
        cluster.ready_in = Some(took);
        eprintln!(
            "[protocol-tests] Kafka {}-node cluster ready in {:.1} s (formatted after {:.1} s) at {} (jars: {}, data: {})",
            cluster.nodes.len(),
            took.as_secs_f64(),
            formatted_in.as_secs_f64(),
            cluster.bootstrap,
            libs.display(),
            cluster.dir.as_deref().unwrap_or(Path::new("?")).display()
        );
        Ok(cluster)
    }

    /// Creates the data folder `<target>/kafka-test/<pid>-<tag>-<n>node`, writes each node's
    /// `server.properties` (with `properties` appended) and formats its storage. Nothing runs yet.
    fn prepare(
        shape: Shape,
        tag: &str,
        extra_jvm_opts: &[String],
        properties: &[(&str, &str)],
    ) -> Result<Cluster, String> {
        let root = test_root();
        fs::create_dir_all(&root).map_err(|e| format!("cannot create {}: {e}", root.display()))?;
        remove_stale_data(&root);
        let count = match shape {
            Shape::Single => 1,
            Shape::Three => 3,
        };
        let dir = root.join(format!("{}-{tag}-{count}node", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;

        let ports = free_ports(2 * count)?;
        let cluster_id = random_cluster_id();
        let voters = (0..count)
            .map(|i| format!("{}@127.0.0.1:{}", i + 1, ports[2 * i + 1]))
            .collect::<Vec<_>>()
            .join(",");
        let heap: &[&str] = match shape {
            Shape::Single => &["-Xms256m", "-Xmx512m"],
            Shape::Three => &["-Xms192m", "-Xmx384m"],
        };
        let mut nodes = Vec::with_capacity(count);
        for i in 0..count {
            let id = i as i32 + 1;
            let node_dir = dir.join(format!("node{id}"));
            fs::create_dir_all(&node_dir)
                .map_err(|e| format!("cannot create {}: {e}", node_dir.display()))?;
            let node = Node {
                id,
                port: ports[2 * i],
                controller_port: ports[2 * i + 1],
                config: node_dir.join("server.properties"),
                log: dir.join(format!("node{id}.log")),
                dir: node_dir,
                jvm_opts: heap
                    .iter()
                    .chain(BROKER_JVM_OPTS)
                    .map(|s| s.to_string())
                    .chain(extra_jvm_opts.iter().cloned())
                    .collect(),
                process: Mutex::new(None),
            };
            let mut props = server_properties(shape, &node, &voters);
            for (key, value) in properties {
                let _ = writeln!(props, "{key}={value}");
            }
            fs::write(&node.config, props)
                .map_err(|e| format!("cannot write {}: {e}", node.config.display()))?;
            nodes.push(node);
        }

        // Format all nodes at once: each is a JVM start of a second or two.
        let formatted: Vec<Result<(), String>> = thread::scope(|s| {
            let handles: Vec<_> = nodes
                .iter()
                .map(|node| {
                    let cid = cluster_id.clone();
                    s.spawn(move || {
                        let mut run = JavaRun::new(
                            "kafka.tools.StorageTool",
                            vec![
                                "format".into(),
                                "-t".into(),
                                cid,
                                "-c".into(),
                                node.config.display().to_string(),
                            ],
                        );
                        run.timeout = Duration::from_secs(120);
                        run.may_dump_class_data = false;
                        let out = run.run();
                        if out.success() {
                            Ok(())
                        } else {
                            Err(format!(
                                "formatting node {} failed ({:?}):\n{}\n{}",
                                node.id, out.status, out.stdout, out.stderr
                            ))
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("format thread panicked".into()))
                })
                .collect()
        });
        formatted.into_iter().collect::<Result<Vec<()>, String>>()?;

        Ok(Cluster {
            bootstrap: nodes.iter().map(Node::addr).collect::<Vec<_>>().join(","),
            external: false,
            nodes,
            dir: Some(dir),
            cluster_id: Some(cluster_id),
            ready_in: None,
        })
    }

    /// Kills the processes and turns `why` into an error message that carries the logs.
    fn fail(mut self, why: String) -> String {
        let logs = self.logs_tail(60);
        // Keep the data folder for inspection: without `dir`, Drop only kills the processes.
        let dir = self.dir.take();
        drop(self);
        format!(
            "Kafka cluster did not start: {why}\n(data and logs kept in {})\n{logs}",
            dir.as_deref().unwrap_or(Path::new("?")).display()
        )
    }

    /// Polls Metadata on every running node until each lists every running node's id.
    fn wait_ready(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let mut last = String::from("no probe yet");
        loop {
            let mut running = Vec::new();
            for node in &self.nodes {
                let mut guard = node.process();
                if let Some(run) = guard.as_mut() {
                    match run.java.try_wait() {
                        Ok(Some(status)) => {
                            return Err(format!(
                                "node {} exited during start-up: {status}",
                                node.id
                            ));
                        }
                        Ok(None) => running.push(node),
                        Err(e) => return Err(format!("cannot watch node {}: {e}", node.id)),
                    }
                }
            }
            let want: Vec<i32> = running.iter().map(|n| n.id).collect();
            let mut all = true;
            for node in &running {
                match metadata_brokers(&node.addr(), Duration::from_secs(2)) {
                    Ok(brokers) => {
                        let have: Vec<i32> = brokers.iter().map(|b| b.node_id).collect();
                        if !want.iter().all(|id| have.contains(id)) {
                            last =
                                format!("node {} lists brokers {have:?}, want {want:?}", node.id);
                            all = false;
                            break;
                        }
                    }
                    Err(e) => {
                        last = format!("node {} at {}: {e}", node.id, node.addr());
                        all = false;
                        break;
                    }
                }
            }
            if all {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("not ready after {timeout:?}; last check: {last}"));
            }
            thread::sleep(Duration::from_millis(250));
        }
    }

    /// `127.0.0.1:p1,127.0.0.1:p2,...`, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        self.bootstrap.clone()
    }

    /// True for a cluster named by `KAFKA_BOOTSTRAP`: nothing was started, and node control
    /// (`kill`, `stop`, `pause`, `resume`, `restart`) panics.
    pub fn is_external(&self) -> bool {
        self.external
    }

    /// Prints a skip line and returns true if this cluster is external, for tests that need
    /// node control: `if cluster.skip_without_node_control("my_test") { return; }`.
    pub fn skip_without_node_control(&self, test: &str) -> bool {
        if self.external {
            println!(
                "skipping {test}: it kills or restarts brokers, which needs a cluster started by the harness (KAFKA_BOOTSTRAP={})",
                self.bootstrap
            );
        }
        self.external
    }

    /// The broker ids: configured ones (1, 2, 3) for own clusters, those in Metadata for an
    /// external one.
    pub fn node_ids(&self) -> Vec<i32> {
        if self.external {
            self.brokers().into_keys().collect()
        } else {
            self.nodes.iter().map(|n| n.id).collect()
        }
    }

    /// `host:port` of broker `id`.
    ///
    /// # Panics
    ///
    /// If there is no such broker.
    pub fn node_addr(&self, id: i32) -> String {
        if self.external {
            self.brokers()
                .remove(&id)
                .unwrap_or_else(|| panic!("no broker {id} in the external cluster's Metadata"))
        } else {
            self.own_node(id, "node_addr").addr()
        }
    }

    /// Brokers currently listed in Metadata (id to `host:port`), asked of the first bootstrap
    /// address that answers.
    ///
    /// # Panics
    ///
    /// If no bootstrap address answers.
    pub fn brokers(&self) -> BTreeMap<i32, String> {
        let mut errors = Vec::new();
        for addr in self.bootstrap.split(',') {
            match metadata_brokers(addr.trim(), Duration::from_secs(5)) {
                Ok(list) => {
                    return list
                        .into_iter()
                        .map(|b| (b.node_id, format!("{}:{}", b.host, b.port)))
                        .collect();
                }
                Err(e) => errors.push(format!("{addr}: {e}")),
            }
        }
        panic!("no broker answered Metadata: {}", errors.join("; "))
    }

    /// The folder with the nodes' data, configuration and logs (own clusters only).
    pub fn data_dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The KRaft cluster id the nodes were formatted with (own clusters only).
    pub fn cluster_id(&self) -> Option<&str> {
        self.cluster_id.as_deref()
    }

    /// How long start-up took, from resolving jars to all nodes serving Metadata.
    pub fn ready_in(&self) -> Option<Duration> {
        self.ready_in
    }

    /// Whether node `id` has a running process (a paused one counts as running).
    pub fn is_running(&self, id: i32) -> bool {
        let node = self.own_node(id, "is_running");
        let mut guard = node.process();
        match guard.as_mut() {
            Some(run) => matches!(run.java.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The last `lines` lines of each node's log, each under a header line.
    pub fn logs_tail(&self, lines: usize) -> String {
        let mut out = String::new();
        for node in &self.nodes {
            let _ = writeln!(
                out,
                "===== node {} log ({}), last {lines} lines =====",
                node.id,
                node.log.display()
            );
            match fs::read(&node.log) {
                Ok(bytes) => {
                    let text = String::from_utf8_lossy(&bytes);
                    let all: Vec<&str> = text.lines().collect();
                    for line in &all[all.len().saturating_sub(lines)..] {
                        out.push_str(line);
                        out.push('\n');
                    }
                }
                Err(e) => {
                    let _ = writeln!(out, "(cannot read: {e})");
                }
            }
        }
        out
    }

    /// A guard that prints the nodes' log tails if the current thread panics while it is alive.
    /// Useful with [`Cluster::shared`], which is never dropped:
    /// `let _logs = cluster.dump_logs_on_panic();`.
    pub fn dump_logs_on_panic(&self) -> LogsOnPanic<'_> {
        LogsOnPanic { cluster: self }
    }

    fn own_node(&self, id: i32, what: &str) -> &Node {
        if self.external {
            panic!(
                "Cluster::{what} needs a cluster started by the test harness, but this one is external \
                 (KAFKA_BOOTSTRAP={}); skip the test with `cluster.skip_without_node_control(..)`",
                self.bootstrap
            );
        }
        self.node(id).unwrap_or_else(|| {
            panic!(
                "Cluster::{what}: no node {id} (nodes are {:?})",
                self.node_ids()
            )
        })
    }

    /// SIGKILLs node `id` (a crash) and waits for the process to end. No-op if it is not running.
    pub fn kill(&self, id: i32) {
        let node = self.own_node(id, "kill");
        if let Some(run) = node.process().take() {
            kill_running(run);
        }
    }

    /// Stops node `id` with SIGTERM (controlled shutdown) and waits for it to exit; SIGKILLs it
    /// if it has not exited after 60 s. No-op if it is not running.
    pub fn stop(&self, id: i32) {
        self.stop_node(id);
    }

    /// [`Cluster::stop`]; true if the node exited by itself (not SIGKILLed, not already gone).
    fn stop_node(&self, id: i32) -> bool {
        let node = self.own_node(id, "stop");
        let Some(mut run) = node.process().take() else {
            return false;
        };
        stop_watchdog(&mut run);
        let pid = run.java.id().to_string();
        signal("TERM", &pid);
        // A paused process only acts on SIGTERM once continued.
        signal("CONT", &pid);
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            match run.java.try_wait() {
                Ok(Some(_)) => return true,
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(50)),
                _ => {
                    eprintln!(
                        "[protocol-tests] node {id} ignored SIGTERM for {STOP_TIMEOUT:?}; killing it"
                    );
                    kill_running(run);
                    return false;
                }
            }
        }
    }

    /// Freezes node `id` with SIGSTOP: its sockets stay open but it answers nothing.
    ///
    /// # Panics
    ///
    /// If the node is not running.
    pub fn pause(&self, id: i32) {
        signal("STOP", &self.running_pid(id, "pause").to_string());
    }

    /// Continues a paused node `id` with SIGCONT.
    ///
    /// # Panics
    ///
    /// If the node is not running.
    pub fn resume(&self, id: i32) {
        signal("CONT", &self.running_pid(id, "resume").to_string());
    }

    /// The process id of node `id`'s JVM while this harness runs it; `None` for an external
    /// cluster or a node that is not running.
    pub fn pid(&self, id: i32) -> Option<u32> {
        self.node(id)?.pid()
    }

    fn running_pid(&self, id: i32, what: &str) -> u32 {
        self.own_node(id, what)
            .pid()
            .unwrap_or_else(|| panic!("Cluster::{what}: node {id} is not running"))
    }

    /// The node with this id among those the harness started.
    fn node(&self, id: i32) -> Option<&Node> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// Starts node `id` again with the same configuration and data (no reformat), stopping it
    /// first (SIGTERM) if it is running, and waits until every running node lists it in Metadata.
    ///
    /// # Panics
    ///
    /// If it is not back within 120 s; the message holds the logs.
    pub fn restart(&self, id: i32) {
        let node = self.own_node(id, "restart");
        self.stop(id);
        let started = Instant::now();
        if let Err(e) = spawn_node(node) {
            panic!("restarting node {id}: {e}");
        }
        if let Err(e) = self.wait_ready(READY_TIMEOUT) {
            panic!("node {id} did not come back: {e}\n{}", self.logs_tail(60));
        }
        eprintln!(
            "[protocol-tests] node {id} back in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }

    fn kill_all(&self) {
        for node in &self.nodes {
            if let Some(run) = node.process().take() {
                kill_running(run);
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.external {
            return;
        }
        let panicking = thread::panicking();
        if panicking {
            eprintln!(
                "[protocol-tests] test panicked; Kafka logs follow (kept in {})\n{}",
                self.dir.as_deref().unwrap_or(Path::new("?")).display(),
                self.logs_tail(60)
            );
        }
        self.kill_all();
        let keep = std::env::var_os("KAFKA_TEST_KEEP_DATA").is_some_and(|v| !v.is_empty());
        if let Some(dir) = self.dir.as_ref().filter(|_| !panicking && !keep) {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

/// Prints the cluster's log tails when dropped during a panic; see
/// [`Cluster::dump_logs_on_panic`].
#[derive(Debug)]
#[must_use = "the logs are printed when the guard is dropped during a panic"]
pub struct LogsOnPanic<'a> {
    cluster: &'a Cluster,
}

impl Drop for LogsOnPanic<'_> {
    fn drop(&mut self) {
        if thread::panicking() && !self.cluster.external {
            eprintln!(
                "[protocol-tests] test panicked; Kafka logs follow\n{}",
                self.cluster.logs_tail(60)
            );
        }
    }
}

/// The brokers' class-data (CDS) archive, made once per jar set and `java`: a single node is booted
/// with `-XX:ArchiveClassesAtExit` and stopped with SIGTERM, and the JVM writes the classes it
/// loaded as it exits. Mapping the archive cuts the CPU a broker needs to start by about 40%
/// (measured on 2 cores: about 8-9 s of CPU down to about 5 s). This costs one extra boot, the
/// first time only; a test process that finds another one making the archive boots without it.
/// `KAFKA_TEST_NO_CDS=1` turns it off.
fn broker_class_data() -> Option<PathBuf> {
    static TRIED: AtomicBool = AtomicBool::new(false);
    let path = archive_path("kafka.Kafka broker")?;
    if path.exists() {
        return Some(path);
    }
    if TRIED.swap(true, Ordering::SeqCst) {
        return None;
    }
    let _lock = DirLock::try_acquire(&path.with_extension("lock"))?;
    if path.exists() {
        return Some(path);
    }
    let started = Instant::now();
    let tmp = path.with_extension(format!("jsa.tmp-{}", std::process::id()));
    let made = (|| -> Result<bool, String> {
        let cluster = Cluster::prepare(
            Shape::Single,
            "cds",
            &[format!("-XX:ArchiveClassesAtExit={}", tmp.display())],
            &[],
        )?;
        for node in &cluster.nodes {
            spawn_node(node)?;
        }
        cluster.wait_ready(READY_TIMEOUT)?;
        // SIGTERM: the JVM writes the archive while it exits.
        Ok(cluster.stop_node(1))
    })();
    match made {
        Ok(true) if tmp.exists() && fs::rename(&tmp, &path).is_ok() => {
            eprintln!(
                "[protocol-tests] made the broker class-data archive {} in {:.1} s (first run only)",
                path.display(),
                started.elapsed().as_secs_f64()
            );
            Some(path)
        }
        other => {
            let _ = fs::remove_file(&tmp);
            eprintln!(
                "[protocol-tests] could not make the broker class-data archive ({other:?}); brokers start without it"
            );
            None
        }
    }
}

/// Starts the node's JVM (output appended to its log) and its watchdog.
fn spawn_node(node: &Node) -> Result<(), String> {
    let mut log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&node.log)
        .map_err(|e| format!("cannot open {}: {e}", node.log.display()))?;
    let _ = writeln!(
        log,
        "===== protocol-tests: starting node {} at {:?} =====",
        node.id,
        SystemTime::now()
    );
    let stderr: File = log
        .try_clone()
        .map_err(|e| format!("cannot clone log handle: {e}"))?;
    let java = Command::new("java")
        .args(&node.jvm_opts)
        .arg(format!(
            "-Dlog4j2.configurationFile={}",
            broker_log4j().display()
        ))
        .arg(format!("-Dkafka.logs.dir={}", node.dir.display()))
        .arg("-cp")
        .arg(libs_classpath())
        .arg("kafka.Kafka")
        .arg(&node.config)
        .current_dir(&node.dir)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(stderr)
        .spawn()
        .map_err(|e| format!("cannot start java for node {}: {e}", node.id))?;
    let watchdog = Command::new("sh")
        .arg("-c")
        .arg(WATCHDOG_SCRIPT)
        .arg("kafka-watchdog")
        .arg(std::process::id().to_string())
        .arg(java.id().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let watchdog = match watchdog {
        Ok(w) => Some(w),
        Err(e) => {
            let mut java = java;
            let _ = java.kill();
            let _ = java.wait();
            return Err(format!("cannot start the watchdog shell: {e}"));
        }
    };
    *node.process() = Some(Running { java, watchdog });
    Ok(())
}

/// The watchdog goes first, so it cannot act on a PID that was already reaped.
fn stop_watchdog(run: &mut Running) {
    if let Some(mut w) = run.watchdog.take() {
        let _ = w.kill();
        let _ = w.wait();
    }
}

fn kill_running(mut run: Running) {
    stop_watchdog(&mut run);
    let _ = run.java.kill();
    let _ = run.java.wait();
}

fn signal(name: &str, pid: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid)
        .stdin(Stdio::null())
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("kill -{name} {pid} failed: {s}"),
        Err(e) => panic!("cannot run kill -{name} {pid}: {e}"),
    }
}

/// Allocates `n` distinct free loopback ports (all bound at once, then released).
fn free_ports(n: usize) -> Result<Vec<u16>, String> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("cannot bind a loopback port: {e}"))?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("cannot read a bound port: {e}"))
}

/// 16 random bytes, base64url without padding, as `StorageTool random-uuid` would print.
fn random_cluster_id() -> String {
    static SALT: AtomicU32 = AtomicU32::new(0);
    loop {
        let mut bytes = [0u8; 16];
        for (k, chunk) in bytes.chunks_mut(8).enumerate() {
            let mut h = std::hash::RandomState::new().build_hasher();
            h.write_u128(
                SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0),
            );
            h.write_u32(std::process::id());
            h.write_u32(SALT.fetch_add(1, Ordering::Relaxed));
            h.write_usize(k);
            chunk.copy_from_slice(&h.finish().to_be_bytes());
        }
        let id = base64url(&bytes);
        // All zeros and AAAAAAAAAAAAAAAAAAAAAQ are reserved. A leading '-' would be taken for an
        // option by StorageTool's argument parser (Kafka's own Uuid.randomUuid avoids it too).
        if bytes.iter().any(|&b| b != 0) && id != "AAAAAAAAAAAAAAAAAAAAAQ" && !id.starts_with('-') {
            return id;
        }
    }
}

fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// Removes data folders (`<pid>-<n>-<k>node`) of test processes that are gone, once old enough.
fn remove_stale_data(root: &Path) {
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .split('-')
            .next()
            .and_then(|p| p.parse::<u32>().ok())
            .filter(|_| name.ends_with("node"))
        else {
            continue;
        };
        if pid == std::process::id() || pid_alive(pid) {
            continue;
        }
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .is_some_and(|age| age > STALE_DATA_AGE);
        if old {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

fn server_properties(shape: Shape, node: &Node, voters: &str) -> String {
    let (rf, min_isr) = match shape {
        Shape::Single => (1, 1),
        Shape::Three => (3, 2),
    };
    let mut p = format!(
        "\
# Written by protocol-tests (cluster.rs) for one test cluster.
process.roles=broker,controller
node.id={id}
controller.quorum.voters={voters}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={data}
auto.create.topics.enable=false
num.partitions=1
default.replication.factor={rf}
min.insync.replicas={min_isr}
offsets.topic.replication.factor={rf}
offsets.topic.num.partitions=1
transaction.state.log.replication.factor={rf}
transaction.state.log.min.isr={min_isr}
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor={rf}
share.coordinator.state.topic.min.isr={min_isr}
share.coordinator.state.topic.num.partitions=1
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
group.consumer.min.session.timeout.ms=1000
group.consumer.min.heartbeat.interval.ms=500
num.network.threads=2
num.io.threads=2
background.threads=2
group.coordinator.threads=1
num.recovery.threads.per.data.dir=1
log.cleaner.dedupe.buffer.size=16777216
",
        id = node.id,
        port = node.port,
        cport = node.controller_port,
        data = node.dir.join("data").display(),
    );
    if shape == Shape::Three {
        p.push_str(
            "\
broker.session.timeout.ms=3000
broker.heartbeat.interval.ms=500
",
        );
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64url_matches_reference_vectors() {
        assert_eq!(base64url(b""), "");
        assert_eq!(base64url(b"f"), "Zg");
        assert_eq!(base64url(b"fo"), "Zm8");
        assert_eq!(base64url(b"foo"), "Zm9v");
        assert_eq!(base64url(&[0xfb, 0xff]), "-_8");
        assert_eq!(base64url(&[0u8; 16]), "AAAAAAAAAAAAAAAAAAAAAA");
    }

    #[test]
    fn cluster_ids_are_22_chars_distinct_and_not_option_like() {
        let ids: Vec<String> = (0..2000).map(|_| random_cluster_id()).collect();
        assert!(ids.iter().all(|id| id.len() == 22 && !id.starts_with('-')));
        let mut unique = ids.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), ids.len());
    }

    #[test]
    fn free_ports_are_distinct() {
        let ports = free_ports(6).unwrap();
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 6);
    }
}
