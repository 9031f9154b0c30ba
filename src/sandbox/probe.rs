//! Deciding the level at start: the bwrap probe (overlapping the rest of start-up, or
//! answered by a remembered success), the Landlock check, `--require-sandbox`, and the
//! helper's presence.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::landlock::read_roots;
use super::uid_pool::{UidPool, state_dir};
use super::{DEFAULT_MASKS, Jail, Level, Limits, Mode, Sandbox, Settings};

/// The start-up probe in flight, so that it overlaps the rest of start-up.
pub struct Probe {
    plan: Plan,
    bwrap_probe: Option<(std::process::Child, Instant)>,
    cache: Option<ProbeCache>,
    /// The cache remembers bwrap working here: no probe was started.
    cached: bool,
}

/// Everything decided before the probe's answer.
struct Plan {
    mode: Mode,
    require: Option<Level>,
    root: bool,
    egress: crate::egress::Policy,
    limits: Limits,
    helper: PathBuf,
    bwrap: Option<PathBuf>,
    masked: Vec<PathBuf>,
    view: super::view::View,
    /// The uid pool, or why root has none (its state directory; shared by clones of the
    /// plan, so the error is too).
    pool: Result<Option<Arc<UidPool>>, Arc<anyhow::Error>>,
}

impl Sandbox {
    /// Start probing (spawns `bwrap` when it may be used). Cheap: returns at once.
    pub fn probe(settings: &Settings) -> Probe {
        let root = nix::unistd::geteuid().is_root();
        let mut masked: Vec<PathBuf> = DEFAULT_MASKS
            .iter()
            .map(PathBuf::from)
            .chain(settings.masks.iter().cloned())
            .filter_map(|p| std::fs::canonicalize(p).ok())
            .filter(|p| p.is_dir() && p != Path::new("/"))
            .collect();
        masked.sort();
        masked.dedup();
        let bwrap = match settings.mode {
            Mode::Auto | Mode::Bwrap => find_on_path("bwrap"),
            _ => None,
        };
        let plan = Plan {
            mode: settings.mode,
            require: settings.require,
            root,
            egress: settings.egress.clone(),
            limits: settings.limits.clone(),
            helper: super::helper_exe().to_path_buf(),
            bwrap,
            masked,
            view: super::view::View::system(&settings.expose),
            pool: if root {
                state_dir()
                    .map(|dir| {
                        let pool = UidPool::new(
                            settings.uid_base,
                            settings.uids.max(1),
                            dir,
                            settings.uids_per_principal,
                        );
                        Some(Arc::new(pool))
                    })
                    .map_err(Arc::new)
            } else {
                Ok(None)
            },
        };
        // A remembered success answers at once and is confirmed after the handshake
        // (`verify_in_background`); otherwise bwrap is probed now, overlapping start-up.
        let cache = plan.bwrap.as_ref().and_then(|_| ProbeCache::new(&plan));
        let cached = cache.as_ref().is_some_and(ProbeCache::hit);
        let bwrap_probe = match &plan.bwrap {
            Some(_) if !cached => match probe_command(&plan.provisional(Level::Bwrap)) {
                Ok(mut cmd) => match cmd.spawn() {
                    Ok(child) => Some((child, Instant::now())),
                    Err(e) => {
                        tracing::warn!("cannot run bwrap: {e}");
                        None
                    }
                },
                Err(e) => {
                    tracing::warn!("cannot build the bwrap probe: {e}");
                    None
                }
            },
            _ => None,
        };
        Probe {
            plan,
            bwrap_probe,
            cache,
            cached,
        }
    }

    /// Confirm a remembered bwrap probe (see [`ProbeCache`]), off the critical path: call
    /// after the first reply.
    pub fn verify_in_background(&self) {
        let Some(cache) = self
            .unverified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return;
        };
        let cmd = probe_command(self);
        let _ = std::thread::Builder::new()
            .name("bwrap-probe".into())
            .spawn(move || {
                let outcome = cmd.map_err(ProbeError::Spawn).and_then(|mut cmd| {
                    let child = cmd.spawn().map_err(ProbeError::Spawn)?;
                    wait_probe(child, Instant::now())
                });
                if let Err(e) = outcome {
                    tracing::error!(
                        "bwrap no longer works here ({e}); runs will fail until the server is \
                         restarted"
                    );
                    cache.forget();
                }
            });
    }
}

impl Plan {
    /// A sandbox at `level` without the workspace-dependent parts (for probing).
    fn provisional(&self, level: Level) -> Sandbox {
        Sandbox {
            level,
            root: self.root,
            egress: None,
            limits: self.limits.clone(),
            landlock_abi: landlock_abi(),
            helper: self.helper.clone(),
            bwrap: self.bwrap.clone(),
            masked: self.masked.clone(),
            view: self.view.clone(),
            read_roots: Vec::new(),
            pool: self.pool.clone().ok().flatten(),
            unverified: Mutex::new(None),
            reclaimers: Mutex::new(Vec::new()),
        }
    }

