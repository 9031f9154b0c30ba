//! The state directory (`--state-dir`) where journals live: the server's own, checked at
//! start like the uid lock directory (a real directory of the server's uid, mode 0700, whose
//! parents only root or that uid can change) and locked, so two servers never share it.

use std::fs::File;
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

/// The suffix of a journal's file name.
pub(super) const SUFFIX: &str = "journal";

/// The state directory, checked and locked for this server.
#[derive(Debug)]
pub struct StateDir {
    path: PathBuf,
    /// Held while the server runs: a second server on the same directory refuses to start.
    _lock: Flock<File>,
}

/// Why a directory cannot hold journals.
fn unsafe_dir(path: &Path, why: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "state directory {}: {why}. It must be a directory of the server's own user, mode \
0700, whose parents only root or that user can change",
        path.display()
    )
}

/// How long a server starting on a locked state directory waits for the server that holds
/// it to let go (one killed a moment ago is still exiting) before it refuses to start.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl StateDir {
    /// Create (0700) or check the directory, and lock it.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        if !path.is_absolute() {
            anyhow::bail!(
                "state directory {}: must be an absolute path",
                path.display()
            );
        }
        if let Some(parent) = path.parent() {
            check_parents(parent)?;
        }
        match std::fs::DirBuilder::new().mode(0o700).create(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(unsafe_dir(path, &format!("cannot create it: {e}"))),
        }
        let me = nix::unistd::geteuid().as_raw();
        let meta = std::fs::symlink_metadata(path).map_err(|e| unsafe_dir(path, &e.to_string()))?;
        if !meta.is_dir() {
            return Err(unsafe_dir(path, "it is not a directory (or it is a link)"));
        }
        if meta.uid() != me {
            return Err(unsafe_dir(
                path,
                &format!("it belongs to uid {}", meta.uid()),
            ));
        }
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(unsafe_dir(
                path,
                &format!("its mode is {:o}", meta.permissions().mode() & 0o7777),
            ));
        }
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path.join("lock"))
            .map_err(|e| unsafe_dir(path, &format!("cannot open its lock file: {e}")))?;
        // A server killed a moment ago holds its lock until its last thread has exited, which
        // can be after its process already shows as ended: a restart waits that long, not
        // more ([`LOCK_WAIT`]).
        let deadline = std::time::Instant::now() + LOCK_WAIT;
        let mut file = lock;
        let lock = loop {
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(l) => break l,
                Err((f, nix::errno::Errno::EWOULDBLOCK))
                    if std::time::Instant::now() < deadline =>
                {
                    file = f;
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Err(_) => anyhow::bail!(
                    "state directory {} is in use by another replbox server",
                    path.display()
                ),
            }
        };
        Ok(Self {
            path: path.to_path_buf(),
            _lock: lock,
        })
    }

    /// Where the journal of session `id` lives.
    pub fn journal_path(&self, id: &str) -> PathBuf {
        self.path.join(format!("{id}.{SUFFIX}"))
    }

    /// The session ids that have a journal here (names that are not a session id are
    /// ignored).
    pub fn journals(&self) -> Vec<String> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(&self.path)
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some(id) = name.strip_suffix(&format!(".{SUFFIX}"))
                && uuid::Uuid::parse_str(id).is_ok_and(|u| u.to_string() == id)
            {
                out.push(id.to_string());
            }
        }
        out.sort();
        out
    }
}

/// Every directory above the state directory must be one only root or the server's user
/// can change (or a sticky one, such as /tmp, where no one else can replace our entry).
fn check_parents(dir: &Path) -> anyhow::Result<()> {
    let me = nix::unistd::geteuid().as_raw();
    let mut cur = Some(dir);
    while let Some(d) = cur {
        let meta = std::fs::symlink_metadata(d)
            .map_err(|e| unsafe_dir(dir, &format!("{}: {e}", d.display())))?;
        if meta.file_type().is_symlink() {
            return Err(unsafe_dir(
                dir,
                &format!("{} is a symbolic link; give the real path", d.display()),
            ));
        }
        let mode = meta.permissions().mode();
        if meta.uid() != 0 && meta.uid() != me {
            return Err(unsafe_dir(
                dir,
                &format!("{} belongs to uid {}", d.display(), meta.uid()),
            ));
        }
        if mode & 0o022 != 0 && mode & 0o1000 == 0 {
            return Err(unsafe_dir(
                dir,
                &format!("{} is writable by others", d.display()),
            ));
        }
        cur = d.parent();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_directory_is_checked_and_locked() {
        let d = tempfile::tempdir().unwrap();
        let dir = std::fs::canonicalize(d.path()).unwrap().join("state");
        let held = StateDir::open(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        assert!(
            StateDir::open(&dir)
                .unwrap_err()
                .to_string()
                .contains("in use")
        );
        drop(held);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(
            StateDir::open(&dir)
                .unwrap_err()
                .to_string()
                .contains("mode")
        );
        assert!(StateDir::open(Path::new("relative")).is_err());
        let link = dir.with_extension("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(StateDir::open(&link.join("x")).is_err());
    }
}
