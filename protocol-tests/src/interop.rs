//! Group members in processes of their own: kafka-source members (the `group_member` binary)
//! and Java `KafkaConsumer` members (`java/GroupConsumer.java`), both printing the same event
//! lines, read into one shared [`GroupLog`] so that their ownership changes interleave in time.
//! A member can leave gracefully ([`ChildMember::stop`]) or be SIGKILLed ([`ChildMember::kill`]).

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use kafka_source::{AssignmentStrategy, TopicPartition};
use parking_lot::Mutex;

use crate::group::{Change, GroupLog, now_ms};
use crate::java::{program_command, test_root};

/// Which group protocol (and assignor) a member uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The classic protocol with one assignment strategy.
    Classic(AssignmentStrategy),
    /// KIP-848 (`group.protocol=consumer`): the broker assigns.
    Consumer,
}

impl Mode {
    /// The program argument: `classic:<strategy>` or `consumer`.
    pub fn arg(self) -> String {
        match self {
            Mode::Classic(s) => format!("classic:{s}"),
            Mode::Consumer => "consumer".into(),
        }
    }
}

/// Where the members of one test connect and what they subscribe to.
#[derive(Debug, Clone)]
pub struct GroupSpec {
    /// Bootstrap servers.
    pub bootstrap: String,
    /// `group.id`.
    pub group: String,
    /// The one topic subscribed to.
    pub topic: String,
    /// Protocol and assignor.
    pub mode: Mode,
    /// `session.timeout.ms` of classic members.
    pub session_timeout: Duration,
}

impl GroupSpec {
    fn args(&self, name: &str) -> Vec<String> {
        vec![
            self.bootstrap.clone(),
            self.group.clone(),
            self.topic.clone(),
            name.to_owned(),
            self.mode.arg(),
            self.session_timeout.as_millis().to_string(),
        ]
    }
}

/// One member process; killed (SIGKILL) when dropped while still running.
#[derive(Debug)]
pub struct ChildMember {
    /// Its name in the log (also its `client.id`).
    pub name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    reader: Option<thread::JoinHandle<()>>,
    stderr: PathBuf,
    log: Arc<Mutex<GroupLog>>,
}

impl ChildMember {
    /// Starts a kafka-source member: `exe` is the `group_member` binary
    /// (`env!("CARGO_BIN_EXE_group_member")` in a test).
    pub fn ours(exe: &Path, spec: &GroupSpec, name: &str, log: &Arc<Mutex<GroupLog>>) -> Self {
        let mut cmd = Command::new(exe);
        cmd.args(spec.args(name));
        Self::spawn(cmd, name, log)
    }

    /// Starts a Java `KafkaConsumer` member.
    pub fn java(spec: &GroupSpec, name: &str, log: &Arc<Mutex<GroupLog>>) -> Self {
        let cmd = program_command("GroupConsumer", &spec.args(name));
        Self::spawn(cmd, name, log)
    }

