//! Python packages: uv, run as the installer, into a layer (`--target`, on its PYTHONPATH)
//! from wheels only (`--no-build`: installing runs no package code), through the shared
//! cache; offline first when the cache gives what the index would. A package the index has
//! only as source is built where the operator allows it (`build`).

use std::path::Path;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::answer::{Installed, Package, PackageError};
use super::install::{self, installer_env};
use super::layer::{Layer, layer_is_empty};
use super::resolved::resolved_key;
use super::{Packages, spec};

impl Packages {
    /// Install `specs` into `layer` from wheels; when the index has a package only as
    /// source and the operator allows builds, build it (see
    /// [`build_python`](Self::build_python)).
    pub(super) async fn install_python(
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
    pub(super) async fn install_wheels(
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
        if let Some((flags, reqs)) = offline_request(pins, specs, &texts) {
            let done = self
                .run_uv(&uv, python, layer, &flags, &reqs, principal, cancel)
                .await;
            if done.ok {
                return Ok(self.installed_offline(&done, started, fresh && !known, key));
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
        online_failure(specs, &done)?;
        Ok(self.installed_online(&done, started, fresh, key))
    }

    /// What the offline run `done` installed, counted; its pins kept under `key` for a
    /// repeat when `remember` (exact pins resolved from the cache into an empty layer).
    fn installed_offline(
        &self,
        done: &install::Done,
        started: Instant,
        remember: bool,
        key: String,
    ) -> Installed {
        let mut out = parse_uv(&done.stderr);
        out.duration_ms = started.elapsed().as_millis() as u64;
        self.metrics.offline(out.installed.len());
        // Exact pins resolved from the cache: what a repeat gets too.
        if remember && !out.installed.is_empty() {
            self.resolved.put(key, out.pins.clone());
        }
        out
    }

    /// What the run from the index `done` installed, counted; what it resolved to kept
    /// under `key` when the layer was `fresh` (so nothing in it weighed on the resolution).
    fn installed_online(
        &self,
        done: &install::Done,
        started: Instant,
        fresh: bool,
        key: String,
    ) -> Installed {
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
        out
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
    pub(super) fn uv_argv(
        &self,
        uv: &Path,
        python: &Path,
        cache: &Path,
        layer: &Layer,
    ) -> Vec<String> {
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

/// Why the wheels-only installation failed: the caller's error, and whether it was for
/// want of a wheel (which a source build may give).
pub(super) struct Unmet {
    pub(super) error: PackageError,
    pub(super) no_wheel: bool,
}

impl From<PackageError> for Unmet {
    fn from(error: PackageError) -> Self {
        Self {
            error,
            no_wheel: false,
        }
    }
}

/// What may be installed from the cache alone (uv's flags, and the requirements): the
/// `pins` this request resolved to lately, or `specs` that are all exact pins.
fn offline_request(
    pins: Option<Vec<String>>,
    specs: &[spec::Spec],
    texts: &[String],
) -> Option<(Vec<&'static str>, Vec<String>)> {
    match pins {
        Some(pins) => Some((vec!["--offline", "--no-deps"], pins)),
        None if specs.iter().all(spec::Spec::is_exact_pin) => {
            Some((vec!["--offline"], texts.to_vec()))
        }
        None => None,
    }
}

/// Why the installation of `specs` from the index (`done`) failed, if it did: stopped, or
/// refused by uv (for want of a wheel, say).
fn online_failure(specs: &[spec::Spec], done: &install::Done) -> Result<(), Unmet> {
    let names: Vec<&str> = specs.iter().map(|s| s.text.as_str()).collect();
    if let Some(why) = &done.stopped {
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
    Ok(())
}

/// What a set of exact pins (`name==version`, the installer's own output) installs.
pub(super) fn of_pins(pins: Vec<String>) -> Installed {
    Installed {
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
    }
}

/// What uv's summary says: ` + name==version` per package added, `Prepared N packages`
/// when it had to download (or unpack) any.
pub(super) fn parse_uv(stderr: &str) -> Installed {
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
}
