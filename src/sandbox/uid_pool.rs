//! The uids user code runs as when the server is root: one per session or run, so that
//! RLIMIT_NPROC (counted per uid) is a per-session budget and sessions cannot signal or read
//! each other. Several servers on one host share the uid range, so a uid is taken with an
//! exclusive `flock` on a file in a root-only directory (released by the kernel if the server
//! dies), besides this server's own free list.
//!
//! A uid is bound to the first principal whose code may leave files as it: the principal's
//! name is written in the uid's lock file (so every server on the host sees it) and the uid
//! goes to no other principal afterwards, since what that code left (a 0600 file in a shared
//! `cwd`, at level `none` in the host's `/tmp` or `/dev/shm`) stays readable as the uid. A
//! principal gets one of its own uids first, then an unbound one; when neither is free the
//! lease is refused (a `limit`, naming `--uids`). Work that provably leaves nothing behind
//! (a run at level `bwrap` or `landlock`, where every place it can write is private and
//! removed) may use an unbound uid and leave it unbound: so may a warm interpreter, started
//! before any principal is known, at those levels. Bindings last as long as the state
//! directory (`/run`: until reboot); removing a uid's lock file (once nothing of that uid is
//! left on the host) unbinds it.
//!
//! A principal holds at most `per_principal` uids bound to it in this server: past that,
//! its work is refused a new binding ([`Refused::Bound`]) and
//! must reuse one of its own, which the caller gets by giving back the uid of one of the
//! principal's ended sessions. Otherwise a principal starting and closing sessions in a
//! loop (each ended session keeps its uid while its files are kept) binds a fresh uid each
//! time, and the bindings, which outlive the server, leave none for other principals.

use std::collections::BTreeSet;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};
use rustix::process::{Pid, Signal};

#[derive(Debug)]
pub struct UidPool {
    base: u32,
    size: u32,
    lock_dir: PathBuf,
    /// Most uids bound to one principal; 0: no limit.
    per_principal: u32,
    free: Mutex<BTreeSet<u32>>,
}

/// Why no uid was leased (what to do about it, said in its message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// None this holder may use is free.
    #[error("{0}")]
    Exhausted(String),
    /// The principal has its most bound uids, none of them free: one of them must be given
    /// back (an ended session's) before its work runs.
    #[error("{0}")]
    Bound(String),
}

/// No uid for a session: a limit of the server's, to wait for or free.
impl From<Refused> for crate::error::ToolError {
    fn from(e: Refused) -> Self {
        Self::new(crate::error::ErrorKind::Limit, e.to_string())
    }
}

impl UidPool {
    pub(super) fn new(base: u32, size: u32, lock_dir: PathBuf, per_principal: u32) -> Self {
        Self {
            base,
            size,
            lock_dir,
            per_principal,
            free: Mutex::new((0..size).collect()),
        }
    }

