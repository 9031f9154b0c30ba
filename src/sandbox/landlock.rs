//! What the helper's Landlock ruleset allows: the read roots at level `landlock` (the view
//! of the host, without the masked directories and the workspace) and, for one spawn, its
//! read and write rules.

use std::path::{Path, PathBuf};

use super::Jail;
use super::view::{Entry, View};

/// Device files every sandbox may open for writing (terminals, sinks, randomness). The
/// host's /dev/shm is not among them: at level `landlock` the helper gives the program a
/// private one when it can (see `ExecArgs::private_shm`), inside bwrap it is bwrap's own.
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
];

/// The read and write rules of one spawn, by path. Inside bwrap the whole (mounted) tree is
/// readable and its private /tmp and /dev/shm writable; at level `landlock`, the read roots
/// and the jail's own read-only directories. A caller's directories (`jail.opened`) get
/// theirs from their handles at level `landlock` (see `ExecArgs::read_fds`), not here; inside
/// bwrap their paths are mounts of those handles already.
pub fn rules(wrapped: bool, read_roots: &[PathBuf], jail: &Jail) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let by_path = |p: &&PathBuf| wrapped || jail.opened(p).is_none();
    let mut write: Vec<PathBuf> = jail.rw.iter().filter(by_path).cloned().collect();
    write.extend(DEVICES.iter().map(PathBuf::from));
    let mut read = Vec::new();
    if wrapped {
        read.push(PathBuf::from("/"));
        write.push("/tmp".into());
        write.push("/dev/shm".into());
    } else {
        read.extend(read_roots.iter().cloned());
        read.extend(jail.ro.iter().filter(by_path).cloned());
    }
    (read, write)
}

/// The Landlock-level read allowlist: the view's trees and files, `/proc` and `/dev`, each
/// split around the `hidden` trees inside it (the masks and the workspace: Landlock can only
/// allow, so a tree with a hidden one inside becomes its other entries), and dropped when it
/// lies inside one. Links are no rules: Landlock checks the file a path resolves to, which
/// must be in the view itself.
pub fn read_roots(view: &View, hidden: &[PathBuf]) -> Vec<PathBuf> {
    let mut roots = Vec::new();
    let listed = view.entries().iter().filter_map(|e| match e {
        Entry::Tree(p) | Entry::File(p) => Some(p.clone()),
        Entry::Link(..) => None,
    });
    for p in listed.chain(["/proc", "/dev"].map(PathBuf::from)) {
        if hidden.iter().any(|h| p.starts_with(h)) {
            continue;
        }
        if hidden.iter().any(|h| h.starts_with(&p)) {
            roots.extend(all_except(&p, hidden));
        } else {
            roots.push(p);
        }
    }
    roots.sort();
    roots.dedup();
    roots
}

/// Every entry under `root` except the `hidden` paths, descending only where a hidden path
/// lies beneath (so `/var` becomes `/var/*` but `/var/tmp`). Landlock can only allow, never
/// deny inside an allowed directory, hence the split.
pub fn all_except(root: &Path, hidden: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir(root) else {
        return out;
    };
    for entry in dir.flatten() {
        let p = entry.path();
        if hidden.iter().any(|h| h == &p) {
            continue;
        }
        let is_real_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
        if is_real_dir && hidden.iter().any(|h| h.starts_with(&p)) {
            out.extend(all_except(&p, hidden));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_except_splits_around_hidden_paths() {
        let d = tempfile::tempdir().expect("tempdir");
        for p in ["a/x", "a/y", "b", "c/z"] {
            std::fs::create_dir_all(d.path().join(p)).expect("mkdir");
        }
        let hidden = vec![d.path().join("a/y"), d.path().join("c")];
        let got = all_except(d.path(), &hidden);
        assert_eq!(got, vec![d.path().join("a/x"), d.path().join("b")]);
    }

    /// Every read root is inside the view (or /proc, /dev), outside every hidden tree; a
    /// hidden tree inside the view splits it.
    #[test]
    fn read_roots_are_the_view_without_hidden_trees() {
        let d = tempfile::tempdir().expect("tempdir");
        let base = std::fs::canonicalize(d.path()).expect("canonical");
        for p in ["tree/a", "tree/secret", "other"] {
            std::fs::create_dir_all(base.join(p)).expect("mkdir");
        }
        std::fs::write(base.join("file"), "x").expect("write");
        let view = View::of(vec![
            Entry::Tree(base.join("tree")),
            Entry::File(base.join("file")),
            Entry::Link(base.join("link"), "tree".into()),
        ]);
        let roots = read_roots(&view, &[base.join("tree/secret")]);
        assert!(roots.contains(&base.join("tree/a")), "{roots:?}");
        assert!(roots.contains(&base.join("file")), "{roots:?}");
        assert!(!roots.contains(&base.join("tree")), "{roots:?}");
        assert!(
            !roots
                .iter()
                .any(|r| r.starts_with(base.join("tree/secret")))
        );
        assert!(!roots.iter().any(|r| r.starts_with(base.join("other"))));
        assert!(!roots.contains(&base.join("link")));
        assert!(roots.contains(&PathBuf::from("/dev")), "{roots:?}");
        assert!(roots.contains(&PathBuf::from("/proc")), "{roots:?}");
    }
}
