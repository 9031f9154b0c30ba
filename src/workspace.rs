//! Private directories: one root per server, one directory per run and per session, all
//! removed when they are done with.
//!
//! When user code runs as a pool uid (server as root), the root and its `runs/` and
//! `sessions/` are 0711: a pool uid can pass through to its own directory but not list the
//! others. A run's directory and a session's `work/` and `out/` belong to its uid (0700); the
//! caches' directory (`cache/`, a run's `<run>.cache/`) is root's (0711) and each language's
//! cache in it the uid's, so that no directory bwrap mounts by path can be renamed by the uid
//! that owns its parent. A session's `ctl/`, where the server writes the bootstrap and the cells, is root's
//! with the session's gid (02750, files 0640): the session reads it, no other session does, and
//! user code cannot plant a symlink there for the server to write through. Caches live and
//! die with their run or session, so nothing one leaves there reaches the next user of the uid.
//! The root holds [`WORKSPACE_MARKER`], by which every server recognises a workspace, and
//! [`LOCK_FILE`], locked (`flock`) by its server for as long as it lives: a workspace whose
//! lock is free belongs to a server that is gone (killed before it could remove it), and the
//! next server to start removes it ([`sweep_stale`]).

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

mod rmtree;
use nix::fcntl::{Flock, FlockArg};
pub use rmtree::remove_tree;
use rustix::fs::{AtFlags, Mode, OFlags};
use tokio::task::JoinHandle;

/// A file in a server's workspace root that names it, so that no session of any server
/// (whatever uid it runs as) takes a workspace, or a directory inside one, as its `cwd`, and
/// no walk of a `cwd` that contains one enters it.
pub const WORKSPACE_MARKER: &str = ".replbox-workspace";

/// The file of a workspace's root its server holds locked while it lives (root's, 0600:
/// user code can neither open nor lock it).
pub const LOCK_FILE: &str = ".replbox-lock";

/// How every workspace's name begins (in the temp dir or `--work-dir`).
const PREFIX: &str = "replbox-";

/// The server's root directory (`replbox-XXXX` in the temp dir), removed on drop.
#[derive(Debug)]
pub struct Workspace {
    // Declared first: dropped (the tree removed) before the lock is let go.
    root: tempfile::TempDir,
    _lock: Flock<std::fs::File>,
}

