//! Running the installer (uv): never user code, never the server's own rights. It runs
//! through the helper like any child, confined at the sandbox's level, as the installer's
//! uid when the server is root, writing only the package cache's tree, with network only to
//! the operator's index through an egress proxy of its own. What it prints is kept bounded.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio_util::sync::CancellationToken;

use super::Packages;
use super::flags::Index;
use super::tree::own_dir;
use crate::egress::{Egress, Policy};
use crate::exec::child::ChildBuilder;
use crate::exec::{self, SpawnSpec, Stdio3};
use crate::output::HeadTail;

/// Bytes of each stream of an installer kept.
const OUTPUT_CAP: usize = 256 * 1024;

/// One installer process to run.
pub(super) struct Job {
    pub(super) argv: Vec<String>,
    pub(super) env: Vec<(String, String)>,
    /// Programs it runs (their installations are made readable where hidden).
    pub(super) exes: Vec<PathBuf>,
    /// What it may write besides its home.
    pub(super) rw: Vec<PathBuf>,
    /// Its HOME, TMPDIR and working directory (a scratch directory).
    pub(super) home: PathBuf,
}

/// How an installer ended.
pub(super) struct Done {
    pub(super) ok: bool,
    pub(super) stdout: String,
    pub(super) stderr: String,
    /// Why it did not run to its end (deadline, cancel, could not start).
    pub(super) stopped: Option<String>,
}

/// Who asked, and until when.
struct Ask<'a> {
    principal: &'a str,
    deadline: tokio::time::Instant,
    cancel: &'a CancellationToken,
}

impl Packages {
    /// A fresh scratch directory, the installer's own, for one run's HOME (removed by
    /// [`run_installer`](Self::run_installer) when the run ends).
    pub(super) fn installer_home(&self) -> Result<PathBuf, Done> {
        let home = self
            .root
            .join("tmp")
            .join(uuid::Uuid::new_v4().simple().to_string());
        own_dir(&home, 0o700, self.installer)
            .map_err(|e| stopped(format!("cannot make the installer's home: {e}")))?;
        Ok(home)
    }

    /// Run `job` for `principal` within the installers' deadline, then remove its home.
    pub(super) async fn run_installer(
        &self,
        job: Job,
        principal: &str,
        cancel: &CancellationToken,
    ) -> Done {
        let home = job.home.clone();
        let ask = Ask {
            principal,
            deadline: tokio::time::Instant::now() + self.timeout,
            cancel,
        };
        let done = self.run_confined(job, &ask).await;
        let _ = tokio::task::spawn_blocking(move || crate::workspace::remove_tree(&home)).await;
        done
    }

    /// Run `job` confined as the installer, its network the installers' proxy.
    async fn run_confined(&self, job: Job, ask: &Ask<'_>) -> Done {
        let exes: Vec<&Path> = job.exes.iter().map(PathBuf::as_path).collect();
        let mut child = ChildBuilder::new(&self.sandbox, None, &job.home)
            .interpreters(&exes)
            .writable(job.rw.clone())
            .language_env(job.env.clone())
            .build();
        child.jail.uid = self.installer;
        let who = format!("installer {}", job.home.display());
        let endpoint = if self.sandbox.wrapped() {
            self.egress.unix(&who, ask.principal, &[])
        } else {
            self.egress.tcp(&who, ask.principal, &[])
        };
        let endpoint = match endpoint {
            Ok(ep) => Arc::new(ep),
            Err(e) => return stopped(format!("cannot open the installer's proxy: {e}")),
        };
        // Held until the installer is gone: dropping it removes the socket bwrap binds.
        let _endpoint = endpoint.clone();
        let child = child.with_egress(Some(endpoint));
        let program = job.argv.first().cloned().unwrap_or_default();
        let spec = SpawnSpec {
            argv: job.argv,
            env: child.env.merged(),
            cwd: job.home.clone(),
            stdio: Stdio3::Pipes,
            jail: child.jail,
        };
        let mut proc = match exec::spawn(&self.sandbox, spec) {
            Ok(p) => p,
            Err(e) => return stopped(format!("cannot start {program}: {e}")),
        };
        // Nothing to say to it: its stdin closed at once.
        drop(proc.child.stdin.take());
        let out = proc.child.stdout.take().map(|p| tokio::spawn(capture(p)));
        let err = proc.child.stderr.take().map(|p| tokio::spawn(capture(p)));
        let mut done = Done {
            ok: false,
            stdout: String::new(),
            stderr: String::new(),
            stopped: None,
        };
        tokio::select! {
            status = proc.wait() => done.ok = status.is_ok_and(|s| s.success()),
            _ = tokio::time::sleep_until(ask.deadline) => {
                proc.kill_tree().await;
                done.stopped = Some("the installation took too long and was stopped".into());
            }
            _ = ask.cancel.cancelled() => {
                proc.kill_tree().await;
                done.stopped = Some("the installation was cancelled".into());
            }
        }
        for (task, slot) in [(out, &mut done.stdout), (err, &mut done.stderr)] {
            if let Some(task) = task
                && let Ok(Ok(buf)) = tokio::time::timeout(Duration::from_secs(2), task).await
            {
                *slot = buf.finish().0;
            }
        }
        done
    }
}

