//! Where the Kafka jars come from, and how JVM programs (broker, command-line tools, the Java
//! producer, the Java group member) are started.
//!
//! The jars are resolved from Maven Central by `protocol-tests/kafka/pom.xml` into
//! `protocol-tests/kafka/target/kafka-libs/` the first time a test needs them; later runs reuse the
//! folder. `KAFKA_LIBS` points at another folder of jars instead (nothing is downloaded then).

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use crate::lock::DirLock;

/// The Java programs' sources (file name, text), compiled together once per content into the test
/// cache.
const JAVA_SOURCES: &[(&str, &str)] = &[
    ("Produce.java", include_str!("../java/Produce.java")),
    (
        "GroupConsumer.java",
        include_str!("../java/GroupConsumer.java"),
    ),
];

/// log4j2 configuration for the broker: INFO to stdout (which goes to `node<i>.log`), with the
/// chattiest loggers turned down.
const BROKER_LOG4J: &str = "\
status = warn
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = STDOUT
logger.req.name = kafka.request.logger
logger.req.level = WARN
logger.sc.name = state.change.logger
logger.sc.level = WARN
logger.ctl.name = org.apache.kafka.controller
logger.ctl.level = WARN
";

/// log4j2 configuration for tools: WARN and above to stderr, so stdout stays parseable.
const TOOLS_LOG4J: &str = "\
status = warn
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = STDERR
";

/// Jars that must be present for the folder to be usable.
const REQUIRED_JAR_PREFIXES: &[&str] = &[
    "kafka_2.13-",
    "kafka-tools-",
    "kafka-clients-",
    "log4j-slf4j-impl-",
];

/// The folder holding the Kafka broker, tools and client jars (and their dependencies).
///
/// `KAFKA_LIBS` overrides the folder; it must then exist and hold the jars. Otherwise the folder is
/// `protocol-tests/kafka/target/kafka-libs/`, filled by Maven (`mvn -B -q -f
/// protocol-tests/kafka/pom.xml dependency:copy-dependencies`) if it is missing or empty. The Maven
/// run happens under a lock folder, into a temporary folder that is renamed into place, so parallel
/// test binaries neither race nor see half a folder. The answer is cached for the process.
///
/// # Panics
///
/// If the jars cannot be found or Maven fails.
pub fn kafka_libs() -> PathBuf {
    static LIBS: OnceLock<PathBuf> = OnceLock::new();
    LIBS.get_or_init(resolve_kafka_libs).clone()
}

fn resolve_kafka_libs() -> PathBuf {
    if let Some(dir) = std::env::var_os("KAFKA_LIBS").filter(|v| !v.is_empty()) {
        let dir = PathBuf::from(dir);
        if let Err(why) = check_libs(&dir) {
            panic!("KAFKA_LIBS={}: {why}", dir.display());
        }
        return dir;
    }
    let kafka_dir = crate_dir().join("kafka");
    let libs = kafka_dir.join("target").join("kafka-libs");
    if check_libs(&libs).is_ok() {
        return libs;
    }
    let _lock = DirLock::acquire(
        &kafka_dir.join("target").join("kafka-libs.lock"),
        Duration::from_secs(30 * 60),
    );
    // Another test process may have filled it while we waited.
    if check_libs(&libs).is_ok() {
        return libs;
    }
    let started = Instant::now();
    eprintln!(
        "[protocol-tests] resolving the Kafka jars with Maven into {} (first run only)",
        libs.display()
    );
    let staging = kafka_dir
        .join("target")
        .join(format!("kafka-libs.tmp-{}", std::process::id()));
    let _ = fs::remove_dir_all(&staging);
    let pom = kafka_dir.join("pom.xml");
    let output = Command::new("mvn")
        .arg("-B")
        .arg("-q")
        .arg("-f")
        .arg(&pom)
        .arg("dependency:copy-dependencies")
        .arg(format!("-DoutputDirectory={}", staging.display()))
        .arg("-DincludeScope=runtime")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run mvn (is Maven installed?): {e}"));
    if !output.status.success() {
        let _ = fs::remove_dir_all(&staging);
        panic!(
            "mvn failed for {} ({}):\n{}\n{}",
            pom.display(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    if let Err(why) = check_libs(&staging) {
        panic!("mvn finished but {}: {why}", staging.display());
    }
    // An empty or incomplete folder from an earlier attempt is replaced.
    let _ = fs::remove_dir_all(&libs);
    fs::rename(&staging, &libs).unwrap_or_else(|e| {
        panic!(
            "cannot move {} to {}: {e}",
            staging.display(),
            libs.display()
        )
    });
    eprintln!(
        "[protocol-tests] Kafka jars ready in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    libs
}

fn check_libs(dir: &Path) -> Result<(), String> {
    let names: Vec<String> = fs::read_dir(dir)
        .map_err(|e| format!("cannot list: {e}"))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".jar"))
        .collect();
    let missing: Vec<&str> = REQUIRED_JAR_PREFIXES
        .iter()
        .copied()
        .filter(|p| !names.iter().any(|n| n.starts_with(p)))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("no jar named {missing:?}* in the folder"))
    }
}