impl Workspace {
    pub fn new(parent: Option<&Path>) -> std::io::Result<Self> {
        let mut b = tempfile::Builder::new();
        b.prefix(PREFIX);
        // Named by its real path: the sandbox opens the directories it binds and allows
        // without following symbolic links.
        let parent = match parent {
            Some(p) => {
                std::fs::create_dir_all(p)?;
                std::fs::canonicalize(p)?
            }
            None => std::fs::canonicalize(std::env::temp_dir())?,
        };
        let root = b.tempdir_in(parent)?;
        // Traversable, not listable: pool uids reach their own directories only.
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o711))?;
        for sub in ["runs", "sessions"] {
            std::fs::DirBuilder::new()
                .mode(0o711)
                .create(root.path().join(sub))?;
        }
        // Locked under another name, then renamed: a sweeping server never sees the lock
        // file of a starting server unlocked.
        let tmp = root.path().join(format!("{LOCK_FILE}.new"));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| std::io::Error::from(e))?;
        std::fs::rename(&tmp, root.path().join(LOCK_FILE))?;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(root.path().join(WORKSPACE_MARKER))?;
        Ok(Self { root, _lock: lock })
    }

    /// Remove, in the background, the workspaces beside this one whose server is gone.
    pub fn sweep_stale_in_background(&self) {
        let Some(parent) = self.root.path().parent().map(Path::to_path_buf) else {
            return;
        };
        let own = self.root.path().to_path_buf();
        let work = move || {
            for path in sweep_stale(&parent, &own) {
                tracing::info!(
                    "removed {}, the workspace of a replbox server that is gone",
                    path.display()
                );
            }
        };
        // Directory walks are blocking work: off the async workers.
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn_blocking(work);
            }
            Err(_) => work(),
        }
    }

    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// A fresh directory for one `run-code` call, belonging to `owner` when given.
    pub fn new_run_dir(&self, owner: Option<u32>) -> std::io::Result<PrivateDir> {
        let mut dir = PrivateDir::create(
            self.root
                .path()
                .join("runs")
                .join(uuid::Uuid::new_v4().to_string()),
            0o700,
        )?;
        chown(dir.path(), owner)?;
        // Beside the run's directory, not in it: a program sees only its own files there.
        dir.cache = dir.path().with_extension("cache");
        cache_root(&dir.cache, owner)?;
        Ok(dir)
    }

    /// A fresh directory for one session, with `work/` (the code's), `ctl/` (the server's:
    /// bootstrap and cells, which the interpreter only reads), `out/` (what the interpreter
    /// hands back to the server, such as figures) and `cache/` (tools' caches). All but
    /// `ctl/` belong to `owner` when given; `ctl/` is then root's with `owner`'s group.
    pub fn new_session_dir(&self, id: &str, owner: Option<u32>) -> std::io::Result<PrivateDir> {
        let mode = if owner.is_some() { 0o711 } else { 0o700 };
        let dir = PrivateDir::create(self.root.path().join("sessions").join(id), mode)?;
        for sub in ["work", "out"] {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(dir.path().join(sub))?;
            chown(&dir.path().join(sub), owner)?;
        }
        cache_root(&dir.path().join("cache"), owner)?;
        let ctl = dir.path().join("ctl");
        std::fs::DirBuilder::new().mode(0o700).create(&ctl)?;
        if let Some(uid) = owner {
            std::os::unix::fs::chown(&ctl, Some(0), Some(uid))?;
            // setgid: what the server writes there takes the session's group.
            std::fs::set_permissions(&ctl, std::fs::Permissions::from_mode(0o2750))?;
        }
        Ok(dir)
    }

    /// The root's identity: a session whose `cwd` contains the root must not list or read
    /// it (other sessions' files are in there).
    pub fn root_id(&self) -> Option<DirId> {
        DirId::of(self.root.path())
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        // Before the TempDir's own (recursive) removal, which then finds nothing: what runs
        // and sessions left may be any shape.
        remove_tree(self.root.path());
    }
}

/// The directory holding a run's or session's caches: root's (0711) when they belong to a
/// pool uid, so that the uid cannot rename the cache directory bwrap mounts by its path
/// (see `sandbox::bwrap::check_dest`); its own otherwise.
fn cache_root(path: &Path, owner: Option<u32>) -> std::io::Result<()> {
    let mode = if owner.is_some() { 0o711 } else { 0o700 };
    std::fs::DirBuilder::new().mode(mode).create(path)
}

/// Remove the workspaces in `parent` (except `own`) whose server is gone, returning their
/// paths. Only what is proved to be a dead replbox workspace is removed: a real directory
/// (no link) named `replbox-…`, owned by this server's uid, holding the marker and a lock
/// file (regular files, this uid's) whose lock is free, taken while removing. Workspaces of
/// a live server (its lock held), of another user, or of a version that kept no lock are
/// left alone. Removal follows no symbolic link: the files inside belong to pool uids and
/// user code may have planted links to anywhere.
pub fn sweep_stale(parent: &Path, own: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(PREFIX) {
            continue;
        }
        let path = parent.join(&name);
        if path == own {
            continue;
        }
        let Some(lock) = dead_workspace(&path) else {
            continue;
        };
        // Iterative and bounded, following no link: the tree may be any shape user code
        // gave it.
        remove_tree(&path);
        removed.push(path);
        drop(lock);
    }
    removed
}

