//! `--package-builds`: a Python package the index has only as source (an sdist) is refused
//! with the wheels-only reason unless the operator allows builds; then it is built, as the
//! installer's uid, into the asking run's or session's own packages. The build code is the
//! package's own: a hostile one writes neither the shared cache, the store of shared
//! layers nor the server's files, changes none of their modes, and reaches nothing but the
//! index. Only bwrap confines it so: a server with the flag at landlock or none does not
//! start. The index is a loopback one of the test's own (sdists with an in-tree build
//! backend, no setuptools), so no test here needs the internet.

use crate::common;
use crate::package_cache::{Dir, IndexFile, Served, build_wheels, serve_files};
use crate::packages::UvCopy;

use std::path::{Path, PathBuf};

use common::{Server, http_call, output, require};
use serde_json::{Value, json};

const TOKEN_A: &str = "package-builds-a-token-0123456789";
const TOKEN_B: &str = "package-builds-b-token-0123456789";

/// What the hostile build writes into every file it can reach.
const MARK: &str = "REPLBOX-BUILD-POISON";

/// An sdist's in-tree build backend (PEP 517, no requirements): its wheel is a module
/// `NAME` whose `VALUE` is `"NAME built"` and whose `ATTEMPTS` is what `@ATTACK@` (run at
/// build time) returned.
const BACKEND: &str = r#"
import base64, hashlib, json, os, socket, zipfile
NAME = "@NAME@"
CONFIG = json.loads(@CONFIG@)

def attack():
    out = ["uid %d" % os.getuid()]
    def t(name, f):
        try:
            f()
            out.append("DID " + name)
        except Exception as e:
            out.append("refused %s %s" % (name, type(e).__name__))
    def plant(path):
        with open(path, "w") as f:
            f.write(CONFIG["mark"])
    def poison_tree(root, only=""):
        os.listdir(root)
        wrote = 0
        for dp, dns, fns in os.walk(root):
            for fn in fns:
                if not fn.endswith(only):
                    continue
                try:
                    with open(os.path.join(dp, fn), "a") as f:
                        f.write("\n# " + CONFIG["mark"] + "\n")
                    wrote += 1
                except OSError:
                    pass
        if not wrote:
            raise PermissionError("nothing written")
    def connect():
        socket.create_connection(("127.0.0.1", CONFIG["port"]), timeout=5).close()
    def proc_root():
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    plant("/proc/%s/root%s/uv/planted-proc" % (pid, CONFIG["cache"]))
                    return
                except OSError:
                    pass
        raise PermissionError("no process's root")
    def target():
        # The installer's own --target (this build's layer), from its command line.
        pid = os.getppid()
        while pid > 1:
            argv = open("/proc/%d/cmdline" % pid, "rb").read().split(b"\0")
            if b"--target" in argv:
                return argv[argv.index(b"--target") + 1].decode()
            status = open("/proc/%d/status" % pid).read()
            pid = int(status.split("PPid:")[1].split()[0])
        raise LookupError("no --target")
    def plant_links():
        # For a later installation into the same layer, which a trusted uv with the shared
        # cache writable would make through these links.
        layer = target()
        os.symlink(cache + "/uv", os.path.join(layer, "rbcleanc"))
        os.symlink(cache + "/layers/shared", os.path.join(layer, "rbcleand"))
    cache = CONFIG["cache"]
    t("cache-plant", lambda: plant(cache + "/uv/planted"))
    t("cache-files", lambda: poison_tree(cache + "/uv"))
    t("store-plant", lambda: os.mkdir(cache + "/layers/shared/" + "0" * 64))
    t("store-files", lambda: poison_tree(cache + "/layers/shared"))
    t("server-files", lambda: poison_tree(cache + "/layers"))
    # r+, not a: at bwrap the cache's directory may exist in the sandbox's own /tmp (the
    # parent of its home's mount), where creating a file changes nothing of the host's.
    t("server-key", lambda: open(cache + "/shared.key", "r+").write(CONFIG["mark"]))
    t("sentinel", lambda: plant(CONFIG["sentinel"] + "/planted"))
    t("connect", connect)
    t("proc-root", proc_root)
    # Modules only: the layer's metadata stays readable, so the next installation into it
    # goes ahead.
    t("own-layer", lambda: poison_tree(target(), ".py"))
    t("plant-links", plant_links)
    # Its mode as it is: a change that would show, without breaking the cache.
    t("cache-chmod", lambda: os.chmod(cache + "/uv", os.stat(cache + "/uv").st_mode & 0o7777))
    return out

