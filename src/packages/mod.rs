//! Packages on demand: `packages` in `run-code` and `session_start`, `%pip install` in a
//! Python session, `await replbox.install(...)` in a JavaScript one. User code never
//! installs anything and gets no network for it: the server runs the installer (uv for
//! Python, npm for JavaScript) confined as the installer's uid, with network only to the
//! operator's indexes, running no package code (uv `--no-build`: wheels only; npm
//! `--ignore-scripts`). Only where the operator allows source builds (`--package-builds`)
//! does a Python package's build code run, for a package with no wheel, confined to a
//! throwaway cache and the asking run's or session's own layer (see `build_python`).
//!
//! ```text
//! ROOT/            the server's, 0711
//!   uv/            installer 0700: uv's content-addressed cache, shared by every install
//!   npm/           installer 0700: npm's content-addressed cache (cacache), likewise
//!   layers/ID/     installer 0755: one run's packages (`--target`, on its PYTHONPATH; for
//!                  npm `--prefix`, its node_modules/ on NODE_PATH), read-only to it,
//!                  removed after it
//!   layers/shared/ the server's, 0711: sealed layers of resolved Python and npm sets
//!                  (`shared`)
//!   layers/building/  the server's, 0711: layers being built (installer 0755 each)
//!   shared.key     the server's, 0600: the secret the shared layers' keys are made with
//!   tmp/ID/        installer 0700: one installation's home, removed after it
//!   egress/        the installer's proxy sockets
//!   usage.json     the server's: when each package was last installed (for eviction)
//!   installer/uv   root's 0755, as root only: the operator's uv when the installer's uid
//!                  cannot reach where it is installed
//! SESSION_DIR/packages/  installer 0755: a session's packages, gone with the session
//! ```
//!
//! An installation may write the cache and its own layer, nothing else (a source build:
//! its own layer and a throwaway cache, not even the shared one): never another
//! run's or session's layer (separate mounts at bwrap, so uv copies out of its cache
//! there; separate rules at Landlock). A layer is read by its run or session only, through
//! a read-only view of that one directory; a shared layer, sealed, by every run or session
//! that asks for its set.

mod build;
mod cache;
mod flags;
mod install;
mod npm;
mod shared;
mod spec;

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use schemars::JsonSchema;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::egress::{Egress, Policy};
use crate::sandbox::Sandbox;
use build::Unmet;
pub use flags::Flags;
pub use spec::{Eco, MAX_SPECS};

/// Longest one installation may take unless the operator says otherwise.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// One package installed, with its version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct Package {
    pub name: String,
    pub version: String,
}

/// What an installation did (the `packages` of a result).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Installed {
    /// Packages added to the environment (dependencies included), with their versions.
    pub installed: Vec<Package>,
    /// How many the installer had to download (0: all from the server's shared cache).
    pub downloaded: u32,
    pub duration_ms: u64,
    /// What installs the same again, as the installer takes it: every package's exact
    /// version for Python (`name==version`), the requested packages' for npm
    /// (`name@version`; npm resolves their dependencies, which may nest other versions).
    #[serde(skip)]
    pub pins: Vec<String>,
    /// Packages built from source (sdists) for this installation, where the operator
    /// allows it (`--package-builds`); absent when none was.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub built: Vec<Package>,
}

impl Installed {
    /// One line for a result's text.
    pub fn line(&self) -> String {
        let names: Vec<String> = self
            .installed
            .iter()
            .map(|p| format!("{}=={}", p.name, p.version))
            .collect();
        let what = if names.is_empty() {
            "nothing new (already installed)".to_string()
        } else {
            names.join(", ")
        };
        let mut from = match self.downloaded {
            0 => "all from the cache".to_string(),
            n => format!("{n} downloaded"),
        };
        if !self.built.is_empty() {
            let built: Vec<String> = self
                .built
                .iter()
                .map(|p| format!("{}=={}", p.name, p.version))
                .collect();
            from.push_str(&format!("; built from source: {}", built.join(", ")));
        }
        format!("packages: {what} in {} ms ({from})", self.duration_ms)
    }
}

/// Why packages could not be had.
#[derive(Debug, Clone)]
pub enum PackageError {
    /// The request cannot be taken (a specifier, a language without packages, the feature
    /// turned off): the caller's to fix.
    Refused(String),
    /// A package cannot be had from the index, or the installer failed (named, with why).
    Failed(String),
}

impl PackageError {
    pub fn message(&self) -> &str {
        match self {
            Self::Refused(m) | Self::Failed(m) => m,
        }
    }
}

impl From<spec::SpecError> for PackageError {
    fn from(e: spec::SpecError) -> Self {
        Self::Refused(e.to_string())
    }
}

/// Why the installer program (uv, or npm's `npm-cli.js`) cannot be had: the operator's to
/// fix. Cloned out of the once-resolved cell each installation reads.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProgramError {
    #[error(
        "packages: the installer (uv) is not installed on this server; its operator can \
         install it (pip install uv) or name it with --uv"
    )]
    NoUv,
    #[error(
        "packages: the installer {} is not reachable by the installer's uid and cannot be \
         placed in {}: {why}",
        uv.display(),
        root.display()
    )]
    UvNotPlaced {
        uv: PathBuf,
        root: PathBuf,
        why: std::sync::Arc<std::io::Error>,
    },
    #[error(
        "packages: npm is not installed beside node on this server; its \
         operator can install it or name its npm-cli.js with --npm"
    )]
    NoNpm,
    #[error(
        "packages: npm ({}) is not reachable by the installer's uid; \
         its operator can name one that is with --npm",
        .0.display()
    )]
    NpmUnreachable(PathBuf),
    /// The blocking task that looked for it did not finish (a panic, the runtime ending).
    #[error("packages: finding {what} failed: {why}")]
    Lookup { what: &'static str, why: String },
}

impl From<ProgramError> for PackageError {
    fn from(e: ProgramError) -> Self {
        Self::Failed(e.to_string())
    }
}

/// A `replbox.install` line that is not made of plain string literals: the caller's to
/// write again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "replbox.install: {line:?} is not a call with string literals; write it on a \
     line of its own at the top of the cell, as \
     await replbox.install('lodash', 'is-odd@3')"
)]
pub struct InstallLineError {
    /// The line's first 80 characters.
    pub line: String,
}

impl From<InstallLineError> for crate::error::ToolError {
    fn from(e: InstallLineError) -> Self {
        Self::invalid(e.to_string())
    }
}

/// A package request: refused (nothing of it was started), or a package that cannot be had.
impl From<PackageError> for crate::error::ToolError {
    fn from(e: PackageError) -> Self {
        match e {
            PackageError::Refused(m) => Self::invalid(m),
            PackageError::Failed(m) => Self::new(crate::error::ErrorKind::PackageUnavailable, m),
        }
    }
}

