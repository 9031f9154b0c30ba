//! JavaScript packages: npm, run by the sessions' node as the installer, into a layer's
//! `node_modules/` (`--prefix`), from the shared cache (`npm/`, npm's content-addressed
//! cacache, which checks every tarball against the registry's integrity), with install
//! scripts off (`--ignore-scripts`: installing runs no package code).

use std::path::{Path, PathBuf};
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::Packages;
use super::answer::{Installed, Package, PackageError, ProgramError};
use super::install::{self, Reason};
use super::layer::Layer;
use super::resolved::resolved_key;
use super::spec::Spec;

impl Packages {
    /// npm's `npm-cli.js` (see [`find_npm`]), found once; as root it must be reachable by
    /// the installer's uid (a system node's is).
    async fn npm(&self, node: &Path) -> Result<PathBuf, ProgramError> {
        let r = self
            .npm
            .get_or_init(|| {
                let (flag, node) = (self.npm_flag.clone(), node.to_path_buf());
                let as_root = self.sandbox.root;
                async move {
                    tokio::task::spawn_blocking(move || {
                        let npm = find_npm(flag.as_deref(), &node).ok_or(ProgramError::NoNpm)?;
                        if as_root && !crate::sandbox::reachable_by_others(&npm) {
                            return Err(ProgramError::NpmUnreachable(npm));
                        }
                        Ok(npm)
                    })
                    .await
                    .unwrap_or_else(|e| {
                        Err(ProgramError::Lookup {
                            what: "npm",
                            why: e.to_string(),
                        })
                    })
                }
            })
            .await;
        r.clone()
    }

    /// npm packages into `layer`. A request asked lately is tried offline first (npm's
    /// cache holds its registry documents and tarballs); anything missing goes to the
    /// registry.
    pub(super) async fn install_npm(
        &self,
        node: &Path,
        specs: &[Spec],
        layer: &Layer,
        (principal, cancel): (&str, &CancellationToken),
        started: Instant,
    ) -> Result<Installed, PackageError> {
        let npm = self.npm(node).await?;
        let texts: Vec<String> = specs.iter().map(|s| s.text.clone()).collect();
        let key = resolved_key(node, &self.registry.url, &texts);
        // Asked lately, or exact versions only (a replay's): the cache likely has it all.
        if self.resolved.get(&key).is_some() || specs.iter().all(Spec::is_exact_npm) {
            let done = self
                .run_npm(node, &npm, layer, &["--offline"], &texts, principal, cancel)
                .await;
            if done.ok {
                let mut out = parse_npm(&done.stdout, &done.stderr, layer, specs);
                out.duration_ms = started.elapsed().as_millis() as u64;
                self.metrics.offline(out.installed.len());
                return Ok(out);
            }
            if done.stopped.is_some() && cancel.is_cancelled() {
                return Err(PackageError::Failed(
                    "packages: the installation was cancelled".into(),
                ));
            }
        }
        let done = self
            .run_npm(node, &npm, layer, &[], &texts, principal, cancel)
            .await;
        let names = texts.join(", ");
        if let Some(why) = done.stopped {
            return Err(PackageError::Failed(format!(
                "packages: could not install {names}: {why}"
            )));
        }
        if !done.ok {
            let (reason, text) = npm_failure(&done.stdout, &done.stderr);
            return Err(PackageError::Failed(format!(
                "packages: could not install {names}: {}.\n{text}",
                reason.says()
            )));
        }
        let mut out = parse_npm(&done.stdout, &done.stderr, layer, specs);
        tracing::debug!(stderr = %done.stderr, downloaded = out.downloaded, "packages: npm installed");
        out.duration_ms = started.elapsed().as_millis() as u64;
        self.metrics.online(out.installed.len(), out.downloaded);
        // Asked lately: offline first next time. What it resolved to (the tree a shared layer
        // is keyed by) is for `provide` to say, from the layer it built.
        self.resolved.mark(key);
        Ok(out)
    }

    /// One run of `npm install` into `layer`: `flags` of the server's own, then `reqs`
    /// (checked specifiers) after `--`, in a scratch home removed after it. npm reads no
    /// user configuration (the home is empty), saves what it installed in the layer's own
    /// package.json (so a later install keeps it) and reports in JSON.
    #[allow(clippy::too_many_arguments)]
    async fn run_npm(
        &self,
        node: &Path,
        npm: &Path,
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
        let mut args: Vec<String> = [
            "--prefix",
            &layer.dir.display().to_string(),
            "--ignore-scripts",
            "--no-audit",
            "--no-fund",
            "--json",
            "--loglevel",
            "http",
        ]
        .iter()
        .chain(flags)
        .map(|a| a.to_string())
        .collect();
        args.push("--".into());
        args.extend(reqs.iter().cloned());
        // The shared cache and this one layer: never another run's or session's.
        let job = self.npm_job(node, npm, home, "install", args, Some(&layer.dir));
        self.run_installer(job, principal, cancel).await
    }
}

