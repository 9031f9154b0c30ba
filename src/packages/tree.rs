//! The package cache's tree on disk (drawn in the module's documentation): where it is, its
//! directories made at the server's start with their owners and modes, and the one way a
//! directory of it is made (`own_dir`: its owner and mode set whatever was there).

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::Flags;

/// The cache's root for `flags`, made (0711) if missing; None when the default one cannot
/// be had (the operator's own must: its failure is an error). The installer's proxy
/// socket lies beneath it (`egress/NAME.sock`): a path the kernel cannot bind would fail
/// every installation, so it is checked now.
pub(super) fn place(flags: &Flags) -> anyhow::Result<Option<PathBuf>> {
    let root = flags.package_cache.clone().unwrap_or_else(default_cache);
    let egress_dir = root.join("egress");
    if egress_dir.as_os_str().len() > crate::egress::SOCKET_DIR_MAX {
        let why = format!(
            "the package cache {} is too long a path ({} bytes): the installer's proxy \
             socket beneath it (DIR/egress/NAME.sock) must fit the Unix socket path \
             limit of {} bytes, so the cache's path may have at most {} bytes; name a \
             shorter one with --package-cache DIR",
            root.display(),
            root.as_os_str().len(),
            crate::egress::SOCKET_PATH_MAX,
            crate::egress::SOCKET_DIR_MAX - "/egress".len(),
        );
        if flags.package_cache.is_some() {
            anyhow::bail!(why);
        }
        tracing::warn!("packages on demand are off: {why}");
        return Ok(None);
    }
    if let Err(e) = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(&root)
    {
        // The operator's own directory must work; the default one is a convenience: a
        // server that cannot make it (a home it may not write) serves without packages.
        if flags.package_cache.is_some() {
            return Err(error(&root, "cannot create it", e));
        }
        tracing::warn!(
            "packages on demand are off: the default package cache {} cannot be \
             created ({e}); name one with --package-cache DIR",
            root.display()
        );
        return Ok(None);
    }
    set_mode(&root, 0o711).map_err(|e| error(&root, "cannot set its mode", e))?;
    Ok(Some(root))
}

/// The caches (the installer's, `installer` when the server is root) and the directories
/// of layers and installers' homes, beneath `root`.
pub(super) fn make(root: &Path, installer: Option<u32>) -> anyhow::Result<()> {
    own_dir(&root.join("uv"), 0o700, installer).map_err(|e| error(root, "uv", e))?;
    own_dir(&root.join("npm"), 0o700, installer).map_err(|e| error(root, "npm", e))?;
    for d in ["layers", "tmp"] {
        own_dir(&root.join(d), 0o711, None).map_err(|e| error(root, d, e))?;
    }
    Ok(())
}

/// Why `what` of the cache at `root` could not be had, for the operator.
pub(super) fn error(root: &Path, what: &str, e: std::io::Error) -> anyhow::Error {
    anyhow::anyhow!("package cache {}: {what}: {e}", root.display())
}

/// A directory of `mode` owned by `uid` (the server's own when None), made if missing.
pub(super) fn own_dir(dir: &Path, mode: u32, uid: Option<u32>) -> std::io::Result<()> {
    match std::fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(std::io::Error::other("not a directory"));
    }
    let id = uid.unwrap_or_else(|| nix::unistd::geteuid().as_raw());
    std::os::unix::fs::lchown(dir, Some(id), Some(id))?;
    set_mode(dir, mode)
}

fn set_mode(dir: &Path, mode: u32) -> std::io::Result<()> {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
}

/// The cache's place when the operator names none: the system's as root, else the user's.
fn default_cache() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/var/cache/replbox/packages");
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("replbox/packages")
}