/// Refuse a request's `packages` that no server could take: a language other than Python
/// and JavaScript, a caller's virtual environment (its interpreter is never run by the
/// installer), a specifier that is not a plain requirement.
pub fn check_request(language: &str, venv: bool, specs: &[String]) -> Result<(), PackageError> {
    let Some(eco) = Eco::of(language) else {
        return Err(PackageError::Refused(format!(
            "packages: only python and javascript take packages here, not {language}; leave \
             packages out"
        )));
    };
    if venv {
        return Err(PackageError::Refused(
            "packages and venv cannot go together: install into the virtual environment \
             itself, or leave venv out"
                .into(),
        ));
    }
    Packages::check(eco, specs)
}

/// The service, or why there is none.
pub fn enabled(p: Option<&Arc<Packages>>) -> Result<&Arc<Packages>, PackageError> {
    p.ok_or_else(|| {
        PackageError::Refused(
            "packages: this server installs no packages (its operator turned them off with \
             --no-packages, or it has no package cache: see its log); leave packages out"
                .into(),
        )
    })
}

/// The packages service: one per server (None when `--no-packages`).
pub struct Packages {
    sandbox: Arc<Sandbox>,
    /// The installer's own proxy: only the operator's indexes.
    egress: Egress,
    index: flags::Index,
    /// The npm registry.
    registry: flags::Index,
    root: PathBuf,
    /// The installer's uid (and gid) when the server is root.
    installer: Option<u32>,
    uv_flag: Option<PathBuf>,
    /// The installer program, resolved once, at the first installation (the operator's
    /// choice: `--uv`, else the uv beside the sessions' Python, else on PATH), and placed
    /// where the installer's uid can run it; or why there is none.
    uv: tokio::sync::OnceCell<Result<PathBuf, ProgramError>>,
    npm_flag: Option<PathBuf>,
    /// npm's program (its `npm-cli.js`, run by the sessions' node), found once.
    npm: tokio::sync::OnceCell<Result<PathBuf, ProgramError>>,
    timeout: Duration,
    resolved: Resolved,
    metrics: crate::metrics::PackageMetrics,
    /// The cache's size, cap and record of use (see `cache`).
    upkeep: cache::Upkeep,
    /// The shared, sealed layers of resolved sets (see `shared`).
    store: shared::Store,
    /// Whether a Python package the index has only as source may be built
    /// (`--package-builds`; see [`build_python`](Self::build_python)).
    builds: bool,
}

/// One run's or session's packages: a directory on its PYTHONPATH (npm's: its
/// `node_modules/` on NODE_PATH). A run's is in the cache's `layers/` and removed when
/// dropped; a session's is in the session's own directory and goes with it.
#[derive(Debug)]
pub struct Layer {
    pub dir: PathBuf,
    pub eco: Eco,
    remove: bool,
    /// The packages installed into it, which eviction leaves in the cache while it lives
    /// (and the shared layer it uses, `layer:KEY`, which eviction leaves in the store).
    held: std::sync::Mutex<Vec<String>>,
    book: Option<Arc<cache::Book>>,
    /// The store of shared layers, read-only to the layer's program from its start (a warm
    /// session takes one later, by its path); None where nothing is shared.
    store: Option<PathBuf>,
    /// The shared layer (sealed, in the store) on its search path after `dir`.
    shared: std::sync::Mutex<Option<PathBuf>>,
    /// What the shared layer holds (npm: a first installation into `dir` takes its
    /// requested packages along, see [`Packages::install`]).
    shared_set: std::sync::Mutex<Option<Installed>>,
    /// The hold on that shared layer, which every server sharing the cache sees (its
    /// evictions leave the layer while it lives).
    hold: std::sync::Mutex<Option<shared::Hold>>,
    /// A source build's code has had it writable (see `build_python`): it may hold links
    /// that uv would follow, so no installation with the shared cache goes into it again.
    built: std::sync::atomic::AtomicBool,
}

impl Drop for Layer {
    fn drop(&mut self) {
        if let Some(book) = &self.book {
            book.release(&self.held.lock().unwrap_or_else(|e| e.into_inner()));
        }
        if !self.remove {
            return;
        }
        let dir = std::mem::take(&mut self.dir);
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn_blocking(move || crate::workspace::remove_tree(&dir));
            }
            Err(_) => crate::workspace::remove_tree(&dir),
        }
    }
}

/// A Python or JavaScript session's packages: its layer (on its search path from the start,
/// so `%pip install` or `replbox.install` can fill it while it runs) and the operator's
/// interpreter the installs are for.
pub struct SessionPackages {
    /// The installer `%pip` runs.
    pub service: Arc<Packages>,
    pub layer: Layer,
    /// The interpreter (python, or the node that runs npm).
    pub exe: PathBuf,
}

impl Layer {
    /// What a child is given to import its packages: the directories it reads (its own
    /// layer, and the store of shared layers), and the variables naming them (its own
    /// first, so that what `%pip` puts there wins).
    pub fn view(&self) -> (Vec<PathBuf>, Vec<(String, String)>) {
        let mut dirs = vec![self.dir.clone()];
        dirs.extend(self.store.clone());
        let var = match self.eco {
            Eco::Python => {
                let mut path = self.dir.display().to_string();
                if let Some(s) = self.shared_dir() {
                    path = format!("{path}:{}", s.display());
                }
                ("PYTHONPATH".into(), path)
            }
            // node looks in it at every require: what is installed later is found at once.
            Eco::Npm => {
                let mut path = self.dir.join("node_modules").display().to_string();
                if let Some(s) = self.shared_dir() {
                    path = format!("{path}:{}", s.join("node_modules").display());
                }
                ("NODE_PATH".into(), path)
            }
        };
        (dirs, vec![var])
    }

