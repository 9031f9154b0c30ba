//! Private directories: one root per server, one directory per run and per session, all
//! removed when they are done with.
//!
//! When user code runs as a pool uid (server as root), the root and its `runs/`, `sessions/`
//! and `cache/` are 0711: a pool uid can pass through to its own directory but not list the
//! others. A run's directory and a session's `work/` belong to its uid (0700); a session's
//! `ctl/`, where the server writes the bootstrap and the cells, stays the server's and is
//! read-only to the session, so user code cannot plant a symlink there for the server to
//! write through.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::task::JoinHandle;

/// The server's root directory (`replbox-XXXX` in the temp dir), removed on drop.
#[derive(Debug)]
pub struct Workspace {
    root: tempfile::TempDir,
}

impl Workspace {
    pub fn new(parent: Option<&Path>) -> std::io::Result<Self> {
        let mut b = tempfile::Builder::new();
        b.prefix("replbox-");
        let root = match parent {
            Some(p) => {
                std::fs::create_dir_all(p)?;
                b.tempdir_in(p)?
            }
            None => b.tempdir()?,
        };
        // Traversable, not listable: pool uids reach their own directories only.
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o711))?;
        for sub in ["runs", "sessions", "cache"] {
            std::fs::DirBuilder::new()
                .mode(0o711)
                .create(root.path().join(sub))?;
        }
        Ok(Self { root })
    }

    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// A fresh directory for one `run-code` call, belonging to `owner` when given.
    pub fn new_run_dir(&self, owner: Option<u32>) -> std::io::Result<PrivateDir> {
        let dir = PrivateDir::create(
            self.root
                .path()
                .join("runs")
                .join(uuid::Uuid::new_v4().to_string()),
            0o700,
        )?;
        chown(dir.path(), owner)?;
        Ok(dir)
    }

    /// A fresh directory for one session, with `work/` (the code's), `ctl/` (the server's:
    /// bootstrap and cells, which the interpreter only reads) and `out/` (what the
    /// interpreter hands back to the server, such as figures). `work/` and `out/` belong to
    /// `owner` when given.
    pub fn new_session_dir(&self, id: &str, owner: Option<u32>) -> std::io::Result<PrivateDir> {
        let mode = if owner.is_some() { 0o711 } else { 0o700 };
        let dir = PrivateDir::create(self.root.path().join("sessions").join(id), mode)?;
        let b = |m| {
            let mut b = std::fs::DirBuilder::new();
            b.mode(m);
            b
        };
        b(0o700).create(dir.path().join("work"))?;
        chown(&dir.path().join("work"), owner)?;
        b(if owner.is_some() { 0o755 } else { 0o700 }).create(dir.path().join("ctl"))?;
        // What the interpreter hands back to the server (figures): the session's to write.
        b(0o700).create(dir.path().join("out"))?;
        chown(&dir.path().join("out"), owner)?;
        Ok(dir)
    }

    /// The root's identity: a session whose `cwd` contains the root must not list or read
    /// it (other sessions' files are in there).
    pub fn root_id(&self) -> Option<DirId> {
        DirId::of(self.root.path())
    }

    /// A cache directory for a language's tools (build caches), kept while the server runs;
    /// one per pool uid when given (a uid cannot write another's files, and concurrent runs
    /// do not share one).
    pub fn cache_dir(&self, lang: &str, owner: Option<u32>) -> PathBuf {
        let base = self.root.path().join("cache");
        let p = match owner {
            Some(uid) => {
                let mine = base.join(uid.to_string());
                if std::fs::DirBuilder::new().mode(0o700).create(&mine).is_ok() {
                    let _ = chown(&mine, Some(uid));
                }
                mine.join(lang)
            }
            None => base.join(lang),
        };
        if std::fs::create_dir_all(&p).is_ok() {
            let _ = chown(&p, owner);
        }
        p
    }
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
    removed: bool,
}

