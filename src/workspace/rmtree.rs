//! Removing a tree user code shaped: any depth, any width, links, FIFOs, other
//! filesystems. Iterative, with a bounded stack and at most four descriptors whatever the
//! depth (a chain of 20,000 directories overflowed a thread's stack in std's recursive
//! removal, which also needs a descriptor per level). It descends by handle, holding only
//! the names and identities of the directories above; it goes up through `..`, checking
//! that it arrives at the directory it came from (or it stops, leaving the rest); it never
//! follows a link, and does not enter another filesystem. A directory whose mode shuts out
//! its owner (user code that owns its tree may chmod it 0) is given its owner's rights back
//! first, by handle.

use std::collections::HashSet;
use std::ffi::{CStr, CString};
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;

use super::DirId;

/// Remove the tree at `path` (a directory or anything else), logging what it could not.
pub fn remove_tree(path: &Path) {
    match remove_tree_iter(path) {
        Ok(0) => {}
        Ok(left) => tracing::warn!(
            "{left} entries under {} could not be removed and were left",
            path.display()
        ),
        // Already gone (removed by whoever raced it, or never made): nothing to report.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!("{} was not removed completely: {e}", path.display()),
    }
}

/// Subdirectories one scan of a directory notes for removal; more are found by scanning it
/// again once those are gone. Bounds the names held per level.
const PENDING_PER_SCAN: usize = 64;

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// One directory on the way from the top of the removal to the one being emptied.
struct Level {
    /// Its name in its parent.
    name: CString,
    /// Its identity: going back up through `..` must arrive here.
    id: DirId,
    /// Subdirectories noted by the last scan, still to be removed.
    pending: Vec<CString>,
    /// Entries that could not be removed (not scanned for again).
    kept: HashSet<CString>,
}

impl Level {
    fn new(name: CString, id: DirId) -> Self {
        Self {
            name,
            id,
            pending: Vec::new(),
            kept: HashSet::new(),
        }
    }

    /// Note that `name` stays (counted in `left`).
    fn keep(&mut self, name: CString, left: &mut usize) {
        self.kept.insert(name);
        *left += 1;
    }
}

/// The directory `name` beneath `at`, not through a link, with its identity and device.
fn open_checked(at: &OwnedFd, name: &CStr) -> Result<(OwnedFd, DirId, u64), Errno> {
    let fd = rustix::fs::openat(at, name, DIR_FLAGS, Mode::empty())?;
    let st = rustix::fs::fstat(&fd)?;
    Ok((fd, DirId::from_stat(&st), st.st_dev))
}

/// The directory `name` beneath `at`, opened as [`open_checked`] does; its owner's read,
/// write and search rights given back first when its mode (or its parent's) keeps them
/// out, so that it can be read and emptied; only on the filesystem `on` when given (what
/// lies on another is left alone). As root this changes nothing: root is not kept out by
/// modes.
fn open_owned(at: &OwnedFd, name: &CStr, on: Option<u64>) -> Result<(OwnedFd, DirId, u64), Errno> {
    let (fd, id, dev) = match open_checked(at, name) {
        Err(Errno::ACCESS) => {
            grant_owner(at, name, on)?;
            open_checked(at, name)?
        }
        r => r?,
    };
    let st = rustix::fs::fstat(&fd)?;
    if st.st_mode & 0o700 != 0o700 && on.is_none_or(|d| d == dev) {
        // Where it is not ours, the kernel refuses; removing then fails as it would have.
        let _ = rustix::fs::fchmod(&fd, Mode::from_raw_mode((st.st_mode & 0o7777) | 0o700));
    }
    Ok((fd, id, dev))
}

/// Give the directory `name` beneath `at` its owner's rights (read, write, search), no link
/// followed: a handle that needs no right on it (O_PATH), checked to be a directory, then
/// its mode changed through that handle (`/proc/self/fd/N` names that very inode).
fn grant_owner(at: &OwnedFd, name: &CStr, on: Option<u64>) -> Result<(), Errno> {
    use std::os::fd::AsRawFd;
    let fd = rustix::fs::openat(
        at,
        name,
        OFlags::PATH
            .union(OFlags::DIRECTORY)
            .union(OFlags::NOFOLLOW)
            .union(OFlags::CLOEXEC),
        Mode::empty(),
    )?;
    let st = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory
        || on.is_some_and(|d| d != st.st_dev)
    {
        return Err(Errno::ACCESS);
    }
    rustix::fs::chmod(
        format!("/proc/self/fd/{}", fd.as_raw_fd()).as_str(),
        Mode::from_raw_mode((st.st_mode & 0o7777) | 0o700),
    )
}

