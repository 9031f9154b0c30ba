//! Warm sessions: per session language, interpreters started ahead of time exactly as a
//! cold `session_start` starts them (a uid lease of their own, a private directory, the
//! sandbox, the environment of a session without caller variables, the bootstrap), each
//! handed whole to one `session_start` that asks for nothing a pooled one lacks, then
//! replaced in the background. A warm Python session has also imported the operator's
//! `--preload` modules into `sys.modules` (no name is defined). The books (sizes that follow
//! demand, expiry, giving uids up) are [`Pool`]'s.
//!
//! Uids: a pooled session leases an unbound uid as no principal ([`Holder::Nobody`]) and
//! leaves it unbound when taken, as a `run-code` run at `bwrap` or `landlock` does: it has
//! no caller `cwd`, so every place it can write is its private directory, removed before
//! the lease is returned, and nothing else of it outlives its tree (System V IPC is refused
//! at those levels). Binding it would bind a fresh uid to the taker at every warm start,
//! even when the taker has free uids of its own, until the principal's bound.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Launcher, StartRequest, Up, VenvAsk};
use crate::error::ToolError;
use crate::lang::{Language, Registry, expand};
use crate::pool::{Pool, Ready};
use crate::sandbox::{Holder, Reclaim};
use crate::session::interp::Ending;
use crate::session::live::{Footprint, lock};

/// A session started ahead of time, not yet anyone's. Dropping it kills its tree, then
/// removes its directory, then returns its uid.
pub struct Pending {
    up: Option<Up>,
    born: Instant,
}

impl Pending {
    /// Release in order: the interpreter's tree, its directory, then its uid.
    fn release(&mut self) -> Option<tokio::task::JoinHandle<()>> {
        let up = self.up.take()?;
        let Up {
            interp,
            dirs,
            lease,
            baseline,
            ..
        } = up;
        drop(interp);
        drop(baseline);
        Footprint {
            dir: dirs.dir,
            lease,
        }
        .release()
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.release();
    }
}

impl Ready for Pending {
    fn ended(&mut self) -> bool {
        self.up.as_mut().is_none_or(|u| u.interp.ended())
    }

    fn born(&self) -> Instant {
        self.born
    }

    fn pid(&self) -> u32 {
        self.up.as_ref().map_or(0, |u| u.interp.pid)
    }
}

/// The warm sessions of every session language.
pub type SessionPool = Pool<Pending>;

/// Python's pool starts with one session, the others' with none until one is asked for.
fn start_size(lang: &str) -> usize {
    usize::from(lang == "python")
}

/// A pooled session is a head start: its uid goes to a caller's session or run when every
/// uid is in use.
impl Reclaim for SessionPool {
    /// Pooled sessions hold unbound uids: any caller may take one.
    fn reclaim<'a>(
        &'a self,
        _principal: &'a str,
        _own: bool,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + 'a>> {
        Box::pin(async move {
            let Some(mut p) = self.take_any() else {
                return false;
            };
            tracing::info!(pid = p.pid(), "stopping a warm session: its uid is needed");
            if let Some(up) = p.up.as_mut() {
                up.interp.kill().await;
            }
            // Its directory removed and its uid returned before the caller leases again.
            if let Some(task) = p.release() {
                let _ = task.await;
            }
            true
        })
    }
}

/// How often the pools are kept: idle ones shrink, expired sessions are replaced.
const UPKEEP: Duration = Duration::from_secs(15);

/// The longest the `--preload` imports may take in a session started ahead of time.
const PRELOAD_TIMEOUT: Duration = Duration::from_secs(120);

/// Warm sessions: the pool, and how its sessions are started.
pub struct WarmSessions {
    pool: Arc<SessionPool>,
    /// Starts them as a cold `session_start` would.
    launcher: Arc<Launcher>,
    /// The session languages installed, refilled in turn.
    registry: Arc<Registry>,
    /// `--preload`: the modules a warm Python session imports.
    preload: Vec<String>,
    /// Modules whose failure to import was logged already (once each).
    logged: Mutex<HashSet<String>>,
}

impl WarmSessions {
    pub(in crate::session) fn new(
        cap: usize,
        preload: Vec<String>,
        launcher: Arc<Launcher>,
        registry: Arc<Registry>,
    ) -> Self {
        Self {
            pool: Arc::new(SessionPool::with_start(cap, start_size)),
            launcher,
            registry,
            preload,
            logged: Mutex::new(HashSet::new()),
        }
    }

    /// The modules to import, as the bootstrap takes them: `matplotlib` brings
    /// `matplotlib.pyplot` (with the backend the figure capture uses, `MPLBACKEND`).
    fn modules(&self) -> Vec<String> {
        let mut v = Vec::new();
        for m in &self.preload {
            v.push(m.clone());
            if m == "matplotlib" {
                v.push("matplotlib.pyplot".to_string());
            }
        }
        v
    }
}