    /// Whether a source build's code has had it writable.
    fn was_built(&self) -> bool {
        self.built.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// [`view`](Self::view)'s variables for a program whose variables `env` were made
    /// before it was given its shared layer (a warm session's): each one's value as the
    /// view says it, then whatever followed the layer's own directory in it.
    pub fn update_view(&self, env: &mut Vec<(String, String)>) {
        let own = match self.eco {
            Eco::Python => self.dir.display().to_string(),
            Eco::Npm => self.dir.join("node_modules").display().to_string(),
        };
        for (k, v) in self.view().1 {
            let rest = env
                .iter()
                .find(|(n, _)| *n == k)
                .and_then(|(_, old)| old.strip_prefix(&own))
                .unwrap_or("")
                .to_string();
            crate::exec::env::set(env, &k, format!("{v}{rest}"));
        }
    }

    /// What the shared layer it uses holds, if any.
    fn shared_set(&self) -> Option<Installed> {
        self.shared_set
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The shared layer it uses, if any.
    pub fn shared_dir(&self) -> Option<PathBuf> {
        self.shared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Packages {
    /// The service for `flags` (None when turned off): its directories made (the
    /// installer's `installer_uid` when the server is root).
    pub fn new(
        flags: &Flags,
        uid_base: u32,
        sandbox: Arc<Sandbox>,
        metrics: crate::metrics::PackageMetrics,
    ) -> anyhow::Result<Option<Arc<Self>>> {
        if flags.no_packages {
            return Ok(None);
        }
        flags.check()?;
        flags.check_level(sandbox.level)?;
        let index = flags.python_index()?;
        let registry = flags.npm_registry()?;
        let root = flags.package_cache.clone().unwrap_or_else(default_cache);
        // The installer's proxy socket lies beneath it (`egress/NAME.sock`): a path the
        // kernel cannot bind would fail every installation, so say so now.
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
        let installer = sandbox
            .root
            .then(|| flags.installer_uid.unwrap_or(uid_base.saturating_sub(1)));
        let err = |what: &str, e: std::io::Error| {
            anyhow::anyhow!("package cache {}: {what}: {e}", root.display())
        };
        if let Err(e) = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(&root)
        {
            // The operator's own directory must work; the default one is a convenience: a
            // server that cannot make it (a home it may not write) serves without packages.
            if flags.package_cache.is_some() {
                return Err(err("cannot create it", e));
            }
            tracing::warn!(
                "packages on demand are off: the default package cache {} cannot be \
                 created ({e}); name one with --package-cache DIR",
                root.display()
            );
            return Ok(None);
        }
        set_mode(&root, 0o711).map_err(|e| err("cannot set its mode", e))?;
        own_dir(&root.join("uv"), 0o700, installer).map_err(|e| err("uv", e))?;
        own_dir(&root.join("npm"), 0o700, installer).map_err(|e| err("npm", e))?;
        for d in ["layers", "tmp"] {
            own_dir(&root.join(d), 0o711, None).map_err(|e| err(d, e))?;
        }
        // The index's hosts by name and port, reached whatever they resolve to: the
        // installer is the server's own program, its only caller input the checked
        // specifiers (an operator's index may be private; a mirror may answer for PyPI).
        let mut hosts: Vec<String> = Vec::new();
        for ix in [&index, &registry] {
            hosts.extend(ix.domains.iter().map(|d| format!("{d}:443")));
            if let Some((h, p)) = &ix.host {
                hosts.push(format!("{h}:{p}"));
            }
        }
        let policy = Policy::new(false, &[], &hosts, &[]).map_err(|e| anyhow::anyhow!(e))?;
        let egress = Egress::new(policy, &egress_dir)
            .map_err(|e| anyhow::anyhow!("cannot set up the installer's proxy: {e}"))?;
        // The operator's --uv must be a program: a typo stops the server at once.
        if let Some(f) = &flags.uv {
            real_program(f).ok_or_else(|| {
                anyhow::anyhow!("--uv {}: not an executable program", f.display())
            })?;
        }
        if let Some(f) = &flags.npm
            && !f.is_file()
        {
            anyhow::bail!("--npm {}: not npm's npm-cli.js", f.display());
        }
        let upkeep = cache::Upkeep::new(&root, flags.package_cache_mb);
        let store = shared::Store::new(&root.join("layers"), &root.join("shared.key"))
            .map_err(|e| err("shared layers", e))?;
        Ok(Some(Arc::new(Self {
            sandbox,
            egress,
            index,
            registry,
            root,
            installer,
            uv_flag: flags.uv.clone(),
            uv: tokio::sync::OnceCell::new(),
            npm_flag: flags.npm.clone(),
            npm: tokio::sync::OnceCell::new(),
            resolved: Resolved::default(),
            metrics,
            upkeep,
            store,
            builds: flags.package_builds,
            timeout: flags
                .package_timeout_s
                .map(|s| Duration::from_secs(s.max(1)))
                .unwrap_or(DEFAULT_TIMEOUT),
        })))
    }

    /// The installer program (see `uv`), resolved at the first call with the sessions'
    /// Python (the real executable, as detected).
    async fn uv(&self, python: &Path) -> Result<PathBuf, ProgramError> {
        let r = self
            .uv
            .get_or_init(|| {
                let (flag, python, root) = (
                    self.uv_flag.clone(),
                    python.to_path_buf(),
                    self.root.clone(),
                );
                let as_root = self.sandbox.root;
                async move {
                    tokio::task::spawn_blocking(move || resolve_uv(flag, &python, &root, as_root))
                        .await
                        .unwrap_or_else(|e| {
                            Err(ProgramError::Lookup {
                                what: "uv",
                                why: e.to_string(),
                            })
                        })
                }
            })
            .await;
        r.clone()
    }

    /// Whether user code cannot change the mode of what it reads its packages from: as
    /// root (another uid), or at bwrap (read-only mounts). Not root at Landlock it runs as
    /// the cache's owner and chmod is no Landlock right: there no layer is shared between
    /// runs or sessions (no store), and none links the cache's files, else one principal's
    /// chmod would make another's imports fail, or fall through to another copy.
    fn modes_sealed(&self) -> bool {
        self.sandbox.root || self.sandbox.level == crate::sandbox::Level::Bwrap
    }

    /// Check a request's specifiers before anything is started for it.
    pub fn check(eco: Eco, specs: &[String]) -> Result<(), PackageError> {
        spec::check(eco, specs)
            .map(|_| ())
            .map_err(PackageError::from)
    }

    /// A new, empty layer (the installer's, readable by all: it holds public packages):
    /// `packages/` in `parent` (a session's own directory, which no user code writes), else
    /// one of the cache's `layers/` (a run's, removed when dropped).
    pub fn layer(&self, eco: Eco, parent: Option<&Path>) -> Result<Layer, PackageError> {
        let (dir, remove) = match parent {
            Some(p) => (p.join("packages"), false),
            None => (
                self.root
                    .join("layers")
                    .join(uuid::Uuid::new_v4().simple().to_string()),
                true,
            ),
        };
        own_dir(&dir, 0o755, self.installer)
            .map_err(|e| PackageError::Failed(format!("cannot make a package layer: {e}")))?;
        Ok(Layer {
            dir,
            eco,
            remove,
            held: std::sync::Mutex::default(),
            book: Some(self.upkeep.book.clone()),
            store: self.modes_sealed().then(|| self.store.dir.clone()),
            shared: std::sync::Mutex::default(),
            shared_set: std::sync::Mutex::default(),
            hold: std::sync::Mutex::default(),
            built: Default::default(),
        })
    }

    /// Install a run's or session's `packages` (checked here) into its `layer` before its
    /// program starts (or into a warm session that has run nothing of its caller's): a set
    /// whose exact pins are known (resolved lately, or exact pins themselves; npm's: the
    /// whole tree it resolved to lately) is taken from the store of shared layers,
    /// read-only, without running the installer; one not there yet is built there (see
    /// `shared`) and taken. Otherwise (nothing shared at this level, a layer that holds
    /// packages already) as [`install`](Self::install).
    pub async fn provide(
        self: &Arc<Self>,
        exe: &Path,
        specs: &[String],
        layer: &Layer,
        principal: &str,
        cancel: &CancellationToken,
    ) -> Result<Installed, PackageError> {
        if layer.store.is_none() || layer.shared_dir().is_some() || !layer_is_empty(&layer.dir) {
            return self.install(exe, specs, layer, principal, cancel).await;
        }
        let started = Instant::now();
        let checked = spec::check(layer.eco, specs)?;
        if checked.is_empty() {
            return self.install(exe, specs, layer, principal, cancel).await;
        }
        let Some(tag) = self.store.tag(exe, layer.eco).await else {
            return self.install(exe, specs, layer, principal, cancel).await;
        };
        let index = self.index_url(layer.eco).to_string();
        let texts: Vec<String> = checked.iter().map(|s| s.text.clone()).collect();
        let asked = resolved_key(exe, &index, &texts);
        let gate = self.upkeep.gate.read().await;
        // Known pins, and their layer in the store: nothing to run. Held first (so that no
        // server evicts it once found), then looked for.
        if let Some(pins) = self.resolved.get(&asked).filter(|p| !p.is_empty()) {
            let key = self.store.key(layer.eco, &pins, &index, &tag);
            let hold = self.store.hold(&key).map_err(|e| {
                PackageError::Failed(format!("packages: cannot hold a shared layer: {e}"))
            })?;
            if self.store.path(&key).is_dir() {
                let mut out = match layer.eco {
                    Eco::Python => Installed {
                        installed: pins
                            .iter()
                            .filter_map(|p| p.split_once("=="))
                            .map(|(n, v)| Package {
                                name: n.to_string(),
                                version: v.to_string(),
                            })
                            .collect(),
                        downloaded: 0,
                        duration_ms: 0,
                        pins,
                        built: Vec::new(),
                    },
                    Eco::Npm => npm::of_layout(&pins, &checked),
                };
                out.duration_ms = started.elapsed().as_millis() as u64;
                self.attach(layer, &key, &out, hold);
                self.metrics.offline(out.installed.len());
                return Ok(out);
            }
        }
        // Build it: the installer fills a directory of its own in `building/` (offline
        // from the pins when known), the server seals it and puts it in the store.
        let building = self
            .store
            .build(self.installer)
            .map_err(|e| PackageError::Failed(format!("cannot make a package layer: {e}")))?;
        let build = Layer {
            dir: building.dir.clone(),
            eco: layer.eco,
            remove: false,
            held: std::sync::Mutex::default(),
            book: None,
            store: None,
            shared: std::sync::Mutex::default(),
            shared_set: std::sync::Mutex::default(),
            hold: std::sync::Mutex::default(),
            built: Default::default(),
        };
        let ask = (principal, cancel);
        let r = match layer.eco {
            Eco::Python => {
                self.install_wheels(exe, &checked, &build, ask, started)
                    .await
            }
            Eco::Npm => {
                self.upkeep.saw_node(exe);
                self.install_npm(exe, &checked, &build, ask, started)
                    .await
                    .map_err(Unmet::from)
            }
        };
        let mut unbuilt = false;
        let r = match r {
            Err(u) => {
                unbuilt = u.no_wheel && self.builds;
                Err(u.error)
            }
            Ok(out) => {
                // What the layer is keyed by: Python's pins; npm's whole tree, as its
                // lockfile says (the requested packages' versions do not fix their
                // dependencies').
                let set = match layer.eco {
                    Eco::Python => Some(out.pins.clone()),
                    Eco::Npm => {
                        let dir = build.dir.clone();
                        tokio::task::spawn_blocking(move || npm::layout(&dir))
                            .await
                            .ok()
                            .flatten()
                    }
                };
                match set.filter(|s| !s.is_empty()) {
                    Some(set) => self
                        .publish(layer, &build.dir, &set, (&index, &tag), &out)
                        .await
                        .map(|()| {
                            if layer.eco == Eco::Npm {
                                self.resolved.put(asked, set);
                            }
                            Some(out)
                        }),
                    None => Ok(None),
                }
            }
        };
        // What is left of the build (nothing once published) goes, with its lock.
        let _ = tokio::task::spawn_blocking(move || drop(building)).await;
        if unbuilt {
            // Built from source: into this run's or session's own layer, never the store
            // (what is there is only what the index served, verified by its hashes).
            drop(gate);
            return self
                .build_python(exe, &checked, layer, (principal, cancel), started)
                .await;
        }
        drop(gate);
        match r {
            Ok(Some(out)) => {
                // The store grew (and the cache, when it downloaded): measured, kept in the
                // cap.
                self.upkeep_in_background();
                Ok(out)
            }
            // npm said nothing of what it installed: nothing to key a layer by, so into the
            // run's or session's own.
            Ok(None) => {
                tracing::warn!("packages: npm left no lockfile; installing into the layer");
                self.install(exe, specs, layer, principal, cancel).await
            }
            Err(e) => Err(e),
        }
    }

    /// The index (or registry) of `eco`'s packages.
    fn index_url(&self, eco: Eco) -> &str {
        match eco {
            Eco::Python => &self.index.url,
            Eco::Npm => &self.registry.url,
        }
    }

    /// Seal the layer built in `built` (holding `out`, the set `set`) and put it in the
    /// store under the key of `set` for `(index, tag)`; `layer` takes it.
    async fn publish(
        &self,
        layer: &Layer,
        built: &Path,
        set: &[String],
        (index, tag): (&str, &str),
        out: &Installed,
    ) -> Result<(), PackageError> {
        let key = self.store.key(layer.eco, set, index, tag);
        // Held before it is in the store: another server's eviction never sees it there
        // unheld.
        let hold = self.store.hold(&key).map_err(|e| {
            PackageError::Failed(format!("packages: cannot hold a shared layer: {e}"))
        })?;
        let (store, built, k) = (self.store.dir.clone(), built.to_path_buf(), key.clone());
        tokio::task::spawn_blocking(move || shared::publish(&store, &built, &k))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)))
            .map_err(|e| {
                PackageError::Failed(format!(
                    "packages: cannot put the installed packages in place: {e}"
                ))
            })?;
        self.attach(layer, &key, out, hold);
        Ok(())
    }

    /// `layer` takes the shared layer `key` (which holds `out`'s packages), held by `hold`:
    /// on its search path, and held (with its packages) while it lives. Called with the gate
    /// shared, so that no eviction of this server's runs between finding the layer and
    /// holding it.
    fn attach(&self, layer: &Layer, key: &str, out: &Installed, hold: shared::Hold) {
        *layer.shared.lock().unwrap_or_else(|e| e.into_inner()) = Some(self.store.path(key));
        *layer.shared_set.lock().unwrap_or_else(|e| e.into_inner()) = Some(out.clone());
        *layer.hold.lock().unwrap_or_else(|e| e.into_inner()) = Some(hold);
        let mut held = layer.held.lock().unwrap_or_else(|e| e.into_inner());
        self.upkeep.book.used(layer.eco, &out.installed, &mut held);
        self.upkeep.book.hold(&cache::layer_key(key), &mut held);
    }

    /// Install `specs` (checked here) into `layer` for the interpreter `exe` (python, or
    /// the node that runs npm), as `principal` asked. Refused specifiers are an error
    /// before anything runs. npm's first installation into a layer that uses a shared one
    /// takes that one's requested packages along (see `npm::along`).
    pub async fn install(
        self: &Arc<Self>,
        exe: &Path,
        specs: &[String],
        layer: &Layer,
        principal: &str,
        cancel: &CancellationToken,
    ) -> Result<Installed, PackageError> {
        let started = Instant::now();
        let specs = spec::check(layer.eco, specs)?;
        if specs.is_empty() {
            return Ok(Installed {
                installed: Vec::new(),
                downloaded: 0,
                duration_ms: 0,
                pins: Vec::new(),
                built: Vec::new(),
            });
        }
        let ask = (principal, cancel);
        // Shared with other installations; an eviction waits for it alone.
        let gate = self.upkeep.gate.read().await;
        let r = match layer.eco {
            Eco::Python => self.install_python(exe, &specs, layer, ask, started).await,
            Eco::Npm => {
                self.upkeep.saw_node(exe);
                match npm::along(layer, &specs) {
                    Some((along, shared)) => {
                        let all: Vec<spec::Spec> = along.into_iter().chain(specs.clone()).collect();
                        self.install_npm(exe, &all, layer, ask, started)
                            .await
                            .map(|out| npm::without(out, &specs, &shared))
                    }
                    None => self.install_npm(exe, &specs, layer, ask, started).await,
                }
            }
        };
        // A source build's packages came from a cache of its own, not this one.
        let cached = !layer.was_built();
        if let Ok(out) = &r
            && cached
        {
            // Recorded before the gate opens: no eviction sees them unheld.
            let mut held = layer.held.lock().unwrap_or_else(|e| e.into_inner());
            self.upkeep.book.used(layer.eco, &out.installed, &mut held);
        }
        drop(gate);
        if cached && r.as_ref().is_ok_and(|out| out.downloaded > 0) {
            self.upkeep_in_background();
        }
        r
    }

    /// What a server starts once it answers: the cache measured (and brought under its
    /// cap).
    pub fn start_upkeep(self: &Arc<Self>) {
        self.upkeep_in_background();
    }

    /// Install `specs` into `layer` from wheels; when the index has a package only as
    /// source and the operator allows builds, build it (see
    /// [`build_python`](Self::build_python)).
    async fn install_python(
        &self,
        python: &Path,
        specs: &[spec::Spec],
        layer: &Layer,
        ask: (&str, &CancellationToken),
        started: Instant,
    ) -> Result<Installed, PackageError> {
        if layer.was_built() {
            // What a build's code planted in the layer (a link into the shared cache, say)
            // a uv with the shared cache writable would follow: a layer a build wrote is
            // installed into as by a build, apart from the cache, from now on.
            return self.build_python(python, specs, layer, ask, started).await;
        }
        match self
            .install_wheels(python, specs, layer, ask, started)
            .await
        {
            Err(u) if u.no_wheel && self.builds => {
                self.build_python(python, specs, layer, ask, started).await
            }
            r => r.map_err(|u| u.error),
        }
    }

    /// Install `specs` into `layer` from wheels only (`--no-build`: no package code runs),
    /// through the shared cache.
    async fn install_wheels(
        &self,
        python: &Path,
        specs: &[spec::Spec],
        layer: &Layer,
        (principal, cancel): (&str, &CancellationToken),
        started: Instant,
    ) -> Result<Installed, Unmet> {
        let uv = self
            .uv(python)
            .await
            .map_err(|e| Unmet::from(PackageError::from(e)))?;
        let texts: Vec<String> = specs.iter().map(|s| s.text.clone()).collect();
        let key = resolved_key(python, &self.index.url, &texts);
        // Offline first, from the cache alone, when that gives what the index would: the
        // pins this same request resolved to lately (into an empty layer, so nothing in it
        // weighed on the resolution), or a request of exact pins. Anything amiss (not all
        // in the cache, pruned since) falls through to the index.
        let fresh = layer_is_empty(&layer.dir);
        let pins = fresh.then(|| self.resolved.get(&key)).flatten();
        let known = pins.is_some();
        let offline: Option<(Vec<&str>, Vec<String>)> = match pins {
            Some(pins) => Some((vec!["--offline", "--no-deps"], pins)),
            None if specs.iter().all(spec::Spec::is_exact_pin) => {
                Some((vec!["--offline"], texts.clone()))
            }
            None => None,
        };
        if let Some((flags, reqs)) = offline {
            let done = self
                .run_uv(&uv, python, layer, &flags, &reqs, principal, cancel)
                .await;
            if done.ok {
                let mut out = parse_uv(&done.stderr);
                out.duration_ms = started.elapsed().as_millis() as u64;
                self.metrics.offline(out.installed.len());
                // Exact pins resolved from the cache: what a repeat gets too.
                if fresh && !known && !out.installed.is_empty() {
                    self.resolved.put(key, out.pins.clone());
                }
                return Ok(out);
            }
            if done.stopped.is_some() && cancel.is_cancelled() {
                return Err(Unmet::from(PackageError::Failed(
                    "packages: the installation was cancelled".into(),
                )));
            }
        }
        let done = self
            .run_uv(&uv, python, layer, &[], &texts, principal, cancel)
            .await;
        let names: Vec<&str> = specs.iter().map(|s| s.text.as_str()).collect();
        if let Some(why) = done.stopped {
            return Err(Unmet::from(PackageError::Failed(format!(
                "packages: could not install {}: {why}",
                names.join(", ")
            ))));
        }
        if !done.ok {
            let (reason, text) = install::uv_failure(&done.stderr);
            return Err(Unmet {
                error: PackageError::Failed(format!(
                    "packages: could not install {}: {}.\n{text}",
                    names.join(", "),
                    reason.says()
                )),
                no_wheel: reason == install::Reason::NoWheel,
            });
        }
        let mut out = parse_uv(&done.stderr);
        out.duration_ms = started.elapsed().as_millis() as u64;
        self.metrics.online(out.installed.len(), out.downloaded);
        if fresh && !out.installed.is_empty() {
            let pins = out
                .installed
                .iter()
                .map(|p| format!("{}=={}", p.name, p.version))
                .collect();
            self.resolved.put(key, pins);
        }
        Ok(out)
    }

    /// One run of `uv pip install` into `layer` for `python`: `flags` of the server's
    /// own, then `reqs` (checked specifiers, or pins of the installer's own output) after
    /// `--`, in a scratch home removed after it.
    #[allow(clippy::too_many_arguments)]
    async fn run_uv(
        &self,
        uv: &Path,
        python: &Path,
        layer: &Layer,
        flags: &[&str],
        reqs: &[String],
        principal: &str,
        cancel: &CancellationToken,
    ) -> install::Done {
        let home = match self.installer_home() {
            Ok(home) => home,
            Err(stopped) => return stopped,
        };
        let cache = self.root.join("uv");
        let mut argv = self.uv_argv(uv, python, &cache, layer);
        argv.insert(3, "--no-build".into());
        if layer.dir.starts_with(&self.store.building) || !self.modes_sealed() || self.builds {
            // A shared layer is sealed (its files made root's) once built: copies, never
            // hard links to the cache's files, which would be sealed with it. Where user
            // code could chmod its layer's files, a hard link would let it chmod the
            // cache's, which every later installation links. Where builds are allowed, a
            // later source build's code writes the session's layer (see `build_python`):
            // no file of it may be one of the cache's.
            argv.extend(["--link-mode".into(), "copy".into()]);
        }
        argv.extend(flags.iter().map(|f| f.to_string()));
        argv.push("--".into());
        argv.extend(reqs.iter().cloned());
        let job = install::Job {
            argv,
            env: installer_env(),
            exes: vec![uv.to_path_buf(), python.to_path_buf()],
            // The shared cache and this one layer: never another run's or session's.
            rw: vec![cache, layer.dir.clone()],
            home,
        };
        self.run_installer(job, principal, cancel).await
    }

    /// `uv pip install` into `layer` for `python` from the index, with `cache`: the
    /// options every run of it takes (the program is `argv[0]`, the subcommand 1-2).
    fn uv_argv(&self, uv: &Path, python: &Path, cache: &Path, layer: &Layer) -> Vec<String> {
        [
            uv.display().to_string(),
            "pip".into(),
            "install".into(),
            "--no-config".into(),
            "--no-progress".into(),
            "--color".into(),
            "never".into(),
            "--python".into(),
            python.display().to_string(),
            "--index-url".into(),
            self.index.url.clone(),
            "--cache-dir".into(),
            cache.display().to_string(),
            "--target".into(),
            layer.dir.display().to_string(),
        ]
        .into()
    }
}

impl Packages {
    /// Whether `specs` would be installed from the cache alone for the interpreter `exe`:
    /// the same request was resolved lately (see [`RESOLVED_FRESH`]).
    pub fn cached(&self, eco: Eco, exe: &Path, specs: &[String]) -> bool {
        let Ok(specs) = spec::check(eco, specs) else {
            return false;
        };
        let texts: Vec<String> = specs.iter().map(|s| s.text.clone()).collect();
        let index = match eco {
            Eco::Python => &self.index.url,
            Eco::Npm => &self.registry.url,
        };
        self.resolved
            .get(&resolved_key(exe, index, &texts))
            .is_some()
    }
}

/// What [`warm_check`]'s code prints when the session can take its layer as it is.
pub const WARM_CLEAR: &str = "replbox-layer-clear";

/// Most top-level names of a layer [`warm_check`] asks about.
const WARM_CHECK_NAMES: usize = 2000;

/// For a Python layer filled after its interpreter started (a warm session's): code that
/// makes the import system look at the layer again and prints [`WARM_CLEAR`] unless a
/// module of the same name as one the layer now holds at its top level is already
/// imported (that one, not the layer's, would be what `import` gives). For npm, code that
/// puts the shared layer's `node_modules/` on node's search path after the layer's own, as
/// NODE_PATH would have at a cold start (node's `require` looks in it at every call, and
/// nothing is preloaded); None without a shared layer.
pub fn warm_check(layer: &Layer) -> Option<String> {
    let shared = layer.shared_dir();
    if layer.eco == Eco::Npm {
        let path = format!(
            "{}:{}",
            layer.dir.join("node_modules").display(),
            shared?.join("node_modules").display()
        );
        let path = serde_json::to_string(&path).ok()?;
        // The warm session has run nothing of its caller's: node's own module loader.
        return Some(format!(
            "void ((m) => {{ process.env.NODE_PATH = {path}; m._initPaths(); \
             console.log({WARM_CLEAR:?}); }})(require('module'))"
        ));
    }
    let mut names: Vec<String> = [Some(layer.dir.clone()), shared.clone()]
        .into_iter()
        .flatten()
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
        .filter_map(|e| {
            let n = e.file_name().to_str()?.to_string();
            let stem = n.split('.').next()?.to_string();
            let ident = stem
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && stem.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            (ident && !n.ends_with(".dist-info") && !n.ends_with(".data")).then_some(stem)
        })
        .take(WARM_CHECK_NAMES)
        .collect();
    names.sort();
    names.dedup();
    let list = serde_json::to_string(&names).ok()?;
    // The shared layer goes on sys.path right after the session's own (as PYTHONPATH
    // would have put it at a cold start): the store is visible to the session from its
    // start, the layer's path is known to it only now.
    let add = match &shared {
        Some(sh) => {
            let (own, sh) = (
                serde_json::to_string(&layer.dir.display().to_string()).ok()?,
                serde_json::to_string(&sh.display().to_string()).ok()?,
            );
            format!(
                "s.path.insert(s.path.index({own}) + 1 if {own} in s.path else 0, {sh}) \
                 if {sh} not in s.path else None, "
            )
        }
        None => String::new(),
    };
    // One expression that leaves no name behind and whose value (None) is not shown.
    Some(format!(
        "(lambda i, s: [{add}i.invalidate_caches(), print({WARM_CLEAR:?} if not \
         [n for n in {list} if n in s.modules] else 'replbox-layer-shadowed')] and None)\
         (__import__('importlib'), __import__('sys'))"
    ))
}

/// What a request resolved to is kept under: the interpreter, the index and the request.
fn resolved_key(python: &Path, index: &str, specs: &[String]) -> String {
    format!("{}\n{index}\n{}", python.display(), specs.join("\n"))
}

/// Whether `dir` holds nothing yet.
fn layer_is_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none())
}