/// The `protocol-tests` crate folder.
fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The workspace's target folder: `CARGO_TARGET_DIR` if set (relative paths are taken from the
/// workspace root), else `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    let workspace = crate_dir()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(crate_dir);
    match std::env::var_os("CARGO_TARGET_DIR").filter(|v| !v.is_empty()) {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                workspace.join(dir)
            }
        }
        None => workspace.join("target"),
    }
}

/// `<target>/kafka-test`: cluster data folders, log4j configurations and the compiled Java programs.
pub fn test_root() -> PathBuf {
    target_dir().join("kafka-test")
}

/// Writes `contents` to `path` unless it already holds exactly that (atomic via rename).
fn write_if_changed(path: &Path, contents: &str) {
    if fs::read_to_string(path).is_ok_and(|c| c == contents) {
        return;
    }
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", parent.display()));
    }
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    fs::write(&tmp, contents).unwrap_or_else(|e| panic!("cannot write {}: {e}", tmp.display()));
    fs::rename(&tmp, path).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

/// The broker's log4j2 configuration file.
pub(crate) fn broker_log4j() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let path = test_root().join("conf").join("log4j2-broker.properties");
        write_if_changed(&path, BROKER_LOG4J);
        path
    })
    .clone()
}

/// The tools' log4j2 configuration file.
pub(crate) fn tools_log4j() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let path = test_root().join("conf").join("log4j2-tools.properties");
        write_if_changed(&path, TOOLS_LOG4J);
        path
    })
    .clone()
}

/// `<libs>/*`, the class path wildcard that the JVM expands itself.
pub(crate) fn libs_classpath() -> String {
    format!("{}/*", kafka_libs().display())
}

/// The jar holding the compiled Java programs (`Produce`, `GroupConsumer`). It is compiled once per
/// source content, under a
/// lock, in a temporary folder that is then renamed into place. (A jar rather than a class folder:
/// the JVM cannot make a class-data archive for a class path with a non-empty folder on it.)
pub(crate) fn programs_jar() -> PathBuf {
    static JAR: OnceLock<PathBuf> = OnceLock::new();
    JAR.get_or_init(compile_programs).clone()
}

fn compile_programs() -> PathBuf {
    let mut hasher = crc32fast::Hasher::new();
    for (name, text) in JAVA_SOURCES {
        hasher.update(name.as_bytes());
        hasher.update(text.as_bytes());
    }
    let hash = hasher.finalize();
    let base = test_root().join("java");
    let dir = base.join(format!("programs-{hash:08x}"));
    let jar = dir.join("programs.jar");
    if jar.exists() {
        return jar;
    }
    let _lock = DirLock::acquire(&base.join("javac.lock"), Duration::from_secs(300));
    if jar.exists() {
        return jar;
    }
    let staging = base.join(format!("programs-{hash:08x}.tmp-{}", std::process::id()));
    let _ = fs::remove_dir_all(&staging);
    let classes = staging.join("classes");
    fs::create_dir_all(&classes)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", classes.display()));
    let mut javac = Command::new("javac");
    javac
        .arg("-nowarn")
        .arg("-cp")
        .arg(libs_classpath())
        .arg("-d")
        .arg(&classes);
    for (name, text) in JAVA_SOURCES {
        let source = staging.join(name);
        fs::write(&source, text)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", source.display()));
        javac.arg(&source);
    }
    run_build_step(javac, "javac (is a JDK installed?)");
    let mut jar_cmd = Command::new("jar");
    jar_cmd
        .arg("--create")
        .arg("--file")
        .arg(staging.join("programs.jar"))
        .arg("-C")
        .arg(&classes)
        .arg(".");
    run_build_step(jar_cmd, "jar (part of the JDK)");
    // An older attempt may have left an incomplete folder behind.
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&staging, &dir).unwrap_or_else(|e| {
        panic!(
            "cannot move {} to {}: {e}",
            staging.display(),
            dir.display()
        )
    });
    jar
}

