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

    /// A fresh directory for one session (with `work/` and `ctl/` inside). `work/` belongs to
    /// `owner` when given; `ctl/` is the server's, readable by the session.
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
        Ok(dir)
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

/// A directory removed (with everything in it) when dropped.
#[derive(Debug)]
pub struct PrivateDir {
    path: PathBuf,
}

impl PrivateDir {
    fn create(path: PathBuf, mode: u32) -> std::io::Result<Self> {
        std::fs::DirBuilder::new().mode(mode).create(&path)?;
        Ok(Self { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        // remove_dir_all does not follow symlinks that user code may have left in it.
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