/// How long what a request resolved to stands in for asking the index again: a request
/// within it gets the same versions, from the cache, without the network.
const RESOLVED_FRESH: Duration = Duration::from_secs(3600);
/// Most requests whose resolution is kept (the oldest goes first).
const RESOLVED_MAX: usize = 512;

/// Recent resolutions: a request's specifiers to the exact pins it installed (the
/// installer's own output, from the index; npm's: the tree of its shared layer, see
/// `npm::layout`, or none when only asked), for [`RESOLVED_FRESH`].
#[derive(Default)]
struct Resolved(std::sync::Mutex<std::collections::HashMap<String, (Vec<String>, Instant)>>);

impl Resolved {
    fn get(&self, key: &str) -> Option<Vec<String>> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.get(key)
            .filter(|(_, at)| at.elapsed() < RESOLVED_FRESH)
            .map(|(pins, _)| pins.clone())
    }

    /// `key` was asked lately, what it resolved to unknown (none): kept as it is when known.
    fn mark(&self, key: String) {
        if self.get(&key).is_none() {
            self.put(key, Vec::new());
        }
    }

    fn put(&self, key: String, pins: Vec<String>) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, (_, at)| at.elapsed() < RESOLVED_FRESH);
        if map.len() >= RESOLVED_MAX
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        map.insert(key, (pins, Instant::now()));
    }
}