    /// Take a uid for `holder` (see the module's documentation for which one).
    pub(super) fn acquire(
        self: Arc<Self>,
        sweep: bool,
        holder: Holder<'_>,
    ) -> Result<Lease, Refused> {
        let principal = match holder {
            Holder::Binds(p) | Holder::Visits(p) => Some(p),
            Holder::Nobody => None,
        };
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        // Work ahead of callers takes none when uids run short: checked and taken under
        // the same lock, so pools refilling at once cannot all pass the check first.
        if holder == Holder::Nobody && self.short(free.len()) {
            return Err(Refused::Exhausted(format!(
                "sandbox user ids run short ({} of {} free): they are kept for callers",
                free.len(),
                self.size
            )));
        }
        // The lowest of the principal's own free uids, else the lowest unbound one; skip
        // those another server holds.
        let (mut own, mut unbound, mut others) = (None, None, 0u32);
        for &slot in free.iter() {
            let Some(lock) = self.try_lock(self.base + slot) else {
                continue;
            };
            match read_owner(&lock) {
                Some(o) if Some(o.as_str()) == principal => {
                    own = Some((slot, lock));
                    break;
                }
                Some(_) => others += 1,
                None if unbound.is_none() => {
                    unbound = Some((slot, lock));
                    if principal.is_none() {
                        break;
                    }
                }
                None => {}
            }
        }
        let (slot, lock) = match (own, unbound) {
            (Some(o), _) => o,
            (None, Some(u)) => {
                if let Holder::Binds(p) = holder {
                    self.may_bind(p, &free)?;
                    if let Err(e) = write_owner(&u.1, p) {
                        return Err(Refused::Exhausted(format!(
                            "cannot record the principal of sandbox user id {} in {}: {e}",
                            self.base + u.0,
                            self.lock_dir.display()
                        )));
                    }
                }
                u
            }
            (None, None) => return Err(Refused::Exhausted(self.exhausted(principal, others))),
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

    /// Whether uids run short: at most a quarter of them (at least 2) are free. Work done
    /// ahead of time (the warm pool) takes none then.
    pub(super) fn runs_short(&self) -> bool {
        self.short(self.free.lock().unwrap_or_else(|p| p.into_inner()).len())
    }

    fn short(&self, free: usize) -> bool {
        free <= (self.size as usize / 4).max(2)
    }

    /// Refused when `principal` already has its most bound uids (none of them free, or
    /// this would not be asked).
    fn may_bind(&self, principal: &str, free: &BTreeSet<u32>) -> Result<(), Refused> {
        if self.per_principal == 0 {
            return Ok(());
        }
        let bound = self.held_by(principal, free);
        if bound < self.per_principal {
            return Ok(());
        }
        Err(Refused::Bound(format!(
            "no sandbox user id is free for principal {principal}: it holds {bound} bound to \
             it, the most one principal may have ({}: --max-active-per-principal plus {} for \
             the files of ended sessions), in its open sessions, running programs and ended \
             sessions' kept files; close a session (session_close) or wait for a run to \
             finish, then try again",
            self.per_principal, KEPT_PER_PRINCIPAL
        )))
    }

    /// How many uids this server holds (those not `free`) are bound to `principal`. Only
    /// this server's: other servers with a principal of the same name (every stdio server's
    /// is `local`) keep their own count. Its bound uids no server holds are free and its
    /// own, taken before any new one is bound.
    fn held_by(&self, principal: &str, free: &BTreeSet<u32>) -> u32 {
        use std::os::unix::fs::OpenOptionsExt;
        let mut n = 0;
        for uid in (0..self.size)
            .filter(|s| !free.contains(s))
            .map(|s| self.base + s)
        {
            let Ok(f) = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(self.lock_dir.join(uid.to_string()))
            else {
                continue;
            };
            if read_owner(&f).as_deref() == Some(principal) {
                n += 1;
            }
        }
        n
    }

    /// Why no uid could be leased: `others` free ones are bound to other principals.
    fn exhausted(&self, principal: Option<&str>, others: u32) -> String {
        let range = format!("{}..{}", self.base, self.base + self.size);
        if others == 0 {
            return format!(
                "all {} sandbox user ids ({range}) are in use by open sessions and running \
                 programs; close a session, or start the server with a larger --uids",
                self.size
            );
        }
        let whom = principal.map_or("work of no principal".to_string(), |p| {
            format!("principal {p}")
        });
        format!(
            "no sandbox user id is left for {whom}: of the {} ({range}), {others} belong to \
             other principals (a uid stays with the first principal whose code ran as it, as \
             files that code left stay readable as that uid) and the others are in use; close \
             a session, or start the server with a larger --uids",
            self.size
        )
    }

    /// Whose code may have run as `id` (a uid, or a gid: a pool uid's gid is its uid):
    /// `Some(None)` for a sandbox id of this server's range or one another server has used
    /// (a lock file names it), bound to no principal yet; `Some(Some(p))` for one bound to
    /// `p`; None for an id no sandbox hands out (an account of the host).
    pub(super) fn principal_of(&self, id: u32) -> Option<Option<String>> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(self.lock_dir.join(id.to_string()));
        let in_range = id >= self.base && id - self.base < self.size;
        match file {
            Ok(f) => Some(read_owner(&f)),
            Err(_) if in_range => Some(None),
            Err(_) => None,
        }
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
            .read(true)
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

/// Uids a principal may have bound beyond its `--max-active-per-principal` sessions and
/// runs: room for the files of a few ended sessions before the oldest gives its uid back.
pub const KEPT_PER_PRINCIPAL: u32 = 4;

/// The most uids bound to one principal for a per-principal cap of `active` sessions and
/// runs (0: no cap, no limit).
pub fn bound_per_principal(active: usize) -> u32 {
    match u32::try_from(active) {
        Ok(0) => 0,
        Ok(a) => a.saturating_add(KEPT_PER_PRINCIPAL),
        Err(_) => 0,
    }
}

/// Who a lease is for: which uids it may take, and whether it binds one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder<'a> {
    /// Code of this principal that may leave files its uid can reach (every session; a run
    /// at level none): one of the principal's own uids, else an unbound one, bound to the
    /// principal from then on.
    Binds(&'a str),
    /// A run of this principal that leaves nothing behind (levels bwrap and landlock): one
    /// of its own uids or an unbound one, left as it was.
    Visits(&'a str),
    /// Work started before any principal is known, leaving nothing behind (a warm
    /// interpreter at bwrap or landlock): an unbound uid, left unbound.
    Nobody,
}

/// The principal a uid's lock file names (None: unbound). A file that cannot be read counts
/// as bound to someone else.
fn read_owner(f: &std::fs::File) -> Option<String> {
    let mut buf = [0u8; 128];
    match f.read_at(&mut buf, 0) {
        Ok(n) => {
            let name = String::from_utf8_lossy(&buf[..n]).trim().to_string();
            (!name.is_empty()).then_some(name)
        }
        Err(_) => Some("\0unreadable".into()),
    }
}

/// Bind the uid of the lock file `f` (held) to `principal`.
fn write_owner(f: &std::fs::File, principal: &str) -> std::io::Result<()> {
    f.set_len(0)?;
    f.write_all_at(format!("{principal}\n").as_bytes(), 0)?;
    f.sync_data()
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

    /// Whether no principal is bound to this uid (a warm session's, a visit's).
    pub fn unbound(&self) -> bool {
        self.lock.as_ref().is_some_and(|l| read_owner(l).is_none())
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
        let pids = crate::proc::pids_of_uid(uid);
        if pids.is_empty() {
            return;
        }
        for pid in pids
            .into_iter()
            .filter_map(|p| Pid::from_raw(i32::try_from(p).ok()?))
        {
            let _ = rustix::process::kill_process(pid, Signal::KILL);
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
        let pool = Arc::new(UidPool::new(5000, 2, locks.path().to_path_buf(), 0));
        let other = Arc::new(UidPool::new(5000, 2, locks.path().to_path_buf(), 0));
        let a = pool
            .clone()
            .acquire(false, Holder::Binds("a"))
            .expect("first");
        let b = pool
            .clone()
            .acquire(false, Holder::Binds("a"))
            .expect("second");
        assert_ne!(a.uid, b.uid);
        assert!(pool.clone().acquire(false, Holder::Binds("a")).is_err());
        assert!(
            other.clone().acquire(false, Holder::Binds("a")).is_err(),
            "another server sees them taken"
        );
        drop(a);
        let c = pool
            .clone()
            .acquire(false, Holder::Binds("a"))
            .expect("after release");
        assert_eq!(c.uid, 5000);
    }

    #[test]
    fn a_uid_stays_with_the_first_principal_that_binds_it() {
        let locks = tempfile::tempdir().expect("tempdir");
        let pool = Arc::new(UidPool::new(6000, 3, locks.path().to_path_buf(), 0));
        let a = pool
            .clone()
            .acquire(false, Holder::Binds("alice"))
            .expect("alice");
        assert_eq!(a.uid, 6000);
        drop(a);
        // What leaves nothing behind takes an unbound uid and leaves it so.
        let w = pool.clone().acquire(false, Holder::Nobody).expect("warm");
        assert_eq!(w.uid, 6001);
        drop(w);
        // Bob gets another, though alice's is free and the lowest.
        let b = pool
            .clone()
            .acquire(false, Holder::Binds("bob"))
            .expect("bob");
        assert_eq!(b.uid, 6001);
        let v = pool
            .clone()
            .acquire(false, Holder::Visits("carol"))
            .expect("visit");
        assert_eq!(v.uid, 6002);
        drop(v);
        // Another server on the host sees the bindings.
        let other = Arc::new(UidPool::new(6000, 3, locks.path().to_path_buf(), 0));
        let a = other
            .clone()
            .acquire(false, Holder::Binds("alice"))
            .expect("own");
        assert_eq!(a.uid, 6000);
        let c = other
            .clone()
            .acquire(false, Holder::Binds("carol"))
            .expect("unbound");
        assert_eq!(c.uid, 6002);
        drop((a, b, c));
        // Every uid is bound: a fourth principal is refused, whatever is free.
        let e = pool
            .clone()
            .acquire(false, Holder::Binds("dave"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--uids") && e.contains("principal dave"), "{e}");
        assert!(pool.clone().acquire(false, Holder::Nobody).is_err());
        assert!(pool.clone().acquire(false, Holder::Visits("dave")).is_err());
        // A principal's visit uses its own uid.
        let v = pool
            .clone()
            .acquire(false, Holder::Visits("bob"))
            .expect("bob's");
        assert_eq!(v.uid, 6001);
    }

    #[test]
    fn a_principal_binds_at_most_its_bound_and_reuses_its_own() {
        let locks = tempfile::tempdir().expect("tempdir");
        let pool = Arc::new(UidPool::new(7000, 6, locks.path().to_path_buf(), 2));
        let a1 = pool.clone().acquire(false, Holder::Binds("a")).expect("a1");
        let a2 = pool.clone().acquire(false, Holder::Binds("a")).expect("a2");
        // Both of a's are held: a third binding is refused as the bound, not exhausted.
        let e = pool.clone().acquire(false, Holder::Binds("a")).unwrap_err();
        let Refused::Bound(m) = e else {
            panic!("not the bound: {e:?}");
        };
        assert!(
            m.contains("principal a") && m.contains("holds 2 bound") && m.contains("session_close"),
            "{m}"
        );
        // A visit binds nothing, so it may still use an unbound uid; b is unaffected.
        let v = pool
            .clone()
            .acquire(false, Holder::Visits("a"))
            .expect("visit");
        let b = pool.clone().acquire(false, Holder::Binds("b")).expect("b");
        // Once one of a's is back, a gets it again.
        let uid = a1.uid;
        drop(a1);
        let again = pool
            .clone()
            .acquire(false, Holder::Binds("a"))
            .expect("own");
        assert_eq!(again.uid, uid);
        drop((a2, v, b, again));
        assert_eq!(bound_per_principal(0), 0);
        assert_eq!(bound_per_principal(3), 3 + KEPT_PER_PRINCIPAL);
    }

    #[test]
    fn work_ahead_of_callers_leaves_a_quarter_free() {
        let locks = tempfile::tempdir().expect("tempdir");
        let pool = Arc::new(UidPool::new(8000, 4, locks.path().to_path_buf(), 0));
        let ahead: Vec<Lease> = (0..2)
            .map(|_| pool.clone().acquire(false, Holder::Nobody).expect("ahead"))
            .collect();
        assert!(pool.runs_short());
        // The third is refused, however many ask; callers still get the rest.
        assert!(pool.clone().acquire(false, Holder::Nobody).is_err());
        let a = pool
            .clone()
            .acquire(false, Holder::Binds("a"))
            .expect("caller");
        let b = pool
            .clone()
            .acquire(false, Holder::Visits("b"))
            .expect("caller");
        drop((ahead, a, b));
    }
}
