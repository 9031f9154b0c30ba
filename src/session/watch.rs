//! Change tracking of a session's directory between evaluations: a snapshot, kept current
//! by inotify when the directory is big enough for a walk at every evaluation to cost
//! (about 6 µs an entry), else by that walk.
//!
//! The watches are added as the session's uid (the thread that runs this holds its
//! filesystem credentials: a directory it may not read gets no watch), on directories the
//! walk opened beneath the session's directory without following links (by their
//! `/proc/self/fd` handle, so no path is resolved twice). After an evaluation only the
//! names the events carry are looked at again, with `lstat` in their directory opened the
//! same way. Whatever the events cannot say for sure falls back to the full walk: a queue
//! overflow, a directory renamed (its watches' paths would be stale), more events than
//! [`MAX_EVENTS`], a watch the kernel refuses (out of watches). The walk's bounds hold
//! for the watched tree too: no more files and folders than `--max-tracked-files`, the
//! same depth and the same directories left out.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::fs::{AtFlags, FileType};
use rustix::io::Errno;

use super::files::{self, Change, FileChange, Snapshot, Stamp};
use crate::hostfs::{self, Walk};
use crate::workspace::DirId;

/// Directories with fewer tracked entries are walked: a watch would save little.
const WATCH_FROM: usize = 200;
/// Sessions watched at once. inotify instances count against the server's user (128 by
/// default, shared with every other program of that user), so only this many are taken.
const MAX_WATCHED: usize = 16;
/// Events read at one evaluation's end; past them the walk is cheaper and surer.
const MAX_EVENTS: usize = 16 * 1024;

static WATCHED: AtomicUsize = AtomicUsize::new(0);

/// One of the [`MAX_WATCHED`] inotify instances.
struct Slot;

impl Slot {
    fn take() -> Option<Slot> {
        WATCHED
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_WATCHED).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        WATCHED.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A session's directory as the previous evaluation left it.
pub struct Tracked {
    pub snap: Snapshot,
    watch: Option<Watch>,
}

struct Watch {
    fd: OwnedFd,
    /// Watch descriptor -> the directory's path (relative, `""` the top) and inode.
    dirs: HashMap<i32, (String, u64)>,
    /// The other way round.
    by_path: BTreeMap<String, i32>,
    /// A watch was refused: the tree is not fully covered.
    broken: bool,
    _slot: Slot,
}

const MASK: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::DELETE)
    .union(WatchFlags::MODIFY)
    .union(WatchFlags::ATTRIB)
    .union(WatchFlags::CLOSE_WRITE)
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::MOVE_SELF)
    .union(WatchFlags::ONLYDIR)
    .union(WatchFlags::EXCL_UNLINK);