/// The lock of `path` when it is a replbox workspace of this uid whose server is gone.
fn dead_workspace(path: &Path) -> Option<Flock<std::fs::File>> {
    let uid = rustix::process::geteuid().as_raw();
    let ours = |st: &rustix::fs::Stat, kind: rustix::fs::FileType| {
        st.st_uid == uid && rustix::fs::FileType::from_raw_mode(st.st_mode) == kind
    };
    let dir = rustix::fs::open(
        path,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    if !ours(
        &rustix::fs::fstat(&dir).ok()?,
        rustix::fs::FileType::Directory,
    ) {
        return None;
    }
    let marker = rustix::fs::statat(&dir, WORKSPACE_MARKER, AtFlags::SYMLINK_NOFOLLOW).ok()?;
    if !ours(&marker, rustix::fs::FileType::RegularFile) {
        return None;
    }
    let lock = rustix::fs::openat(
        &dir,
        LOCK_FILE,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .ok()?;
    if !ours(
        &rustix::fs::fstat(&lock).ok()?,
        rustix::fs::FileType::RegularFile,
    ) {
        return None;
    }
    Flock::lock(std::fs::File::from(lock), FlockArg::LockExclusiveNonblock).ok()
}

/// The cache directory for a language's tools (`MPLCONFIGDIR`, build caches) of one run or
/// session: a session's `cache/`, a run's `<run>.cache/` beside it, removed with the private
/// directory. Created for `owner`.
pub fn cache_dir(private: &PrivateDir, lang: &str, owner: Option<u32>) -> PathBuf {
    let p = private.cache.join(lang);
    if std::fs::DirBuilder::new().mode(0o700).create(&p).is_ok() {
        let _ = chown(&p, owner);
    }
    p
}

/// Write a file of a session's `ctl/` (the server's directory): mode 0640, so that only the
/// session's group (the directory's, by setgid) reads it.
pub fn write_ctl(path: &Path, data: impl AsRef<[u8]>) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    std::io::Write::write_all(&mut f, data.as_ref())
}

/// Give `path` to `owner` (uid and gid alike); nothing when None.
pub fn chown(path: &Path, owner: Option<u32>) -> std::io::Result<()> {
    match owner {
        Some(uid) => std::os::unix::fs::chown(path, Some(uid), Some(uid)),
        None => Ok(()),
    }
}

/// A directory removed (with everything in it) when dropped, or by
/// [`remove_then`](Self::remove_then). Removal is blocking work: inside the runtime it runs
/// on the blocking pool, never on an async worker.
#[derive(Debug)]
pub struct PrivateDir {
    path: PathBuf,
    /// Where its tools' caches go (`cache_dir`), removed with it.
    cache: PathBuf,
    removed: bool,
}

impl PrivateDir {
    fn create(path: PathBuf, mode: u32) -> std::io::Result<Self> {
        std::fs::DirBuilder::new().mode(mode).create(&path)?;
        let cache = path.join("cache");
        Ok(Self {
            path,
            cache,
            removed: false,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Remove the directory, then drop `after` (what must outlive it, such as the lease of
    /// the uid that owns it). Inside the runtime both happen on the blocking pool, and the
    /// task returned ends when they are done; outside it, here.
    pub fn remove_then<T: Send + 'static>(mut self, after: T) -> Option<JoinHandle<()>> {
        if self.removed {
            drop(after);
            return None;
        }
        self.removed = true;
        let path = std::mem::take(&mut self.path);
        let cache = std::mem::take(&mut self.cache);
        off_the_workers(move || {
            remove_with_cache(&path, &cache);
            drop(after);
        })
    }

    /// Move the directory out, leaving nothing to remove behind (for an owner that orders
    /// its removal in its own drop).
    pub fn take(&mut self) -> PrivateDir {
        PrivateDir {
            path: std::mem::take(&mut self.path),
            cache: std::mem::take(&mut self.cache),
            removed: std::mem::replace(&mut self.removed, true),
        }
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        let path = std::mem::take(&mut self.path);
        let cache = std::mem::take(&mut self.cache);
        off_the_workers(move || remove_with_cache(&path, &cache));
    }
}

/// Run blocking `work` on the blocking pool when inside the runtime, else here.
fn off_the_workers(work: impl FnOnce() + Send + 'static) -> Option<JoinHandle<()>> {
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => Some(rt.spawn_blocking(work)),
        Err(_) => {
            work();
            None
        }
    }
}

/// Remove a private directory and its cache when the cache lies beside it (a run's).
fn remove_with_cache(path: &Path, cache: &Path) {
    remove_tree(path);
    if !cache.as_os_str().is_empty() && !cache.starts_with(path) {
        remove_tree(cache);
    }
}

/// A directory's identity (device, inode), to recognise it whatever path leads to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirId {
    dev: u64,
    ino: u64,
}

impl DirId {
    pub fn of(path: &Path) -> Option<Self> {
        std::fs::symlink_metadata(path)
            .ok()
            .map(|m| Self::from_meta(&m))
    }

    pub fn from_stat(st: &rustix::fs::Stat) -> Self {
        Self {
            dev: st.st_dev,
            ino: st.st_ino,
        }
    }

    pub fn from_meta(m: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            dev: m.dev(),
            ino: m.ino(),
        }
    }
}

/// Why a path a client gave, relative to a session's directory, is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelPathError {
    #[error("the path is empty")]
    Empty,
    #[error("{0:?} is absolute; give a path relative to the session's directory")]
    Absolute(String),
    #[error("the path contains a NUL byte")]
    Nul,
    #[error("{0:?} goes up with '..'; only paths inside the session's directory are allowed")]
    Up(String),
    #[error("{0:?} names no file")]
    NoFile(String),
}

