//! Shared layers: one immutable directory per resolved set of Python or npm packages, built
//! once and then put on the search path of every run or session that asks for the same
//! set, read-only, instead of installing it again (an npm set's `node_modules/` tree
//! whole: node finds a package's own dependencies from the real path of the file that
//! requires them, so the tree serves from wherever it lies).
//!
//! ```text
//! ROOT/layers/shared/        the server's, 0711: passable, not listable by other uids
//!   KEY/                     root's (not root: the server's), read-only, sealed
//! ROOT/layers/building/ID/   the installer's, while it builds a layer
//! ROOT/layers/building/ID.lock  the server's, 0600: locked (exclusive) by the server
//!                            building ID for as long as it does
//! ROOT/layers/holds/KEY      the server's, 0600: locked (shared) by every server with a
//!                            live run or session on the layer KEY
//! ROOT/shared.key            the server's, 0600: the secret the keys are made with
//! ```
//!
//! KEY is a keyed hash of the set's exact pins (sorted; npm's: every package's place in
//! the tree, its version and its tarball's integrity, `node_modules/a/node_modules/b@1.0.0
//! sha512-…`, from npm's lockfile),
//! the index and the interpreter's version, ABI and platform (node's, for npm): the same
//! request on the same interpreter gets the same layer, and nobody without the server's secret can name a layer from the packages in
//! it (so probing for what others installed needs a listing, which the store refuses to
//! other uids). The installer fills `building/ID` (copies, never hard links into its
//! cache: sealing must not change the cache's files), the server seals it (every entry
//! owned by root, or the server's user, without write, set-uid or set-gid bits) and only
//! then renames it into the store: nobody sees a layer half built or unsealed, and
//! neither the installer nor any session can change one afterwards.
//!
//! Servers may share one cache, so what says a layer is in use, or a build is under way,
//! lives in the file system as locks (`flock`), not in one server's memory: a holder takes
//! a shared lock on `holds/KEY` before it looks for the layer and keeps it while its run or
//! session lives; eviction takes it exclusive without waiting, and leaves the layer when it
//! cannot. A build's lock is held for the build's life. The kernel drops a dead server's
//! locks, so a starting server removes the builds nobody holds at once, and never one that
//! is under way.

use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rustix::fs::{AtFlags, FlockOperation, Mode, OFlags};
use rustix::io::Errno;

use sha2::{Digest, Sha256};

/// Bytes of the store's secret.
const SECRET_LEN: usize = 32;

/// Age past which a directory left in `building/` without a lock (by a server from before
/// builds had locks) is no one's (longer than any installation may take).
const LEFTOVER_AGE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The store's secret (`ROOT/shared.key`), made at the first start; and the interpreters'
/// tags, learned once each.
pub(super) struct Store {
    pub(super) dir: PathBuf,
    pub(super) building: PathBuf,
    /// The layers' hold files (see the module's doc).
    holds: PathBuf,
    secret: [u8; SECRET_LEN],
    tags: Mutex<std::collections::HashMap<PathBuf, (std::time::SystemTime, String)>>,
}

impl Store {
    /// The store under `layers`, its secret read from (or made in) `key_file`.
    pub(super) fn new(layers: &Path, key_file: &Path) -> std::io::Result<Self> {
        let dir = layers.join("shared");
        let building = layers.join("building");
        let holds = layers.join("holds");
        super::tree::own_dir(&dir, 0o711, None)?;
        super::tree::own_dir(&building, 0o711, None)?;
        super::tree::own_dir(&holds, 0o700, None)?;
        sweep(&building);
        Ok(Self {
            dir,
            building,
            holds,
            secret: secret(key_file)?,
            tags: Mutex::default(),
        })
    }

