//! Source builds, where the operator allows them (`--package-builds`): a Python package the
//! index has only as source is built by uv in a run of its own, whose build code is kept
//! from everything shared (see [`Packages::build_python`]).

use std::path::Path;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::answer::{Installed, PackageError};
use super::install::{self, installer_env};
use super::layer::Layer;
use super::python::parse_uv;
use super::{Packages, spec};

impl Packages {
    /// Install `specs` into `layer` (a run's or session's own, never a shared one) with
    /// source builds allowed, for `--package-builds` once the wheels-only installation
    /// found no wheel for a package. A build backend is the package's own code: it runs in
    /// the installer's confinement as the installer's uid (never root), and this one may
    /// write only its scratch home and `layer`. Its cache is a throwaway one in that home:
    /// the shared cache, which every principal's installs come from, is not mounted in its
    /// sandbox (builds run at bwrap only: `Flags::check_level`), nor is the store of shared
    /// layers; its network is the installers' proxy (the index only). Nothing of it is
    /// shared: the layer is never published, its pins are not kept for a repeat, and its
    /// packages are not in the cache's books. The result lists what was built. The layer
    /// is marked: every later installation into it runs this way too, apart from the
    /// shared cache (see `Layer::was_built`).
    pub(super) async fn build_python(
        &self,
        python: &Path,
        specs: &[spec::Spec],
        layer: &Layer,
        (principal, cancel): (&str, &CancellationToken),
        started: Instant,
    ) -> Result<Installed, PackageError> {
        let uv = self.uv(python).await?;
        let names: Vec<&str> = specs.iter().map(|s| s.text.as_str()).collect();
        let failed = |why: String| {
            PackageError::Failed(format!(
                "packages: could not install {}: {why}",
                names.join(", ")
            ))
        };
        let home = self
            .installer_home()
            .map_err(|d| failed(d.stopped.unwrap_or_default()))?;
        let mut argv = self.uv_argv(&uv, python, &home.join("cache"), layer);
        argv.push("--".into());
        argv.extend(specs.iter().map(|s| s.text.clone()));
        let job = install::Job {
            argv,
            env: installer_env(),
            exes: vec![uv.to_path_buf(), python.to_path_buf()],
            rw: vec![layer.dir.clone()],
            home,
        };
        // From here on the layer may hold anything the build's code put there.
        layer.built.store(true, std::sync::atomic::Ordering::SeqCst);
        tracing::info!(principal, packages = %names.join(" "), "packages: building from source");
        let done = self.run_installer(job, principal, cancel).await;
        if let Some(why) = done.stopped {
            return Err(failed(why));
        }
        if !done.ok {
            let (reason, text) = install::uv_failure(&done.stderr);
            return Err(failed(format!(
                "{} (a build from source was tried: this server allows them).\n{text}",
                reason.says()
            )));
        }
        let mut out = parse_uv(&done.stderr);
        out.duration_ms = started.elapsed().as_millis() as u64;
        self.metrics.online(out.installed.len(), out.downloaded);
        Ok(out)
    }
}