impl Packages {
    /// One run of `npm cache ARGS` on the shared cache, as the installer (eviction: `ls`
    /// lists a package's keys, `clean` removes them).
    pub(super) async fn run_npm_cache(
        &self,
        node: &Path,
        npm: &Path,
        args: &[&str],
        cancel: &CancellationToken,
    ) -> install::Done {
        let home = match self.installer_home() {
            Ok(home) => home,
            Err(stopped) => return stopped,
        };
        let args = args.iter().map(|a| a.to_string()).collect();
        let job = self.npm_job(node, npm, home, "cache", args, None);
        self.run_installer(job, "", cancel).await
    }
}

impl Packages {
    /// `npm SUBCOMMAND` with the settings every run of it has (the installer's npmrc, the
    /// operator's registry, the shared cache), then `args`; it may write the cache and
    /// `layer`, nothing else.
    fn npm_job(
        &self,
        node: &Path,
        npm: &Path,
        home: PathBuf,
        subcommand: &str,
        args: Vec<String>,
        layer: Option<&Path>,
    ) -> install::Job {
        let cache = self.root.join("npm");
        let mut argv: Vec<String> = vec![
            node.display().to_string(),
            npm.display().to_string(),
            subcommand.into(),
            "--no-update-notifier".into(),
            "--userconfig".into(),
            home.join("npmrc").display().to_string(),
            "--registry".into(),
            self.registry.url.clone(),
            "--cache".into(),
            cache.display().to_string(),
        ];
        argv.extend(args);
        let mut env = install::installer_env();
        env.push(("NODE_OPTIONS".into(), String::new()));
        install::Job {
            argv,
            env,
            exes: vec![node.to_path_buf(), npm.to_path_buf()],
            rw: std::iter::once(cache)
                .chain(layer.map(Path::to_path_buf))
                .collect(),
            home,
        }
    }
}

/// The operator's `--npm` must be npm's `npm-cli.js`: a typo stops the server at once.
pub(super) fn check_flag(flag: Option<&Path>) -> anyhow::Result<()> {
    if let Some(f) = flag
        && !f.is_file()
    {
        anyhow::bail!("--npm {}: not npm's npm-cli.js", f.display());
    }
    Ok(())
}

/// Largest lockfile read (the server's own installer wrote it).
const LOCKFILE_MAX: u64 = 32 << 20;

/// Every package npm put in the layer `dir`, with its place, version and the integrity of
/// its tarball (`node_modules/a@1.0.0 sha512-…`, `node_modules/a/node_modules/@s/b@2.0.0
/// sha512-…`; a package bundled in another's tarball has none of its own), sorted: what its
/// lockfile says. The integrity is what tells the packages apart: npm takes a package of
/// the name of another's alias (`b`, asked for beside `a`, which depends on `b` as
/// `npm:c@^1`) for that alias, at the same place and version as the honest tree's `c`.
/// None when there is no lockfile, or it holds anything but registry packages beneath
/// `node_modules/`.
pub(super) fn layout(dir: &Path) -> Option<Vec<String>> {
    #[derive(serde::Deserialize)]
    struct Entry {
        #[serde(default)]
        version: Option<String>,
        #[serde(default)]
        link: bool,
        #[serde(default)]
        integrity: Option<String>,
        #[serde(default, rename = "inBundle")]
        in_bundle: bool,
    }
    #[derive(serde::Deserialize)]
    struct Lock {
        #[serde(default)]
        packages: std::collections::BTreeMap<String, Entry>,
    }
    let (text, _) = crate::bounded_read::read(&dir.join("package-lock.json"), LOCKFILE_MAX).ok()?;
    let lock: Lock = serde_json::from_slice(&text).ok()?;
    let mut out = Vec::new();
    for (place, e) in lock.packages {
        // The layer itself.
        if place.is_empty() {
            continue;
        }
        // Names and scopes only: nothing that would not be a package's place.
        let part = |c: &str| match c.strip_prefix('@') {
            Some(scope) => !scope.is_empty() && !scope.contains('@'),
            None => !c.is_empty() && c != "." && c != ".." && !c.contains('@'),
        };
        let plain = place.starts_with("node_modules/") && place.split('/').all(part);
        if e.link || !plain {
            return None;
        }
        let version = e.version?;
        if e.in_bundle {
            out.push(format!("{place}@{version}"));
            continue;
        }
        // Without an integrity nothing says what the tarball held: not shared.
        let integrity = e.integrity.filter(|i| !i.is_empty())?;
        out.push(format!("{place}@{version} {integrity}"));
    }
    out.sort();
    Some(out)
}

