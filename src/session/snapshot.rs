//! A snapshot of a session's directory: (size, mtime, inode) of each regular file under it.
//! The walk is bounded (entries looked at, depth, descriptors), does not follow symbolic
//! links, does not enter hidden directories (`.cache`, `.git`, ... — HOME is the session's
//! directory, so tools keep their caches there) or `__pycache__`/`node_modules`, and leaves
//! hidden files out.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::rc::Rc;

use rustix::fs::{AtFlags, FileType};

use crate::hostfs::{self, Walk};
use crate::workspace::DirId;

/// What is recorded of one file: a change in any of these is a modification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub size: u64,
    mtime_s: i64,
    mtime_ns: i64,
    ino: u64,
}

/// The regular files under a directory, by path relative to it (`/`-separated).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub files: BTreeMap<String, Stamp>,
    /// False when the walk stopped at the entry limit: the listing is partial.
    pub complete: bool,
}

/// Directories never entered (besides hidden ones): caches that tools write by themselves.
const SKIP_DIRS: &[&str] = &["__pycache__", "node_modules"];
/// Depth below which the walk does not go.
const MAX_DEPTH: usize = 32;

/// Walk the directory `root` (a handle, as the calling thread's user: run it through
/// [`as_uid`](crate::hostfs::as_uid)), looking at no more than `max_entries` entries, following
/// no link, staying on its filesystem, not entering the directories in `skip` (the server's
/// workspace, should a caller's cwd contain it), any replbox workspace, or what that user may
/// not read.
pub fn snapshot(root: BorrowedFd<'_>, max_entries: usize, skip: &[DirId]) -> Snapshot {
    snapshot_with(root, max_entries, skip, &mut |_, _, _| {})
}

/// [`snapshot`], calling `enter(dir, path, depth)` on each directory before reading it.
pub(super) fn snapshot_with(
    root: BorrowedFd<'_>,
    max_entries: usize,
    skip: &[DirId],
    enter: &mut dyn FnMut(BorrowedFd<'_>, &str, usize),
) -> Snapshot {
    let mut snap = Snapshot {
        files: BTreeMap::new(),
        complete: true,
    };
    let walk = walk_of(skip);
    if let Ok(top) = hostfs::open_dir_beneath(root, &walk) {
        walk_into(top, String::new(), 0, &walk, max_entries, &mut snap, enter);
    }
    snap
}

/// How a session's directory is walked: on its filesystem, around `skip` and workspaces.
pub(super) fn walk_of(skip: &[DirId]) -> Walk {
    Walk {
        same_mount: true,
        forbidden: skip.to_vec(),
        into_workspaces: false,
    }
}

/// Whether the walk enters a directory named `name` whose entries would sit at `depth`.
pub(super) fn enters(name: &str, depth: usize) -> bool {
    depth < MAX_DEPTH && !name.starts_with('.') && !SKIP_DIRS.contains(&name)
}

/// Add the files under the directory `top` (at `prefix`, `depth` levels down) to `snap`,
/// looking at no more than `max_entries` entries (else `snap.complete` is false).
pub(super) fn walk_into(
    top: OwnedFd,
    prefix: String,
    depth: usize,
    walk: &Walk,
    max_entries: usize,
    snap: &mut Snapshot,
    enter: &mut dyn FnMut(BorrowedFd<'_>, &str, usize),
) {
    let mut seen = 0usize;
    // Directories still to list, by name in their parent: a directory's handle lives as long
    // as some of its subdirectories are still to list, so the handles open at once are those
    // on one path down (MAX_DEPTH), however wide the tree (one handle per noted directory
    // ran the server out of descriptors).
    let mut stack: ToList = Vec::new();
    let mut next: Option<(OwnedFd, String, usize)> = Some((top, prefix, depth));
    loop {
        let (dir, prefix, depth) = match next.take() {
            Some(d) => d,
            None => {
                let Some((parent, name, rel, depth)) = stack.pop() else {
                    break;
                };
                match hostfs::open_subdir(parent.as_fd(), &name, walk) {
                    Ok(sub) => (sub, rel, depth),
                    Err(_) => continue, // a link, gone, forbidden or unreadable: not listed
                }
            }
        };
        // Before reading it, so that nothing created meanwhile escapes a watch.
        enter(dir.as_fd(), &prefix, depth);
        let dir = Rc::new(dir);
        let Ok(mut rd) = rustix::fs::Dir::read_from(&*dir) else {
            continue; // unreadable or gone meanwhile: nothing to list there
        };
        while let Some(Ok(entry)) = rd.read() {
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            seen += 1;
            if seen > max_entries {
                snap.complete = false;
                return;
            }
            let Ok(name) = std::str::from_utf8(name) else {
                continue; // not UTF-8: cannot be named in a URI or JSON faithfully
            };
            if name.starts_with('.') {
                continue;
            }
            note(&dir, name, join(&prefix, name), depth, snap, &mut stack);
        }
    }
}

/// `prefix/name`, or `name` at the top.
pub(super) fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}/{name}")
    }
}

impl Stamp {
    pub(super) fn of(st: &rustix::fs::Stat) -> Self {
        // The stat fields' types differ by architecture.
        #[allow(clippy::unnecessary_cast)]
        Stamp {
            size: st.st_size as u64,
            mtime_s: st.st_mtime as i64,
            mtime_ns: st.st_mtime_nsec as i64,
            ino: st.st_ino,
        }
    }
}

/// Directories still to list: (the parent's handle, the name in it, the path relative to
/// the top, the depth).
type ToList = Vec<(Rc<OwnedFd>, String, String, usize)>;

/// Record the entry `name` of `dir` (at `rel`): a regular file in the snapshot, a directory
/// to list later (within the depth bound), nothing else.
fn note(
    dir: &Rc<OwnedFd>,
    name: &str,
    rel: String,
    depth: usize,
    snap: &mut Snapshot,
    stack: &mut ToList,
) {
    // lstat: a link is neither a directory nor a file here.
    let Ok(st) = rustix::fs::statat(&**dir, name, AtFlags::SYMLINK_NOFOLLOW) else {
        return;
    };
    match FileType::from_raw_mode(st.st_mode) {
        FileType::Directory if enters(name, depth + 1) => {
            stack.push((dir.clone(), name.to_string(), rel, depth + 1));
        }
        FileType::RegularFile => {
            snap.files.insert(rel, Stamp::of(&st));
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wide_tree_is_listed_with_few_descriptors() {
        // More subdirectories (each with a file) than this process may open descriptors:
        // a walk holding a handle per directory still to list misses some.
        let (soft, _) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
        let n = (soft as usize).min(65_536) + 64;
        let d = tempfile::tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .unwrap();
        for i in 0..n {
            std::fs::create_dir(d.path().join(format!("d{i}"))).unwrap();
            std::fs::write(d.path().join(format!("d{i}/f")), "x").unwrap();
        }
        let fd = hostfs::open_dir_path(&std::fs::canonicalize(d.path()).unwrap()).unwrap();
        let snap = snapshot(fd.as_fd(), 2 * n + 1, &[]);
        assert!(snap.complete);
        assert_eq!(snap.files.len(), n);
    }
}
