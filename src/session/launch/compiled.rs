//! Bootstrap modules compiled once (`[session.compiled]`; ghc only): ghci's macros as a
//! package of object code, so that a session's start type-checks a few `:def` lines instead
//! of the macros' whole source in ghci's interpreter.
//!
//! A build lives in `<cache>/ghci/<key>/`, the key a hash of the module's source, this
//! recipe and what ghc says of itself and of the packages the module uses (a changed
//! module, a ghc upgrade or a reinstalled dependency builds anew). The server builds it
//! with its own rights (trusted input: the operator's ghc, the language's module) into a
//! temporary directory, checks that ghci loads it, and renames it into place: a key's
//! directory is complete or absent, and sessions only read it (root's, 0755, files 0644;
//! bound read-only into their sandbox). A file lock serialises servers building at once.
//! Anything that fails leaves the session on the interpreted bootstrap, with a warning.

use std::collections::HashMap;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;

use crate::lang::Compiled;

/// Changes whenever the steps below change what a build holds.
const RECIPE: &str = "ghc-package-1";
/// The package's unit id (one per build directory, so it needs no hash of its own).
const UNIT: &str = "replbox-ghci";
/// The packages the module imports (they are the package's dependencies).
const DEPENDS: &[&str] = &["base", "directory", "unix"];
/// ghc's arguments for only the global package database: nothing of the server's user's own.
const CLEAN: &[&str] = &["-no-user-package-db", "-package-env", "-"];
/// The file a build's directory holds once it is complete.
const DONE: &str = "complete";
/// A step of the build (ghc compiling with -O on a loaded machine) that takes longer is
/// given up.
const STEP_TIMEOUT: Duration = Duration::from_secs(300);

/// A built module: where it is (readable by sessions) and ghci's arguments that load it.
#[derive(Debug)]
pub(crate) struct Built {
    pub(crate) dir: PathBuf,
    pub(crate) args: Vec<String>,
}

/// One attempt at a build: its result once made.
type Attempt = OnceCell<Option<Arc<Built>>>;

/// The builds of one server, by the session program they are for (at most one attempt
/// each per server: a failure is not retried until the next start).
#[derive(Default)]
pub(crate) struct Builds {
    root: Option<PathBuf>,
    by_exe: Mutex<HashMap<PathBuf, Arc<Attempt>>>,
}

impl Builds {
    /// Builds kept beneath `root` (None: the system's or the user's cache).
    pub(crate) fn new(root: Option<PathBuf>) -> Self {
        Self {
            root,
            by_exe: Mutex::default(),
        }
    }

    /// The build of `c` for the ghci `exe`, made now if there is none yet; None when it
    /// cannot be made (the reason is logged once).
    pub(crate) async fn get(&self, c: &Compiled, exe: &Path) -> Option<Arc<Built>> {
        let cell = {
            let mut map = self.by_exe.lock().unwrap_or_else(|e| e.into_inner());
            map.entry(exe.to_path_buf()).or_default().clone()
        };
        cell.get_or_init(|| async {
            let root = self.root.clone().unwrap_or_else(default_root);
            match build(c, exe, &root).await {
                Ok(b) => {
                    tracing::debug!(dir = %b.dir.display(), "ghci bootstrap module ready");
                    Some(Arc::new(b))
                }
                Err(why) => {
                    tracing::warn!(
                        "ghci sessions use the interpreted bootstrap (slower to start): \
                         {why}"
                    );
                    None
                }
            }
        })
        .await
        .clone()
    }
}

/// The cache's place when none is given: the system's as root, else the user's.
fn default_root() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/var/cache/replbox/ghci");
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("replbox/ghci")
}