    fn spawn(mut cmd: Command, name: &str, log: &Arc<Mutex<GroupLog>>) -> Self {
        let dir = test_root().join("interop");
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let stderr = dir.join(format!("{name}-{}.stderr", now_ms()));
        let err = File::create(&stderr)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", stderr.display()));
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start member {name} ({cmd:?}): {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let log2 = Arc::clone(log);
        let name2 = name.to_owned();
        let reader = thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Err(why) = apply_line(&log2, &name2, &line) {
                    eprintln!("[interop] {name2}: {why}: {line:?}");
                }
            }
        });
        ChildMember {
            name: name.to_owned(),
            stdin: child.stdin.take(),
            child,
            reader: Some(reader),
            stderr,
            log: Arc::clone(log),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Asks the member to close (leaving the group, committing) and waits up to `timeout` for
    /// it to exit; every line it printed is in the log afterwards.
    ///
    /// # Panics
    ///
    /// If it does not exit in time (it is killed then) or exits unsuccessfully.
    pub fn stop(mut self, timeout: Duration) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"STOP\n");
            let _ = stdin.flush();
        }
        let status = self.wait(timeout);
        self.join_reader();
        match status {
            Some(s) if s.success() => {}
            other => panic!(
                "member {} did not close cleanly within {timeout:?} ({other:?}); stderr: {}",
                self.name,
                self.stderr_text()
            ),
        }
    }

    /// SIGKILLs the member. Once it is dead and its last lines are read, the log records that
    /// it lost whatever it still owned: a dead process owns nothing.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.join_reader();
        let mut log = self.log.lock();
        let owned: Vec<TopicPartition> = log
            .owners()
            .into_iter()
            .filter(|(_, o)| o.contains(&self.name))
            .map(|(tp, _)| tp)
            .collect();
        log.push(now_ms(), Change::Lost(self.name.clone(), owned));
    }

    /// The member's stderr so far.
    pub fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    fn wait(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(s)) => return Some(s),
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(50)),
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return None;
                }
            }
        }
    }

    fn join_reader(&mut self) {
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

impl Drop for ChildMember {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Parses `topic:partition,...` or `-`.
fn parse_tps(s: &str) -> Result<Vec<TopicPartition>, String> {
    if s == "-" {
        return Ok(Vec::new());
    }
    s.split(',').map(parse_tp).collect()
}

fn parse_tp(s: &str) -> Result<TopicPartition, String> {
    let (t, p) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("bad partition {s:?}"))?;
    let p = p.parse().map_err(|e| format!("bad partition {s:?}: {e}"))?;
    Ok(TopicPartition::new(t, p))
}

/// Applies one line of a member's output to the log.
fn apply_line(log: &Mutex<GroupLog>, name: &str, line: &str) -> Result<(), String> {
    let mut words = line.split_whitespace();
    let kind = words.next().unwrap_or("");
    match kind {
        "ASSIGNED" | "REVOKED" | "LOST" => {
            let ms: u64 = words
                .next()
                .ok_or("no time")?
                .parse()
                .map_err(|e| format!("bad time: {e}"))?;
            let tps = parse_tps(words.next().ok_or("no partitions")?)?;
            let name = name.to_owned();
            let change = match kind {
                "ASSIGNED" => Change::Assigned(name, tps),
                "REVOKED" => Change::Revoked(name, tps),
                _ => Change::Lost(name, tps),
            };
            log.lock().push(ms, change);
        }
        "RECORDS" => {
            let tp = parse_tp(words.next().ok_or("no partition")?)?;
            let offsets: Vec<i64> = words
                .map(|w| w.parse().map_err(|e| format!("bad offset: {e}")))
                .collect::<Result<_, String>>()?;
            let mut l = log.lock();
            let m = l.records.entry(tp).or_default();
            for o in offsets {
                *m.entry(o).or_default() += 1;
            }
        }
        "STARTED" | "CLOSED" => {}
        _ => return Err("unknown line".into()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_applied_in_time_order() {
        let log = Mutex::new(GroupLog::default());
        apply_line(&log, "j", "ASSIGNED 20 t-1:0,t-1:1").unwrap();
        apply_line(&log, "r", "REVOKED 20 t-1:0").unwrap();
        apply_line(&log, "r", "ASSIGNED 10 t-1:0").unwrap();
        apply_line(&log, "r", "RECORDS t-1:0 5 6 7").unwrap();
        apply_line(&log, "r", "LOST 30 -").unwrap();
        // One member's changes within a millisecond keep their order.
        apply_line(&log, "k", "ASSIGNED 40 t-1:2,t-1:3").unwrap();
        apply_line(&log, "k", "REVOKED 40 t-1:3").unwrap();
        assert!(apply_line(&log, "r", "BOGUS").is_err());
        let l = log.lock();
        let order: Vec<(u64, &str)> = l.changes.iter().map(|(t, c)| (*t, c.member())).collect();
        assert_eq!(
            order,
            vec![
                (10, "r"),
                (20, "r"),
                (20, "j"),
                (30, "r"),
                (40, "k"),
                (40, "k")
            ]
        );
        assert!(matches!(l.changes[1].1, Change::Revoked(..)));
        assert!(matches!(l.changes[4].1, Change::Assigned(..)));
        assert_eq!(l.owners()[&TopicPartition::new("t-1", 3)].len(), 0);
        l.assert_no_overlap(&Default::default());
        assert_eq!(l.distinct(), 3);
    }
}