/// Remove the tree at `path`; returns the number of entries it left.
fn remove_tree_iter(path: &Path) -> std::io::Result<usize> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(std::io::Error::other("not a removable path"));
    };
    let name = CString::new(std::os::unix::ffi::OsStrExt::as_bytes(name))?;
    let base = rustix::fs::open(parent, DIR_FLAGS, Mode::empty())?;
    let top = match rustix::fs::statat(&base, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
        Err(Errno::NOENT) => return Ok(0),
        r => r?,
    };
    if FileType::from_raw_mode(top.st_mode) != FileType::Directory {
        rustix::fs::unlinkat(&base, name.as_c_str(), AtFlags::empty())?;
        return Ok(0);
    }
    let (cur, id, dev) = open_owned(&base, &name, None)?;
    if id != DirId::from_stat(&top) {
        return Err(std::io::Error::other("replaced while it was opened"));
    }
    Removal {
        path,
        dev,
        base,
        cur,
        stack: vec![Level::new(name, id)],
        left: 0,
    }
    .run()
}

/// A removal under way.
struct Removal<'a> {
    /// For messages.
    path: &'a Path,
    /// The tree's filesystem: nothing on another is entered.
    dev: u64,
    /// The directory holding the top of the tree.
    base: OwnedFd,
    /// The directory being emptied (the last of `stack`).
    cur: OwnedFd,
    stack: Vec<Level>,
    left: usize,
}

