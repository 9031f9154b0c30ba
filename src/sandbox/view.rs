//! What user code sees of the host's files at levels `bwrap` and `landlock`: an allow-list.
//! The system (`/usr`, the `/bin` and `/lib*` links or directories), the parts of `/etc`
//! that programs read ([`ETC`]), a few system caches, the CPU topology, and the trees the
//! operator adds (`--expose`). Per spawn, the interpreter's own installation, the trees its
//! language reads (`reads` in its `language.toml`), the session's or run's own directories
//! and a caller's `cwd` and `venv` are added (see `Jail`). Everything else is absent at
//! `bwrap` (the root is bwrap's own empty tmpfs) and unreadable at `landlock` (no rule).

use std::path::{Path, PathBuf};

/// Entries of `/etc` that programs read: the user and name-service databases, the dynamic
/// linker's configuration, time zone and locale, TLS roots, the alternatives links,
/// terminal, MIME, font and language configuration. A name ending in `*` stands for every
/// entry it begins. Not: credentials and configuration of services (`ssh`, `shadow`,
/// `sudoers`, `pip.conf` and `npmrc`, which may hold index tokens), nor the host's identity
/// (`hostname`, `machine-id`).
pub const ETC: &[&str] = &[
    "alternatives",
    "bash.bashrc",
    "ca-certificates",
    "ca-certificates.conf",
    "crypto-policies",
    "debian_version",
    "ethertypes",
    "fonts",
    "gai.conf",
    "group",
    "host.conf",
    "hosts",
    "inputrc",
    "java-*",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ld.so.preload",
    "libpaper.d",
    "locale.alias",
    "locale.conf",
    "localtime",
    "lsb-release",
    "magic",
    "magic.mime",
    "mailcap",
    "mime.types",
    "mtab",
    "networks",
    "nsswitch.conf",
    "os-release",
    "papersize",
    "passwd",
    "perl",
    "pki",
    "profile",
    "protocols",
    "python3*",
    "resolv.conf",
    "rpc",
    "services",
    "ssl",
    "terminfo",
    "timezone",
];

/// Outside `/etc` and the top level: system caches and the CPU topology (thread pools size
/// themselves from it).
const SYSTEM: &[&str] = &["/var/cache/fontconfig", "/sys/devices/system/cpu"];

/// Top-level entries of the system: directories, or links into `/usr` on a merged system.
const TOP: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

/// One entry of the view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A directory, read-only with everything beneath it.
    Tree(PathBuf),
    /// A single file, read-only.
    File(PathBuf),
    /// A symbolic link, recreated as it is (its target shows only if it is in the view).
    Link(PathBuf, PathBuf),
}

impl Entry {
    pub fn path(&self) -> &Path {
        match self {
            Entry::Tree(p) | Entry::File(p) | Entry::Link(p, _) => p,
        }
    }
}

/// The host's files user code sees (besides each spawn's own).
#[derive(Debug, Clone, Default)]
pub struct View {
    entries: Vec<Entry>,
}

impl View {
    /// The system's view plus the operator's `extra` trees (or files), as they are on this
    /// host: missing entries are left out, and every path is the real one (no link on the
    /// way, so that a rule or a mount lands where it says).
    pub fn system(extra: &[PathBuf]) -> Self {
        let mut entries = Vec::new();
        for p in TOP {
            entries.extend(entry(Path::new(p)));
        }
        for name in ETC {
            for p in etc_matches(name) {
                entries.extend(entry(&p));
            }
        }
        for p in SYSTEM {
            entries.extend(real(Path::new(p)).and_then(|p| entry(&p)));
        }
        for p in extra {
            entries.extend(real(p).and_then(|p| entry(&p)));
        }
        let mut view = View { entries };
        view.normalize();
        view
    }

    /// A view of exactly these entries (tests).
    pub fn of(entries: Vec<Entry>) -> Self {
        let mut view = View { entries };
        view.normalize();
        view
    }