impl PrivateDir {
    fn create(path: PathBuf, mode: u32) -> std::io::Result<Self> {
        std::fs::DirBuilder::new().mode(mode).create(&path)?;
        Ok(Self {
            path,
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
        off_the_workers(move || {
            remove_tree(&path);
            drop(after);
        })
    }

    /// Move the directory out, leaving nothing to remove behind (for an owner that orders
    /// its removal in its own drop).
    pub fn take(&mut self) -> PrivateDir {
        PrivateDir {
            path: std::mem::take(&mut self.path),
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
        off_the_workers(move || remove_tree(&path));
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

fn remove_tree(path: &Path) {
    // remove_dir_all does not follow symlinks that user code may have left in it.
    let _ = std::fs::remove_dir_all(path);
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

    pub fn from_meta(m: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            dev: m.dev(),
            ino: m.ino(),
        }
    }
}

/// Why a path given by a client was refused before touching the file system.
pub fn check_relative(rel: &str) -> Result<Vec<&str>, String> {
    if rel.is_empty() {
        return Err("the path is empty".into());
    }
    if rel.starts_with('/') {
        return Err(format!(
            "{rel:?} is absolute; give a path relative to the session's directory"
        ));
    }
    if rel.contains('\0') {
        return Err("the path contains a NUL byte".into());
    }
    let mut parts = Vec::new();
    for part in rel.split('/') {
        match part {
            "" | "." => continue,
            ".." => {
                return Err(format!(
                    "{rel:?} goes up with '..'; only paths inside the session's directory are allowed"
                ));
            }
            p => parts.push(p),
        }
    }
    if parts.is_empty() {
        return Err(format!("{rel:?} names no file"));
    }
    Ok(parts)
}

/// Open the regular file `parts` (path components, already checked by [`check_relative`])
/// beneath `root`, read-only, following no symbolic link on the way: code in a session can
/// plant links, and a link must never lead the server (which may have more rights than the
/// code) outside the directory. Each component is opened relative to the previous one, so a
/// directory swapped for a link while this runs is refused too. A directory in `forbidden`
/// is not entered.
pub fn open_beneath(
    root: &Path,
    parts: &[&str],
    forbidden: &[DirId],
) -> std::io::Result<std::fs::File> {
    use nix::fcntl::{OFlag, open, openat};
    use nix::sys::stat::Mode;
    let dir_flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let Some((last, dirs)) = parts.split_last() else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "no file named",
        ));
    };
    let check = |fd: std::os::fd::OwnedFd| -> std::io::Result<std::os::fd::OwnedFd> {
        let meta = std::fs::File::from(fd.try_clone()?).metadata()?;
        if forbidden.contains(&DirId::from_meta(&meta)) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                "the server's own directories are not served",
            ));
        }
        Ok(fd)
    };
    let mut dir = check(open(root, dir_flags, Mode::empty())?)?;
    for d in dirs {
        dir = check(openat(&dir, *d, dir_flags, Mode::empty())?)?;
    }
    // O_NONBLOCK: opening a FIFO planted under the name must not hang the server.
    let fd = openat(
        &dir,
        *last,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        Mode::empty(),
    )?;
    let file = std::fs::File::from(fd);
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(file)
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
        assert!(check_relative("../x").is_err());
        assert!(check_relative("a/../../x").is_err());
        assert!(check_relative("/etc/passwd").is_err());
        assert!(check_relative("").is_err());
        assert!(check_relative("./").is_err());
    }

    #[test]
    fn open_beneath_follows_no_link() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        std::fs::create_dir(root.path().join("d")).unwrap();
        std::fs::write(root.path().join("d/ok.txt"), "ok").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), root.path().join("link"))
            .unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("dirlink")).unwrap();
        let f = open_beneath(root.path(), &["d", "ok.txt"], &[]).unwrap();
        assert_eq!(read_capped(f, 10).unwrap().unwrap(), b"ok");
        assert!(open_beneath(root.path(), &["link"], &[]).is_err());
        assert!(open_beneath(root.path(), &["dirlink", "secret"], &[]).is_err());
        assert!(
            open_beneath(root.path(), &["d"], &[]).is_err(),
            "a directory"
        );
        let f = open_beneath(root.path(), &["d", "ok.txt"], &[]).unwrap();
        assert_eq!(read_capped(f, 1).unwrap(), Err(2));
        let d = DirId::of(&root.path().join("d")).unwrap();
        assert!(open_beneath(root.path(), &["d", "ok.txt"], &[d]).is_err());
    }
}
