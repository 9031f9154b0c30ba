//! Private directories: one root per server, one directory per run and per session, all
//! removed when they are done with.

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
        for sub in ["runs", "sessions", "cache"] {
            std::fs::create_dir(root.path().join(sub))?;
        }
        Ok(Self { root })
    }

    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// A fresh directory for one `run-code` call.
    pub fn new_run_dir(&self) -> std::io::Result<PrivateDir> {
        PrivateDir::create(
            self.root
                .path()
                .join("runs")
                .join(uuid::Uuid::new_v4().to_string()),
        )
    }

    /// A fresh directory for one session (with `work/` and `ctl/` inside).
    pub fn new_session_dir(&self, id: &str) -> std::io::Result<PrivateDir> {
        let dir = PrivateDir::create(self.root.path().join("sessions").join(id))?;
        std::fs::create_dir(dir.path().join("work"))?;
        std::fs::create_dir(dir.path().join("ctl"))?;
        Ok(dir)
    }

    /// A cache directory for a language's tools (build caches), kept while the server runs.
    pub fn cache_dir(&self, lang: &str) -> PathBuf {
        let p = self.root.path().join("cache").join(lang);
        let _ = std::fs::create_dir_all(&p);
        p
    }
}

/// A directory removed (with everything in it) when dropped.
#[derive(Debug)]
pub struct PrivateDir {
    path: PathBuf,
}

impl PrivateDir {
    fn create(path: PathBuf) -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(Self { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
