//! The shared cache's upkeep: its size (a gauge, measured after every installation that
//! downloaded and at the server's start), and, with `--package-cache-mb`, a cap kept by
//! evicting the packages used least recently.
//!
//! What eviction must never take: a package a running installation reads (installations
//! share [`Upkeep::gate`] while they run; an eviction pass holds it alone) and a package
//! in a live run's or session's layer. A layer holds no mount of, nor symbolic link into,
//! the cache: uv links (hard links, where the layer and the cache share a mount) or
//! copies files out of it, npm unpacks tarballs. Evicting what a layer holds would break
//! nothing, but would free nothing either where the files are hard links; so a package is
//! held while any live layer has it ([`Book`]) and only packages no layer holds are
//! evicted. Evicting goes through the installers' own commands (`uv cache clean NAME`,
//! `npm cache clean KEY`), run as the installer like any installation.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;

use super::answer::Package;
use super::{Eco, Packages, install};

/// Largest record of use read back (it is the server's own file; past this it is ignored).
const BOOK_FILE_MAX: u64 = 8 << 20;

/// When each package was last put in a layer, and which live layers hold it; keyed
/// `python:NAME` (PEP 503 name) or `npm:NAME`.
#[derive(Debug, Default)]
pub(super) struct Book(Mutex<Entries>);

#[derive(Debug, Default)]
struct Entries {
    /// Unix milliseconds of the last installation that put it in a layer.
    last: HashMap<String, u64>,
    /// How many live layers hold it.
    held: HashMap<String, usize>,
}

fn key(eco: Eco, name: &str) -> String {
    match eco {
        Eco::Python => format!("python:{}", super::spec::normalize_python(name)),
        Eco::Npm => format!("npm:{name}"),
    }
}

/// A shared layer's key in the record (see `shared`).
pub(super) fn layer_key(key: &str) -> String {
    format!("layer:{key}")
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl Book {
    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `packages` were put in a layer (whose holdings are `held`): used now, and held
    /// until the layer goes.
    pub(super) fn used(&self, eco: Eco, packages: &[Package], held: &mut Vec<String>) {
        let t = now();
        let mut e = self.lock();
        for p in packages {
            let k = key(eco, &p.name);
            e.last.insert(k.clone(), t);
            if !held.contains(&k) {
                *e.held.entry(k.clone()).or_default() += 1;
                held.push(k);
            }
        }
    }

    /// `k` (a shared layer) was taken by a layer (whose holdings are `held`): used now, and
    /// held until that layer goes.
    pub(super) fn hold(&self, k: &str, held: &mut Vec<String>) {
        let mut e = self.lock();
        e.last.insert(k.to_string(), now());
        if !held.iter().any(|h| h == k) {
            *e.held.entry(k.to_string()).or_default() += 1;
            held.push(k.to_string());
        }
    }

    /// A layer holding `keys` is gone.
    pub(super) fn release(&self, keys: &[String]) {
        let mut e = self.lock();
        for k in keys {
            if let Some(n) = e.held.get_mut(k) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    e.held.remove(k);
                }
            }
        }
    }

    /// The packages no live layer holds, least recently used first; `found` (what the
    /// cache holds that was never recorded) before all of them.
    fn candidates(&self, found: &[String]) -> Vec<String> {
        let e = self.lock();
        let mut all: Vec<(u64, String)> = e.last.iter().map(|(k, t)| (*t, k.clone())).collect();
        all.extend(
            found
                .iter()
                .filter(|k| !e.last.contains_key(*k))
                .map(|k| (0, k.clone())),
        );
        all.retain(|(_, k)| !e.held.contains_key(k));
        all.sort();
        all.into_iter().map(|(_, k)| k).collect()
    }

    fn held(&self, k: &str) -> bool {
        self.lock().held.contains_key(k)
    }

    fn forget(&self, k: &str) {
        self.lock().last.remove(k);
    }

    fn snapshot(&self) -> HashMap<String, u64> {
        self.lock().last.clone()
    }

    /// The record of use saved by an earlier server (`file`), read as data.
    fn load(&self, file: &Path) {
        let Ok(meta) = std::fs::symlink_metadata(file) else {
            return;
        };
        if !meta.is_file() || meta.len() > BOOK_FILE_MAX {
            return;
        }
        let Ok(text) = std::fs::read(file) else {
            return;
        };
        match serde_json::from_slice::<HashMap<String, u64>>(&text) {
            Ok(map) => {
                let mut e = self.lock();
                for (k, t) in map {
                    if k.starts_with("python:") || k.starts_with("npm:") || k.starts_with("layer:")
                    {
                        e.last.entry(k).or_insert(t);
                    }
                }
            }
            Err(e) => tracing::warn!(file = %file.display(), error = %e,
                "packages: the cache's record of use is unreadable; starting a new one"),
        }
    }
}