impl Watch {
    fn new() -> Option<Watch> {
        let slot = Slot::take()?;
        let fd = inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC).ok()?;
        Some(Watch {
            fd,
            dirs: HashMap::new(),
            by_path: BTreeMap::new(),
            broken: false,
            _slot: slot,
        })
    }

    /// Watch the directory `dir` (at `path`), before the walk reads it.
    fn add(&mut self, dir: BorrowedFd<'_>, path: &str) {
        if self.broken {
            return;
        }
        let Ok(st) = rustix::fs::fstat(dir) else {
            self.broken = true;
            return;
        };
        // The handle's own directory: the magic link leads to the open file, not to a path.
        let proc_path = format!("/proc/self/fd/{}", dir.as_raw_fd());
        match inotify::add_watch(&self.fd, proc_path.as_str(), MASK) {
            Ok(wd) => {
                if let Some((old, _)) = self.dirs.insert(wd, (path.to_string(), st.st_ino)) {
                    // The same directory under two paths: only a rename does that.
                    self.by_path.remove(&old);
                    self.broken = true;
                }
                self.by_path.insert(path.to_string(), wd);
            }
            // The walk opened it for reading, so this is the kernel's limit (or a bug):
            // the tree is not covered.
            Err(_) => self.broken = true,
        }
    }

    /// Forget the directories at `path` and below.
    fn drop_dirs(&mut self, path: &str) {
        let below: Vec<String> = subtree(&self.by_path, path).cloned().collect();
        for p in below {
            if let Some(wd) = self.by_path.remove(&p) {
                self.dirs.remove(&wd);
                // Already gone with its directory, if it was deleted.
                let _ = inotify::remove_watch(&self.fd, wd);
            }
        }
    }

    /// The names in watched directories that events were about, or None when only a walk
    /// can tell what changed.
    fn drain(&mut self) -> Option<BTreeSet<(i32, String)>> {
        let mut touched = BTreeSet::new();
        let mut buf = [MaybeUninit::<u8>::uninit(); 16 * 1024];
        let mut reader = inotify::Reader::new(&self.fd, &mut buf);
        let mut count = 0usize;
        loop {
            let ev = match reader.next() {
                Ok(ev) => ev,
                Err(Errno::AGAIN) => return Some(touched),
                Err(Errno::INTR) => continue,
                Err(_) => return None,
            };
            count += 1;
            let flags = ev.events();
            if count > MAX_EVENTS
                || flags.contains(ReadFlags::QUEUE_OVERFLOW)
                || flags.contains(ReadFlags::MOVE_SELF)
                || (flags.contains(ReadFlags::ISDIR)
                    && flags.intersects(ReadFlags::MOVED_FROM | ReadFlags::MOVED_TO))
            {
                return None;
            }
            if flags.contains(ReadFlags::IGNORED) {
                // The directory is gone (its parent's event says so) or unmounted.
                if let Some((path, _)) = self.dirs.remove(&ev.wd()) {
                    self.by_path.remove(&path);
                }
                continue;
            }
            let Some(name) = ev.file_name().and_then(|n| n.to_str().ok()) else {
                continue; // about the directory itself, or a name the walk skips
            };
            if name.starts_with('.') {
                continue;
            }
            touched.insert((ev.wd(), name.to_string()));
        }
    }
}

/// The keys of `map` at `path` and below it.
fn subtree<'a, V>(map: &'a BTreeMap<String, V>, path: &'a str) -> impl Iterator<Item = &'a String> {
    let at = map.get_key_value(path).map(|(k, _)| k);
    let below = if path.is_empty() {
        None
    } else {
        let prefix = format!("{path}/");
        Some(
            map.range(prefix.clone()..)
                .take_while(move |(k, _)| k.starts_with(&prefix))
                .map(|(k, _)| k),
        )
    };
    at.into_iter().chain(below.into_iter().flatten())
}

/// Open the directory `path` (relative, `/`-separated) beneath `root`, link by link refused.
fn open_rel(root: BorrowedFd<'_>, path: &str, walk: &Walk) -> Option<OwnedFd> {
    let mut dir = hostfs::open_dir_beneath(root, walk).ok()?;
    if !path.is_empty() {
        for part in path.split('/') {
            dir = hostfs::open_subdir(dir.as_fd(), part, walk).ok()?;
        }
    }
    Some(dir)
}

impl Tracked {
    /// Walk `root` (as the session's uid); None when it has more than `max_entries`
    /// entries (too big to track).
    pub fn start(root: BorrowedFd<'_>, max_entries: usize, skip: &[DirId]) -> Option<Tracked> {
        let snap = files::snapshot(root, max_entries, skip);
        if !snap.complete {
            return None;
        }
        let mut me = Tracked { snap, watch: None };
        if me.snap.files.len() >= WATCH_FROM {
            // Walked again under the watch, so nothing changed in between is missed.
            me.walk(root, max_entries, skip, true);
            if !me.snap.complete {
                return None;
            }
        }
        Some(me)
    }

    /// What changed since the last call (or the start), in path order; None when the
    /// directory outgrew `max_entries` (tracking ends).
    pub fn refresh(
        &mut self,
        root: BorrowedFd<'_>,
        max_entries: usize,
        skip: &[DirId],
        session_id: &str,
    ) -> Option<Vec<FileChange>> {
        if let Some(before) = self.apply_events(root, max_entries, skip) {
            return self
                .snap
                .complete
                .then(|| changes(session_id, &before, &self.snap));
        }
        let old = std::mem::take(&mut self.snap);
        self.walk(root, max_entries, skip, old.files.len() >= WATCH_FROM);
        self.snap
            .complete
            .then(|| files::diff(session_id, &old, &self.snap))
    }