/// What a layer laid out as `layout` (see [`layout`]) holds, for a request of `specs`: every
/// package with its version, and the requested ones' pins (those at its top).
pub(super) fn of_layout(layout: &[String], specs: &[Spec]) -> Installed {
    let mut installed = Vec::new();
    let mut pins = Vec::new();
    for entry in layout {
        // Its place and version, without the integrity.
        let entry = entry.split(' ').next().unwrap_or(entry);
        let Some((place, version)) = entry.rsplit_once('@') else {
            continue;
        };
        let Some((_, name)) = place.rsplit_once("node_modules/") else {
            continue;
        };
        if place == format!("node_modules/{name}") && specs.iter().any(|s| s.name == name) {
            pins.push(format!("{name}@{version}"));
        }
        installed.push(Package {
            name: name.to_string(),
            version: version.to_string(),
        });
    }
    installed.sort_by(|a, b| a.name.cmp(&b.name).then(a.version.cmp(&b.version)));
    installed.dedup();
    Installed {
        installed,
        downloaded: 0,
        duration_ms: 0,
        pins,
        built: Vec::new(),
    }
}

/// For an installation into `layer`, which uses a shared layer and has no packages of its
/// own yet: the shared layer's requested packages (their exact versions) that `specs` do
/// not name, to install along, and what the shared layer holds. npm then places them and
/// what is asked together, as in one layer: a dependency of what is asked never takes the
/// name of a package the run or session started with at the top of its own layer (which
/// comes first on NODE_PATH), and the layer's package.json keeps them for later
/// installations. None when there is nothing to take along.
pub(super) fn along(layer: &Layer, specs: &[Spec]) -> Option<(Vec<Spec>, Installed)> {
    let shared = layer.shared_set()?;
    if std::fs::symlink_metadata(layer.dir.join("package.json")).is_ok() {
        return None;
    }
    let keep: Vec<String> = shared
        .pins
        .iter()
        .filter(|p| {
            p.rsplit_once('@')
                .is_some_and(|(n, _)| !specs.iter().any(|s| s.name == n))
        })
        .cloned()
        .collect();
    if keep.is_empty() {
        return None;
    }
    let along = super::spec::check(super::Eco::Npm, &keep).ok()?;
    Some((along, shared))
}

/// What an installation with packages taken along (see [`along`]) says: not the packages the
/// shared layer has already (the same versions), nor the pins of packages not `asked` for.
pub(super) fn without(mut out: Installed, asked: &[Spec], shared: &Installed) -> Installed {
    out.installed.retain(|p| !shared.installed.contains(p));
    out.pins.retain(|p| {
        p.rsplit_once('@')
            .is_some_and(|(n, _)| asked.iter().any(|s| s.name == n))
    });
    out
}

/// npm's `npm-cli.js`: `flag`, else what the `npm` on PATH is (a link to it), else the one
/// installed beside `node` (`PREFIX/lib/node_modules/npm`).
fn find_npm(flag: Option<&Path>, node: &Path) -> Option<PathBuf> {
    let is_cli = |p: &Path| {
        std::fs::canonicalize(p)
            .ok()
            .filter(|r| r.is_file() && r.extension().is_some_and(|e| e == "js"))
    };
    if let Some(f) = flag {
        return std::fs::canonicalize(f).ok().filter(|r| r.is_file());
    }
    let beside = std::fs::canonicalize(node)
        .ok()
        .and_then(|n| n.parent()?.parent().map(Path::to_path_buf))
        .map(|prefix| prefix.join("lib/node_modules/npm/bin/npm-cli.js"));
    if let Some(cli) = beside.as_deref().and_then(is_cli) {
        return Some(cli);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).find_map(|d| is_cli(&d.join("npm")))
}