    /// The key of the set `pins` (Python's `name==version`, npm's `PLACE@version INTEGRITY`,
    /// see `npm::layout`) of `eco` for the interpreter tagged `tag` and the index `index`.
    pub(super) fn key(&self, eco: super::Eco, pins: &[String], index: &str, tag: &str) -> String {
        let mut pins: Vec<String> = pins
            .iter()
            // Python's names normalized; npm's pins as they are (an integrity's base64 ends
            // in `==`, and its case is what it says).
            .map(
                |p| match p.split_once("==").filter(|_| eco == super::Eco::Python) {
                    Some((name, version)) => {
                        format!(
                            "{}=={}",
                            super::spec::normalize_python(name),
                            version.trim()
                        )
                    }
                    None => p.clone(),
                },
            )
            .collect();
        pins.sort();
        pins.dedup();
        let mut h = Sha256::new();
        h.update(self.secret);
        for part in [tag, index] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        for p in &pins {
            h.update((p.len() as u64).to_le_bytes());
            h.update(p.as_bytes());
        }
        h.finalize()[..20]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The layer `key`'s place in the store.
    pub(super) fn path(&self, key: &str) -> PathBuf {
        self.dir.join(key)
    }

    /// The interpreter `exe`'s version, ABI and platform (Python's `cpython-311
    /// linux-x86_64 "" 3.11.7`; node's `node 20.20.2 linux x64 115`), asked once per
    /// program (again when it changes on disk); None when it will not say.
    pub(super) async fn tag(&self, exe: &Path, eco: super::Eco) -> Option<String> {
        let changed = std::fs::metadata(exe).and_then(|m| m.modified()).ok()?;
        if let Some((at, tag)) = self.tags.lock().unwrap_or_else(|e| e.into_inner()).get(exe)
            && *at == changed
        {
            return Some(tag.clone());
        }
        // The operator's interpreter, isolated (no site, no user paths, no environment).
        let args: &[&str] = match eco {
            super::Eco::Python => &[
                "-I",
                "-S",
                "-c",
                "import sys, sysconfig; print(sys.implementation.cache_tag, \
                 sysconfig.get_platform(), repr(getattr(sys, 'abiflags', '')), \
                 sys.version.split()[0])",
            ],
            // Its native modules' ABI too: a package's prebuilt addon is for one.
            super::Eco::Npm => &[
                "-e",
                "console.log(['node', process.versions.node, process.platform, \
                 process.arch, process.versions.modules].join(' '))",
            ],
        };
        let out = tokio::time::timeout(
            std::time::Duration::from_secs(20),
            tokio::process::Command::new(exe)
                .args(args)
                .env_clear()
                .stdin(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .ok()?
        .ok()?;
        let tag = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() || tag.is_empty() || tag.len() > 200 {
            return None;
        }
        self.tags
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(exe.to_path_buf(), (changed, tag.clone()));
        Some(tag)
    }

    /// A hold on the layer `key` (whether or not it is in the store yet): while it lives,
    /// no server evicts that layer. Waits while an eviction of it is under way (a rename),
    /// so a holder that then finds the layer may use it.
    pub(super) fn hold(&self, key: &str) -> std::io::Result<Hold> {
        lock(&self.holds, key, FlockOperation::LockShared).map(Hold)
    }

    /// A new directory in `building/` for a layer to be built, locked for as long as the
    /// [`Build`] lives (and removed with it, unless published).
    pub(super) fn build(&self, installer: Option<u32>) -> std::io::Result<Build> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let lock = lock(
            &self.building,
            &format!("{id}.lock"),
            FlockOperation::LockExclusive,
        )?;
        let dir = self.building.join(&id);
        let build = Build {
            dir,
            lock: Some(lock),
        };
        super::tree::own_dir(&build.dir, 0o755, installer)?;
        Ok(build)
    }

    /// The layers the store holds (the server's own listing).
    pub(super) fn keys(&self) -> Vec<String> {
        std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(|n| n.len() == 40 && n.bytes().all(|b| b.is_ascii_hexdigit()))
            .collect()
    }
}

/// Put the built layer `built` (sealed here) into the store `store` as `key`; the layer's
/// path. When another installation put the same set there first, `built` is removed and
/// that one is used.
pub(super) fn publish(store: &Path, built: &Path, key: &str) -> std::io::Result<PathBuf> {
    seal(built)?;
    // Moving a directory to another parent rewrites its `..`: its owner needs write on it
    // for that (root does not), so the top is the server's 0755 for the rename, then 0555.
    set_mode(built, 0o755)?;
    let place = store.join(key);
    match rustix::fs::renameat_with(
        rustix::fs::CWD,
        built,
        rustix::fs::CWD,
        &place,
        rustix::fs::RenameFlags::NOREPLACE,
    ) {
        Ok(()) => {
            set_mode(&place, 0o555)?;
            Ok(place)
        }
        Err(rustix::io::Errno::EXIST) | Err(rustix::io::Errno::NOTEMPTY) => {
            remove_sealed(built);
            Ok(place)
        }
        Err(e) => {
            remove_sealed(built);
            Err(e.into())
        }
    }
}

/// Remove the layer `key` from the store `store` unless a server holds it (see the
/// module's doc): out of the store at once (renamed beside it, into `building/`, under a
/// lock of its own), then its files. Whether it was removed.
pub(super) fn remove(store: &Path, key: &str) -> bool {
    let Some(layers) = store.parent() else {
        return false;
    };
    let holds = layers.join("holds");
    // Exclusive, without waiting: a holder anywhere keeps it.
    let Ok(alone) = lock(&holds, key, FlockOperation::NonBlockingLockExclusive) else {
        return false;
    };
    let from = store.join(key);
    let building = layers.join("building");
    let gone = format!("gone-{}", uuid::Uuid::new_v4().simple());
    let Ok(removal) = lock(
        &building,
        &format!("{gone}.lock"),
        FlockOperation::LockExclusive,
    ) else {
        return false;
    };
    let removal = Build {
        dir: building.join(gone),
        lock: Some(removal),
    };
    // Writable by its owner for the move (see `publish`).
    let moved = set_mode(&from, 0o755).is_ok() && std::fs::rename(&from, &removal.dir).is_ok();
    // The hold file goes while it is locked: a holder that opened it before checks, once it
    // has its lock, that its file is still the one in `holds/`, and opens it again if not.
    let _ = std::fs::remove_file(holds.join(key));
    drop(alone);
    drop(removal);
    moved
}

/// A lock (`op`) on `dir/name` (the server's, 0600, made if missing; opened beneath `dir`'s
/// handle, no link followed). Taken on the file that is still `dir/name` once locked (a
/// remover unlinks it while it holds it exclusive); WOULDBLOCK when `op` does not wait and
/// someone holds it.
fn lock(dir: &Path, name: &str, op: FlockOperation) -> std::io::Result<OwnedFd> {
    let d = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    // Each attempt loses only to a remover that unlinked the file in between.
    for _ in 0..100 {
        let fd = rustix::fs::openat(
            &d,
            name,
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        rustix::fs::flock(&fd, op)?;
        let (have, named) = (
            rustix::fs::fstat(&fd)?,
            rustix::fs::statat(&d, name, AtFlags::SYMLINK_NOFOLLOW),
        );
        if let Ok(named) = named
            && (named.st_dev, named.st_ino) == (have.st_dev, have.st_ino)
        {
            return Ok(fd);
        }
    }
    Err(std::io::Error::other(format!(
        "the lock file {name} keeps being replaced"
    )))
}

/// A hold on a shared layer (see [`Store::hold`]); released when dropped.
#[derive(Debug)]
pub(super) struct Hold(#[allow(dead_code)] OwnedFd);

/// A layer being built in `building/` (see [`Store::build`]): its directory, removed with
/// its lock when dropped (nothing is left when it was published: it was renamed away).
#[derive(Debug)]
pub(super) struct Build {
    pub(super) dir: PathBuf,
    lock: Option<OwnedFd>,
}

impl Drop for Build {
    fn drop(&mut self) {
        remove_sealed(&self.dir);
        // The lock file goes while it is still locked (see `lock`).
        let mut name = self.dir.clone().into_os_string();
        name.push(".lock");
        let _ = std::fs::remove_file(name);
        drop(self.lock.take());
    }
}

/// Remove what `building/` holds that no live server is building: each `ID.lock` nobody
/// holds, with its `ID`; a directory without a lock (a server's from before builds had
/// locks) only once it is older than [`LEFTOVER_AGE`].
fn sweep(building: &Path) {
    let Ok(rd) = std::fs::read_dir(building) else {
        return;
    };
    let mut locked = std::collections::HashSet::new();
    let mut lockless = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        match name.strip_suffix(".lock") {
            Some(id) => {
                locked.insert(id.to_string());
                match lock(building, name, FlockOperation::NonBlockingLockExclusive) {
                    // Nobody's: the build died with its server.
                    Ok(fd) => drop(Build {
                        dir: building.join(id),
                        lock: Some(fd),
                    }),
                    Err(e) if e.raw_os_error() == Some(Errno::WOULDBLOCK.raw_os_error()) => {}
                    Err(e) => tracing::warn!(lock = name, error = %e,
                        "packages: cannot check a build left in the cache"),
                }
            }
            None => lockless.push((name.to_string(), e)),
        }
    }
    for (name, e) in lockless {
        if locked.contains(&name) {
            continue;
        }
        let stale = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > LEFTOVER_AGE);
        if stale {
            remove_sealed(&e.path());
        }
    }
}

/// The server's secret in `file` (0600, its own), made when missing or unusable.
fn secret(file: &Path) -> std::io::Result<[u8; SECRET_LEN]> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let mut out = [0u8; SECRET_LEN];
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(file)
        && let Ok(m) = f.metadata()
        && m.is_file()
        && m.uid() == nix::unistd::geteuid().as_raw()
        && m.mode() & 0o077 == 0
        && f.read_exact(&mut out).is_ok()
    {
        return Ok(out);
    }
    // uuid's v4 ids come from the system's random source.
    for chunk in out.chunks_mut(16) {
        chunk.copy_from_slice(&uuid::Uuid::new_v4().as_bytes()[..chunk.len()]);
    }
    let tmp = file.with_extension(format!("tmp{}", uuid::Uuid::new_v4().simple()));
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&out)?;
    }
    std::fs::rename(&tmp, file)?;
    Ok(out)
}

