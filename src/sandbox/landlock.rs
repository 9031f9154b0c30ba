//! What the helper's Landlock ruleset allows: the read roots at level `landlock` (everything
//! but the masked directories and the workspace) and, for one spawn, its read and write
//! rules.

use std::path::{Path, PathBuf};

use super::Jail;

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

/// The read and write rules of one spawn. Inside bwrap the whole (masked) tree is readable
/// and its private /tmp and /dev/shm writable; at level `landlock`, the read roots and the
/// jail's own read-only directories.
pub fn rules(wrapped: bool, read_roots: &[PathBuf], jail: &Jail) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut write: Vec<PathBuf> = jail.rw.clone();
    write.extend(DEVICES.iter().map(PathBuf::from));
    let mut read = Vec::new();
    if wrapped {
        read.push(PathBuf::from("/"));
        write.push("/tmp".into());
        write.push("/dev/shm".into());
    } else {
        read.extend(read_roots.iter().cloned());
        read.extend(jail.ro.iter().cloned());
    }
    (read, write)
}

/// The Landlock-level read allowlist: every entry under `/` except the `hidden` trees (the
/// masks and the workspace), each resolved to where it really is, and dropped when that is
/// inside (or contains) a hidden tree: Landlock resolves a rule's path once, so a symbolic
/// link such as `/var/run -> /run` would otherwise re-open a masked tree. Entries inside
/// another entry are dropped too.
pub fn read_roots(hidden: &[PathBuf]) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = all_except(Path::new("/"), hidden)
        .into_iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .filter(|p| !hidden.iter().any(|h| p.starts_with(h) || h.starts_with(p)))
        .collect();
    roots.sort();
    roots.dedup();
    let all = roots.clone();
    roots.retain(|p| !all.iter().any(|q| q != p && p.starts_with(q)));
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

    /// Every read root is a real path, outside every hidden tree: `/var/run` (a link to the
    /// masked `/run` on this kind of system) and links to a hidden tree never become rules.
    #[test]
    fn read_roots_never_lead_into_a_hidden_tree() {
        let hidden: Vec<PathBuf> = ["/run", "/tmp", "/root", "/home"]
            .iter()
            .filter_map(|p| std::fs::canonicalize(p).ok())
            .collect();
        let roots = read_roots(&hidden);
        assert!(!roots.is_empty());
        for r in &roots {
            assert_eq!(&std::fs::canonicalize(r).expect("exists"), r);
            assert!(
                !hidden.iter().any(|h| r.starts_with(h) || h.starts_with(r)),
                "{r:?}"
            );
        }
        if std::fs::read_link("/var/run").is_ok() {
            assert!(!roots.contains(&PathBuf::from("/var/run")));
        }
        assert!(roots.contains(&PathBuf::from("/usr")), "{roots:?}");
    }
}