def get_requires_for_build_wheel(config_settings=None):
    return []

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    attempts = attack() if CONFIG.get("attack") else []
    dist = NAME + "-1.0.dist-info"
    files = {
        NAME + "/__init__.py": ("VALUE = %r\nATTEMPTS = %r\n" % (NAME + " built", attempts)).encode(),
        dist + "/METADATA": ("Metadata-Version: 2.1\nName: %s\nVersion: 1.0\n" % NAME).encode(),
        dist + "/WHEEL": b"Wheel-Version: 1.0\nGenerator: replbox-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(
        "%s,sha256=%s,%d\n" % (p, base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode(), len(d))
        for p, d in files.items()
    ) + dist + "/RECORD,,\n"
    files[dist + "/RECORD"] = record.encode()
    name = NAME + "-1.0-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        for p, d in files.items():
            z.writestr(p, d)
    return name
"#;

/// sdists `NAME-1.0.tar.gz` in `dir`, each with the in-tree [`BACKEND`] given `config`
/// (JSON); the index's entries for them.
fn build_sdists(dir: &Path, sdists: &[(&str, Value)]) -> Vec<IndexFile> {
    let script = r#"
import hashlib, io, json, os, sys, tarfile
out = sys.argv[1]
for s in json.load(sys.stdin):
    name = s["name"]
    root = name + "-1.0/"
    files = {
        root + "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n\n[project]\nname = "%s"\nversion = "1.0"\n' % name,
        root + "backend.py": s["backend"],
        root + "PKG-INFO": "Metadata-Version: 2.1\nName: %s\nVersion: 1.0\n" % name,
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for p, d in files.items():
            b = d.encode()
            i = tarfile.TarInfo(p)
            i.size = len(b)
            i.mode = 0o644
            t.addfile(i, io.BytesIO(b))
    data = buf.getvalue()
    file = name + "-1.0.tar.gz"
    open(os.path.join(out, file), "wb").write(data)
    print(name, file, hashlib.sha256(data).hexdigest())
"#;
    let input: Vec<Value> = sdists
        .iter()
        .map(|(name, config)| {
            let backend = BACKEND.replace("@NAME@", name).replace(
                "@CONFIG@",
                &serde_json::to_string(&config.to_string()).expect("json"),
            );
            json!({"name": name, "backend": backend})
        })
        .collect();
    let mut child = std::process::Command::new("python3")
        .args(["-c", script, &dir.display().to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(Value::Array(input).to_string().as_bytes())
            .expect("write");
    }
    let out = child.wait_with_output().expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l.split(' ');
            Some(IndexFile {
                name: w.next()?.to_string(),
                file: w.next()?.to_string(),
                sha256: w.next()?.to_string(),
            })
        })
        .collect()
}

/// A loopback index serving wheels `wheels` and plain sdists `sdists` (each built as
/// `"NAME built"`), plus `more` sdists with their own configs; its URL and record.
fn index(
    files: &Dir,
    wheels: &[&str],
    sdists: &[&str],
    more: &[(&str, Value)],
) -> (String, Served) {
    let mut entries: Vec<IndexFile> = build_wheels(&files.0, wheels, 64)
        .into_iter()
        .map(|(name, sha256)| IndexFile {
            file: format!("{name}-1.0-py3-none-any.whl"),
            name,
            sha256,
        })
        .collect();
    let mut all: Vec<(&str, Value)> = sdists.iter().map(|n| (*n, json!({}))).collect();
    all.extend(more.iter().cloned());
    entries.extend(build_sdists(&files.0, &all));
    serve_files(files.0.clone(), entries)
}

/// A path of the test's own for a package cache the server makes (as its own uid), removed
/// when dropped.
struct CachePath(PathBuf);

impl CachePath {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("replbox-pb-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        Self(p)
    }
    fn s(&self) -> &str {
        self.0.to_str().expect("utf-8 path")
    }
}