    /// The helper must be there: every child runs under it.
    fn check_helper(&self) -> anyhow::Result<()> {
        let ok = std::fs::metadata(&self.helper)
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
        if !ok {
            anyhow::bail!(
                "the helper {} is missing or not executable: install `{}` beside the replbox \
                 binary (cargo install and the wheel do), or name it with REPLBOX_HELPER",
                self.helper.display(),
                super::HELPER_BIN
            );
        }
        Ok(())
    }
}

/// Whether the bwrap probe answered yes (a named `--sandbox bwrap` that does not work is an
/// error).
fn bwrap_works(
    plan: &Plan,
    probe: Option<(std::process::Child, Instant)>,
    cached: bool,
    cache: Option<&ProbeCache>,
) -> anyhow::Result<bool> {
    match probe {
        None if cached => Ok(true),
        Some((child, started)) => match wait_probe(child, started) {
            Ok(()) => {
                if let Some(c) = cache {
                    c.store();
                }
                Ok(true)
            }
            Err(e) if plan.mode == Mode::Bwrap => {
                anyhow::bail!("--sandbox bwrap does not work here: {e}")
            }
            Err(e) => {
                tracing::warn!("sandbox level bwrap unavailable: {e}");
                Ok(false)
            }
        },
        None if plan.mode == Mode::Bwrap => {
            anyhow::bail!("--sandbox bwrap does not work here: bwrap is not on PATH")
        }
        None => Ok(false),
    }
}

/// Why a level's probe says it does not work here.
#[derive(Debug, thiserror::Error)]
enum ProbeError {
    #[error("the kernel has no Landlock")]
    NoLandlock,
    #[error("the kernel has no seccomp")]
    NoSeccomp,
    /// bwrap's probe exited otherwise than 0 (what it wrote to stderr).
    #[error("the probe failed ({status}): {stderr}")]
    Failed {
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("the probe did not finish within 5 s")]
    Timeout,
    #[error("the probe could not be waited for: {0}")]
    Wait(std::io::Error),
    /// Its command could not be made or started.
    #[error("{0}")]
    Spawn(std::io::Error),
}

fn landlock_works() -> Result<(), ProbeError> {
    if landlock_abi() < 1 {
        return Err(ProbeError::NoLandlock);
    }
    // SAFETY: PR_GET_SECCOMP takes no pointer; it fails with EINVAL without seccomp.
    if unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) } < 0 {
        return Err(ProbeError::NoSeccomp);
    }
    Ok(())
}

impl Probe {
    /// Wait for the probe and decide the level. `workspace` is hidden from Landlock-level
    /// reads (other sessions' directories live there). Errors when the helper is missing,
    /// when a named level does not work, or the level is below `--require-sandbox`.
    pub fn finish(self, workspace: &Path) -> anyhow::Result<Sandbox> {
        let plan = self.plan;
        plan.check_helper()?;
        if let Err(e) = &plan.pool {
            // Running as root without a safe way to hand out uids: user code would share
            // uids with another server's, so refuse rather than weaken the guarantee.
            anyhow::bail!("{e}");
        }
        // Everything of runs and sessions lives there: nobody but root (or the server's
        // user) may be able to put another directory in its place.
        if let Ok(real) = std::fs::canonicalize(workspace) {
            super::bwrap::check_own(&real).map_err(|e| {
                anyhow::anyhow!(
                    "the working area {}: {e}. Give --work-dir a directory whose way only root \
                     can change",
                    workspace.display()
                )
            })?;
        }
        let bwrap_ok = bwrap_works(&plan, self.bwrap_probe, self.cached, self.cache.as_ref())?;
        let level = match plan.mode {
            Mode::Bwrap => Level::Bwrap,
            Mode::None => Level::None,
            Mode::Landlock => {
                landlock_works()
                    .map_err(|e| anyhow::anyhow!("--sandbox landlock does not work here: {e}"))?;
                Level::Landlock
            }
            Mode::Auto if bwrap_ok => Level::Bwrap,
            Mode::Auto => match landlock_works() {
                Ok(()) => Level::Landlock,
                Err(e) => {
                    tracing::warn!("sandbox level landlock unavailable: {e}");
                    Level::None
                }
            },
        };
        if let Some(required) = plan.require
            && level < required
        {
            anyhow::bail!(
                "the sandbox level in force here is {level}, below the required {required} \
                 (--require-sandbox); refusing to start"
            );
        }
        let mut sandbox = plan.provisional(level);
        if level != Level::Bwrap {
            sandbox.bwrap = None;
        } else if self.cached {
            sandbox.unverified = Mutex::new(self.cache);
        }
        if plan.egress.enabled() {
            let dir = workspace.join("egress");
            let egress = crate::egress::Egress::new(plan.egress.clone(), &dir)
                .map_err(|e| anyhow::anyhow!("cannot set up the egress proxy: {e}"))?;
            sandbox.egress = Some(Arc::new(egress));
        }
        if level == Level::Landlock {
            let mut hidden = sandbox.masked.clone();
            hidden.push(std::fs::canonicalize(workspace).unwrap_or_else(|_| workspace.into()));
            sandbox.read_roots = read_roots(&sandbox.view, &hidden);
        }
        if level == Level::None {
            sandbox.view = Default::default();
        } else {
            tracing::info!(
                "sandbox view: user code reads only these host paths (read-only), each \
                 language's installation and reads, and its own directories: {}",
                sandbox.view.describe()
            );
        }
        Ok(sandbox)
    }
}

