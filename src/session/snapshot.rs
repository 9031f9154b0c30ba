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
    let mut snap = Snapshot {
        files: BTreeMap::new(),
        complete: true,
    };
    let walk = Walk {
        same_mount: true,
        forbidden: skip.to_vec(),
        into_workspaces: false,
    };
    let Ok(top) = hostfs::open_dir_beneath(root, &walk) else {
        return snap;
    };
    let mut seen = 0usize;
    // Directories still to list, by name in their parent: a directory's handle lives as long
    // as some of its subdirectories are still to list, so the handles open at once are those
    // on one path down (MAX_DEPTH), however wide the tree (one handle per noted directory
    // ran the server out of descriptors).
    let mut stack: ToList = Vec::new();
    let mut next: Option<(OwnedFd, String, usize)> = Some((top, String::new(), 0));
    loop {
        let (dir, prefix, depth) = match next.take() {
            Some(d) => d,
            None => {
                let Some((parent, name, rel, depth)) = stack.pop() else {
                    break;
                };
                match hostfs::open_subdir(parent.as_fd(), &name, &walk) {
                    Ok(sub) => (sub, rel, depth),
                    Err(_) => continue, // a link, gone, forbidden or unreadable: not listed
                }
            }
        };
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
                return snap;
            }
            let Ok(name) = std::str::from_utf8(name) else {
                continue; // not UTF-8: cannot be named in a URI or JSON faithfully
            };
            if name.starts_with('.') {
                continue;
            }
            let rel = if prefix.is_empty() {
                name.to_string()
            } else {
                format!("{prefix}/{name}")
            };
            note(&dir, name, rel, depth, &mut snap, &mut stack);
        }
    }
    snap
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
        FileType::Directory if depth + 1 < MAX_DEPTH && !SKIP_DIRS.contains(&name) => {
            stack.push((dir.clone(), name.to_string(), rel, depth + 1));
        }
        FileType::RegularFile => {
            // The stat fields' types differ by architecture.
            #[allow(clippy::unnecessary_cast)]
            snap.files.insert(
                rel,
                Stamp {
                    size: st.st_size as u64,
                    mtime_s: st.st_mtime as i64,
                    mtime_ns: st.st_mtime_nsec as i64,
                    ino: st.st_ino,
                },
            );
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