impl WarmSessions {
    /// The pool of warm sessions (for the sandbox's reclaimers and the metrics).
    pub(in crate::session) fn pool(&self) -> Arc<SessionPool> {
        self.pool.clone()
    }

    /// Start filling the warm pools (`serve` does this once it answers) and keep them:
    /// every [`UPKEEP`] idle pools shrink and expired sessions are replaced. None at level
    /// none as root, where a uid is bound to its principal before any code runs as it.
    pub(in crate::session) fn fill(self: &Arc<Self>) {
        if !self.pool.enabled() {
            return;
        }
        if !self.launcher.sandbox.can_prestart() {
            tracing::info!(
                "no warm sessions at sandbox level none as root: a session's uid is bound to \
                 its caller before its interpreter starts"
            );
            return;
        }
        self.pool.activate();
        let langs = session_languages(&self.registry);
        for lang in &langs {
            self.refill(lang);
        }
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(UPKEEP);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(me) = weak.upgrade() else { return };
                if me.pool.is_closed() {
                    return;
                }
                me.pool.trim();
                for lang in &langs {
                    me.refill(lang);
                }
            }
        });
    }

    /// Start as many warm sessions of `lang` as its pool lacks, in the background (none
    /// while uids run short).
    fn refill(self: &Arc<Self>, lang: &Arc<Language>) {
        let me = self;
        self.pool.hold(self.launcher.sandbox.uids_short());
        self.pool.refill(lang.id(), || {
            let (me, lang) = (me.clone(), lang.clone());
            async move { me.start_pending(&lang).await }
        });
    }

    /// Whether a warm session can be what this request asks for: nothing of the caller's
    /// shapes how a session starts (cwd, venv, env, files, domains).
    fn poolable(&self, req: &StartRequest) -> bool {
        self.pool.enabled()
            && self.launcher.sandbox.can_prestart()
            // The way to the egress proxy counts against its session's principal, unknown
            // before a warm session is taken: with a proxy every session starts cold.
            && self.launcher.sandbox.egress.is_none()
            && req.cwd.is_none()
            && req.venv.is_none()
            && req.env.is_empty()
            && req.files.is_empty()
            && req.allow_domains.is_empty()
            // Code mode's channel and variables are made with the session (cold).
            && req.mcp_servers.is_empty()
    }

    /// Whether `packages` would come from the shared cache alone (the same request was
    /// resolved lately for this language's interpreter): then a warm session takes them
    /// into its layer in milliseconds; otherwise a cold start installs them while nothing
    /// waits on a taken warm session.
    async fn cached(&self, lang: &Arc<Language>, packages: &[String]) -> bool {
        let Some(pk) = self.launcher.packages.get().and_then(Option::as_ref) else {
            return false;
        };
        let Some(eco) = crate::packages::Eco::of(lang.id()) else {
            return false;
        };
        let Ok((lang, spec)) = self.launcher.session_language(lang.id()) else {
            return false;
        };
        let Ok(it) = self.launcher.interpreter(lang, spec).await else {
            return false;
        };
        pk.cached(eco, &it.exe, packages)
    }

    /// Install `packages` into a taken warm session's layer for `principal`; Ok(false)
    /// when the session cannot be what the request asks for (it has no layer, or it has
    /// already imported a module of the same name as one now in its layer, as a
    /// `--preload` module or one of theirs: a cold start would import the layer's).
    async fn add_packages(
        &self,
        up: &mut Up,
        packages: &[String],
        principal: &str,
    ) -> Result<bool, ToolError> {
        let Some(sp) = up.dirs.packages.clone() else {
            return Ok(false);
        };
        let never = tokio_util::sync::CancellationToken::new();
        let installed = sp
            .service
            .provide(&sp.exe, packages, &sp.layer, principal, &never)
            .await?;
        if let Some(code) = crate::packages::warm_check(&sp.layer) {
            let out = up
                .interp
                .internal(&code, tokio::time::Instant::now() + PRELOAD_TIMEOUT)
                .await;
            let clear = matches!(out.ending, Ending::Done(_))
                && out
                    .output
                    .text
                    .lines()
                    .any(|l| l.trim() == crate::packages::WARM_CLEAR);
            if !clear {
                tracing::debug!(output = %out.output.text, "a warm session could not take packages");
                return Ok(false);
            }
        }
        // Its restarts see the layer as a cold start would have.
        up.interp.update_launch_env(|env| sp.layer.update_view(env));
        up.dirs.installed = Some(installed);
        Ok(true)
    }

    /// A warm session of `lang`, its uid left unbound (see the module's documentation);
    /// None (start cold) when the request needs a cold start or none is ready. Either way a
    /// poolable request is demand: the pool grows and is refilled now.
    pub(in crate::session) async fn take(
        self: &Arc<Self>,
        lang: &Arc<Language>,
        req: &StartRequest,
        principal: &str,
    ) -> Result<Option<Up>, ToolError> {
        if !self.poolable(req) {
            return Ok(None);
        }
        if !req.packages.is_empty() && !self.cached(lang, &req.packages).await {
            return Ok(None);
        }
        let taken = self.pool.take(lang.id());
        self.refill(lang);
        let Some(mut pending) = taken else {
            return Ok(None);
        };
        if !req.packages.is_empty() {
            let Some(up) = pending.up.as_mut() else {
                return Ok(None);
            };
            // Dropped (its tree, directory and uid released) when it cannot be used.
            if !self.add_packages(up, &req.packages, principal).await? {
                return Ok(None);
            }
        }
        Ok(pending.up.take())
    }

    /// Start one warm session of `lang` as a cold `session_start` without arguments would
    /// (as no principal, on an unbound uid), then import the `--preload` modules. `Ok(None)`:
    /// not started because uids run short or none is unbound (no failure).
    async fn start_pending(&self, lang: &Language) -> Result<Option<Pending>, WarmError> {
        let launcher = &self.launcher;
        if launcher.sandbox.uids_short() || launcher.sandbox.egress.is_some() {
            return Ok(None);
        }
        let (lang, spec) = launcher
            .session_language(lang.id())
            .map_err(WarmError::Start)?;
        let it = launcher
            .interpreter(lang, spec)
            .await
            .map_err(WarmError::Start)?;
        let lease = match launcher.sandbox.lease(Holder::Nobody) {
            Ok(l) => l,
            // Every free uid is some principal's: callers come first (no failure).
            Err(e) => {
                tracing::debug!(error = %e, "no unbound uid for a warm session");
                return Ok(None);
            }
        };
        let uid = lease.as_ref().map(|l| l.uid);
        let id = uuid::Uuid::new_v4().to_string();
        let (dirs, prepared, it) = launcher
            .dirs(&id, uid, None, Vec::new(), (VenvAsk::No, it), None)
            .await
            .map_err(WarmError::Start)?;
        let interp = launcher
            .bring_up(
                &it,
                &dirs,
                &prepared,
                lease.as_ref(),
                (&BTreeMap::new(), &[]),
            )
            .await
            .map_err(WarmError::Start)?;
        let mut pending = Pending {
            up: Some(Up {
                id,
                it,
                dirs,
                prepared,
                lease,
                interp,
                baseline: None,
                notes: Vec::new(),
            }),
            born: Instant::now(),
        };
        if let Some(up) = pending.up.as_mut() {
            self.preload(up).await?;
            launcher.take_baseline(up).await;
        }
        pending.born = Instant::now();
        Ok(Some(pending))
    }

    /// Import the `--preload` modules, for a language whose file says how
    /// (`session.preload`), as an internal evaluation: the user's first cell is still
    /// cell 1 and finds no new name. A module that does not import is skipped there and
    /// logged here, once.
    async fn preload(&self, up: &mut Up) -> Result<(), WarmError> {
        let Some(template) = up.it.spec.preload.clone() else {
            return Ok(());
        };
        let modules = self.modules();
        if modules.is_empty() {
            return Ok(());
        }
        let list = serde_json::to_string(&modules).map_err(WarmError::Json)?;
        let code = expand(&template, &[("modules", list.as_str())]);
        let out = up
            .interp
            .internal(&code, tokio::time::Instant::now() + PRELOAD_TIMEOUT)
            .await;
        if !matches!(out.ending, Ending::Done(_)) {
            return Err(WarmError::Preload(out.ending));
        }
        // One line for all of them, once: the default list names modules a host may simply
        // not have (no pandas is no fault).
        let mut newly = Vec::new();
        for line in out.output.text.lines() {
            let Some(failed) = line.trim().strip_prefix(PRELOAD_FAILED) else {
                continue;
            };
            for m in failed.split_whitespace() {
                if modules.iter().any(|x| x == m) && lock(&self.logged).insert(m.to_string()) {
                    newly.push(m.to_string());
                }
            }
        }
        if !newly.is_empty() {
            tracing::info!(
                lang = up.it.lang.id(),
                modules = %newly.join(", "),
                "--preload modules that do not import here; warm sessions go without them"
            );
        }
        Ok(())
    }
}

/// How the bootstrap's preload names the modules that did not import (one line).
const PRELOAD_FAILED: &str = "replbox-preload-failed:";

/// Why a warm session was not started (logged; sessions start cold meanwhile).
#[derive(Debug, thiserror::Error)]
enum WarmError {
    /// What a cold start without arguments would have been refused with.
    #[error("{}", .0.message)]
    Start(ToolError),
    #[error("{0}")]
    Json(serde_json::Error),
    /// The `--preload` imports' evaluation ended otherwise than done (how).
    #[error("importing the --preload modules did not finish ({0:?})")]
    Preload(Ending),
}

/// The installed languages that can hold a session.
fn session_languages(registry: &Registry) -> Vec<Arc<Language>> {
    registry
        .all()
        .iter()
        .filter(|l| l.spec.session.is_some() && l.installed())
        .cloned()
        .collect()
}