/// The uv an installation runs, as [`Packages::uv`] says; staged where the installer's
/// uid can run it when the server is root and it lies where other users cannot reach.
fn resolve_uv(
    flag: Option<PathBuf>,
    python: &Path,
    root: &Path,
    as_root: bool,
) -> Result<PathBuf, ProgramError> {
    let uv = find_uv(flag.as_deref(), python).ok_or(ProgramError::NoUv)?;
    if !as_root || crate::sandbox::reachable_by_others(&uv) {
        return Ok(uv);
    }
    let staged = stage_uv(&uv, root).map_err(|e| ProgramError::UvNotPlaced {
        uv: uv.clone(),
        root: root.to_path_buf(),
        why: std::sync::Arc::new(e),
    })?;
    tracing::info!(uv = %uv.display(), staged = %staged.display(), "packages: installer placed");
    Ok(staged)
}

/// `p` with links resolved, when it is a regular file and not a script.
fn real_program(p: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(p)
        .ok()
        .filter(|r| r.is_file() && !is_script(r))
}

/// The real uv program (links and shims resolved): `flag`, else the one installed beside
/// `python` (its path or the file it links to), else the first on PATH that is a real
/// program, not a version manager's shim (a script that runs whatever the manager picks,
/// and that a confined uid may not reach), else the one the `uv` package of the first
/// `python3` on PATH names (pyenv's, whose `uv` on PATH is a shim).
fn find_uv(flag: Option<&Path>, python: &Path) -> Option<PathBuf> {
    if let Some(f) = flag {
        return real_program(f);
    }
    let mut dirs: Vec<PathBuf> = python.parent().map(Path::to_path_buf).into_iter().collect();
    if let Ok(r) = std::fs::canonicalize(python) {
        dirs.extend(r.parent().map(Path::to_path_buf));
    }
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path).filter(|d| !d.ends_with("shims")));
    }
    if let Some(uv) = dirs.iter().find_map(|d| real_program(&d.join("uv"))) {
        return Some(uv);
    }
    let out = std::process::Command::new("python3")
        .args(["-c", "import uv; print(uv.find_uv_bin())"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let named = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !named.is_empty())
        .then(|| real_program(Path::new(&named)))
        .flatten()
}

