//! The uids user code runs as when the server is root: one per session or run, so that
//! RLIMIT_NPROC (counted per uid) is a per-session budget and sessions cannot signal or read
//! each other. Several servers on one host share the uid range, so a uid is taken with an
//! exclusive `flock` on a file in a root-only directory (released by the kernel if the server
//! dies), besides this server's own free list.

use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};

#[derive(Debug)]
pub struct UidPool {
    base: u32,
    size: u32,
    lock_dir: PathBuf,
    free: Mutex<BTreeSet<u32>>,
}

impl UidPool {
    pub(super) fn new(base: u32, size: u32, lock_dir: PathBuf) -> Self {
        Self {
            base,
            size,
            lock_dir,
            free: Mutex::new((0..size).collect()),
        }
    }

    pub(super) fn acquire(self: Arc<Self>, sweep: bool) -> Result<Lease, String> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        // The lowest free slot, so that a lone caller keeps finding its warm build caches;
        // skip those another server holds.
        let mut taken = None;
        for &slot in free.iter() {
            if let Some(lock) = self.try_lock(self.base + slot) {
                taken = Some((slot, lock));
                break;
            }
        }
        let Some((slot, lock)) = taken else {
            return Err(format!(
                "all {} sandbox user ids ({}..{}) are in use by open sessions and running \
                 programs; close a session, or start the server with a larger --uids",
                self.size,
                self.base,
                self.base + self.size
            ));
        };
        free.remove(&slot);
        drop(free);
        Ok(Lease {
            uid: self.base + slot,
            slot,
            sweep,
            dirty: Arc::new(AtomicBool::new(false)),
            lock: Some(lock),
            pool: self.clone(),
        })
    }

    /// How many uids this server could still hand out (ignoring those another server holds).
    pub(super) fn free(&self) -> usize {
        self.free.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub(super) fn size(&self) -> u32 {
        self.size
    }

    /// Uids of the pool this server holds now.
    pub(super) fn in_use(&self) -> usize {
        let free = self.free.lock().unwrap_or_else(|p| p.into_inner()).len();
        (self.size as usize).saturating_sub(free)
    }

    fn try_lock(&self, uid: u32) -> Option<Flock<std::fs::File>> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(self.lock_dir.join(uid.to_string()))
            .ok()?;
        Flock::lock(f, FlockArg::LockExclusiveNonblock).ok()
    }

    fn release(&self, slot: u32) {
        self.free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(slot);
    }
}

/// The server's state directory (uid locks, the probe cache): root's alone (checked, so
/// nobody can pre-create it to steal or block uids, or to forge a probe result).
pub(super) fn state_dir() -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = if Path::new("/run").is_dir() {
        PathBuf::from("/run/replbox")
    } else {
        std::env::temp_dir().join("replbox-state")
    };
    let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
    let meta = std::fs::symlink_metadata(&dir)
        .map_err(|e| anyhow::anyhow!("state directory {}: {e}", dir.display()))?;
    if !meta.is_dir() || meta.uid() != 0 || meta.permissions().mode() & 0o077 != 0 {
        anyhow::bail!(
            "state directory {} must be a directory owned by root with mode 0700",
            dir.display()
        );
    }
    Ok(dir)
}

/// One uid of the pool, returned when dropped.
#[derive(Debug)]
pub struct Lease {
    pub uid: u32,
    slot: u32,
    /// Kill leftovers before the uid is reused. Not needed at the bwrap level, where the pid
    /// namespace dies with its first process.
    sweep: bool,
    dirty: Arc<AtomicBool>,
    lock: Option<Flock<std::fs::File>>,
    pool: Arc<UidPool>,
}

impl Lease {
    /// The flag a process of this lease sets when it ends without a confirmed clean tree.
    pub fn dirty_flag(&self) -> Arc<AtomicBool> {
        self.dirty.clone()
    }

    /// Kill whatever still runs as this uid now, when its tree was not confirmed gone (a
    /// lease kept after its session ended, while its files are read as it). Blocking.
    pub fn sweep_now(&self) {
        if self.sweep && self.dirty.swap(false, Ordering::Relaxed) {
            kill_uid(self.uid);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let sweep = self.sweep && self.dirty.load(Ordering::Relaxed);
        let (uid, slot, pool) = (self.uid, self.slot, self.pool.clone());
        let lock = self.lock.take();
        if !sweep {
            // The helper saw every process of this lease gone: nothing to wait for.
            drop(lock);
            pool.release(slot);
            return;
        }
        tracing::debug!(uid, "sweeping the uid of a tree not confirmed gone");
        let work = move || {
            kill_uid(uid);
            // Other servers may take the uid once its lock is closed.
            drop(lock);
            pool.release(slot);
        };
        // Reading /proc is blocking work: keep it off the async workers.
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn_blocking(work);
            }
            Err(_) => work(),
        }
    }
}

/// SIGKILL every process whose real uid is `uid` (the helper already killed its tree; this
/// catches anything that got away, so a reused uid starts clean).
pub fn kill_uid(uid: u32) {
    for _ in 0..50 {
        let pids = replbox_exec::procfs::pids_of_uid(uid);
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_hands_out_distinct_uids_and_takes_them_back() {
        let locks = tempfile::tempdir().expect("tempdir");
        let pool = Arc::new(UidPool::new(5000, 2, locks.path().to_path_buf()));
        let other = Arc::new(UidPool::new(5000, 2, locks.path().to_path_buf()));
        let a = pool.clone().acquire(false).expect("first");
        let b = pool.clone().acquire(false).expect("second");
        assert_ne!(a.uid, b.uid);
        assert!(pool.clone().acquire(false).is_err());
        assert!(
            other.clone().acquire(false).is_err(),
            "another server sees them taken"
        );
        drop(a);
        let c = pool.clone().acquire(false).expect("after release");
        assert_eq!(c.uid, 5000);
    }
}