/// The installer's variables: no colour, no Python downloads, and the operator's own CA
/// bundle when the server was given one (a TLS-inspecting network's, say; node's own
/// variable for npm).
pub(super) fn installer_env() -> Vec<(String, String)> {
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

/// The installers' own egress proxy, its sockets in `dir`: the index's and the registry's
/// hosts by name and port, reached whatever they resolve to (the installer is the server's
/// own program, its only caller input the checked specifiers; an operator's index may be
/// private; a mirror may answer for PyPI).
pub(super) fn proxy(index: &Index, registry: &Index, dir: &Path) -> anyhow::Result<Egress> {
    let mut hosts: Vec<String> = Vec::new();
    for ix in [index, registry] {
        hosts.extend(ix.domains.iter().map(|d| format!("{d}:443")));
        if let Some((h, p)) = &ix.host {
            hosts.push(format!("{h}:{p}"));
        }
    }
    let policy = Policy::new(false, &[], &hosts, &[]).map_err(|e| anyhow::anyhow!(e))?;
    Egress::new(policy, dir)
        .map_err(|e| anyhow::anyhow!("cannot set up the installer's proxy: {e}"))
}

pub(super) fn stopped(why: String) -> Done {
    Done {
        ok: false,
        stdout: String::new(),
        stderr: String::new(),
        stopped: Some(why),
    }
}

/// Read a pipe to its end within the cap.
async fn capture(mut pipe: impl AsyncRead + Unpin) -> HeadTail {
    let mut buf = HeadTail::new(OUTPUT_CAP);
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.push(&chunk[..n]),
        }
    }
    buf
}

/// Why uv could not install, for the agent: the reason in a few words, then uv's own
/// explanation (its `error:`, `cause:` and `hint:` lines).
pub(super) fn uv_failure(stderr: &str) -> (Reason, String) {
    // No wheel before no version: uv says of a package with one version, an sdist, that
    // it "has no usable wheels and only NAME==V is available".
    let reason = if stderr.contains("was not found in the package registry")
        || stderr.contains("not found in the provided package locations")
    {
        Reason::NotFound
    } else if stderr.contains("Failed to build") || stderr.contains("build backend") {
        Reason::Build
    } else if stderr.contains("no usable wheels")
        || stderr.contains("no wheels with a matching")
        || stderr.contains("building from source is disabled")
        || stderr.contains("--no-build")
    {
        Reason::NoWheel
    } else if stderr.contains("there is no version of")
        || (stderr.contains("only ") && stderr.contains(" is available"))
        || stderr.contains("there are no versions of")
    {
        Reason::NoVersion
    } else if stderr.contains("Hash mismatch") || stderr.contains("hash mismatch") {
        Reason::Hash
    } else if stderr.contains("Failed to fetch")
        || stderr.contains("error sending request")
        || stderr.contains("Could not connect")
        || stderr.contains("tunnel")
    {
        Reason::Unreachable
    } else {
        Reason::Failed
    };
    (
        reason,
        explanation(stderr, |l| {
            let t = l.trim_start();
            t.starts_with("error:")
                || t.starts_with("cause:")
                || t.starts_with("hint:")
                || t.starts_with("Caused by:")
                || t.starts_with("×")
                || t.starts_with("╰─▶")
        }),
    )
}

/// The lines of `stderr` that `keep` picks (all when none), bounded.
fn explanation(stderr: &str, keep: impl Fn(&str) -> bool) -> String {
    let picked: Vec<&str> = stderr.lines().filter(|l| keep(l)).collect();
    let lines: Vec<&str> = if picked.is_empty() {
        stderr
            .lines()
            .rev()
            .take(12)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect()
    } else {
        picked
    };
    let mut text = lines.join("\n").trim().to_string();
    if text.len() > 2000 {
        let mut cut = 2000;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    text
}

/// Why a package cannot be had, in the agent's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reason {
    NotFound,
    NoVersion,
    NoWheel,
    /// Building from source (allowed by the operator) failed.
    Build,
    Hash,
    Unreachable,
    Failed,
}

impl Reason {
    pub(super) fn says(self) -> &'static str {
        match self {
            Reason::NotFound => "not on the package index",
            Reason::NoVersion => "no version on the index matches",
            Reason::NoWheel => {
                "no built package (wheel) for this platform and Python, and this server \
                 installs wheels only (it never builds from source)"
            }
            Reason::Build => "building it from source failed",
            Reason::Hash => "what the index served did not match its hashes",
            Reason::Unreachable => "the package index could not be reached",
            Reason::Failed => "the installer failed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uv_failures_are_told_apart() {
        let nf = "error: No solution found when resolving dependencies\n  cause: Because \
                  nope was not found in the package registry and you require nope, we can \
                  conclude that your requirements are unsatisfiable.\n";
        let (r, text) = uv_failure(nf);
        assert_eq!(r, Reason::NotFound);
        assert!(text.contains("nope was not found"), "{text}");
        let nv = "  cause: Because there is no version of six==99.0 and you require six==99.0";
        assert_eq!(uv_failure(nv).0, Reason::NoVersion);
        let sd = "  cause: Because all versions of docopt have no usable wheels\nhint: Wheels are \
                  required for `docopt` because building from source is disabled";
        assert_eq!(uv_failure(sd).0, Reason::NoWheel);
        assert!(Reason::NoWheel.says().contains("wheels only"));
        let one = "  cause: Because rbsrc==1.0 has no usable wheels and only rbsrc==1.0 is \
                   available, we can conclude that all versions of rbsrc cannot be used.\nhint: \
                   Wheels are required for `rbsrc` because building from source is disabled";
        assert_eq!(uv_failure(one).0, Reason::NoWheel);
        let built = "  × Failed to build `rbbad==1.0`\n  ├─▶ The build backend returned an error\n";
        assert_eq!(uv_failure(built).0, Reason::Build);
    }
}
