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
//!
//! This file is the service ([`Packages`]), which ties the parts together: the cache's tree
//! (`tree`), the layers (`layer`), the store of shared layers and its client (`shared`,
//! `provide`), the memory of resolutions (`resolved`), the installers (`install`; Python's:
//! `python`, `uv`, `build`; `npm`), the cache's upkeep (`cache`), the requests (`spec`,
//! `cell`) and the answers (`answer`).

mod answer;
mod build;
mod cache;
mod cell;
mod flags;
mod install;
mod layer;
mod npm;
mod provide;
mod python;
mod resolved;
mod shared;
mod spec;
mod tree;
mod uv;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::egress::Egress;
use crate::sandbox::Sandbox;
use answer::ProgramError;
pub use answer::{Installed, PackageError};
pub use cell::{InstallLineError, js_install_lines, pip_lines};
pub use flags::Flags;
pub use layer::{Layer, SessionPackages, WARM_CLEAR, warm_check};
use resolved::Resolved;
pub use spec::{Eco, MAX_SPECS};
use tree::own_dir;

/// Longest one installation may take unless the operator says otherwise.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

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
        let Some(root) = tree::place(flags)? else {
            return Ok(None);
        };
        let installer = sandbox
            .root
            .then(|| flags.installer_uid.unwrap_or(uid_base.saturating_sub(1)));
        tree::make(&root, installer)?;
        let egress = install::proxy(&index, &registry, &root.join("egress"))?;
        uv::check_flag(flags.uv.as_deref())?;
        npm::check_flag(flags.npm.as_deref())?;
        let upkeep = cache::Upkeep::new(&root, flags.package_cache_mb);
        let store = shared::Store::new(&root.join("layers"), &root.join("shared.key"))
            .map_err(|e| tree::error(&root, "shared layers", e))?;
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
        Ok(Layer::new(
            dir,
            eco,
            remove,
            Some(self.upkeep.book.clone()),
            self.modes_sealed().then(|| self.store.dir.clone()),
        ))
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

    /// The index (or registry) of `eco`'s packages.
    fn index_url(&self, eco: Eco) -> &str {
        match eco {
            Eco::Python => &self.index.url,
            Eco::Npm => &self.registry.url,
        }
    }
}