/// Why the compiled bootstrap could not be built (logged; sessions then use the interpreted
/// one). The server's own work with the operator's ghc.
#[derive(Debug, thiserror::Error)]
enum BuildError {
    #[error("no ghc beside {}", .0.display())]
    NoGhc(PathBuf),
    #[error("ghc --info gave no version")]
    NoVersion,
    #[error("ghc --info gave no package database")]
    NoDb,
    #[error("{0}")]
    Join(tokio::task::JoinError),
    /// A file or directory of the build, or ghc's package database (`at`).
    #[error("{}: {error}", .at.display())]
    At { at: PathBuf, error: std::io::Error },
    #[error("{0}")]
    Io(std::io::Error),
    #[error("no package {dep} in {}", .db.display())]
    NoPackage { dep: &'static str, db: PathBuf },
    #[error("{0} names no id")]
    NoId(String),
    #[error("cannot lock {}: {error}", .root.display())]
    Lock {
        root: PathBuf,
        error: nix::errno::Errno,
    },
    #[error("cannot move the build into place: {0}")]
    Place(std::io::Error),
    #[error("ghci did not load the built module: {0}")]
    NotLoaded(String),
    #[error("cannot finish the build: {0}")]
    Finish(std::io::Error),
    #[error("cannot run {}: {error}", .exe.display())]
    Spawn { exe: PathBuf, error: std::io::Error },
    /// A step (`what`: its command line) that failed: its status and what it printed.
    #[error("{what}: {status}: {output}")]
    Step {
        what: String,
        status: std::process::ExitStatus,
        output: String,
    },
    #[error("{what}: {error}")]
    Wait { what: String, error: std::io::Error },
    #[error("{what}: gave up after {} s", STEP_TIMEOUT.as_secs())]
    Timeout { what: String },
}

/// ghc of the same installation as the ghci `exe` (`ghci-9.0.2` beside `ghc-9.0.2`).
fn ghc_beside(exe: &Path) -> Option<PathBuf> {
    let name = exe.file_name()?.to_str()?;
    let ghc = exe.with_file_name(name.replacen("ghci", "ghc", 1));
    (name.contains("ghci") && ghc.is_file()).then_some(ghc)
}

async fn build(c: &Compiled, exe: &Path, root: &Path) -> Result<Built, BuildError> {
    let ghc = ghc_beside(exe).ok_or_else(|| BuildError::NoGhc(exe.into()))?;
    let info = run(&ghc, &["--info".into()], Path::new("/")).await?;
    let field = |name: &str| {
        // `,("Project version","9.0.2")`
        let at = info.find(&format!("(\"{name}\",\""))? + name.len() + 5;
        let end = info[at..].find('"')?;
        Some(info[at..at + end].to_string())
    };
    let version = field("Project version").ok_or(BuildError::NoVersion)?;
    let global_db = field("Global Package DB").ok_or(BuildError::NoDb)?;
    let (c, root, ghc2) = (c.clone(), root.to_path_buf(), ghc.clone());
    let depends = tokio::task::spawn_blocking(move || dependency_ids(Path::new(&global_db)))
        .await
        .map_err(BuildError::Join)??;
    let ghci = root.join(key(&version, &c.module.text, &info, &depends));
    let args = |dir: &Path| {
        vec![
            "-package-db".to_string(),
            dir.join("db").display().to_string(),
            "-package-id".to_string(),
            UNIT.to_string(),
        ]
    };
    if ghci.join(DONE).is_file() {
        return Ok(Built {
            args: args(&ghci),
            dir: ghci,
        });
    }
    // Built under a lock: servers starting at once build it once.
    let lock_root = root.clone();
    let lock = tokio::task::spawn_blocking(move || lock_builds(&lock_root))
        .await
        .map_err(BuildError::Join)??;
    if ghci.join(DONE).is_file() {
        return Ok(Built {
            args: args(&ghci),
            dir: ghci,
        });
    }
    // What a server that died while it finished a build left.
    let _ = std::fs::remove_dir_all(&ghci);
    let tmp = root.join(format!(".build-{}", uuid::Uuid::new_v4().simple()));
    let made = make(&c, &ghc2, (&version, &depends), &tmp, &ghci).await;
    if made.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    // The package database names the build's final place: it is made there.
    let placed = match made {
        Ok(()) => match std::fs::rename(&tmp, &ghci) {
            Ok(()) => finish(&ghc2, &ghci).await,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                Err(BuildError::Place(e))
            }
        },
        Err(e) => Err(e),
    };
    if placed.is_err() {
        let _ = std::fs::remove_dir_all(&ghci);
    }
    drop(lock);
    placed.map(|()| Built {
        args: args(&ghci),
        dir: ghci,
    })
}

/// A build's directory name: ghc's version, and a hash of all a build depends on.
fn key(version: &str, module: &str, info: &str, depends: &[String]) -> String {
    let mut h = Sha256::new();
    for part in [RECIPE, module, info, &depends.join(" ")] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    let hash: String = h.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{version}-{hash}")
}

/// The unit ids of [`DEPENDS`] in ghc's global package database (`id:` of each one's file).
fn dependency_ids(db: &Path) -> Result<Vec<String>, BuildError> {
    let entries = std::fs::read_dir(db).map_err(|error| BuildError::At {
        at: db.into(),
        error,
    })?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".conf"))
        .collect();
    names.sort();
    let mut ids = Vec::new();
    for dep in DEPENDS {
        // `directory-1.3.6.2.conf`, not `directory-extra-…`: the version starts with a digit.
        let file = names
            .iter()
            .find(|n| {
                n.strip_prefix(dep)
                    .and_then(|r| r.strip_prefix('-'))
                    .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
            })
            .ok_or_else(|| BuildError::NoPackage { dep, db: db.into() })?;
        let text = std::fs::read_to_string(db.join(file)).map_err(BuildError::Io)?;
        let id = text
            .lines()
            .find_map(|l| l.strip_prefix("id:"))
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| BuildError::NoId(file.clone()))?;
        ids.push(id);
    }
    Ok(ids)
}