/// Whether `p` starts with `#!` (a shim, not the program).
fn is_script(p: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 2];
    std::fs::File::open(p)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|()| &head == b"#!")
}

/// Put the operator's `uv` where the installer's uid can run it: `ROOT/installer/uv`, the
/// server's (root's) and read-only to others, a hard link to it (a copy across file
/// systems). Used when it lies under a directory other users cannot enter (pyenv under a
/// 0700 /root): the installer's uid is such a user, and at levels without a mount namespace
/// nothing can show it the original.
fn stage_uv(uv: &Path, root: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let dir = root.join("installer");
    own_dir(&dir, 0o755, None)?;
    let target = dir.join("uv");
    let src = std::fs::metadata(uv)?;
    // Root's and 0755 (never writable by the installer's uid, which runs it).
    let sound = |m: &std::fs::Metadata| m.is_file() && m.uid() == 0 && m.mode() & 0o7777 == 0o755;
    if let Ok(t) = std::fs::symlink_metadata(&target)
        && sound(&t)
        && ((t.dev(), t.ino()) == (src.dev(), src.ino())
            || (t.len() == src.len() && t.mtime() == src.mtime()))
    {
        return Ok(target);
    }
    let tmp = dir.join(format!("uv.{}", uuid::Uuid::new_v4().simple()));
    let _ = std::fs::remove_file(&tmp);
    if std::fs::hard_link(uv, &tmp).is_err() || !sound(&std::fs::symlink_metadata(&tmp)?) {
        let _ = std::fs::remove_file(&tmp);
        std::fs::copy(uv, &tmp)?;
        let f = std::fs::File::open(&tmp)?;
        f.set_modified(src.modified()?)?;
        std::os::unix::fs::lchown(&tmp, Some(0), Some(0))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    }
    std::fs::rename(&tmp, &target)?;
    Ok(target)
}