/// bwrap with every namespace, mount and capability of a real spawn and the helper bound in,
/// running `true` directly: the helper's own start-up (a few ms) would only delay the first
/// reply, and a helper layer that fails later fails closed with a message.
fn probe_command(sb: &Sandbox) -> std::io::Result<std::process::Command> {
    let mut line = sb.command(&Jail::default(), Path::new("/"), false)?;
    if let Some(i) = line.args.iter().position(|a| a == "--") {
        line.args.truncate(i + 1);
        line.args.push("/bin/true".into());
    }
    let mut c = std::process::Command::new(&line.program);
    c.args(&line.args)
        .env_clear()
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    Ok(c)
}

fn wait_probe(mut child: std::process::Child, started: Instant) -> Result<(), ProbeError> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    use std::io::Read;
                    let _ = e.read_to_string(&mut err);
                }
                return Err(ProbeError::Failed {
                    status,
                    stderr: err.trim().to_string(),
                });
            }
            Ok(None) if started.elapsed() > Duration::from_secs(5) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ProbeError::Timeout);
            }
            Ok(None) => std::thread::sleep(Duration::from_micros(200)),
            Err(e) => return Err(ProbeError::Wait(e)),
        }
    }
}

/// The kernel's Landlock ABI version (0 when unavailable).
pub fn landlock_abi() -> i32 {
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) only returns
    // the ABI version; no memory is passed.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    if v < 0 { 0 } else { v as i32 }
}

/// An executable named `program` in the server's PATH (the operator's).
pub fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .filter(|d| d.is_absolute())
        .map(|d| d.join(program))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// A successful bwrap probe, remembered so that later starts answer `initialize` without
/// waiting ~10 ms for bwrap. Only successes are kept (a failure is always re-checked), and the
/// key covers what decides the outcome: bwrap's and the helper's binaries, the kernel and
/// this boot, the uid and the masks. A start that uses the cache still
/// probes in the background and forgets the entry if bwrap stopped working; spawns then fail
/// with bwrap's error (closed, not downgraded) until the server is restarted.
#[derive(Debug)]
pub(super) struct ProbeCache {
    file: PathBuf,
    key: String,
}

impl ProbeCache {
    fn new(plan: &Plan) -> Option<Self> {
        let dir = if plan.root {
            state_dir().ok()?
        } else {
            // Not root: only a runtime directory that is the user's own and private.
            let d = PathBuf::from(std::env::var_os("XDG_RUNTIME_DIR")?);
            let m = std::fs::symlink_metadata(&d).ok()?;
            if !m.is_dir()
                || m.uid() != nix::unistd::geteuid().as_raw()
                || m.permissions().mode() & 0o077 != 0
            {
                return None;
            }
            d
        };
        let stamp = |p: &Path| {
            std::fs::metadata(p)
                .map(|m| {
                    format!(
                        "{}:{}:{}",
                        p.display(),
                        m.len(),
                        m.mtime_nsec() + m.mtime() * 1_000_000_000
                    )
                })
                .unwrap_or_default()
        };
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let key = format!(
            "v3 euid={} bwrap={} helper={} kernel={} boot={} masks={:?}\n",
            nix::unistd::geteuid(),
            stamp(plan.bwrap.as_deref()?),
            stamp(&plan.helper),
            kernel.trim(),
            boot.trim(),
            plan.masked
        );
        Some(Self {
            file: dir.join(format!("bwrap-probe-{}", nix::unistd::geteuid())),
            key,
        })
    }

    fn hit(&self) -> bool {
        std::fs::read_to_string(&self.file).is_ok_and(|k| k == self.key)
    }

    fn store(&self) {
        use std::os::unix::fs::OpenOptionsExt;
        let tmp = self
            .file
            .with_extension(format!("tmp{}", std::process::id()));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| std::io::Write::write_all(&mut f, self.key.as_bytes()));
        if written.is_ok() {
            let _ = std::fs::rename(&tmp, &self.file);
        } else {
            let _ = std::fs::remove_file(&tmp);
        }
    }

    fn forget(&self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

#[cfg(test)]
mod tests {
    use super::ProbeError;

    /// The reasons the start-up log and `--sandbox` refusals give, byte for byte.
    #[test]
    fn probe_messages_are_pinned() {
        use std::os::unix::process::ExitStatusExt;
        let failed = ProbeError::Failed {
            status: std::process::ExitStatus::from_raw(1 << 8),
            stderr: "bwrap: No permissions to create new namespace".into(),
        };
        assert_eq!(
            failed.to_string(),
            "the probe failed (exit status: 1): bwrap: No permissions to create new namespace"
        );
        assert_eq!(
            ProbeError::Timeout.to_string(),
            "the probe did not finish within 5 s"
        );
        assert_eq!(
            ProbeError::NoLandlock.to_string(),
            "the kernel has no Landlock"
        );
    }
}