    /// A full walk, watching the tree when it is big enough.
    fn walk(&mut self, root: BorrowedFd<'_>, max_entries: usize, skip: &[DirId], watched: bool) {
        // The old watch first, so its slot is free again.
        self.watch = None;
        let mut watch = if watched { Watch::new() } else { None };
        self.snap = match &mut watch {
            Some(w) => files::snapshot_with(root, max_entries, skip, &mut |dir, path, _| {
                w.add(dir, path)
            }),
            None => files::snapshot(root, max_entries, skip),
        };
        self.watch = watch.filter(|w| !w.broken && self.snap.files.len() >= WATCH_FROM);
    }

    /// Bring the snapshot up to date from the watch's events; returns the previous stamps
    /// of the paths it looked at, or None when a walk must do it (the watch is dropped).
    fn apply_events(
        &mut self,
        root: BorrowedFd<'_>,
        max_entries: usize,
        skip: &[DirId],
    ) -> Option<BTreeMap<String, Option<Stamp>>> {
        // Put back only when it could answer.
        let mut watch = self.watch.take()?;
        let touched = watch.drain()?;
        let walk = files::walk_of(skip);
        let snap = &mut self.snap;
        let mut before: BTreeMap<String, Option<Stamp>> = BTreeMap::new();
        let mut opened: Option<(i32, OwnedFd)> = None;
        for (wd, name) in touched {
            let Some((dir_path, _)) = watch.dirs.get(&wd).cloned() else {
                continue; // a directory dropped meanwhile
            };
            let path = files::join(&dir_path, &name);
            let st = stat_in(root, wd, &dir_path, &name, &walk, &mut opened);
            let kind = st.as_ref().map(|s| FileType::from_raw_mode(s.st_mode));
            let known_dir = watch
                .by_path
                .get(&path)
                .and_then(|w| watch.dirs.get(w))
                .map(|(_, ino)| *ino);
            if kind == Some(FileType::Directory) && st.as_ref().map(|s| s.st_ino) == known_dir {
                continue; // the same directory: its own watch reports what is inside
            }
            forget(snap, &mut watch, &path, &mut before);
            match (kind, st) {
                (Some(FileType::RegularFile), Some(st)) => {
                    let prev = snap.files.insert(path.clone(), Stamp::of(&st));
                    before.entry(path).or_insert(prev);
                }
                (Some(FileType::Directory), Some(_)) => {
                    let depth = path.split('/').count();
                    let Some((_, dir)) = &opened else { continue };
                    if !files::enters(&name, depth) {
                        continue;
                    }
                    let Ok(sub) = hostfs::open_subdir(dir.as_fd(), &name, &walk) else {
                        continue;
                    };
                    let budget = max_entries.saturating_sub(snap.files.len() + watch.dirs.len());
                    let new = walk_new(&mut watch, sub, path, depth, &walk, budget);
                    absorb(snap, new, &mut before);
                }
                _ => {}
            }
            if watch.broken {
                restore(snap, before);
                return None;
            }
        }
        if snap.files.len() + watch.dirs.len() > max_entries {
            snap.complete = false;
        }
        self.watch = Some(watch);
        Some(before)
    }
}

/// The stat of `name` in the watched directory `wd` at `dir_path`, not following a link.
/// `opened` keeps the last directory opened: one open of each directory events name (they
/// come sorted by it).
fn stat_in(
    root: BorrowedFd<'_>,
    wd: i32,
    dir_path: &str,
    name: &str,
    walk: &Walk,
    opened: &mut Option<(i32, OwnedFd)>,
) -> Option<rustix::fs::Stat> {
    if opened.as_ref().is_none_or(|(w, _)| *w != wd) {
        *opened = open_rel(root, dir_path, walk).map(|fd| (wd, fd));
    }
    opened
        .as_ref()
        .and_then(|(_, dir)| rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).ok())
}