impl Removal<'_> {
    fn run(mut self) -> std::io::Result<usize> {
        loop {
            let Some(level) = self.stack.last_mut() else {
                return Ok(self.left);
            };
            if let Some(sub) = level.pending.pop() {
                self.descend(sub);
                continue;
            }
            self.scan()?;
            if self.stack.last().is_some_and(|l| !l.pending.is_empty()) {
                continue;
            }
            if !self.ascend()? {
                return Ok(self.left);
            }
        }
    }

    /// Go down into the subdirectory `sub` of the current one (noted by a scan).
    fn descend(&mut self, sub: CString) {
        let Some(level) = self.stack.last_mut() else {
            return;
        };
        match open_owned(&self.cur, &sub, Some(self.dev)) {
            Ok((child, id, dev)) if dev == self.dev => {
                self.cur = child;
                self.stack.push(Level::new(sub, id));
            }
            Ok(_) => {
                tracing::warn!(
                    "not removing {sub:?} under {}: another filesystem is mounted there",
                    self.path.display()
                );
                level.keep(sub, &mut self.left);
            }
            Err(Errno::NOENT) => {}
            Err(e) => {
                tracing::debug!("cannot enter {sub:?} under {}: {e}", self.path.display());
                level.keep(sub, &mut self.left);
            }
        }
    }

    /// Read the current directory once: remove what is not a directory, note up to
    /// PENDING_PER_SCAN subdirectories.
    fn scan(&mut self) -> std::io::Result<()> {
        let Some(level) = self.stack.last_mut() else {
            return Ok(());
        };
        let here = &self.cur;
        let mut dir = Dir::read_from(here)?;
        while let Some(entry) = dir.read() {
            let entry = entry?;
            let n = entry.file_name();
            if n == c"." || n == c".." || level.kept.contains(n) {
                continue;
            }
            let mut kind = entry.file_type();
            if kind == FileType::Unknown {
                kind = match rustix::fs::statat(here, n, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) => FileType::from_raw_mode(st.st_mode),
                    Err(_) => continue,
                };
            }
            let full = level.pending.len() >= PENDING_PER_SCAN;
            if kind == FileType::Directory {
                if !full {
                    level.pending.push(n.to_owned());
                }
                continue;
            }
            match rustix::fs::unlinkat(here, n, AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => {}
                // A directory after all (swapped in since it was read): enter it later, or
                // find it again in the next scan (there is one when pending is full).
                Err(Errno::ISDIR) => {
                    if !full {
                        level.pending.push(n.to_owned());
                    }
                }
                Err(e) => {
                    tracing::debug!("cannot remove {n:?} under {}: {e}", self.path.display());
                    level.keep(n.to_owned(), &mut self.left);
                }
            }
        }
        Ok(())
    }

    /// The current directory is empty but for what was kept: remove it from its parent and
    /// go on there. False when that was the top.
    fn ascend(&mut self) -> std::io::Result<bool> {
        let Some(done) = self.stack.pop() else {
            return Ok(false);
        };
        let (parent_fd, parent) = match self.stack.last_mut() {
            None => (self.base.try_clone()?, None),
            Some(p) => {
                let (up, id, _) = open_checked(&self.cur, c"..")?;
                if id != p.id {
                    return Err(std::io::Error::other(format!(
                        "a directory was moved while it was removed; {} entries and what lies \
above the moved one were left",
                        self.left + 1
                    )));
                }
                (up, Some(p))
            }
        };
        if done.kept.is_empty() {
            match rustix::fs::unlinkat(&parent_fd, done.name.as_c_str(), AtFlags::REMOVEDIR) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => {
                    tracing::debug!("cannot remove {:?}: {e}", done.name);
                    self.left += 1;
                    if let Some(p) = parent {
                        p.kept.insert(done.name);
                    }
                }
            }
        } else if let Some(p) = parent {
            p.kept.insert(done.name);
        }
        self.cur = parent_fd;
        Ok(!self.stack.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree its owner (not root) shut itself out of: directories of mode 0 and 0500, a
    /// link to a directory of someone else's of mode 0. Removed as that owner (a thread
    /// with its fsuid, so without root's rights over modes), whole; the link's target is
    /// left as it was.
    #[test]
    fn a_tree_chmodded_shut_by_its_owner_is_removed() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        if !rustix::process::geteuid().is_root() {
            eprintln!("SKIP: a_tree_chmodded_shut_by_its_owner_is_removed needs root");
            return;
        }
        let parent = tempfile::tempdir().unwrap();
        let (top, outside) = (parent.path().join("top"), parent.path().join("outside"));
        std::fs::create_dir_all(top.join("shut/deeper/x")).unwrap();
        std::fs::write(top.join("shut/deeper/f"), "f").unwrap();
        std::fs::create_dir_all(top.join("readonly")).unwrap();
        std::fs::write(top.join("readonly/f"), "f").unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, top.join("link")).unwrap();
        let owner = 65_534;
        for p in [
            parent.path(),
            &top,
            &top.join("shut"),
            &top.join("shut/deeper"),
            &top.join("shut/deeper/x"),
            &top.join("shut/deeper/f"),
            &top.join("readonly"),
            &top.join("readonly/f"),
        ] {
            std::os::unix::fs::lchown(p, Some(owner), Some(owner)).unwrap();
        }
        let mode = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        mode(&outside, 0o000);
        mode(&top.join("shut/deeper"), 0o000);
        mode(&top.join("shut"), 0o000);
        mode(&top.join("readonly"), 0o500);
        mode(&top, 0o500);
        let t = top.clone();
        let left = std::thread::spawn(move || {
            // This thread only: its fsuid the owner's (which drops root's rights over modes).
            nix::unistd::setfsgid(nix::unistd::Gid::from_raw(owner));
            nix::unistd::setfsuid(nix::unistd::Uid::from_raw(owner));
            remove_tree_iter(&t)
        })
        .join()
        .unwrap()
        .unwrap();
        assert_eq!(left, 0);
        assert!(!top.exists());
        let m = std::fs::metadata(&outside).unwrap();
        assert_eq!((m.mode() & 0o7777, m.uid()), (0, 0));
    }

    #[test]
    fn a_deep_tree_is_removed_with_a_small_stack() {
        // On a tmpfs where there is one: a disk makes 20,000 directories slowly.
        let parent = tempfile::tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .unwrap();
        let top = parent.path().join("top");
        // 20,000 levels, siblings on the way (files, links, a FIFO, directories), built
        // relative to a handle: the path is far longer than PATH_MAX.
        let mut fd = rustix::fs::open(
            parent.path(),
            rustix::fs::OFlags::PATH,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        for (i, name) in std::iter::once("top")
            .chain(std::iter::repeat_n("d", 20_000))
            .enumerate()
        {
            rustix::fs::mkdirat(&fd, name, rustix::fs::Mode::from_raw_mode(0o700)).unwrap();
            if i % 1000 == 0 {
                rustix::fs::symlinkat("/etc", &fd, "link").unwrap();
                rustix::fs::openat(
                    &fd,
                    "file",
                    rustix::fs::OFlags::CREATE | rustix::fs::OFlags::WRONLY,
                    rustix::fs::Mode::from_raw_mode(0o600),
                )
                .unwrap();
                rustix::fs::mkdirat(&fd, "sib", rustix::fs::Mode::from_raw_mode(0o700)).ok();
                rustix::fs::mknodat(
                    &fd,
                    "fifo",
                    rustix::fs::FileType::Fifo,
                    rustix::fs::Mode::from_raw_mode(0o600),
                    0,
                )
                .unwrap();
            }
            fd = rustix::fs::openat(
                &fd,
                name,
                rustix::fs::OFlags::PATH,
                rustix::fs::Mode::empty(),
            )
            .unwrap();
        }
        drop(fd);
        // A wide level too: more subdirectories than one scan notes.
        for i in 0..(3 * PENDING_PER_SCAN) {
            std::fs::create_dir_all(top.join(format!("w{i}/x"))).unwrap();
        }
        let t = top.clone();
        // A 64 KiB stack: the recursive removal needs a frame (and a descriptor) per level.
        std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(move || assert_eq!(remove_tree_iter(&t).unwrap(), 0))
            .unwrap()
            .join()
            .unwrap();
        assert!(!top.exists());
        assert!(
            std::path::Path::new("/etc/passwd").exists(),
            "no link was followed"
        );
    }
}
