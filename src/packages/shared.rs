//! Shared layers: one immutable directory per resolved set of Python packages, built once
//! and then put on the search path of every run or session that asks for the same set,
//! read-only, instead of installing it again.
//!
//! ```text
//! ROOT/layers/shared/        the server's, 0711: passable, not listable by other uids
//!   KEY/                     root's (not root: the server's), read-only, sealed
//! ROOT/layers/building/ID/   the installer's, while it builds a layer
//! ROOT/shared.key            the server's, 0600: the secret the keys are made with
//! ```
//!
//! KEY is a keyed hash of the set's exact pins (sorted), the index and the interpreter's
//! version, ABI and platform: the same request on the same interpreter gets the same
//! layer, and nobody without the server's secret can name a layer from the packages in
//! it (so probing for what others installed needs a listing, which the store refuses to
//! other uids). The installer fills `building/ID` (copies, never hard links into its
//! cache: sealing must not change the cache's files), the server seals it (every entry
//! owned by root, or the server's user, without write, set-uid or set-gid bits) and only
//! then renames it into the store: nobody sees a layer half built or unsealed, and
//! neither the installer nor any session can change one afterwards.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

/// Bytes of the store's secret.
const SECRET_LEN: usize = 32;

/// Age past which a directory left in `building/` is no one's (longer than any
/// installation may take).
const LEFTOVER_AGE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The store's secret (`ROOT/shared.key`), made at the first start; and the interpreters'
/// tags, learned once each.
pub(super) struct Store {
    pub(super) dir: PathBuf,
    pub(super) building: PathBuf,
    secret: [u8; SECRET_LEN],
    tags: Mutex<std::collections::HashMap<PathBuf, (std::time::SystemTime, String)>>,
}

impl Store {
    /// The store under `layers`, its secret read from (or made in) `key_file`.
    pub(super) fn new(layers: &Path, key_file: &Path) -> std::io::Result<Self> {
        let dir = layers.join("shared");
        let building = layers.join("building");
        super::own_dir(&dir, 0o711, None)?;
        super::own_dir(&building, 0o711, None)?;
        // What an earlier server left half built (old enough that no installation of
        // another server sharing this cache can still be filling it).
        if let Ok(rd) = std::fs::read_dir(&building) {
            for e in rd.flatten() {
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
        Ok(Self {
            dir,
            building,
            secret: secret(key_file)?,
            tags: Mutex::default(),
        })
    }

    /// The key of the set `pins` (`name==version`) for the interpreter tagged `tag` and the
    /// index `index`.
    pub(super) fn key(&self, pins: &[String], index: &str, tag: &str) -> String {
        let mut pins: Vec<String> = pins
            .iter()
            .map(|p| match p.split_once("==") {
                Some((name, version)) => {
                    format!(
                        "{}=={}",
                        super::spec::normalize_python(name),
                        version.trim()
                    )
                }
                None => p.clone(),
            })
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

    /// The interpreter `python`'s version, ABI and platform (`cpython-311 linux-x86_64 ""`),
    /// asked once per program (again when it changes on disk); None when it will not say.
    pub(super) async fn tag(&self, python: &Path) -> Option<String> {
        let changed = std::fs::metadata(python).and_then(|m| m.modified()).ok()?;
        if let Some((at, tag)) = self
            .tags
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(python)
            && *at == changed
        {
            return Some(tag.clone());
        }
        // The operator's interpreter, isolated (no site, no user paths, no environment).
        let out = tokio::time::timeout(
            std::time::Duration::from_secs(20),
            tokio::process::Command::new(python)
                .args([
                    "-I",
                    "-S",
                    "-c",
                    "import sys, sysconfig; print(sys.implementation.cache_tag, \
                     sysconfig.get_platform(), repr(getattr(sys, 'abiflags', '')), \
                     sys.version.split()[0])",
                ])
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
            .insert(python.to_path_buf(), (changed, tag.clone()));
        Some(tag)
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

/// Remove the layer `key` from the store `store` (unheld: see eviction): out of the store
/// at once (renamed beside it, into `building/`), then its files. Whether it was there.
pub(super) fn remove(store: &Path, key: &str) -> bool {
    let from = store.join(key);
    let Some(layers) = store.parent() else {
        return false;
    };
    let to = layers
        .join("building")
        .join(format!("gone-{}", uuid::Uuid::new_v4().simple()));
    // Writable by its owner for the move (see `publish`).
    if set_mode(&from, 0o755).is_err() || std::fs::rename(&from, &to).is_err() {
        return false;
    }
    remove_sealed(&to);
    true
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

/// Remove a sealed (or half-built) tree: its directories made writable again by their
/// owner (the server, when it is not root, needs it), then removed.
pub(super) fn remove_sealed(top: &Path) {
    let mut stack = vec![top.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if !m.is_dir() {
            continue;
        }
        let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755));
        if let Ok(rd) = std::fs::read_dir(&p) {
            stack.extend(rd.flatten().map(|e| e.path()));
        }
    }
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
        let k = s.key(&pins(&["six==1.17.0", "iniconfig==2.0.0"]), "ix", "t");
        assert_eq!(k.len(), 40);
        assert_eq!(
            k,
            s.key(&pins(&["iniconfig==2.0.0", "Six==1.17.0"]), "ix", "t")
        );
        assert_ne!(k, s.key(&pins(&["six==1.17.0"]), "ix", "t"));
        assert_ne!(
            k,
            s.key(&pins(&["six==1.17.0", "iniconfig==2.0.0"]), "iy", "t")
        );
        assert_ne!(
            k,
            s.key(&pins(&["six==1.17.0", "iniconfig==2.0.0"]), "ix", "u")
        );
        // The same secret after a restart; another cache's differs.
        let again = Store::new(&dir.join("layers"), &dir.join("shared.key")).unwrap();
        assert_eq!(
            k,
            again.key(&pins(&["six==1.17.0", "iniconfig==2.0.0"]), "ix", "t")
        );
        std::fs::remove_file(dir.join("shared.key")).unwrap();
        let other = Store::new(&dir.join("layers"), &dir.join("shared.key")).unwrap();
        assert_ne!(
            k,
            other.key(&pins(&["six==1.17.0", "iniconfig==2.0.0"]), "ix", "t")
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
}