fn set_mode(p: &Path, mode: u32) -> std::io::Result<()> {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
}

/// Make `top` unchangeable by anyone but the server: every entry (no link followed) owned
/// by the server's uid and gid (root's, when it is root), directories 0555, files 0444 or
/// 0555 (set-uid, set-gid and sticky bits dropped). Top-down, so that from the first step
/// the installer's uid can no longer add or remove anything in it.
pub(super) fn seal(top: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let (uid, gid) = (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    );
    let mut stack = vec![top.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p)?;
        // A second name for the inode may lie outside the layer (the cache's file, the
        // secret): sealing it would chown and chmod that one too. Installers copy.
        if !m.is_dir() && m.nlink() > 1 {
            return Err(std::io::Error::other(format!(
                "{} is a hard link, not a copy",
                p.display()
            )));
        }
        std::os::unix::fs::lchown(&p, Some(uid), Some(gid))?;
        if m.file_type().is_symlink() {
            continue;
        }
        let mode = if m.is_dir() {
            0o555
        } else {
            0o444 | (m.mode() & 0o111)
        };
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))?;
        if m.is_dir() {
            for e in std::fs::read_dir(&p)? {
                stack.push(e?.path());
            }
        }
    }
    Ok(())
}

/// Remove a sealed (or half-built) tree: `remove_tree` gives the server's own directories
/// their owner's rights back as it goes (the server, when it is not root, needs it).
pub(super) fn remove_sealed(top: &Path) {
    crate::workspace::remove_tree(top);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_depend_on_the_set_the_index_the_interpreter_and_the_secret() {
        let dir = std::env::temp_dir().join(format!("replbox-shared-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("layers")).unwrap();
        let s = Store::new(&dir.join("layers"), &dir.join("shared.key")).unwrap();
        let pins = |v: &[&str]| v.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        let k = s.key(
            super::super::Eco::Python,
            &pins(&["six==1.17.0", "iniconfig==2.0.0"]),
            "ix",
            "t",
        );
        assert_eq!(k.len(), 40);
        assert_eq!(
            k,
            s.key(
                super::super::Eco::Python,
                &pins(&["iniconfig==2.0.0", "Six==1.17.0"]),
                "ix",
                "t"
            )
        );
        assert_ne!(
            k,
            s.key(
                super::super::Eco::Python,
                &pins(&["six==1.17.0"]),
                "ix",
                "t"
            )
        );
        assert_ne!(
            k,
            s.key(
                super::super::Eco::Python,
                &pins(&["six==1.17.0", "iniconfig==2.0.0"]),
                "iy",
                "t"
            )
        );
        assert_ne!(
            k,
            s.key(
                super::super::Eco::Python,
                &pins(&["six==1.17.0", "iniconfig==2.0.0"]),
                "ix",
                "u"
            )
        );
        // The same secret after a restart; another cache's differs.
        let again = Store::new(&dir.join("layers"), &dir.join("shared.key")).unwrap();
        assert_eq!(
            k,
            again.key(
                super::super::Eco::Python,
                &pins(&["six==1.17.0", "iniconfig==2.0.0"]),
                "ix",
                "t"
            )
        );
        std::fs::remove_file(dir.join("shared.key")).unwrap();
        let other = Store::new(&dir.join("layers"), &dir.join("shared.key")).unwrap();
        assert_ne!(
            k,
            other.key(
                super::super::Eco::Python,
                &pins(&["six==1.17.0", "iniconfig==2.0.0"]),
                "ix",
                "t"
            )
        );
        // Sealed: read-only, no set-uid; published under its key, a second copy dropped.
        let b = s.building.join("b1");
        std::fs::create_dir_all(b.join("pkg")).unwrap();
        std::fs::write(b.join("pkg/m.py"), "x").unwrap();
        std::fs::set_permissions(b.join("pkg/m.py"), std::fs::Permissions::from_mode(0o4775))
            .unwrap();
        let place = publish(&s.dir, &b, &k).unwrap();
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(place.join("pkg/m.py")).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o555);
        assert_eq!(
            std::fs::metadata(place.join("pkg")).unwrap().mode() & 0o7777,
            0o555
        );
        let b2 = s.building.join("b2");
        std::fs::create_dir_all(&b2).unwrap();
        assert_eq!(publish(&s.dir, &b2, &k).unwrap(), place);
        assert!(!b2.exists());
        assert_eq!(s.keys(), vec![k.clone()]);
        assert!(remove(&s.dir, &k));
        assert!(!place.exists());
        assert!(s.keys().is_empty());
        remove_sealed(&dir);
    }

    /// What an installer left in a layer as a hard link (a second name of the cache's
    /// file, or of the store's secret) is never sealed: sealing would make that file
    /// root's and read-only where it is too. The layer is not published.
    #[test]
    fn a_hard_link_in_a_built_layer_changes_nothing_outside_it() {
        use std::os::unix::fs::MetadataExt;
        let dir = std::env::temp_dir().join(format!("replbox-shared-hl-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("layers")).unwrap();
        let s = Store::new(&dir.join("layers"), &dir.join("shared.key")).unwrap();
        let outside = dir.join("cache-file");
        std::fs::write(&outside, "the cache's").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o640)).unwrap();
        let b = s.building.join("b1");
        std::fs::create_dir_all(b.join("node_modules/a")).unwrap();
        std::fs::write(b.join("node_modules/a/index.js"), "x").unwrap();
        std::fs::hard_link(&outside, b.join("node_modules/a/linked.js")).unwrap();
        let k = s.key(
            super::super::Eco::Npm,
            &["node_modules/a@1.0.0 sha512-a==".into()],
            "r",
            "t",
        );
        assert!(publish(&s.dir, &b, &k).is_err());
        assert!(s.keys().is_empty());
        let m = std::fs::metadata(&outside).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o640);
        remove_sealed(&dir);
    }
}