/// Whatever was at `path` before is gone or replaced: out of the snapshot (its stamps noted
/// in `before`, the first one kept) and out of the watch.
fn forget(
    snap: &mut Snapshot,
    watch: &mut Watch,
    path: &str,
    before: &mut BTreeMap<String, Option<Stamp>>,
) {
    let old: Vec<String> = subtree(&snap.files, path).cloned().collect();
    for p in old {
        let stamp = snap.files.remove(&p);
        before.entry(p).or_insert(stamp);
    }
    watch.drop_dirs(path);
}

/// A snapshot of the new directory `sub` at `path`, its directories added to the watch.
fn walk_new(
    watch: &mut Watch,
    sub: OwnedFd,
    path: String,
    depth: usize,
    walk: &Walk,
    budget: usize,
) -> Snapshot {
    let mut new = Snapshot {
        files: BTreeMap::new(),
        complete: true,
    };
    files::walk_into(sub, path, depth, walk, budget, &mut new, &mut |d, p, _| {
        watch.add(d, p)
    });
    new
}

/// `new`'s files into `snap`, their earlier stamps noted in `before` (the first one kept).
fn absorb(snap: &mut Snapshot, new: Snapshot, before: &mut BTreeMap<String, Option<Stamp>>) {
    if !new.complete {
        snap.complete = false;
    }
    for (p, stamp) in new.files {
        let prev = snap.files.insert(p.clone(), stamp);
        before.entry(p).or_insert(prev);
    }
}

/// Back to what the previous evaluation left, for the walk to compare with.
fn restore(snap: &mut Snapshot, before: BTreeMap<String, Option<Stamp>>) {
    for (p, stamp) in before {
        match stamp {
            Some(stamp) => snap.files.insert(p, stamp),
            None => snap.files.remove(&p),
        };
    }
}

