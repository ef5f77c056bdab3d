//! Child processes with their peak RSS and CPU time read from `/proc/<pid>`.

use std::fs::{self, File};
use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// How often `/proc/<pid>` is sampled while a child runs.
const SAMPLE_EVERY: Duration = Duration::from_millis(10);

/// What one child process did.
#[derive(Debug, Clone, Default)]
pub(crate) struct ChildRun {
    /// Its stdout.
    pub(crate) stdout: String,
    /// The `key=value` pairs of its `RESULT` line, if it printed one.
    pub(crate) result: Option<Vec<(String, String)>>,
    /// Peak resident set size (`VmHWM`), in bytes.
    pub(crate) peak_rss: u64,
    /// User + system CPU time of the whole process (all threads): the `cpu_s` it reported,
    /// else from `/proc/<pid>/stat` (10 ms ticks).
    pub(crate) cpu_secs: f64,
    /// Whether it exited with status 0 (or was done and told to exit).
    pub(crate) ok: bool,
}

impl ChildRun {
    /// The value of `key` in the `RESULT` line.
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.result
            .as_ref()?
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Runs `cmd` (stderr appended to `log`) until it prints a `RESULT` line or exits, at most
/// `timeout`; samples `/proc/<pid>` meanwhile and once more after the `RESULT` line, then closes
/// its stdin and reaps it. A child past `timeout` is killed.
pub(crate) fn run(mut cmd: Command, log: &Path, timeout: Duration) -> ChildRun {
    let stderr = File::options()
        .create(true)
        .append(true)
        .open(log)
        .map(Stdio::from)
        .unwrap_or_else(|_| Stdio::null());
    let mut child = match cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cannot start {cmd:?}: {e}");
            return ChildRun::default();
        }
    };
    let pid = child.id();
    let (tx, rx) = mpsc::channel::<String>();
    let stdout = child.stdout.take();
    let reader = thread::spawn(move || {
        if let Some(out) = stdout {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        }
    });
    let mut run = ChildRun::default();
    let deadline = Instant::now() + timeout;
    let sample = |run: &mut ChildRun| {
        if let Some((rss, cpu)) = read_proc(pid) {
            run.peak_rss = run.peak_rss.max(rss);
            run.cpu_secs = run.cpu_secs.max(cpu);
        }
    };
    loop {
        sample(&mut run);
        while let Ok(line) = rx.try_recv() {
            if let Some(rest) = line.strip_prefix("RESULT ") {
                run.result = Some(parse_pairs(rest));
            }
            run.stdout.push_str(&line);
            run.stdout.push('\n');
        }
        if run.result.is_some() {
            // Done: the last sample above came after the RESULT line was printed.
            sample(&mut run);
            drop(child.stdin.take());
            run.ok = child.wait().is_ok_and(|s| s.success());
            break;
        }
        match child.try_wait() {
            Ok(Some(status)) => {
                run.ok = status.success();
                break;
            }
            Ok(None) => {}
            Err(_) => break,
        }
        if Instant::now() > deadline {
            eprintln!("child {pid} still running after {timeout:?}; killing it");
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        thread::sleep(SAMPLE_EVERY);
    }
    let _ = reader.join();
    while let Ok(line) = rx.try_recv() {
        if let Some(rest) = line.strip_prefix("RESULT ") {
            run.result = Some(parse_pairs(rest));
        }
        run.stdout.push_str(&line);
        run.stdout.push('\n');
    }
    if let Some(cpu) = run.get("cpu_s").and_then(|v| v.parse().ok()) {
        run.cpu_secs = cpu;
    }
    run
}

fn parse_pairs(s: &str) -> Vec<(String, String)> {
    s.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// (`VmHWM` in bytes, utime + stime in seconds) of a live process.
fn read_proc(pid: u32) -> Option<(u64, f64)> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let hwm_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name in parentheses: state is field 3, utime 14, stime 15.
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((hwm_kib * 1024, (utime + stime) as f64 / clock_ticks()))
}

/// CPU time of every live thread of `pid`, in seconds, from `/proc/<pid>/task/*/schedstat`
/// (nanoseconds on the CPU). Threads that ended are not counted: for a long-running process
/// such as the broker, read it before and after a run and take the difference.
pub(crate) fn threads_cpu_secs(pid: u32) -> Option<f64> {
    cpu_secs_of_threads(pid, None)
}

/// CPU time of the live JIT compiler threads of the JVM `pid` (HotSpot names them `C1
/// CompilerThread<n>` and `C2 CompilerThread<n>`), in seconds; read it before and after a run
/// as with [`threads_cpu_secs`].
pub(crate) fn jit_cpu_secs(pid: u32) -> Option<f64> {
    cpu_secs_of_threads(
        pid,
        Some(|name: &str| name.starts_with("C1 Compiler") || name.starts_with("C2 Compiler")),
    )
}

/// Runs `work` and returns its result with the CPU time that `read` counts for the process
/// `broker` (such as [`threads_cpu_secs`] or [`jit_cpu_secs`]) taken meanwhile: `None` without
/// a broker or if unreadable.
pub(crate) fn cpu_during<T>(
    broker: Option<u32>,
    read: fn(u32) -> Option<f64>,
    work: impl FnOnce() -> T,
) -> (T, Option<f64>) {
    let before = broker.and_then(read);
    let out = work();
    let after = broker.and_then(read);
    (out, before.zip(after).map(|(before, after)| after - before))
}

/// CPU time of the live threads of `pid`, or of those whose name (`comm`) passes `keep`.
fn cpu_secs_of_threads(pid: u32, keep: Option<fn(&str) -> bool>) -> Option<f64> {
    let mut ns = 0u64;
    for task in fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        if let Some(keep) = keep {
            let named = fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|name| keep(name.trim_end()));
            if !named {
                continue;
            }
        }
        // A thread that ends between the listing and the read is left out.
        if let Ok(stat) = fs::read_to_string(task.path().join("schedstat")) {
            ns += stat
                .split_whitespace()
                .next()
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Some(ns as f64 / 1e9)
}

/// `getconf CLK_TCK` (100 on Linux unless told otherwise).
fn clock_ticks() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}