impl Drop for CachePath {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run(code: &str, packages: &[&str]) -> Value {
    json!({"languageId": "python", "code": code, "packages": packages})
}

/// A run's standard output.
fn stdout(o: &common::Out) -> &str {
    o.structured["stdout"].as_str().unwrap_or("")
}

/// Without `--package-builds`, an sdist-only package is refused with the wheels-only
/// reason (run-code, session_start, `%pip`), and the index never served its sdist: nothing
/// tried to build it. The flag is in `serve --help`, which says it needs bwrap, and a
/// server at level none refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn package_builds_are_off_unless_the_operator_allows_them() {
    if !require("python", "python3") || !require("uv", "uv") {
        return;
    }
    let o = std::process::Command::new(common::BIN)
        .args(["serve", "--help"])
        .output()
        .expect("replbox");
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(help.contains("--package-builds"), "{help}");
    // Its lines as one (help wraps them).
    let words = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(words.contains("Needs the sandbox level bwrap"), "{help}");
    let files = Dir::new("pb-off-index");
    let (url, served) = index(&files, &[], &["rbsrcoff"], &[]);
    let cache = CachePath::new("off");
    let s = Server::stdio()
        .args(["--package-cache", cache.s(), "--package-index", &url])
        .start()
        .await;
    let o = s
        .call(
            "run-code",
            run("import rbsrcoff; print('ran')", &["rbsrcoff"]),
        )
        .await;
    assert_eq!(o.error_kind(), "package_unavailable", "{}", o.text);
    assert!(o.text.contains("rbsrcoff"), "{}", o.text);
    assert!(o.text.contains("wheels only"), "{}", o.text);
    assert!(!o.text.contains("ran"), "{}", o.text);
    let o = s
        .call(
            "session_start",
            json!({"language": "python", "packages": ["rbsrcoff"]}),
        )
        .await;
    assert_eq!(o.error_kind(), "package_unavailable", "{}", o.text);
    assert!(o.text.contains("wheels only"), "{}", o.text);
    let id = s.start_session("python").await;
    s.eval(&id, "x = 5").await;
    let o = s.eval(&id, "%pip install rbsrcoff\nprint('ran')").await;
    assert_eq!(o.error_kind(), "package_unavailable", "{}", o.text);
    assert!(o.text.contains("wheels only"), "{}", o.text);
    assert_eq!(output(&s.eval(&id, "print(x)").await).trim(), "5");
    s.stop().await;
    let got = served.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert!(got.is_empty(), "the sdist was fetched: {got:?}");
    // Builds need a level that confines them.
    refused_at("none", None).await;
}

/// A server with `--package-builds` at `level` (below bwrap), as `uid` (None: the tests'
/// own), does not start, saying why and what to do; it made no package cache.
async fn refused_at(level: &str, uid: Option<u32>) {
    let at = format!("{level} (uid {uid:?})");
    let cache = CachePath::new(&format!("refused-{level}-{}", uid.unwrap_or(0)));
    let e = match Server::stdio()
        .uid(uid)
        .args([
            "--sandbox",
            level,
            "--package-builds",
            "--package-cache",
            cache.s(),
        ])
        .try_start()
        .await
    {
        Ok(s) => {
            s.stop().await;
            panic!("a server at {at} took --package-builds");
        }
        Err(e) => e,
    };
    if e.contains(&format!("--sandbox {level} does not work here")) {
        common::skip(format!("package builds refused at {at}: {e}"));
        return;
    }
    for says in [
        format!("--package-builds needs the sandbox level bwrap, and this server's is {level}"),
        "the installer's uid, which owns the shared package cache".into(),
        "Run with --sandbox bwrap".into(),
        "or drop --package-builds".into(),
    ] {
        assert!(e.contains(&says), "{at}: {says}: {e}");
    }
    let why = if level == "none" {
        "nothing confines that code"
    } else {
        "Landlock does not control chmod"
    };
    assert!(e.contains(why), "{at}: {e}");
    assert!(!cache.0.exists(), "{at}: the cache was made: {e}");
}

/// Unprivileged servers (when the tests run as root) get uids of their own, apart from
/// tests/packages.rs's.
static NEXT_UID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(62_300);

/// Every regular file under `root` that holds [`MARK`].
fn poisoned(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if m.is_dir() {
            stack.extend(
                std::fs::read_dir(&p)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path()),
            );
        } else if m.is_file()
            && std::fs::read(&p).is_ok_and(|b| b.windows(MARK.len()).any(|w| w == MARK.as_bytes()))
        {
            found.push(p);
        }
    }
    found
}

/// Whether any entry under `root` is named `name`.
fn holds(root: &Path, name: &str) -> bool {
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        for e in std::fs::read_dir(&p).into_iter().flatten().flatten() {
            if e.file_name() == name {
                return true;
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            }
        }
    }
    false
}