fn lock_builds(root: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, BuildError> {
    let at = |error| BuildError::At {
        at: root.into(),
        error,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(root)
        .map_err(at)?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(root.join(".lock"))
        .map_err(at)?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, error)| {
        BuildError::Lock {
            root: root.into(),
            error,
        }
    })
}

/// Compile the module into a package in `dir`, whose database names `place`, where it
/// will be.
async fn make(
    c: &Compiled,
    ghc: &Path,
    (version, depends): (&str, &[String]),
    dir: &Path,
    place: &Path,
) -> Result<(), BuildError> {
    let module = c.module.file.trim_end_matches(".hs").to_string();
    let lib = format!("HS{UNIT}-ghc{version}");
    {
        let (at, text, file) = (
            dir.to_path_buf(),
            c.module.text.clone(),
            c.module.file.clone(),
        );
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::DirBuilder::new().mode(0o755).create(&at)?;
            std::fs::DirBuilder::new()
                .mode(0o755)
                .create(at.join("db"))?;
            std::fs::write(at.join(file), text)
        })
        .await
        .map_err(BuildError::Join)?
        .map_err(|error| BuildError::At {
            at: dir.into(),
            error,
        })?;
    }
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let mut compile = s(CLEAN);
    compile.extend(s(&[
        "-dynamic",
        "-fPIC",
        "-O",
        "-this-unit-id",
        UNIT,
        "-hisuf",
        "dyn_hi",
        "-osuf",
        "dyn_o",
        "-c",
        &c.module.file,
    ]));
    run(ghc, &compile, dir).await?;
    let mut link = s(CLEAN);
    link.extend(s(&["-dynamic", "-shared", "-fPIC"]));
    link.push(format!("{module}.dyn_o"));
    link.extend(s(&["-o", &format!("lib{lib}.so")]));
    for d in DEPENDS {
        link.extend(s(&["-package", d]));
    }
    run(ghc, &link, dir).await?;
    let conf = format!(
        "name: {UNIT}\nversion: 0\nid: {UNIT}\nkey: {UNIT}\nexposed: True\n\
         exposed-modules: {module}\nimport-dirs: {at}\nlibrary-dirs: {at}\n\
         dynamic-library-dirs: {at}\nhs-libraries: HS{UNIT}\ndepends: {}\n",
        depends.join(" "),
        at = place.display(),
    );
    let path = dir.join(format!("db/{UNIT}.conf"));
    tokio::task::spawn_blocking(move || std::fs::write(path, conf))
        .await
        .map_err(BuildError::Join)?
        .map_err(BuildError::Io)
}

/// In its place: the package database's cache, a check that ghc's interpreter (as ghci)
/// loads the package and runs a function of it (the object code is linked then), the
/// permissions, and last the mark that the build is complete.
async fn finish(ghc: &Path, dir: &Path) -> Result<(), BuildError> {
    let pkg = ghc.with_file_name(
        ghc.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("ghc")
            .replacen("ghc", "ghc-pkg", 1),
    );
    let db = dir.join("db").display().to_string();
    run(
        &pkg,
        &["--package-db".into(), db.clone(), "recache".into()],
        dir,
    )
    .await?;
    let module = "ReplboxGhci";
    let check =
        format!("{module}.nonce ({module}.Session \"\" \"replbox-ok\" \"\" \"\" \"\" \"\" \"\")");
    let mut try_it: Vec<String> = ["-ignore-dot-ghci"]
        .iter()
        .chain(CLEAN)
        .map(|x| x.to_string())
        .collect();
    try_it.extend(["-package-db".into(), db, "-package-id".into(), UNIT.into()]);
    try_it.extend(["-e".into(), check]);
    // Not in `dir`: a module's source in the working directory would shadow the package's.
    let out = run(ghc, &try_it, &dir.join("db")).await?;
    if !out.contains("\"replbox-ok\"") {
        return Err(BuildError::NotLoaded(out.trim().to_string()));
    }
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        publish(&dir)?;
        std::fs::write(dir.join(DONE), b"")?;
        std::fs::set_permissions(dir.join(DONE), std::fs::Permissions::from_mode(0o644))
    })
    .await
    .map_err(BuildError::Join)?
    .map_err(BuildError::Finish)
}

/// Every file readable by all (sessions run as other uids), nothing writable but by owner.
fn publish(dir: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let ty = e.file_type()?;
        if ty.is_dir() {
            std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(0o755))?;
            publish(&e.path())?;
        } else if ty.is_file() {
            std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(0o644))?;
        }
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
}