    /// Sorted, without duplicates and without entries inside a tree of the view.
    fn normalize(&mut self) {
        self.entries.sort_by(|a, b| a.path().cmp(b.path()));
        self.entries.dedup_by(|a, b| a.path() == b.path());
        let trees: Vec<PathBuf> = self.trees().map(Path::to_path_buf).collect();
        self.entries.retain(|e| {
            !trees
                .iter()
                .any(|t| e.path() != t && e.path().starts_with(t))
        });
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The directories of the view.
    pub fn trees(&self) -> impl Iterator<Item = &Path> {
        self.entries.iter().filter_map(|e| match e {
            Entry::Tree(p) => Some(p.as_path()),
            _ => None,
        })
    }

    /// Whether `p` (canonical) is shown: it lies in a tree of the view, or is one of its
    /// files.
    pub fn shows(&self, p: &Path) -> bool {
        self.entries.iter().any(|e| match e {
            Entry::Tree(t) => p.starts_with(t),
            Entry::File(f) => p == f,
            Entry::Link(..) => false,
        })
    }

    /// One line per entry, for the log.
    pub fn describe(&self) -> String {
        let mut out = Vec::new();
        for e in &self.entries {
            out.push(match e {
                Entry::Tree(p) => format!("{}/", p.display()),
                Entry::File(p) => p.display().to_string(),
                Entry::Link(p, t) => format!("{} -> {}", p.display(), t.display()),
            });
        }
        out.join(" ")
    }
}

/// The entry for `p` as it is on the host (not following a link at `p` itself), if any.
fn entry(p: &Path) -> Option<Entry> {
    let meta = std::fs::symlink_metadata(p).ok()?;
    let t = meta.file_type();
    if t.is_symlink() {
        std::fs::read_link(p)
            .ok()
            .map(|target| Entry::Link(p.to_path_buf(), target))
    } else if t.is_dir() {
        Some(Entry::Tree(p.to_path_buf()))
    } else if t.is_file() {
        Some(Entry::File(p.to_path_buf()))
    } else {
        None
    }
}

/// `p` with its links resolved, when it exists.
fn real(p: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(p).ok()
}

/// The entries of `/etc` a name of [`ETC`] stands for (`python3*`: every entry beginning
/// `python3`). `/etc` itself is the real one: a link at `/etc` is not followed.
fn etc_matches(name: &str) -> Vec<PathBuf> {
    let etc = Path::new("/etc");
    match name.strip_suffix('*') {
        None => vec![etc.join(name)],
        Some(prefix) => {
            let mut v: Vec<PathBuf> = std::fs::read_dir(etc)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                .map(|e| e.path())
                .collect();
            v.sort();
            v
        }
    }
}

/// The paths a list of `reads` (of a `language.toml`: absolute, a last component ending in
/// `*` matching every entry it begins) stands for on this host, real paths of existing
/// entries.
pub fn resolve_reads(reads: &[String]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for r in reads {
        let p = Path::new(r);
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
        let found: Vec<PathBuf> = match (
            name.as_deref().and_then(|n| n.strip_suffix('*')),
            p.parent(),
        ) {
            (Some(prefix), Some(dir)) => std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                .map(|e| e.path())
                .collect(),
            _ => vec![p.to_path_buf()],
        };
        for f in found {
            if let Some(real) = real(&f)
                && !out.contains(&real)
            {
                out.push(real);
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_view_holds_the_system_and_not_the_rest() {
        let v = View::system(&[]);
        assert!(v.shows(Path::new("/usr/bin")), "{}", v.describe());
        for hidden in [
            "/opt",
            "/var/lib",
            "/var/log",
            "/etc/ssh",
            "/etc/shadow",
            "/home",
            "/root",
            "/srv",
            "/tmp",
        ] {
            assert!(!v.shows(Path::new(hidden)), "{hidden}: {}", v.describe());
        }
        if Path::new("/etc/passwd").is_file() {
            assert!(v.shows(Path::new("/etc/passwd")));
        }
        // No entry inside another tree of the view, none twice.
        let paths: Vec<&Path> = v.entries().iter().map(Entry::path).collect();
        for (i, p) in paths.iter().enumerate() {
            assert!(!paths[i + 1..].contains(p));
            assert!(!v.trees().any(|t| t != *p && p.starts_with(t)), "{p:?}");
        }
    }

    #[test]
    fn extra_trees_are_added_as_real_paths_and_reads_match_patterns() {
        let d = tempfile::tempdir().unwrap();
        let real_dir = std::fs::canonicalize(d.path()).unwrap();
        std::fs::create_dir(real_dir.join("java-17-x")).unwrap();
        std::fs::create_dir(real_dir.join("java-21-y")).unwrap();
        std::fs::create_dir(real_dir.join("other")).unwrap();
        std::os::unix::fs::symlink(real_dir.join("other"), real_dir.join("link")).unwrap();
        let v = View::system(&[real_dir.join("link")]);
        assert!(v.shows(&real_dir.join("other/x")));
        assert!(!v.shows(&real_dir.join("java-17-x")));
        let pattern = format!("{}/java-*", real_dir.display());
        let missing = format!("{}/missing", real_dir.display());
        assert_eq!(
            resolve_reads(&[pattern, missing]),
            vec![real_dir.join("java-17-x"), real_dir.join("java-21-y")]
        );
    }
}