/// The changes of the paths in `before` (their earlier stamps) to `now`.
fn changes(
    session_id: &str,
    before: &BTreeMap<String, Option<Stamp>>,
    now: &Snapshot,
) -> Vec<FileChange> {
    let mut out = Vec::new();
    for (path, old) in before {
        let new = now.files.get(path);
        let (change, size) = match (old, new) {
            (None, Some(n)) => (Change::Created, n.size),
            (Some(o), Some(n)) if o != n => (Change::Modified, n.size),
            (Some(o), None) => (Change::Deleted, o.size),
            _ => continue,
        };
        out.push(FileChange {
            path: path.clone(),
            size,
            change,
            uri: new.map(|_| files::file_uri(session_id, path)),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn dir_fd(p: &std::path::Path) -> OwnedFd {
        hostfs::open_dir_path(p).expect("open the test directory")
    }

    fn kinds(changes: &[FileChange]) -> Vec<(String, Change)> {
        changes.iter().map(|c| (c.path.clone(), c.change)).collect()
    }

    /// The tree the tests start from: enough files for a watch, one subdirectory.
    fn tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().expect("tempdir");
        for i in 0..WATCH_FROM {
            std::fs::write(t.path().join(format!("f{i:04}")), b"x").expect("write");
        }
        std::fs::create_dir(t.path().join("sub")).expect("mkdir");
        std::fs::write(t.path().join("sub/a"), b"a").expect("write");
        t
    }

    #[test]
    fn events_give_the_walks_answer() {
        let t = tree();
        let root = dir_fd(t.path());
        let mut tr = Tracked::start(root.as_fd(), 5000, &[]).expect("tracked");
        assert!(tr.watch.is_some(), "a directory this big is watched");
        let p = t.path();
        std::fs::write(p.join("new"), b"n").expect("write");
        std::fs::write(p.join("f0001"), b"changed").expect("write");
        std::fs::remove_file(p.join("f0002")).expect("rm");
        std::fs::create_dir_all(p.join("d/e")).expect("mkdir");
        std::fs::write(p.join("d/e/deep"), b"d").expect("write");
        std::fs::write(p.join("sub/b"), b"b").expect("write");
        std::fs::write(p.join(".hidden"), b"h").expect("write");
        let got = tr.refresh(root.as_fd(), 5000, &[], "s").expect("complete");
        assert!(tr.watch.is_some(), "no fallback was needed");
        assert_eq!(
            kinds(&got),
            vec![
                ("d/e/deep".to_string(), Change::Created),
                ("f0001".to_string(), Change::Modified),
                ("f0002".to_string(), Change::Deleted),
                ("new".to_string(), Change::Created),
                ("sub/b".to_string(), Change::Created),
            ]
        );
        // The new directory is watched too, and the snapshot is the walk's.
        std::fs::write(p.join("d/e/deep"), b"longer").expect("write");
        std::fs::remove_dir_all(p.join("sub")).expect("rm");
        let got = tr.refresh(root.as_fd(), 5000, &[], "s").expect("complete");
        assert_eq!(
            kinds(&got),
            vec![
                ("d/e/deep".to_string(), Change::Modified),
                ("sub/a".to_string(), Change::Deleted),
                ("sub/b".to_string(), Change::Deleted),
            ]
        );
        assert_eq!(
            tr.snap.files,
            files::snapshot(root.as_fd(), 5000, &[]).files
        );
        assert!(
            tr.refresh(root.as_fd(), 5000, &[], "s")
                .expect("complete")
                .is_empty()
        );
    }

    #[test]
    fn links_are_not_followed_and_renames_walk() {
        let t = tree();
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::write(outside.path().join("secret"), b"s").expect("write");
        let root = dir_fd(t.path());
        let mut tr = Tracked::start(root.as_fd(), 5000, &[]).expect("tracked");
        let p = t.path();
        // A link to a directory outside, and a directory swapped for a link.
        symlink(outside.path(), p.join("out")).expect("symlink");
        std::fs::remove_dir_all(p.join("sub")).expect("rm");
        symlink(outside.path(), p.join("sub")).expect("symlink");
        let got = tr.refresh(root.as_fd(), 5000, &[], "s").expect("complete");
        assert_eq!(kinds(&got), vec![("sub/a".to_string(), Change::Deleted)]);
        assert!(tr.snap.files.keys().all(|k| !k.contains("secret")));
        // Writes beneath the link's target are not the session's.
        std::fs::write(outside.path().join("secret2"), b"s").expect("write");
        assert!(
            tr.refresh(root.as_fd(), 5000, &[], "s")
                .expect("complete")
                .is_empty()
        );
        // A directory renamed: the walk answers, and the watch is rebuilt.
        std::fs::create_dir(p.join("r")).expect("mkdir");
        std::fs::write(p.join("r/x"), b"x").expect("write");
        tr.refresh(root.as_fd(), 5000, &[], "s").expect("complete");
        std::fs::rename(p.join("r"), p.join("r2")).expect("rename");
        let got = tr.refresh(root.as_fd(), 5000, &[], "s").expect("complete");
        assert_eq!(
            kinds(&got),
            vec![
                ("r/x".to_string(), Change::Deleted),
                ("r2/x".to_string(), Change::Created)
            ]
        );
        assert!(tr.watch.is_some(), "watched again after the walk");
        std::fs::write(p.join("r2/y"), b"y").expect("write");
        let got = tr.refresh(root.as_fd(), 5000, &[], "s").expect("complete");
        assert_eq!(kinds(&got), vec![("r2/y".to_string(), Change::Created)]);
    }

    #[test]
    fn outgrowing_the_bound_ends_tracking() {
        let t = tree();
        let root = dir_fd(t.path());
        let max = WATCH_FROM + 10;
        let mut tr = Tracked::start(root.as_fd(), max, &[]).expect("tracked");
        assert!(tr.watch.is_some());
        std::fs::create_dir(t.path().join("many")).expect("mkdir");
        for i in 0..20 {
            std::fs::write(t.path().join(format!("many/{i}")), b"x").expect("write");
        }
        assert!(tr.refresh(root.as_fd(), max, &[], "s").is_none());
    }

    #[test]
    fn small_directories_are_walked() {
        let t = tempfile::tempdir().expect("tempdir");
        let root = dir_fd(t.path());
        let mut tr = Tracked::start(root.as_fd(), 5000, &[]).expect("tracked");
        assert!(tr.watch.is_none());
        std::fs::write(t.path().join("a"), b"a").expect("write");
        let got = tr.refresh(root.as_fd(), 5000, &[], "s").expect("complete");
        assert_eq!(kinds(&got), vec![("a".to_string(), Change::Created)]);
    }
}
