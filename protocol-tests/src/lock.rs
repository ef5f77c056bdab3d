//! A cross-process lock made of a directory, for steps that several test binaries may start at once
//! (filling the jar folder, compiling the Java producer).
//!
//! `create_dir` is atomic, so exactly one process wins. The winner writes its PID into the folder;
//! a lock whose owner is gone (the process died without removing it) is taken over.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

/// Held while the lock folder exists; removing the folder on drop releases it.
#[derive(Debug)]
pub(crate) struct DirLock {
    path: PathBuf,
}

/// A lock folder without an owner file is treated as abandoned after this long (its creator writes
/// the file right after creating the folder, so only a crash in between leaves it empty).
const OWNERLESS_GRACE: Duration = Duration::from_secs(30);

impl DirLock {
    /// Takes the lock at `path` if it is free (or abandoned); `None` if another process holds it.
    pub(crate) fn try_acquire(path: &Path) -> Option<DirLock> {
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).ok()?;
        }
        for _ in 0..2 {
            match fs::create_dir(path) {
                Ok(()) => {
                    fs::write(path.join("owner"), std::process::id().to_string()).ok()?;
                    return Some(DirLock {
                        path: path.to_path_buf(),
                    });
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists && is_stale(path) => {
                    remove_stale(path);
                }
                Err(_) => return None,
            }
        }
        None
    }

    /// Waits until the lock at `path` is ours; panics after `timeout`.
    pub(crate) fn acquire(path: &Path, timeout: Duration) -> DirLock {
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", parent.display()));
        }
        let deadline = Instant::now() + timeout;
        let mut announced = false;
        loop {
            match fs::create_dir(path) {
                Ok(()) => {
                    let owner = path.join("owner");
                    fs::write(&owner, std::process::id().to_string())
                        .unwrap_or_else(|e| panic!("cannot write {}: {e}", owner.display()));
                    return DirLock {
                        path: path.to_path_buf(),
                    };
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    if is_stale(path) {
                        remove_stale(path);
                        continue;
                    }
                    if !announced {
                        eprintln!(
                            "[protocol-tests] waiting for lock {} (held by another test process)",
                            path.display()
                        );
                        announced = true;
                    }
                    if Instant::now() > deadline {
                        panic!(
                            "timed out after {timeout:?} waiting for lock {}; remove it if no test is running",
                            path.display()
                        );
                    }
                    thread::sleep(Duration::from_millis(200));
                }
                Err(e) => panic!("cannot create lock {}: {e}", path.display()),
            }
        }
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Moves a stale lock aside, then removes it: a rename is atomic, so two waiters that both judged
/// it stale cannot both remove it.
fn remove_stale(path: &Path) {
    let aside = path.with_extension(format!("stale-{}-{}", std::process::id(), unique_suffix()));
    if fs::rename(path, &aside).is_ok() {
        let _ = fs::remove_dir_all(&aside);
    }
}

fn is_stale(path: &Path) -> bool {
    match fs::read_to_string(path.join("owner")) {
        Ok(text) => match text.trim().parse::<u32>() {
            Ok(pid) => !pid_alive(pid),
            Err(_) => older_than(path, OWNERLESS_GRACE),
        },
        Err(_) => older_than(path, OWNERLESS_GRACE),
    }
}

fn older_than(path: &Path, age: Duration) -> bool {
    fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .is_some_and(|d| d > age)
}

fn unique_suffix() -> u128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// Whether a process with this PID exists (a zombie counts as existing).
pub(crate) fn pid_alive(pid: u32) -> bool {
    let proc_root = Path::new("/proc/self");
    if proc_root.exists() {
        return Path::new(&format!("/proc/{pid}")).exists();
    }
    std::process::Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_excludes_and_releases() {
        let dir = std::env::temp_dir().join(format!("pt-lock-{}", std::process::id()));
        let lock = dir.join("a.lock");
        let first = DirLock::acquire(&lock, Duration::from_secs(1));
        assert!(lock.join("owner").exists());
        let second = thread::spawn({
            let lock = lock.clone();
            move || {
                let started = Instant::now();
                let _held = DirLock::acquire(&lock, Duration::from_secs(10));
                started.elapsed()
            }
        });
        thread::sleep(Duration::from_millis(500));
        drop(first);
        let waited = second.join().unwrap();
        assert!(waited >= Duration::from_millis(400), "{waited:?}");
        assert!(!lock.exists());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn lock_of_dead_owner_is_taken_over() {
        let dir = std::env::temp_dir().join(format!("pt-stale-{}", std::process::id()));
        let lock = dir.join("b.lock");
        fs::create_dir_all(&lock).unwrap();
        // PIDs are below pid_max (at most 2^22), so this one cannot exist.
        fs::write(lock.join("owner"), "4294967294").unwrap();
        let held = DirLock::acquire(&lock, Duration::from_secs(2));
        assert_eq!(
            fs::read_to_string(lock.join("owner")).unwrap(),
            std::process::id().to_string()
        );
        drop(held);
        let _ = fs::remove_dir_all(&dir);
    }
}