/// The installer's variables: no colour, no Python downloads, and the operator's own CA
/// bundle when the server was given one (a TLS-inspecting network's, say; node's own
/// variable for npm).
fn installer_env() -> Vec<(String, String)> {
    let mut env = vec![
        ("NO_COLOR".to_string(), "1".to_string()),
        ("UV_PYTHON_DOWNLOADS".to_string(), "never".to_string()),
    ];
    for k in ["SSL_CERT_FILE", "SSL_CERT_DIR", "NODE_EXTRA_CA_CERTS"] {
        if let Ok(v) = std::env::var(k) {
            env.push((k.to_string(), v));
        }
    }
    env
}

/// What uv's summary says: ` + name==version` per package added, `Prepared N packages`
/// when it had to download (or unpack) any.
fn parse_uv(stderr: &str) -> Installed {
    let mut out = Installed {
        installed: Vec::new(),
        downloaded: 0,
        duration_ms: 0,
        pins: Vec::new(),
        built: Vec::new(),
    };
    for line in stderr.lines() {
        if let Some(p) = line.trim_start().strip_prefix("Built ")
            && let Some((name, version)) = p.trim().split_once("==")
        {
            out.built.push(Package {
                name: name.to_string(),
                version: version.to_string(),
            });
        } else if let Some(p) = line.strip_prefix(" + ")
            && let Some((name, version)) = p.trim().split_once("==")
        {
            out.installed.push(Package {
                name: name.to_string(),
                version: version.to_string(),
            });
        } else if let Some(rest) = line.strip_prefix("Prepared ") {
            out.downloaded = rest
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(1);
        }
    }
    out.pins = out
        .installed
        .iter()
        .map(|p| format!("{}=={}", p.name, p.version))
        .collect();
    out
}

/// `%pip install ...` / `!pip install ...` lines at the top of a Python cell: the
/// specifiers they ask for and the rest of the cell (None when the cell has none).
/// Options are refused as specifiers are (only names and versions are accepted).
pub fn pip_lines(code: &str) -> Option<(Vec<String>, String)> {
    let mut specs = Vec::new();
    let mut rest_at = 0;
    let mut any = false;
    for line in code.split_inclusive('\n') {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            rest_at += line.len();
            continue;
        }
        // Quoted as a shell would take them (`%pip install "pandas>=2"`); a line that
        // does not split is passed on whole, to be refused as a specifier.
        let owned = shlex::split(t).unwrap_or_else(|| vec![t.to_string()]);
        let words: Vec<&str> = owned.iter().map(String::as_str).collect();
        let is_pip = matches!(
            words.as_slice(),
            ["%pip" | "!pip" | "!pip3" | "%pip3", "install", ..]
                | ["!python" | "!python3", "-m", "pip", "install", ..]
        );
        if !is_pip {
            break;
        }
        any = true;
        let skip = if words[0].starts_with("!python") {
            4
        } else {
            2
        };
        // `-q`/`--quiet` and `-U`/`--upgrade` mean nothing here; any other option is
        // passed on as a specifier, to be refused by name.
        specs.extend(
            words[skip..]
                .iter()
                .filter(|w| !matches!(**w, "-q" | "--quiet" | "-U" | "--upgrade"))
                .map(|w| w.to_string()),
        );
        rest_at += line.len();
    }
    any.then(|| (specs, code[rest_at..].to_string()))
}