/// What npm's JSON report says: `add` (name, version) per package added, and how many
/// tarballs it fetched from the registry (its `http` log lines say `cache miss`); the
/// pins are the requested packages' versions at the top of the layer's `node_modules`.
fn parse_npm(stdout: &str, stderr: &str, layer: &Layer, specs: &[Spec]) -> Installed {
    #[derive(serde::Deserialize)]
    struct Added {
        name: String,
        version: String,
        #[serde(default)]
        path: String,
    }
    #[derive(serde::Deserialize)]
    struct Report {
        #[serde(default)]
        add: Vec<Added>,
    }
    let report: Report = json_tail(stdout).unwrap_or(Report { add: Vec::new() });
    let top = layer.dir.join("node_modules");
    let pins = report
        .add
        .iter()
        .filter(|a| {
            specs.iter().any(|s| s.name == a.name) && Path::new(&a.path) == top.join(&a.name)
        })
        .map(|a| format!("{}@{}", a.name, a.version))
        .collect();
    let mut installed: Vec<Package> = report
        .add
        .into_iter()
        .map(|a| Package {
            name: a.name,
            version: a.version,
        })
        .collect();
    installed.sort_by(|a, b| a.name.cmp(&b.name).then(a.version.cmp(&b.version)));
    installed.dedup();
    // A tarball's body came from the registry when npm's fetch says its cache missed, or
    // had to be updated (what it says after an eviction: `npm cache clean` leaves a
    // tombstone in the cache's index), or was skipped; not when it was a hit, served stale
    // or revalidated (a 304).
    let downloaded = stderr
        .lines()
        .filter(|l| {
            l.starts_with("npm http fetch GET 200 ")
                && l.contains(".tgz ")
                && ["(cache miss)", "(cache updated)", "(cache skip)"]
                    .iter()
                    .any(|s| l.ends_with(s))
        })
        .count();
    Installed {
        installed,
        downloaded: u32::try_from(downloaded).unwrap_or(u32::MAX),
        duration_ms: 0,
        pins,
        built: Vec::new(),
    }
}

/// The JSON document npm printed (the last one when it printed more).
fn json_tail<T: serde::de::DeserializeOwned>(stdout: &str) -> Option<T> {
    let t = stdout.trim();
    if let Ok(v) = serde_json::from_str(t) {
        return Some(v);
    }
    let at = t.rfind("\n{")?;
    serde_json::from_str(&t[at + 1..]).ok()
}