/// The cache's cap and the state eviction needs.
pub(super) struct Upkeep {
    /// Bytes (None: no cap).
    cap: Option<u64>,
    /// Installations share it while they run; an eviction pass holds it alone.
    pub(super) gate: tokio::sync::RwLock<()>,
    pub(super) book: Arc<Book>,
    /// One pass at a time.
    pass: tokio::sync::Mutex<()>,
    /// The record of use, kept across restarts (`ROOT/usage.json`, the server's).
    file: PathBuf,
    /// The node npm runs with, once an installation named it.
    node: Mutex<Option<PathBuf>>,
}

impl Upkeep {
    pub(super) fn new(root: &Path, cap_mb: Option<u64>) -> Self {
        let book = Arc::new(Book::default());
        let file = root.join("usage.json");
        book.load(&file);
        Self {
            cap: cap_mb.map(|m| m.saturating_mul(1 << 20)),
            gate: tokio::sync::RwLock::new(()),
            book,
            pass: tokio::sync::Mutex::new(()),
            file,
            node: Mutex::new(None),
        }
    }

    pub(super) fn saw_node(&self, node: &Path) {
        *self.node.lock().unwrap_or_else(|e| e.into_inner()) = Some(node.to_path_buf());
    }

    fn node(&self) -> Option<PathBuf> {
        self.node.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Packages {
    /// Measure the cache (the gauge), then, past the cap, evict the packages used least
    /// recently that nothing uses, until it fits or nothing more may go. In the
    /// background: after an installation that downloaded, and once at the server's start.
    pub(super) fn upkeep_in_background(self: &Arc<Self>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let me = self.clone();
        rt.spawn(async move { me.upkeep().await });
    }

    async fn upkeep(&self) {
        let _pass = self.upkeep.pass.lock().await;
        self.save_book().await;
        let mut size = self.measure().await;
        let Some(cap) = self.upkeep.cap else {
            return;
        };
        if size <= cap {
            return;
        }
        let _alone = self.upkeep.gate.write().await;
        let found = {
            let root = self.root.clone();
            let mut found = tokio::task::spawn_blocking(move || recorded_nowhere(&root))
                .await
                .unwrap_or_default();
            found.extend(self.store.keys().iter().map(|k| layer_key(k)));
            found
        };
        let mut tried: HashSet<String> = HashSet::new();
        while size > cap {
            let Some(victim) = self
                .upkeep
                .book
                .candidates(&found)
                .into_iter()
                .find(|k| !tried.contains(k) && !self.upkeep.book.held(k))
            else {
                tracing::warn!(
                    bytes = size,
                    cap,
                    "packages: the cache is over --package-cache-mb, and what it holds \
                     beside is used by live sessions or runs (or cannot be evicted)"
                );
                break;
            };
            tried.insert(victim.clone());
            let evicted = self.evict(&victim).await;
            if evicted {
                self.upkeep.book.forget(&victim);
                tracing::info!(package = %victim, "packages: evicted from the cache");
            }
            size = self.measure().await;
            // Counted once the gauge says what is left: whoever sees the count sees the
            // size after that eviction, not before it.
            if evicted {
                self.metrics.evicted();
            }
        }
        self.save_book().await;
    }

    /// The cache's size now (the gauge set to it).
    async fn measure(&self) -> u64 {
        let dirs = [
            self.root.join("uv"),
            self.root.join("npm"),
            self.store.dir.clone(),
        ];
        let size = tokio::task::spawn_blocking(move || {
            let mut seen = HashSet::new();
            dirs.iter().map(|d| tree_bytes(d, &mut seen)).sum::<u64>()
        })
        .await
        .unwrap_or(0);
        self.metrics.cache_bytes(size);
        size
    }

    async fn save_book(&self) {
        let (map, file) = (self.upkeep.book.snapshot(), self.upkeep.file.clone());
        let r = tokio::task::spawn_blocking(move || {
            let text = serde_json::to_vec(&map).map_err(std::io::Error::other)?;
            let tmp = file.with_extension("json.tmp");
            let _ = std::fs::remove_file(&tmp);
            {
                use std::io::Write;
                use std::os::unix::fs::OpenOptionsExt;
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&tmp)?;
                f.write_all(&text)?;
            }
            std::fs::rename(&tmp, &file)
        })
        .await;
        if let Ok(Err(e)) = r {
            tracing::warn!(error = %e, "packages: cannot save the cache's record of use");
        }
    }

    /// Remove one package (`python:NAME`, `npm:NAME`) from the cache with its installer's
    /// own command; whether that ran.
    async fn evict(&self, key: &str) -> bool {
        let never = CancellationToken::new();
        if let Some(k) = key.strip_prefix("layer:") {
            // The server's own: out of the store at once (renamed), then removed.
            let (store, k) = (self.store.dir.clone(), k.to_string());
            return tokio::task::spawn_blocking(move || super::shared::remove(&store, &k))
                .await
                .unwrap_or(false);
        }
        if let Some(name) = key.strip_prefix("python:") {
            // The program found at the first installation (none yet: nothing of it to evict
            // but what an earlier server left, which waits for one).
            let Some(Ok(uv)) = self.uv.get().cloned() else {
                return false;
            };
            let Ok(home) = self.installer_home() else {
                return false;
            };
            let job = install::Job {
                argv: vec![
                    uv.display().to_string(),
                    "cache".into(),
                    "clean".into(),
                    "--no-config".into(),
                    "--color".into(),
                    "never".into(),
                    "--cache-dir".into(),
                    self.root.join("uv").display().to_string(),
                    "--".into(),
                    name.to_string(),
                ],
                env: install::installer_env(),
                exes: vec![uv.clone()],
                rw: vec![self.root.join("uv")],
                home,
            };
            let done = self.run_installer(job, "", &never).await;
            if !done.ok {
                tracing::warn!(package = name, stderr = %done.stderr, "packages: uv cache clean failed");
            }
            return done.ok;
        }
        if let Some(name) = key.strip_prefix("npm:") {
            let (Some(node), Some(Ok(npm))) = (self.upkeep.node(), self.npm.get().cloned()) else {
                return false;
            };
            let ls = self
                .run_npm_cache(&node, &npm, &["ls", "--", name], &never)
                .await;
            if !ls.ok {
                return false;
            }
            // npm's keys: its registry document's and its tarballs' (URLs, one a line).
            let keys: Vec<String> = ls
                .stdout
                .lines()
                .map(str::trim)
                .filter(|l| l.starts_with("make-fetch-happen:request-cache:"))
                .map(str::to_string)
                .collect();
            if keys.is_empty() {
                return true;
            }
            let mut args: Vec<&str> = vec!["clean", "--"];
            args.extend(keys.iter().map(String::as_str));
            let done = self.run_npm_cache(&node, &npm, &args, &never).await;
            if !done.ok {
                tracing::warn!(package = name, stderr = %done.stderr, "packages: npm cache clean failed");
            }
            return done.ok;
        }
        false
    }
}

/// Bytes a tree takes on disk (each file once, whatever links it has), links not followed.
fn tree_bytes(dir: &Path, seen: &mut HashSet<(u64, u64)>) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in rd.flatten() {
            let Ok(m) = entry.metadata() else {
                continue;
            };
            if m.nlink() > 1 && !m.is_dir() && !seen.insert((m.dev(), m.ino())) {
                continue;
            }
            total = total.saturating_add(m.blocks().saturating_mul(512));
            if m.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    total
}

/// Python packages uv's cache holds (the names of its per-package directories, for PyPI
/// and for other indexes), recorded or not: what an earlier server without a record left.
fn recorded_nowhere(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let uv = root.join("uv");
    let Ok(rd) = std::fs::read_dir(&uv) else {
        return out;
    };
    let names = |dir: &Path, out: &mut Vec<String>| {
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir())
                    && let Some(n) = e.file_name().to_str()
                {
                    out.push(key(Eco::Python, n));
                }
            }
        }
    };
    for bucket in rd.flatten() {
        let b = bucket.file_name();
        if !b.to_str().is_some_and(|b| b.starts_with("wheels-v")) {
            continue;
        }
        names(&bucket.path().join("pypi"), &mut out);
        if let Ok(ix) = std::fs::read_dir(bucket.path().join("index")) {
            for i in ix.flatten() {
                names(&i.path(), &mut out);
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkg(name: &str) -> Package {
        Package {
            name: name.into(),
            version: "1".into(),
        }
    }

    #[test]
    fn held_packages_are_never_candidates_and_the_oldest_comes_first() {
        let book = Book::default();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        book.used(Eco::Python, &[pkg("Six"), pkg("iniconfig")], &mut a);
        book.used(Eco::Npm, &[pkg("is-odd")], &mut b);
        assert_eq!(a, ["python:six", "python:iniconfig"]);
        // Everything is held by a live layer.
        assert!(book.candidates(&["python:old".into()]).len() == 1);
        book.release(&a);
        book.lock().last.insert("python:six".into(), 5);
        let c = book.candidates(&["python:old".into(), "python:six".into()]);
        assert_eq!(c, ["python:old", "python:six", "python:iniconfig"]);
        // Two layers hold is-odd: it stays held until both go.
        let mut b2 = Vec::new();
        book.used(Eco::Npm, &[pkg("is-odd")], &mut b2);
        book.release(&b);
        assert!(book.held("npm:is-odd"));
        book.release(&b2);
        assert!(!book.held("npm:is-odd"));
    }
}