/// With `--package-builds` at bwrap, as root and not: an sdist is built (as the
/// installer's uid, never root) and imports in run-code, at a session's start and in the
/// line after `%pip`; the result says it was built; nothing of it goes to the store, and it
/// is built again when asked again. A hostile sdist's build code, run in a session that has
/// a package of the cache in its own layer, writes neither the shared cache, the store, the
/// server's files nor a directory every user may write, changes the mode of none of them,
/// and reaches no loopback port but the index; a second principal then gets the clean
/// package, from the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn package_builds_at_bwrap_as_root_and_not() {
    let level = "bwrap";
    if !require("python", "python3") || !require("uv", "uv") {
        return;
    }
    let we_are_root = nix::unistd::geteuid().is_root();
    let uv = if we_are_root {
        UvCopy::new(&format!("pb-{level}"))
    } else {
        None
    };
    let mut setups = vec![we_are_root];
    if we_are_root {
        setups.push(false);
    }
    for root in setups {
        let at = format!("{level} (root: {root})");
        let cache = CachePath::new(&format!("{level}-{root}"));
        let sentinel = Dir::new(&format!("pb-sentinel-{level}-{root}"));
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&sentinel.0, std::fs::Permissions::from_mode(0o777))
                .expect("chmod");
        }
        let canary = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        canary.set_nonblocking(true).expect("nonblocking");
        let config = json!({
            "attack": true,
            "mark": MARK,
            "cache": cache.s(),
            "sentinel": sentinel.s(),
            "port": canary.local_addr().expect("addr").port(),
        });
        let files = Dir::new(&format!("pb-index-{level}-{root}"));
        let (url, _) = index(
            &files,
            &["rbclean", "rbcleanb", "rbcleanc", "rbcleand"],
            &["rbsrc", "rbsrcb", "rbsrcc"],
            &[("rbevil", config)],
        );
        let mut args = vec![
            "--sandbox",
            level,
            "--package-builds",
            "--package-cache",
            cache.s(),
            "--package-index",
            &url,
        ];
        let uv_path;
        if !root && let Some(u) = &uv {
            uv_path = u.uv();
            args.extend(["--uv", uv_path.as_str()]);
        }
        let uid = (!root).then(|| NEXT_UID.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let s = match Server::http()
            .token(TOKEN_A)
            .token(TOKEN_B)
            .uid(uid)
            .args(&args)
            .try_start()
            .await
        {
            Ok(s) => s,
            Err(e) => {
                // bwrap not working here is a skip; refusing the flag at bwrap is not.
                assert!(!e.log.contains("--package-builds needs"), "{at}: {e}");
                common::skip(format!("package builds at {at}: {e}"));
                continue;
            }
        };
        let a = s.connect(TOKEN_A).await;
        let b = s.connect(TOKEN_B).await;
        // run-code: built, said so, imported; with a wheel beside it.
        let o = http_call(
            &a,
            "run-code",
            run(
                "import rbsrc, rbclean; print(rbsrc.VALUE, rbclean.VALUE)",
                &["rbsrc", "rbclean"],
            ),
        )
        .await;
        assert_eq!(stdout(&o).trim(), "rbsrc built rbclean", "{at}: {}", o.text);
        assert_eq!(o.structured["sandbox"], json!(level), "{at}: {}", o.text);
        assert_eq!(
            o.structured["packages"]["built"],
            json!([{"name": "rbsrc", "version": "1.0"}]),
            "{at}: {}",
            o.text
        );
        assert!(
            o.text.contains("built from source: rbsrc==1.0"),
            "{at}: {}",
            o.text
        );
        // Asked again: built again (no pins kept, no layer shared), not from the store.
        let o = http_call(
            &b,
            "run-code",
            run("import rbsrc; print(rbsrc.VALUE)", &["rbsrc"]),
        )
        .await;
        assert_eq!(stdout(&o).trim(), "rbsrc built", "{at}: {}", o.text);
        assert_eq!(
            o.structured["packages"]["built"],
            json!([{"name": "rbsrc", "version": "1.0"}]),
            "{at}: {}",
            o.text
        );
        // A session's start packages.
        let o = http_call(
            &a,
            "session_start",
            json!({"language": "python", "packages": ["rbsrcb"]}),
        )
        .await;
        assert!(!o.is_error, "{at}: {}", o.text);
        assert!(
            o.text.contains("built from source: rbsrcb==1.0"),
            "{at}: {}",
            o.text
        );
        let id = o.s("session_id").to_string();
        let eval = |id: &str, code: &str| json!({"session_id": id, "code": code});
        let o = http_call(
            &a,
            "session_eval",
            eval(&id, "import rbsrcb; print(rbsrcb.VALUE)"),
        )
        .await;
        assert_eq!(output(&o).trim(), "rbsrcb built", "{at}: {}", o.text);
        // %pip: a build, imported in the next line.
        let o = http_call(
            &a,
            "session_eval",
            eval(
                &id,
                "%pip install rbsrcc\nimport rbsrcc\nprint(rbsrcc.VALUE)",
            ),
        )
        .await;
        assert_eq!(output(&o).trim(), "rbsrcc built", "{at}: {}", o.text);
        assert!(
            o.text.contains("built from source: rbsrcc==1.0"),
            "{at}: {}",
            o.text
        );
        // The hostile build, in a session whose own layer `%pip` filled from the cache
        // first (a layer of links to the cache's files would give the build those files).
        let o = http_call(&a, "session_start", json!({"language": "python"})).await;
        let id = o.s("session_id").to_string();
        let o = http_call(&a, "session_eval", eval(&id, "%pip install rbcleanb")).await;
        assert!(!o.is_error, "{at}: {}", o.text);
        assert!(o.text.contains("rbcleanb==1.0"), "{at}: {}", o.text);
        let o = http_call(
            &a,
            "session_eval",
            eval(
                &id,
                "%pip install rbevil\nimport rbevil\nprint('\\n'.join(rbevil.ATTEMPTS))",
            ),
        )
        .await;
        assert!(!o.is_error, "{at}: {}", o.text);
        let said = output(&o).to_string();
        let uid_line = said
            .lines()
            .find_map(|l| l.strip_prefix("uid "))
            .unwrap_or_else(|| panic!("{at}: {said}"));
        assert_ne!(uid_line.trim(), "0", "{at}: the build ran as root");
        for what in [
            "cache-plant",
            "cache-files",
            "store-plant",
            "store-files",
            "server-files",
            "server-key",
            "sentinel",
            "connect",
            "proc-root",
            "cache-chmod",
        ] {
            assert!(
                said.contains(&format!("refused {what} ")),
                "{at}: {what}: {said}"
            );
        }
        // Its own layer it may write: links planted there, for the session's next
        // installation to follow into the shared cache and the store.
        assert!(said.contains("DID plant-links"), "{at}: {said}");
        let o = http_call(
            &a,
            "session_eval",
            eval(&id, "%pip install rbcleanc rbcleand"),
        )
        .await;
        for p in [
            "uv/rbcleanc",
            "uv/__init__.py",
            "uv/blob.bin",
            "layers/shared/__init__.py",
        ] {
            assert!(
                !cache.0.join(p).exists(),
                "{at}: {p} written through a planted link: {}",
                o.text
            );
        }
        // Nothing of the cache (uv's files, the store, every layer, the server's files)
        // holds the mark; the sentinel is empty; no connection reached the canary.
        let found = poisoned(&cache.0);
        assert!(found.is_empty(), "{at}: poisoned {found:?}: {said}");
        assert!(!cache.0.join("uv/planted").exists(), "{at}");
        assert_eq!(
            std::fs::read_dir(&sentinel.0).expect("sentinel").count(),
            0,
            "{at}: {said}"
        );
        assert!(
            matches!(canary.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "{at}: the build connected to the canary: {said}"
        );
        // Built packages are in no shared layer.
        let store = cache.0.join("layers/shared");
        for name in ["rbsrc", "rbsrcb", "rbsrcc", "rbevil"] {
            assert!(!holds(&store, name), "{at}: {name} in the store");
        }
        // The other principal gets the clean packages from the cache.
        let check = format!(
            "import rbclean, rbcleanb, rbcleanc\nprint(rbclean.VALUE, rbcleanb.VALUE, \
             rbcleanc.VALUE, any({MARK:?} in open(m.__file__).read() for m in (rbclean, \
             rbcleanb, rbcleanc)))"
        );
        let o = http_call(
            &b,
            "run-code",
            run(&check, &["rbclean", "rbcleanb", "rbcleanc"]),
        )
        .await;
        assert_eq!(
            stdout(&o).trim(),
            "rbclean rbcleanb rbcleanc False",
            "{at}: {}",
            o.text
        );
        let o = http_call(&b, "session_start", json!({"language": "python"})).await;
        let idb = o.s("session_id").to_string();
        let o = http_call(
            &b,
            "session_eval",
            eval(
                &idb,
                &format!("%pip install rbclean rbcleanb rbcleanc\n{check}"),
            ),
        )
        .await;
        assert_eq!(
            output(&o).trim(),
            "rbclean rbcleanb rbcleanc False",
            "{at}: {}",
            o.text
        );
        assert!(o.text.contains("all from the cache"), "{at}: {}", o.text);
        drop((a, b));
        s.stop().await;
    }
}

/// At landlock, as root and not, a server with `--package-builds` does not start: build
/// code runs as the installer's uid, which owns the shared cache and every layer, and
/// chmod is no Landlock right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn package_builds_are_refused_at_landlock_as_root_and_not() {
    refused_at("landlock", None).await;
    if nix::unistd::geteuid().is_root() {
        let uid = NEXT_UID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        refused_at("landlock", Some(uid)).await;
    }
}
