//! The shared package cache kept under `--package-cache-mb` (least recently used first,
//! never what a live session holds), its metrics on `/metrics`, and warm sessions taking
//! requests with `packages`. The package index is a loopback one of the test's own (wheels
//! it builds), so no test here needs the internet.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::{Server, http_call, output, require};
use serde_json::json;

const TOKEN: &str = "package-cache-token-0123456789";

/// A directory of the test's own, removed when dropped.
pub(crate) struct Dir(pub(crate) PathBuf);

impl Dir {
    pub(crate) fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("replbox-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("test dir");
        Self(p)
    }
    pub(crate) fn s(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Pure-Python wheels `NAME-1.0-py3-none-any.whl`, each a module whose `VALUE` is its name
/// and a `blob.bin` of `blob` random bytes (stored, so that it weighs as much unpacked),
/// built by python's zipfile into `dir`; the sha256 of each.
pub(crate) fn build_wheels(
    dir: &std::path::Path,
    names: &[&str],
    blob: usize,
) -> Vec<(String, String)> {
    let script = r#"
import base64, hashlib, os, sys, zipfile
out, blob = sys.argv[1], int(sys.argv[2])
for name in sys.argv[3:]:
    dist = f"{name}-1.0.dist-info"
    files = {
        f"{name}/__init__.py": f"VALUE = {name!r}\n".encode(),
        f"{name}/blob.bin": os.urandom(blob),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: replbox-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(
        f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}\n"
        for p, d in files.items()
    ) + f"{dist}/RECORD,,\n"
    files[f"{dist}/RECORD"] = record.encode()
    path = os.path.join(out, f"{name}-1.0-py3-none-any.whl")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for p, d in files.items():
            z.writestr(p, d)
    print(name, hashlib.sha256(open(path, "rb").read()).hexdigest())
"#;
    let mut args = vec![
        "-c".to_string(),
        script.to_string(),
        dir.display().to_string(),
        blob.to_string(),
    ];
    args.extend(names.iter().map(|n| n.to_string()));
    let out = std::process::Command::new("python3")
        .args(&args)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(n, h)| (n.to_string(), h.to_string()))
        .collect()
}

/// A loopback simple index (PEP 503 pages) serving the wheels in `dir`, on its own
/// thread's runtime (it lives as long as the test process; the port is the test's).
/// Its base URL (`http://127.0.0.1:PORT/simple`).
fn serve_index(dir: PathBuf, wheels: Vec<(String, String)>) -> String {
    let files = wheels
        .into_iter()
        .map(|(name, sha256)| IndexFile {
            file: format!("{name}-1.0-py3-none-any.whl"),
            name,
            sha256,
        })
        .collect();
    serve_files(dir, files).0
}

/// A file of `dir` a loopback index serves: its project's name, its file name (a wheel's
/// or an sdist's) and its sha256.
pub(crate) struct IndexFile {
    pub(crate) name: String,
    pub(crate) file: String,
    pub(crate) sha256: String,
}

/// What a loopback index served: the file names asked for, in order.
pub(crate) type Served = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// [`serve_index`] for any files (a project's page lists every file of its name), and
/// the record of the files it served.
pub(crate) fn serve_files(dir: PathBuf, files: Vec<IndexFile>) -> (String, Served) {
    use axum::extract::Path as P;
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();
    let pages = std::sync::Arc::new(files);
    let served = Served::default();
    let page = {
        let pages = pages.clone();
        move |P(name): P<String>| {
            let pages = pages.clone();
            async move {
                let links: String = pages
                    .iter()
                    .filter(|f| f.name == name)
                    .map(|f| {
                        format!(
                            "<a href=\"/files/{0}#sha256={1}\">{0}</a>",
                            f.file, f.sha256
                        )
                    })
                    .collect();
                if links.is_empty() {
                    return StatusCode::NOT_FOUND.into_response();
                }
                (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "text/html")],
                    format!("<!DOCTYPE html><html><body>{links}</body></html>"),
                )
                    .into_response()
            }
        }
    };
    let log = served.clone();
    let file = move |P(f): P<String>| {
        let dir = dir.clone();
        let log = log.clone();
        async move {
            if f.contains('/') || f.starts_with('.') {
                return StatusCode::NOT_FOUND.into_response();
            }
            log.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(f.clone());
            match std::fs::read(dir.join(&f)) {
                Ok(b) => (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/octet-stream")],
                    b,
                )
                    .into_response(),
                Err(_) => StatusCode::NOT_FOUND.into_response(),
            }
        }
    };
    let app = axum::Router::new()
        .route("/simple/{name}/", axum::routing::get(page))
        .route("/files/{file}", axum::routing::get(file));
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(listener).expect("listener");
            let _ = axum::serve(l, app).await;
        });
    });
    (format!("http://127.0.0.1:{port}/simple"), served)
}