/// Why npm could not install: its error code in a few words, then its own explanation.
fn npm_failure(stdout: &str, stderr: &str) -> (Reason, String) {
    #[derive(serde::Deserialize, Default)]
    struct Err {
        #[serde(default)]
        code: String,
        #[serde(default)]
        summary: String,
    }
    #[derive(serde::Deserialize)]
    struct Report {
        error: Err,
    }
    let err = json_tail::<Report>(stdout)
        .map(|r| r.error)
        .unwrap_or_default();
    let code = if err.code.is_empty() {
        stderr
            .lines()
            .find_map(|l| l.strip_prefix("npm error code "))
            .unwrap_or("")
            .trim()
            .to_string()
    } else {
        err.code
    };
    let reason = match code.as_str() {
        "E404" => Reason::NotFound,
        "ETARGET" => Reason::NoVersion,
        "EINTEGRITY" => Reason::Hash,
        "ECONNREFUSED" | "ECONNRESET" | "ENOTFOUND" | "EAI_AGAIN" | "ETIMEDOUT" | "E407"
        | "E403" | "ENOTCACHED" | "EPROXY" => Reason::Unreachable,
        _ => Reason::Failed,
    };
    let mut text = if err.summary.is_empty() {
        let lines: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("npm error") && !l.contains("complete log"))
            .collect();
        lines.join("\n")
    } else {
        err.summary
    };
    if text.len() > 2000 {
        let mut cut = 2000;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    (reason, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npm_report_gives_packages_and_downloads() {
        let out = r#"{"add": [{"name": "is-odd", "version": "3.0.1", "path": "/l/node_modules/is-odd"},
            {"name": "is-number", "version": "6.0.0", "path": "/l/node_modules/is-number"},
            {"name": "is-odd", "version": "0.1.2", "path": "/l/node_modules/x/node_modules/is-odd"}],
            "added": 3}"#;
        let err = "npm http fetch GET 200 https://registry.npmjs.org/is-odd 242ms (cache miss)\n\
                   npm http cache is-odd@https://registry.npmjs.org/is-odd/-/is-odd-3.0.1.tgz 0ms (cache hit)\n\
                   npm http fetch GET 200 https://registry.npmjs.org/is-number/-/is-number-6.0.0.tgz 340ms (cache miss)\n\
                   npm http fetch GET 200 https://registry.npmjs.org/is-even/-/is-even-1.0.0.tgz 177ms (cache updated)\n\
                   npm http fetch GET 304 https://registry.npmjs.org/is-odd/-/is-odd-3.0.1.tgz 17ms (cache revalidated)\n";
        let layer = Layer::new(
            PathBuf::from("/l"),
            super::super::Eco::Npm,
            false,
            None,
            None,
        );
        let specs = super::super::spec::check(super::super::Eco::Npm, &["is-odd@3".into()])
            .expect("a specifier");
        let i = parse_npm(out, err, &layer, &specs);
        // The tarballs fetched: a miss, and an update (an evicted one fetched again).
        assert_eq!(i.downloaded, 2);
        assert_eq!(i.pins, ["is-odd@3.0.1"]);
        assert_eq!(
            i.installed
                .iter()
                .map(|p| format!("{}@{}", p.name, p.version))
                .collect::<Vec<_>>(),
            ["is-number@6.0.0", "is-odd@0.1.2", "is-odd@3.0.1"]
        );
    }

    #[test]
    fn a_lockfile_gives_the_layout_and_the_layout_what_is_installed() {
        let dir = std::env::temp_dir().join(format!("replbox-layout-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let lock = |packages: &str| {
            std::fs::write(
                dir.join("package-lock.json"),
                format!(r#"{{"name": "x", "lockfileVersion": 3, "packages": {packages}}}"#),
            )
            .unwrap()
        };
        lock(
            r#"{"": {"dependencies": {"is-odd": "^3.0.1"}},
                "node_modules/is-odd": {"version": "3.0.1", "integrity": "sha512-o=="},
                "node_modules/@s/x": {"version": "1.0.0", "integrity": "sha512-x=="},
                "node_modules/is-odd/node_modules/is-number": {"version": "6.0.0", "inBundle": true}}"#,
        );
        let l = layout(&dir).expect("a layout");
        assert_eq!(
            l,
            [
                "node_modules/@s/x@1.0.0 sha512-x==",
                "node_modules/is-odd/node_modules/is-number@6.0.0",
                "node_modules/is-odd@3.0.1 sha512-o=="
            ]
        );
        let specs =
            super::super::spec::check(super::super::Eco::Npm, &["is-odd@3".into(), "@s/x".into()])
                .unwrap();
        let i = of_layout(&l, &specs);
        assert_eq!(i.pins, ["@s/x@1.0.0", "is-odd@3.0.1"]);
        assert_eq!(
            i.installed
                .iter()
                .map(|p| format!("{}@{}", p.name, p.version))
                .collect::<Vec<_>>(),
            ["@s/x@1.0.0", "is-number@6.0.0", "is-odd@3.0.1"]
        );
        // Anything but registry packages beneath node_modules/: no layout, nothing shared.
        for bad in [
            r#"{"node_modules/a": {"version": "1.0.0", "link": true}}"#,
            r#"{"node_modules/../a": {"version": "1.0.0"}}"#,
            r#"{"lib/a": {"version": "1.0.0"}}"#,
            r#"{"node_modules/a": {}}"#,
            // Nothing that says what its tarball held.
            r#"{"node_modules/a": {"version": "1.0.0"}}"#,
        ] {
            lock(bad);
            assert_eq!(layout(&dir), None, "{bad}");
        }
        std::fs::remove_file(dir.join("package-lock.json")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.join("package-lock.json")).unwrap();
        assert_eq!(layout(&dir), None);
        // A FIFO in its place is refused, not waited on for a writer.
        std::fs::remove_file(dir.join("package-lock.json")).unwrap();
        nix::unistd::mkfifo(
            &dir.join("package-lock.json"),
            nix::sys::stat::Mode::S_IRWXU,
        )
        .unwrap();
        assert_eq!(layout(&dir), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn npm_failures_are_told_apart() {
        let nf = r#"{"error": {"code": "E404", "summary": "Not Found - GET https://registry.npmjs.org/nope - Not found", "detail": ""}}"#;
        let (r, text) = npm_failure(nf, "");
        assert_eq!(r, Reason::NotFound);
        assert!(text.contains("Not Found"), "{text}");
        let nv =
            "npm error code ETARGET\nnpm error notarget No matching version found for is-odd@99.\n";
        let (r, text) = npm_failure("", nv);
        assert_eq!(r, Reason::NoVersion);
        assert!(text.contains("No matching version"), "{text}");
    }
}