/// Run one step of the build in `cwd` (the operator's tools, a clean environment, HOME the
/// build directory); its output, or why it failed.
async fn run(exe: &Path, args: &[String], cwd: &Path) -> Result<String, BuildError> {
    let home = cwd.display().to_string();
    let mut cmd = tokio::process::Command::new(exe);
    cmd.args(args)
        .current_dir(cwd)
        .env_clear()
        .envs(crate::exec::env::base_env(Path::new(&home), "dumb"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let child = cmd.spawn().map_err(|error| BuildError::Spawn {
        exe: exe.into(),
        error,
    })?;
    let pid = child.id();
    let what = format!("{} {}", exe.display(), args.join(" "));
    match tokio::time::timeout(STEP_TIMEOUT, child.wait_with_output()).await {
        Ok(Ok(out)) => {
            let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&out.stderr));
            if out.status.success() {
                Ok(text)
            } else {
                Err(BuildError::Step {
                    what,
                    status: out.status,
                    output: text.trim().to_string(),
                })
            }
        }
        Ok(Err(error)) => Err(BuildError::Wait { what, error }),
        Err(_) => {
            // Its whole group: ghc's own children (the C compiler, the linker) too.
            if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            Err(BuildError::Timeout { what })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_changes_with_the_module_ghc_and_dependencies() {
        let deps = vec!["base-4.15.1.0".to_string()];
        let k = key("9.0.2", "module A where", "info", &deps);
        assert!(k.starts_with("9.0.2-"), "{k}");
        assert_eq!(k, key("9.0.2", "module A where", "info", &deps));
        for other in [
            key("9.0.2", "module A where x = 1", "info", &deps),
            key("9.0.2", "module A where", "info of another ghc", &deps),
            key(
                "9.0.2",
                "module A where",
                "info",
                &["base-4.15.2.0".to_string()],
            ),
        ] {
            assert_ne!(k, other);
        }
    }

    #[test]
    fn dependency_ids_are_read_from_the_global_database() {
        let db = tempfile::tempdir().expect("tempdir");
        for (file, id) in [
            ("base-4.15.1.0.conf", "base-4.15.1.0"),
            ("directory-extra-1.0.conf", "directory-extra-1.0"),
            ("directory-1.3.6.2.conf", "directory-1.3.6.2"),
            ("unix-2.7.2.2-abc.conf", "unix-2.7.2.2-abc"),
        ] {
            std::fs::write(db.path().join(file), format!("name: x\nid: {id}\n")).expect("write");
        }
        assert_eq!(
            dependency_ids(db.path()).expect("ids"),
            ["base-4.15.1.0", "directory-1.3.6.2", "unix-2.7.2.2-abc"]
        );
        std::fs::remove_file(db.path().join("unix-2.7.2.2-abc.conf")).expect("rm");
        let e = dependency_ids(db.path()).expect_err("unix is missing");
        assert_eq!(
            e.to_string(),
            format!("no package unix in {}", db.path().display())
        );
        std::fs::write(db.path().join("unix-2.conf"), "name: unix\n").expect("write");
        let e = dependency_ids(db.path()).expect_err("no id");
        assert_eq!(e.to_string(), "unix-2.conf names no id");
        let gone = db.path().join("gone");
        let e = dependency_ids(&gone).expect_err("no database");
        assert_eq!(
            e.to_string(),
            format!("{}: No such file or directory (os error 2)", gone.display())
        );
    }

    /// A failed step says its command line, status and output; a late one, the bound.
    #[test]
    fn step_messages_are_pinned() {
        use std::os::unix::process::ExitStatusExt;
        let e = BuildError::Step {
            what: "/usr/bin/ghc -c ReplboxGhci.hs".into(),
            status: std::process::ExitStatus::from_raw(1 << 8),
            output: "ReplboxGhci.hs:1:1: error".into(),
        };
        assert_eq!(
            e.to_string(),
            "/usr/bin/ghc -c ReplboxGhci.hs: exit status: 1: ReplboxGhci.hs:1:1: error"
        );
        let e = BuildError::Timeout {
            what: "/usr/bin/ghc -c ReplboxGhci.hs".into(),
        };
        assert_eq!(
            e.to_string(),
            "/usr/bin/ghc -c ReplboxGhci.hs: gave up after 300 s"
        );
    }

    #[tokio::test]
    async fn without_ghc_beside_ghci_there_is_no_build() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ghci = dir.path().join("ghci");
        std::fs::write(&ghci, "").expect("write");
        assert_eq!(ghc_beside(&ghci), None);
        let c = Compiled {
            module: crate::lang::spec::Source {
                file: "ReplboxGhci.hs".into(),
                text: "module ReplboxGhci where".into(),
            },
            bootstrap: crate::lang::spec::Source {
                file: "b.ghci".into(),
                text: String::new(),
            },
        };
        let builds = Builds::new(Some(dir.path().join("cache")));
        assert!(builds.get(&c, &ghci).await.is_none());
        assert!(!dir.path().join("cache").exists());
    }
}