/// The metrics once the server has counted `n` evictions. Eviction runs after an
/// installation, in the background: this waits for the server to say so (the bound is only
/// a backstop).
async fn after_evictions(addr: std::net::SocketAddr, n: u64) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let m = scrape(addr).await;
        if metric(&m, "replbox_package_cache_evictions_total") >= n {
            return m;
        }
        assert!(std::time::Instant::now() < deadline, "no eviction: {m}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `/metrics`, scraped over HTTP with the token.
async fn scrape(addr: std::net::SocketAddr) -> String {
    reqwest::Client::new()
        .get(format!("http://{addr}/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}

/// A metric's value in `text` (0 when absent).
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or(0)
}

/// The wheels, the index and a cache: None (skipped) without python or uv.
fn setup(tag: &str, names: &[&str], blob: usize) -> Option<(Dir, Dir, String)> {
    if !require("python", "python3") || !require("uv", "uv") {
        return None;
    }
    let files = Dir::new(&format!("index-{tag}"));
    let wheels = build_wheels(&files.0, names, blob);
    let index = serve_index(files.0.clone(), wheels);
    Some((files, Dir::new(&format!("pkgcache-{tag}")), index))
}

/// Two packages of 900 KiB each under a 2 MiB cap (each weighs twice that: uv's copy in
/// the cache and its shared layer's): the second one's installation evicts the first and
/// its layer (used least recently, held by nothing), never what a live session holds, nor
/// does a second server on the same cache (which also removes a dead server's build, and
/// only that);
/// `/metrics` counts the hits and misses and says the cache's size, which stays under the
/// cap; the evicted package is downloaded again when asked for again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_stays_under_its_cap_and_metrics_say_so() {
    let Some((_files, cache, index)) = setup("cap", &["rbcapa", "rbcapb"], 900 << 10) else {
        return;
    };
    let s = Server::http()
        .token(TOKEN)
        .args([
            "--package-cache",
            &cache.s(),
            "--package-cache-mb",
            "2",
            "--package-index",
            &index,
        ])
        .start()
        .await;
    let c = s.connect(TOKEN).await;
    let run = |pkg: &str| {
        json!({"languageId": "python", "packages": [pkg],
               "code": format!("import {pkg}; print({pkg}.VALUE)")})
    };
    let o = http_call(c.peer(), "run-code", run("rbcapa")).await;
    assert_eq!(o.text.lines().next(), Some("rbcapa"), "{}", o.text);
    assert_eq!(
        o.structured["packages"]["downloaded"],
        json!(1),
        "{}",
        o.text
    );
    let o = http_call(c.peer(), "run-code", run("rbcapa")).await;
    assert_eq!(o.text.lines().next(), Some("rbcapa"), "{}", o.text);
    assert_eq!(
        o.structured["packages"]["downloaded"],
        json!(0),
        "{}",
        o.text
    );
    // The session holds rbcapb (and its layer) while it lives: its installation takes the
    // cache past the cap, and rbcapa and its layer (no run holds them now) are what go.
    let o = http_call(
        c.peer(),
        "session_start",
        json!({"language": "python", "packages": ["rbcapb"]}),
    )
    .await;
    assert!(!o.is_error, "{}", o.text);
    let id = o.structured["session_id"].as_str().expect("id").to_string();
    let m = after_evictions(s.addr, 2).await;
    assert_eq!(
        metric(&m, "replbox_package_cache_evictions_total"),
        2,
        "{m}"
    );
    assert_eq!(metric(&m, "replbox_package_cache_hits_total"), 1, "{m}");
    assert_eq!(metric(&m, "replbox_package_cache_misses_total"), 2, "{m}");
    let bytes = metric(&m, "replbox_package_cache_bytes");
    assert!(bytes > 1800 << 10 && bytes <= 2 << 20, "{bytes}: {m}");
    assert!(
        m.contains("replbox_package_installs_total{source=\"index\"} 2"),
        "{m}"
    );
    // A second server on the same cache, with a smaller cap, and two builds left in it:
    // one of a server that died mid-build (its lock held by nobody), one under way (its
    // lock held, here by the test). At its start it removes the dead one at once, keeps
    // the live one, and evicts nothing the first server's session holds.
    let building = cache.0.join("layers/building");
    let dead = building.join("0123456789abcdef0123456789abcdef");
    let live = building.join("fedcba9876543210fedcba9876543210");
    let mut live_lock = None;
    for b in [&dead, &live] {
        std::fs::create_dir_all(b.join("pkg")).expect("build dir");
        std::fs::write(b.join("pkg/m.py"), "x").expect("build file");
        let lock = std::fs::File::create(b.with_extension("lock")).expect("lock file");
        if b == &live {
            rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).expect("flock");
            live_lock = Some(lock);
        }
    }
    let b = Server::stdio()
        .env("REPLBOX_LOG", "info")
        .args([
            "--package-cache",
            &cache.s(),
            "--package-cache-mb",
            "1",
            "--package-index",
            &index,
        ])
        .start()
        .await;
    // Its first pass ends with an eviction or with saying what it could not evict.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while ![
        "the cache is over --package-cache-mb",
        "evicted from the cache",
    ]
    .iter()
    .any(|l| b.log().contains(l))
    {
        assert!(std::time::Instant::now() < deadline, "no pass: {}", b.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!b.log().contains("evicted from the cache"), "{}", b.log());
    assert!(!dead.exists() && !dead.with_extension("lock").exists());
    assert!(live.join("pkg/m.py").exists() && live.with_extension("lock").exists());
    let layers = std::fs::read_dir(cache.0.join("layers/shared"))
        .expect("store")
        .count();
    assert_eq!(layers, 1, "the session's layer is in the store");
    b.stop().await;
    drop(live_lock);
    // What the session holds is intact and imports.
    let o = http_call(
        c.peer(),
        "session_eval",
        json!({"session_id": id, "code": "import rbcapb; print(rbcapb.VALUE, len(open(rbcapb.__path__[0] + '/blob.bin', 'rb').read()))"}),
    )
    .await;
    assert_eq!(
        output(&o).trim(),
        format!("rbcapb {}", 900 << 10),
        "{}",
        o.text
    );
    // rbcapa was evicted: asked for again, it is downloaded again.
    let o = http_call(c.peer(), "run-code", run("rbcapa")).await;
    assert_eq!(o.text.lines().next(), Some("rbcapa"), "{}", o.text);
    assert_eq!(
        o.structured["packages"]["downloaded"],
        json!(1),
        "{}",
        o.text
    );
    s.stop().await;
}

/// With warm sessions, a `session_start` with packages the cache already has starts from a
/// warm session and adds them to its layer (the result says `warm`; the package imports).
/// One whose top-level module a warm session has already imported (here the `--preload`
/// module `colorsys`, shadowed by a package of the same name) starts cold, and gets the
/// layer's module.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_session_takes_cached_packages() {
    let Some((files, cache, index)) = setup("warm", &["rbwarm", "colorsys"], 1024) else {
        return;
    };
    let s = Server::http()
        .token(TOKEN)
        .env("REPLBOX_SESSION_POOL", "1")
        .args([
            "--package-cache",
            &cache.s(),
            "--package-index",
            &index,
            "--preload",
            "colorsys",
        ])
        .start()
        .await;
    let _files = files;
    let c = s.connect(TOKEN).await;
    // Each comes into the cache (and the request's resolution is kept).
    for pkg in ["rbwarm", "colorsys"] {
        let o = http_call(
            c.peer(),
            "run-code",
            json!({"languageId": "python", "packages": [pkg],
                   "code": format!("import {pkg}; print({pkg}.VALUE)")}),
        )
        .await;
        assert_eq!(o.text.lines().next(), Some(pkg), "{}", o.text);
    }
    // Wait for the server to say a warm python session is ready (a backstop bound).
    let ready = || async {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let m = scrape(s.addr).await;
            if m.contains("replbox_warm_sessions{language=\"python\"} 1") {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "no warm session: {m}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    ready().await;
    let o = http_call(
        c.peer(),
        "session_start",
        json!({"language": "python", "packages": ["rbwarm"]}),
    )
    .await;
    assert!(!o.is_error, "{}", o.text);
    assert_eq!(o.structured["warm"], json!(true), "{}", o.text);
    assert_eq!(
        o.structured["packages"]["installed"],
        json!([{"name": "rbwarm", "version": "1.0"}]),
        "{}",
        o.text
    );
    assert_eq!(
        o.structured["packages"]["downloaded"],
        json!(0),
        "{}",
        o.text
    );
    let id = o.structured["session_id"].as_str().expect("id").to_string();
    let o = http_call(
        c.peer(),
        "session_eval",
        json!({"session_id": id, "code": "import rbwarm; print(rbwarm.VALUE)"}),
    )
    .await;
    assert_eq!(output(&o).trim(), "rbwarm", "{}", o.text);
    // Restarted (it ignores the interrupt of its timeout), it still has them: a restart
    // starts it as a cold start with them would.
    let o = http_call(
        c.peer(),
        "session_eval",
        json!({"session_id": id, "timeout_ms": 1000, "code":
               "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass"}),
    )
    .await;
    assert_eq!(o.structured["restarted"], json!(true), "{}", o.text);
    let o = http_call(
        c.peer(),
        "session_eval",
        json!({"session_id": id, "code": "import rbwarm; print(rbwarm.VALUE)"}),
    )
    .await;
    assert_eq!(output(&o).trim(), "rbwarm", "after a restart: {}", o.text);
    // The warm session imported the stdlib's colorsys: it cannot stand for the package.
    ready().await;
    let o = http_call(
        c.peer(),
        "session_start",
        json!({"language": "python", "packages": ["colorsys"]}),
    )
    .await;
    assert!(!o.is_error, "{}", o.text);
    assert_eq!(o.structured["warm"], json!(false), "{}", o.text);
    let id = o.structured["session_id"].as_str().expect("id").to_string();
    let o = http_call(
        c.peer(),
        "session_eval",
        json!({"session_id": id, "code": "import colorsys; print(colorsys.VALUE)"}),
    )
    .await;
    assert_eq!(output(&o).trim(), "colorsys", "{}", o.text);
    s.stop().await;
}

/// npm packages `NAME@1.0.0` (an `index.js` exporting its name, and `blob.bin` of `blob`
/// random bytes, which gzip cannot shrink) packed by python into `dir`; each one's
/// registry document (its tarball at `base`).
fn build_npm(
    dir: &std::path::Path,
    names: &[&str],
    blob: usize,
    base: &str,
) -> Vec<(String, String)> {
    let script = r#"
import base64, hashlib, io, json, os, sys, tarfile
out, blob, base = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for name in sys.argv[4:]:
    files = {
        "package/package.json": json.dumps({"name": name, "version": "1.0.0", "main": "index.js"}).encode(),
        "package/index.js": f"module.exports = {name!r};\n".encode(),
        "package/blob.bin": os.urandom(blob),
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for p, d in files.items():
            i = tarfile.TarInfo(p)
            i.size = len(d)
            i.mode = 0o644
            t.addfile(i, io.BytesIO(d))
    data = buf.getvalue()
    file = f"{name}-1.0.0.tgz"
    open(os.path.join(out, file), "wb").write(data)
    doc = {"name": name, "dist-tags": {"latest": "1.0.0"}, "versions": {"1.0.0": {
        "name": name, "version": "1.0.0", "main": "index.js",
        "dist": {"tarball": f"{base}/{name}/-/{file}",
                 "shasum": hashlib.sha1(data).hexdigest(),
                 "integrity": "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()}}}}
    print(name, json.dumps(doc))
"#;
    let mut args = vec![
        "-c".to_string(),
        script.to_string(),
        dir.display().to_string(),
        blob.to_string(),
        base.to_string(),
    ];
    args.extend(names.iter().map(|n| n.to_string()));
    let out = std::process::Command::new("python3")
        .args(&args)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(n, d)| (n.to_string(), d.to_string()))
        .collect()
}

/// A loopback npm registry serving the packages `build_npm` makes in `dir` (documents at
/// `/NAME`, tarballs at `/NAME/-/FILE`), on its own thread's runtime; its base URL.
fn serve_npm(dir: PathBuf, names: &[&str], blob: usize) -> String {
    let files = dir.clone();
    serve_npm_docs(dir, |base| build_npm(&files, names, blob, base))
}

/// A loopback npm registry serving the documents `build` makes (given the registry's base
/// URL; their tarballs in `dir`, at `/NAME/-/FILE`); its base URL.
pub(crate) fn serve_npm_docs(
    dir: PathBuf,
    build: impl FnOnce(&str) -> Vec<(String, String)>,
) -> String {
    use axum::extract::Path as P;
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let base = format!(
        "http://127.0.0.1:{}",
        listener.local_addr().expect("addr").port()
    );
    let docs = std::sync::Arc::new(build(&base));
    let doc = move |P(name): P<String>| {
        let docs = docs.clone();
        async move {
            match docs.iter().find(|(n, _)| *n == name) {
                Some((_, d)) => (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/json")],
                    d.clone(),
                )
                    .into_response(),
                None => StatusCode::NOT_FOUND.into_response(),
            }
        }
    };
    let file = move |P((_, f)): P<(String, String)>| {
        let dir = dir.clone();
        async move {
            if f.contains('/') || f.starts_with('.') {
                return StatusCode::NOT_FOUND.into_response();
            }
            match std::fs::read(dir.join(&f)) {
                Ok(b) => (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/octet-stream")],
                    b,
                )
                    .into_response(),
                Err(_) => StatusCode::NOT_FOUND.into_response(),
            }
        }
    };
    let app = axum::Router::new()
        .route("/{name}", axum::routing::get(doc))
        .route("/{name}/-/{file}", axum::routing::get(file));
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(listener).expect("listener");
            let _ = axum::serve(l, app).await;
        });
    });
    base
}

/// npm's half of the cap: two packages of 800 KiB each under a 2 MiB cap, from a loopback
/// registry (each weighs twice that: npm's cache keeps the tarball, as large, and its
/// shared layer the files). The second one's installation (a live session holds it and
/// its layer) evicts the first and its layer, npm's cache keys for it cleaned by npm
/// itself; `/metrics` says so, the cache stays under the cap, and the first is downloaded
/// again when asked for again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn npm_cache_stays_under_its_cap() {
    if !require("javascript", "node") || !require("npm", "npm") {
        return;
    }
    let files = Dir::new("npm-registry-cap");
    let registry = serve_npm(files.0.clone(), &["rbnpma", "rbnpmb"], 800 << 10);
    let cache = Dir::new("npmcache-cap");
    let s = Server::http()
        .token(TOKEN)
        .args([
            "--package-cache",
            &cache.s(),
            "--package-cache-mb",
            "2",
            "--npm-registry",
            &registry,
        ])
        .start()
        .await;
    let c = s.connect(TOKEN).await;
    let run = |pkg: &str| {
        json!({"languageId": "javascript", "packages": [pkg],
               "code": format!("console.log(require('{pkg}'))")})
    };
    let o = http_call(c.peer(), "run-code", run("rbnpma")).await;
    assert_eq!(o.text.lines().next(), Some("rbnpma"), "{}", o.text);
    assert_eq!(
        o.structured["packages"]["downloaded"],
        json!(1),
        "{}",
        o.text
    );
    let o = http_call(
        c.peer(),
        "session_start",
        json!({"language": "javascript", "packages": ["rbnpmb"]}),
    )
    .await;
    assert!(!o.is_error, "{}", o.text);
    let id = o.structured["session_id"].as_str().expect("id").to_string();
    let m = after_evictions(s.addr, 2).await;
    assert_eq!(
        metric(&m, "replbox_package_cache_evictions_total"),
        2,
        "{m}"
    );
    assert_eq!(metric(&m, "replbox_package_cache_misses_total"), 2, "{m}");
    let bytes = metric(&m, "replbox_package_cache_bytes");
    assert!(bytes > 1600 << 10 && bytes <= 2 << 20, "{bytes}: {m}");
    // What is left in the store is the session's layer.
    let layers = std::fs::read_dir(cache.0.join("layers/shared"))
        .expect("store")
        .count();
    assert_eq!(layers, 1, "the session's layer is in the store");
    // What the session holds still loads.
    let o = http_call(
        c.peer(),
        "session_eval",
        json!({"session_id": id, "code": "console.log(require('rbnpmb'))"}),
    )
    .await;
    assert_eq!(output(&o).trim(), "rbnpmb", "{}", o.text);
    // rbnpma was evicted: asked for again (within the hour, so npm is tried offline
    // first), npm's cache no longer has it and it comes from the registry again.
    let o = http_call(c.peer(), "run-code", run("rbnpma")).await;
    assert_eq!(o.text.lines().next(), Some("rbnpma"), "{}", o.text);
    assert_eq!(
        o.structured["packages"]["downloaded"],
        json!(1),
        "{}",
        o.text
    );
    let m = scrape(s.addr).await;
    assert!(
        m.contains("replbox_package_installs_total{source=\"index\"} 3"),
        "{m}"
    );
    assert!(
        !m.contains("replbox_package_installs_total{source=\"cache\"}"),
        "{m}"
    );
    drop(files);
    s.stop().await;
}

/// With warm sessions, a JavaScript `session_start` with packages the cache already has
/// takes a warm session and gives it the set's shared layer (the running node told where
/// it is): the result says `warm`, npm is not run, and the package loads from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_javascript_session_takes_cached_packages() {
    if !require("javascript", "node") || !require("npm", "npm") {
        return;
    }
    let files = Dir::new("npm-registry-warm");
    let registry = serve_npm(files.0.clone(), &["rbwarmjs"], 1024);
    let cache = Dir::new("npmcache-warm");
    let s = Server::http()
        .token(TOKEN)
        .env("REPLBOX_SESSION_POOL", "1")
        .args(["--package-cache", &cache.s(), "--npm-registry", &registry])
        .start()
        .await;
    let c = s.connect(TOKEN).await;
    let o = http_call(
        c.peer(),
        "run-code",
        json!({"languageId": "javascript", "packages": ["rbwarmjs"],
               "code": "console.log(require('rbwarmjs'))"}),
    )
    .await;
    assert_eq!(o.text.lines().next(), Some("rbwarmjs"), "{}", o.text);
    // A plain session asks for javascript's pool; then a warm one waits.
    let o = http_call(c.peer(), "session_start", json!({"language": "javascript"})).await;
    assert!(!o.is_error, "{}", o.text);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let m = scrape(s.addr).await;
        if m.contains("replbox_warm_sessions{language=\"javascript\"} 1") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no warm session: {m}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let o = http_call(
        c.peer(),
        "session_start",
        json!({"language": "javascript", "packages": ["rbwarmjs"]}),
    )
    .await;
    assert!(!o.is_error, "{}", o.text);
    assert_eq!(o.structured["warm"], json!(true), "{}", o.text);
    assert_eq!(
        o.structured["packages"]["installed"],
        json!([{"name": "rbwarmjs", "version": "1.0.0"}]),
        "{}",
        o.text
    );
    assert_eq!(
        o.structured["packages"]["downloaded"],
        json!(0),
        "{}",
        o.text
    );
    let id = o.structured["session_id"].as_str().expect("id").to_string();
    let o = http_call(
        c.peer(),
        "session_eval",
        json!({"session_id": id, "code": "console.log(require('rbwarmjs'), require.resolve('rbwarmjs'))"}),
    )
    .await;
    let store = cache.0.join("layers/shared").display().to_string();
    assert!(
        output(&o).starts_with(&format!("rbwarmjs {store}/")),
        "{}",
        o.text
    );
    // Restarted (it ignores the interrupt of its timeout), it still has them.
    let o = http_call(
        c.peer(),
        "session_eval",
        json!({"session_id": id, "timeout_ms": 1000, "code":
               "process.on('SIGINT', () => {}); while (true) {}"}),
    )
    .await;
    assert_eq!(o.structured["restarted"], json!(true), "{}", o.text);
    let o = http_call(
        c.peer(),
        "session_eval",
        json!({"session_id": id, "code": "console.log(require('rbwarmjs'))"}),
    )
    .await;
    assert_eq!(output(&o).trim(), "rbwarmjs", "after a restart: {}", o.text);
    drop(files);
    s.stop().await;
}