/// Why a path given by a client was refused before touching the file system.
pub fn check_relative(rel: &str) -> Result<Vec<&str>, RelPathError> {
    if rel.is_empty() {
        return Err(RelPathError::Empty);
    }
    if rel.starts_with('/') {
        return Err(RelPathError::Absolute(rel.into()));
    }
    if rel.contains('\0') {
        return Err(RelPathError::Nul);
    }
    let mut parts = Vec::new();
    for part in rel.split('/') {
        match part {
            "" | "." => continue,
            ".." => return Err(RelPathError::Up(rel.into())),
            p => parts.push(p),
        }
    }
    if parts.is_empty() {
        return Err(RelPathError::NoFile(rel.into()));
    }
    Ok(parts)
}

/// Read at most `cap` bytes of `file`; `Err(size)` when the file is larger.
pub fn read_capped(file: std::fs::File, cap: u64) -> std::io::Result<Result<Vec<u8>, u64>> {
    use std::io::Read;
    let size = file.metadata()?.len();
    if size > cap {
        return Ok(Err(size));
    }
    let mut buf = Vec::with_capacity(size as usize);
    // take(cap + 1): a file that grows while it is read is still bounded.
    file.take(cap + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > cap {
        return Ok(Err(buf.len() as u64));
    }
    Ok(Ok(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_private_dir_dropped_outside_the_runtime_is_removed_at_once() {
        let parent = tempfile::tempdir().unwrap();
        let ws = Workspace::new(Some(parent.path())).unwrap();
        let dir = ws.new_run_dir(None).unwrap();
        let path = dir.path().to_path_buf();
        std::fs::write(path.join("f"), "x").unwrap();
        drop(dir);
        assert!(!path.exists());
    }

    #[tokio::test]
    async fn a_private_dir_is_removed_before_what_must_outlive_it() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        /// Records, when dropped, whether the directory was gone by then.
        struct After(PathBuf, Arc<AtomicBool>);
        impl Drop for After {
            fn drop(&mut self) {
                self.1.store(!self.0.exists(), Ordering::SeqCst);
            }
        }
        let parent = tempfile::tempdir().unwrap();
        let ws = Workspace::new(Some(parent.path())).unwrap();
        let dir = ws.new_run_dir(None).unwrap();
        let path = dir.path().to_path_buf();
        std::fs::write(path.join("f"), "x").unwrap();
        let gone_first = Arc::new(AtomicBool::new(false));
        let task = dir.remove_then(After(path.clone(), gone_first.clone()));
        task.expect("inside the runtime: a blocking task")
            .await
            .unwrap();
        assert!(!path.exists());
        assert!(gone_first.load(Ordering::SeqCst));
    }

    #[test]
    fn relative_paths_are_checked() {
        assert_eq!(check_relative("a/./b.csv").unwrap(), vec!["a", "b.csv"]);
        let e = |rel: &str| check_relative(rel).unwrap_err().to_string();
        assert_eq!(
            e("a/../../x"),
            "\"a/../../x\" goes up with '..'; only paths inside the session's directory are \
             allowed"
        );
        assert_eq!(
            e("/etc/passwd"),
            "\"/etc/passwd\" is absolute; give a path relative to the session's directory"
        );
        assert_eq!(e(""), "the path is empty");
        assert_eq!(e("./"), "\"./\" names no file");
        assert_eq!(e("a\0b"), "the path contains a NUL byte");
    }
}