fn run_build_step(mut cmd: Command, what: &str) {
    let output = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    if !output.status.success() {
        panic!(
            "{what} failed ({}): {cmd:?}\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// A short-lived JVM program to run to completion.
#[derive(Debug, Clone)]
pub(crate) struct JavaRun {
    /// Fully qualified main class.
    pub(crate) class: String,
    /// Program arguments.
    pub(crate) args: Vec<String>,
    /// JVM options placed before the class path.
    pub(crate) jvm_opts: Vec<String>,
    /// Extra class path entry placed before the jars.
    pub(crate) extra_classpath: Option<PathBuf>,
    /// The process is killed after this long.
    pub(crate) timeout: Duration,
    /// Use a class-data archive made for this class path (see `class_data_archive`).
    pub(crate) class_data_sharing: bool,
    /// Whether this run may write that archive if it does not exist yet (it then holds the
    /// classes this program loaded, so leave it to the admin-client tools).
    pub(crate) may_dump_class_data: bool,
}

/// Options for a small tool JVM: small heap, fast start-up (C1 only, serial GC).
pub(crate) fn small_tool_opts() -> Vec<String> {
    [
        "-Xmx256m",
        "-XX:TieredStopAtLevel=1",
        "-XX:+UseSerialGC",
        "-Djava.awt.headless=true",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// What a finished (or timed-out) JVM program printed.
#[derive(Debug)]
pub(crate) struct JavaOutput {
    pub(crate) status: Option<ExitStatus>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl JavaOutput {
    pub(crate) fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

impl JavaRun {
    pub(crate) fn new(class: &str, args: Vec<String>) -> JavaRun {
        JavaRun {
            class: class.to_string(),
            args,
            jvm_opts: small_tool_opts(),
            extra_classpath: None,
            timeout: Duration::from_secs(120),
            class_data_sharing: true,
            may_dump_class_data: true,
        }
    }

    /// Shell-like rendering of the command, for error messages.
    pub(crate) fn describe(&self) -> String {
        format!("{} {}", self.class, self.args.join(" "))
    }

    /// Runs the program and collects its output; `status` is `None` on timeout.
    pub(crate) fn run(&self) -> JavaOutput {
        let mut classpath = libs_classpath();
        if let Some(extra) = &self.extra_classpath {
            classpath = format!("{}:{classpath}", extra.display());
        }
        let cds = if self.class_data_sharing {
            class_data_archive(&classpath, self.may_dump_class_data)
        } else {
            Cds::Off
        };
        let mut cmd = Command::new("java");
        cmd.args(&self.jvm_opts)
            // JVM warnings (e.g. about an unusable class-data archive) to stderr, not stdout.
            .arg("-Xlog:disable")
            .arg("-Xlog:all=warning:stderr")
            .arg(format!(
                "-Dlog4j2.configurationFile={}",
                tools_log4j().display()
            ))
            .arg("-cp")
            .arg(classpath);
        match &cds {
            Cds::Off => {}
            Cds::Use(path) => {
                cmd.arg(format!("-XX:SharedArchiveFile={}", path.display()));
            }
            Cds::Dump { tmp, .. } => {
                cmd.arg(format!("-XX:ArchiveClassesAtExit={}", tmp.display()));
            }
        }
        cmd.arg(&self.class)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start java (is Java 17+ installed?): {e}"));
        let out = drain(child.stdout.take());
        let err = drain(child.stderr.take());
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                Err(e) => panic!("waiting for java {}: {e}", self.describe()),
            }
        };
        if let Cds::Dump { tmp, path } = &cds {
            if status.is_some_and(|s| s.success()) && tmp.exists() {
                let _ = fs::rename(tmp, path);
            } else {
                let _ = fs::remove_file(tmp);
            }
        }
        JavaOutput {
            status,
            stdout: out.join().unwrap_or_default(),
            stderr: err.join().unwrap_or_default(),
        }
    }

    /// Runs the program and returns its stdout.
    ///
    /// # Panics
    ///
    /// If it exits non-zero or times out; the message holds its output.
    pub(crate) fn run_ok(&self) -> String {
        let out = self.run();
        if !out.success() {
            panic!(
                "java {} failed ({}):\n--- stdout ---\n{}\n--- stderr ---\n{}",
                self.describe(),
                match out.status {
                    Some(s) => s.to_string(),
                    None => format!("timed out after {:?}", self.timeout),
                },
                out.stdout,
                out.stderr
            );
        }
        out.stdout
    }
}

/// How a tool JVM uses class-data sharing (CDS).
#[derive(Debug)]
enum Cds {
    Off,
    /// Map the existing archive: halves a tool's start-up (about 3 s to 1.3 s on 2 cores).
    Use(PathBuf),
    /// Write the archive at exit (adds a few seconds to this one run); renamed into place after.
    Dump {
        tmp: PathBuf,
        path: PathBuf,
    },
}

/// The dynamic CDS archive for a class path: made by the first run (that may dump) of the first
/// test process, then reused by every run with the same class path. A change of the jars or of
/// `java` makes a new one (see [`archive_path`]); the JVM itself also refuses (with a warning,
/// then runs normally) an archive that does not fit. `KAFKA_TEST_NO_CDS=1` turns it off.
fn class_data_archive(classpath: &str, may_dump: bool) -> Cds {
    static DUMP_TRIED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    let Some(path) = archive_path(classpath) else {
        return Cds::Off;
    };
    if path.exists() {
        return Cds::Use(path);
    }
    if !may_dump {
        return Cds::Off;
    }
    let mut tried = DUMP_TRIED.lock().unwrap_or_else(|p| p.into_inner());
    if tried.contains(&path) {
        return Cds::Off;
    }
    tried.push(path.clone());
    Cds::Dump {
        tmp: path.with_extension(format!("jsa.tmp-{}", std::process::id())),
        path,
    }
}

/// Where the class-data archive for `purpose` (a class path, or a name like "broker") lives:
/// `<target>/kafka-test/java/cds-<key>.jsa`, keyed by `purpose`, the jars (names, sizes, times)
/// and the `java` binary. `None` when `KAFKA_TEST_NO_CDS` is set.
pub(crate) fn archive_path(purpose: &str) -> Option<PathBuf> {
    static JARS_KEY: OnceLock<Option<u32>> = OnceLock::new();
    if std::env::var_os("KAFKA_TEST_NO_CDS").is_some_and(|v| !v.is_empty() && v != "0") {
        return None;
    }
    let jars_key = JARS_KEY.get_or_init(|| {
        let mut key = crc32fast::Hasher::new();
        let mut jars: Vec<_> = fs::read_dir(kafka_libs())
            .ok()?
            .filter_map(|e| e.ok())
            .collect();
        jars.sort_by_key(|e| e.file_name());
        for jar in jars {
            key.update(jar.file_name().to_string_lossy().as_bytes());
            if let Ok(meta) = jar.metadata() {
                key.update(&meta.len().to_le_bytes());
                let mtime = meta
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map(|d| d.as_nanos())
                    .unwrap_or(0);
                key.update(&mtime.to_le_bytes());
            }
        }
        let java = java_binary();
        key.update(java.display().to_string().as_bytes());
        if let Ok(meta) = fs::metadata(&java) {
            key.update(&meta.len().to_le_bytes());
        }
        Some(key.finalize())
    });
    let mut key = crc32fast::Hasher::new_with_initial((*jars_key)?);
    key.update(purpose.as_bytes());
    let dir = test_root().join("java");
    fs::create_dir_all(&dir).ok()?;
    Some(dir.join(format!("cds-{:08x}.jsa", key.finalize())))
}

/// The `java` found on `PATH`, with symbolic links resolved.
fn java_binary() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("java"))
        .find(|p| p.is_file())
        .and_then(|p| fs::canonicalize(p).ok())
        .unwrap_or_else(|| PathBuf::from("java"))
}

fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut buf);
        }
        String::from_utf8_lossy(&buf).into_owned()
    })
}

/// A `java` command for a long-running program from the compiled Java programs (see
/// [`programs_jar`]), with small-tool JVM options and WARN-level logging to stderr. The caller
/// sets up stdin, stdout and stderr and spawns it.
pub(crate) fn program_command(class: &str, args: &[String]) -> Command {
    let mut cmd = Command::new("java");
    cmd.args(small_tool_opts())
        .arg("-Xlog:disable")
        .arg("-Xlog:all=warning:stderr")
        .arg(format!(
            "-Dlog4j2.configurationFile={}",
            tools_log4j().display()
        ))
        .arg("-cp")
        .arg(format!("{}:{}", programs_jar().display(), libs_classpath()))
        .arg(class)
        .args(args);
    cmd
}