/// `await replbox.install('a', "b@1")` lines at the top of a JavaScript cell (also with the
/// names in one array, without `await`, with a `;`): the specifiers and the rest of the
/// cell; None when the cell starts with none. A line that starts as one but is not made of
/// plain string literals is an error saying how to write it.
pub fn js_install_lines(code: &str) -> Option<Result<(Vec<String>, String), InstallLineError>> {
    let mut specs = Vec::new();
    let mut rest_at = 0;
    let mut any = false;
    for line in code.split_inclusive('\n') {
        let t = line.trim();
        if t.is_empty() || t.starts_with("//") {
            rest_at += line.len();
            continue;
        }
        let call = t.strip_prefix("await").map(str::trim_start).unwrap_or(t);
        let Some(args) = call.strip_prefix("replbox.install") else {
            break;
        };
        any = true;
        match js_string_args(args) {
            Some(names) => specs.extend(names),
            None => {
                return Some(Err(InstallLineError {
                    line: t.chars().take(80).collect(),
                }));
            }
        }
        rest_at += line.len();
    }
    any.then(|| Ok((specs, code[rest_at..].to_string())))
}

/// `('a', "b")`, `(['a', 'b'])` (a trailing `;` allowed): the strings, when they are plain
/// literals (no escapes, no `${}`); None otherwise.
fn js_string_args(s: &str) -> Option<Vec<String>> {
    let s = s.trim_start().strip_prefix('(')?;
    let s = s.trim_end();
    let s = s
        .strip_suffix(';')
        .unwrap_or(s)
        .trim_end()
        .strip_suffix(')')?;
    let mut inner = s.trim();
    if let Some(list) = inner.strip_prefix('[') {
        inner = list.strip_suffix(']')?.trim();
    }
    let mut out = Vec::new();
    let mut rest = inner;
    while !rest.is_empty() {
        let q = rest.chars().next()?;
        if !matches!(q, '\'' | '"' | '`') {
            return None;
        }
        let end = rest[1..].find(q)? + 1;
        let lit = &rest[1..end];
        if lit.contains('\\') || lit.contains("${") {
            return None;
        }
        out.push(lit.to_string());
        rest = rest[end + 1..].trim_start();
        match rest.strip_prefix(',') {
            Some(r) => rest = r.trim_start(),
            None if rest.is_empty() => {}
            None => return None,
        }
    }
    Some(out)
}

/// A directory of `mode` owned by `uid` (the server's own when None), made if missing.
fn own_dir(dir: &Path, mode: u32, uid: Option<u32>) -> std::io::Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uv_summary_gives_packages_and_downloads() {
        let first = "Using CPython 3.11.7\nResolved 2 packages in 401ms\nPrepared 2 packages \
                     in 36ms\nInstalled 2 packages in 7ms\n + iniconfig==2.3.1\n + six==1.17.0\n";
        let i = parse_uv(first);
        assert_eq!(i.downloaded, 2);
        assert_eq!(
            i.installed,
            [
                Package {
                    name: "iniconfig".into(),
                    version: "2.3.1".into()
                },
                Package {
                    name: "six".into(),
                    version: "1.17.0".into()
                },
            ]
        );
        let again = "Resolved 1 package in 3ms\nInstalled 1 package in 2ms\n + six==1.17.0\n";
        assert_eq!(parse_uv(again).downloaded, 0);
        assert!(parse_uv(again).built.is_empty());
        let built = "Resolved 2 packages in 13ms\n   Building docopt==0.6.2\n      Built \
                     docopt==0.6.2\nPrepared 2 packages in 99ms\nInstalled 2 packages in 1ms\n \
                     + docopt==0.6.2\n + six==1.17.0\n";
        let i = parse_uv(built);
        assert_eq!(
            i.built,
            [Package {
                name: "docopt".into(),
                version: "0.6.2".into()
            }]
        );
        assert_eq!(i.installed.len(), 2);
        assert!(
            i.line()
                .ends_with("(2 downloaded; built from source: docopt==0.6.2)"),
            "{}",
            i.line()
        );
    }

    #[test]
    fn pip_lines_are_found_at_the_top_of_a_cell_only() {
        assert_eq!(
            pip_lines("%pip install six tomli\nimport six\n"),
            Some((vec!["six".into(), "tomli".into()], "import six\n".into()))
        );
        assert_eq!(
            pip_lines("!pip install -q six\n"),
            Some((vec!["six".into()], String::new()))
        );
        assert_eq!(
            pip_lines("!pip install --index-url=https://evil six").map(|p| p.0),
            Some(vec!["--index-url=https://evil".into(), "six".into()])
        );
        assert_eq!(
            pip_lines("%pip install \"six>=1\" 'tomli; python_version < \"3.11\"'\n").map(|p| p.0),
            Some(vec![
                "six>=1".into(),
                "tomli; python_version < \"3.11\"".into()
            ])
        );
        assert_eq!(pip_lines("import six\n%pip install six"), None);
    }

    #[test]
    fn js_install_lines_take_string_literals_only() {
        assert_eq!(
            js_install_lines(
                "await replbox.install('is-odd', \"lodash@^4\");\nrequire('is-odd')(3)\n"
            ),
            Some(Ok((
                vec!["is-odd".into(), "lodash@^4".into()],
                "require('is-odd')(3)\n".into()
            )))
        );
        assert_eq!(
            js_install_lines("// deps\nreplbox.install(['a', `b`,])\n").map(|r| r.map(|p| p.0)),
            Some(Ok(vec!["a".into(), "b".into()]))
        );
        for bad in [
            "await replbox.install(name)",
            "await replbox.install('a' + x)",
            "await replbox.install(`${x}`)",
            "await replbox.install('a\\'b')",
            "await replbox.install('a'); require('fs')",
            "await replbox.installX('a')",
        ] {
            assert!(
                matches!(js_install_lines(bad), Some(Err(_))),
                "{bad:?}: {:?}",
                js_install_lines(bad)
            );
        }
        assert_eq!(
            js_install_lines("const x = 1;\nawait replbox.install('a')"),
            None
        );
        assert_eq!(js_install_lines("console.log('replbox.install')"), None);
        assert_eq!(
            js_install_lines("await replbox.install(name)")
                .and_then(Result::err)
                .map(|e| e.to_string())
                .as_deref(),
            Some(
                "replbox.install: \"await replbox.install(name)\" is not a call with string \
                 literals; write it on a line of its own at the top of the cell, as await \
                 replbox.install('lodash', 'is-odd@3')"
            )
        );
        assert_eq!(
            ProgramError::NoUv.to_string(),
            "packages: the installer (uv) is not installed on this server; its operator can \
             install it (pip install uv) or name it with --uv"
        );
        assert_eq!(
            ProgramError::NpmUnreachable("/x/npm-cli.js".into()).to_string(),
            "packages: npm (/x/npm-cli.js) is not reachable by the installer's uid; its \
             operator can name one that is with --npm"
        );
        assert_eq!(pip_lines("print('%pip install six')"), None);
    }
}
