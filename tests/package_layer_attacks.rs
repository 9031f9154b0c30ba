//! Attacks on the package layers one principal's session could aim at another's: a
//! layer shared between principals must be one that no session can make unreadable, or
//! the other principal's imports fail, or fall through to another copy of the package
//! (the interpreter's own site-packages) without a word.

use crate::common;

use serde_json::json;

/// A package cache and a uv every uid can run, both this test's own, removed when dropped.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(name: &str) -> Option<Self> {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("replbox-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("bin")).ok()?;
        for d in [&dir, &dir.join("bin")] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).ok()?;
        }
        let out = std::process::Command::new("python3")
            .args(["-c", "import uv; print(uv.find_uv_bin())"])
            .output()
            .ok()?;
        let uv = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        std::fs::copy(&uv, dir.join("bin/uv")).ok()?;
        Some(Self(dir))
    }
    fn path(&self, p: &str) -> String {
        self.0.join(p).display().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        let _ = std::fs::remove_dir_all(format!("{}-cache", self.0.display()));
    }
}

/// A's import: `ours PATH` when its `six` comes from its packages (on its PYTHONPATH).
const A_IMPORTS: &str = r#"
import os, six
d = os.path.dirname(six.__file__)
print("ours" if d in os.environ.get("PYTHONPATH", "").split(":") else "other", d)
"#;

/// Not root at Landlock every session runs as the server's uid, and chmod is no Landlock
/// right: a session can change the mode of any file of the server's whose path it has. Its
/// own layer's path it has (on its PYTHONPATH): that layer, and the files in it, must be
/// no other principal's (neither a shared layer nor hard links to the cache's files). B's
/// code makes its `six.py` and the directory it came from unreadable; A's session, started
/// with the same packages, still imports its `six` from its own packages; and B's layer,
/// shut as it is, is removed when B's session closes.
#[tokio::test]
async fn a_session_cannot_unseal_another_principals_packages_at_landlock_not_root() {
    if !common::require("python", "python3") || !common::require("uv", "uv") {
        return;
    }
    let Some(scratch) = Scratch::new("layer-attacks") else {
        common::skip("uv's program not found (python3 -c 'import uv')");
        return;
    };
    // Made by the server (as its uid), beside the scratch directory.
    let cache = format!("{}-cache", scratch.0.display());
    let _ = std::fs::remove_dir_all(&cache);
    let uv = scratch.path("bin/uv");
    let uid = nix::unistd::geteuid().is_root().then_some(61_950);
    let started = common::Server::http()
        .token("layer-attack-principal-a-0123456789")
        .token("layer-attack-principal-b-0123456789")
        .args([
            "--sandbox",
            "landlock",
            "--package-cache",
            &cache,
            "--uv",
            &uv,
            // A closed session's files go at once (not kept readable for a while).
            "--keep-files-s",
            "0",
        ])
        .uid(uid)
        .try_start()
        .await;
    let s = match started {
        Ok(s) => s,
        Err(e) => {
            common::skip(format!("packages at landlock, not root: {e}"));
            return;
        }
    };
    let a = s.connect("layer-attack-principal-a-0123456789").await;
    let b = s.connect("layer-attack-principal-b-0123456789").await;
    let start = json!({"language": "python", "packages": ["six"]});
    let o = common::http_call(&a, "session_start", start.clone()).await;
    assert!(!o.is_error, "{}", o.text);
    let sa = o.s("session_id").to_string();
    let o = common::http_call(&b, "session_start", start).await;
    assert!(!o.is_error, "{}", o.text);
    let sb = o.s("session_id").to_string();
    // B's code: the directory of its six, made unreadable (and then its store's).
    let attack = r#"
import os, six
d = os.path.dirname(six.__file__)
for p in [os.path.join(d, "six.py"), d]:
    try:
        os.chmod(p, 0)
        print("chmod", p)
    except OSError as e:
        print("refused", p, type(e).__name__)
"#;
    let o_b = common::http_call(
        &b,
        "session_eval",
        json!({"session_id": sb, "code": attack}),
    )
    .await;
    assert!(!o_b.is_error, "{}", o_b.text);
    let o = common::http_call(
        &a,
        "session_eval",
        json!({"session_id": sa, "code": A_IMPORTS}),
    )
    .await;
    let said = o.structured["output"].as_str().unwrap_or("").trim();
    assert!(
        said.starts_with("ours "),
        "A's six is not its packages': {}",
        o.text
    );
    // B's own layer, shut (mode 0) by B's code, still goes with B's session.
    let shut = o_b.structured["output"]
        .as_str()
        .unwrap_or("")
        .lines()
        .filter_map(|l| l.strip_prefix("chmod "))
        .next_back()
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| panic!("B's code could not shut its layer: {}", o_b.text));
    {
        let layer = shut;
        let o = common::http_call(&b, "session_close", json!({"session_id": sb})).await;
        assert!(!o.is_error, "{}", o.text);
        // The removal runs after the close answers: a bound that is only a backstop.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::fs::symlink_metadata(&layer).is_ok() {
            assert!(
                std::time::Instant::now() < deadline,
                "{} was left behind",
                layer.display()
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    drop((a, b));
    s.stop().await;
}

/// The hostile registry's packages, packed by python into `dir` (their tarballs at `base`);
/// each one's registry document. `rbvictim@1.0.0` is plain (`index.js` says `victim`).
/// `rbhostile@1.0.0`'s tarball holds what npm could be led to write outside the package or
/// link to what is not its own: symbolic and hard links (to the store's secret, up the
/// tree, to `/etc/passwd`), entries with `..` and absolute paths, `bin` names and targets
/// with `..` or absolute, `directories.bin` and `man` up the tree, a bundled `rbvictim` of
/// its own (`poisoned`) with a link to `/` and a `.bin` link up the tree, a set-uid file;
/// and an alias of its own (`rbvictim2`, `npm:rbvictim@1.0.0`). `rbimpostor@1.0.0`'s
/// tarball says it is `rbvictim` (and its `index.js`, `impostor`). `rbdep@1.0.0` requires
/// `rbalias`, its alias of `rbvictim@^1.0.0`; `rbalias@1.0.0` is a package of that name
/// (`EVIL`), which npm takes for the alias when it is asked for too.
fn hostile_npm(dir: &std::path::Path, base: &str) -> Vec<(String, String)> {
    let script = r##"
import base64, hashlib, io, json, os, sys, tarfile
out, base = sys.argv[1], sys.argv[2]
def add(t, name, data=None, typ=tarfile.REGTYPE, link=None, mode=0o644):
    i = tarfile.TarInfo(name)
    i.type, i.mode = typ, mode
    if link is not None:
        i.linkname = link
    if data is None:
        t.addfile(i)
    else:
        i.size = len(data)
        t.addfile(i, io.BytesIO(data))
def pack(name, manifest, entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        add(t, "package/package.json", json.dumps(manifest).encode())
        for e in entries:
            add(t, *e[:2], **e[2] if len(e) > 2 else {})
    data = buf.getvalue()
    file = f"{name}-1.0.0.tgz"
    open(os.path.join(out, file), "wb").write(data)
    v = dict(manifest)
    v.update({"name": name, "dist": {"tarball": f"{base}/{name}/-/{file}",
              "shasum": hashlib.sha1(data).hexdigest(),
              "integrity": "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()}})
    doc = {"name": name, "dist-tags": {"latest": "1.0.0"}, "versions": {"1.0.0": v}}
    print(name, json.dumps(doc))
S, H = tarfile.SYMTYPE, tarfile.LNKTYPE
pack("rbvictim", {"name": "rbvictim", "version": "1.0.0", "main": "index.js"},
     [("package/index.js", b"module.exports = 'victim';\n")])
pack("rbhostile", {
    "name": "rbhostile", "version": "1.0.0", "main": "index.js",
    "bin": {"../../../../rbesc-bin": "../../../../../rbesc-target.js", "rbh": "index.js",
            "rbh2": "/etc/passwd", "rbh3": "../../../../shared.key"},
    "directories": {"bin": "../../..", "man": "../../.."},
    "man": ["../../../../../etc/passwd"],
    "dependencies": {"rbvictim": "1.0.0", "rbvictim2": "npm:rbvictim@1.0.0"},
    "bundleDependencies": ["rbvictim"]}, [
    ("package/index.js", b"module.exports = 'hostile';\n"),
    ("package/lnk", None, {"typ": S, "link": "../../../../shared.key"}),
    ("package/abs", None, {"typ": S, "link": "/etc/passwd"}),
    ("package/hl", None, {"typ": H, "link": "package/index.js"}),
    ("package/hl2", None, {"typ": H, "link": "../../../../shared.key"}),
    ("package/hl3", None, {"typ": H, "link": "/etc/passwd"}),
    ("package/../../../../rbescape.js", b"escaped\n"),
    ("package/../../../../../rbescape.js", b"escaped\n"),
    ("/tmp/rbescape-abs.js", b"escaped\n"),
    ("package/node_modules/rbvictim/package.json",
     json.dumps({"name": "rbvictim", "version": "1.0.0", "main": "index.js"}).encode()),
    ("package/node_modules/rbvictim/index.js", b"module.exports = 'poisoned';\n"),
    ("package/node_modules/rbvictim/root", None, {"typ": S, "link": "/"}),
    ("package/node_modules/.bin/rbvictim", None, {"typ": S, "link": "../../../../../rbesc"}),
    ("package/setuid", b"#!/bin/sh\n", {"mode": 0o6777}),
])
pack("rbimpostor", {"name": "rbvictim", "version": "1.0.0", "main": "index.js"},
     [("package/index.js", b"module.exports = 'impostor';\n")])
pack("rbdep", {"name": "rbdep", "version": "1.0.0", "main": "index.js",
               "dependencies": {"rbalias": "npm:rbvictim@^1.0.0"}},
     [("package/index.js", b"module.exports = require('rbalias');\n")])
pack("rbalias", {"name": "rbalias", "version": "1.0.0", "main": "index.js"},
     [("package/index.js", b"module.exports = 'EVIL';\n")])
"##;
    let out = std::process::Command::new("python3")
        .args(["-c", script, &dir.display().to_string(), base])
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

/// Every symbolic link under `top` whose target, read from where it lies, leaves `top`;
/// every file (not a directory) with another name somewhere (a hard link); every entry
/// named like what the hostile package tried to write outside, but in its own package.
fn escapes(top: &std::path::Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let mut bad = Vec::new();
    let mut stack = vec![top.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        let name = p.file_name().map(|n| n.to_string_lossy().to_string());
        // Inside its own package (an absolute entry is unpacked there) is no escape.
        let inside = p.to_string_lossy().contains("/node_modules/rbhostile/");
        if !inside && name.is_some_and(|n| n.starts_with("rbesc")) {
            bad.push(format!("planted {}", p.display()));
        }
        if m.file_type().is_symlink() {
            let target = std::fs::read_link(&p).unwrap_or_default();
            let mut at: Vec<std::ffi::OsString> = p
                .parent()
                .unwrap_or(top)
                .components()
                .map(|c| c.as_os_str().to_owned())
                .collect();
            let mut out = target.is_absolute();
            for c in target.components() {
                match c {
                    std::path::Component::ParentDir => {
                        at.pop();
                    }
                    std::path::Component::Normal(n) => at.push(n.to_owned()),
                    _ => {}
                }
            }
            let resolved: std::path::PathBuf = at.iter().collect();
            out |= !resolved.starts_with(top);
            if out {
                bad.push(format!("{} -> {}", p.display(), target.display()));
            }
            continue;
        }
        if !m.is_dir() && m.nlink() > 1 {
            bad.push(format!("{} has {} names", p.display(), m.nlink()));
        }
        if m.is_dir() {
            stack.extend(
                std::fs::read_dir(&p)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path()),
            );
        }
    }
    bad
}

/// A hostile package from the registry (installed with scripts off) against the store of
/// shared layers: principal B's run asks for `rbhostile` and then `rbimpostor`; what npm
/// unpacks for it stays in its own layer (no link or file of it outside, no hard link, no
/// set-uid bit, nothing writable), the store's secret and `/etc/passwd` are unchanged,
/// and principal A's session, started with `rbvictim`, requires the registry's `rbvictim`
/// from a layer of its own, not B's bundled copy or the impostor. At bwrap and landlock,
/// as root and not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_npm_package_reaches_nothing_outside_its_layer() {
    use std::os::unix::fs::MetadataExt;
    if !common::require("javascript", "node") || !common::require("npm", "npm") {
        return;
    }
    let files = crate::package_cache::Dir::new("hostile-npm-registry");
    let registry =
        crate::package_cache::serve_npm_docs(files.0.clone(), |base| hostile_npm(&files.0, base));
    let passwd = std::fs::metadata("/etc/passwd").expect("/etc/passwd");
    let we_are_root = nix::unistd::geteuid().is_root();
    let mut setups = vec![("bwrap", None), ("landlock", None)];
    if we_are_root {
        setups.extend([("bwrap", Some(61_960)), ("landlock", Some(61_961))]);
    }
    for (level, uid) in setups {
        let at = format!("{level} (uid {uid:?})");
        let cache = std::env::temp_dir().join(format!(
            "replbox-hostile-npm-{level}-{}-{}",
            uid.unwrap_or(0),
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&cache);
        let started = common::Server::http()
            .token("hostile-npm-principal-a-0123456789")
            .token("hostile-npm-principal-b-0123456789")
            .args([
                "--sandbox",
                level,
                "--package-cache",
                &cache.display().to_string(),
                "--npm-registry",
                &registry,
            ])
            .uid(uid)
            .try_start()
            .await;
        let s = match started {
            Ok(s) => s,
            Err(e) => {
                common::skip(format!("npm packages at {at}: {e}"));
                continue;
            }
        };
        let a = s.connect("hostile-npm-principal-a-0123456789").await;
        let b = s.connect("hostile-npm-principal-b-0123456789").await;
        let key = || std::fs::read(cache.join("shared.key")).ok();
        let secret = key();
        let run = |pkg: &str, code: &str| json!({"languageId": "javascript", "packages": [pkg], "code": code});
        let o = common::http_call(
            &b,
            "run-code",
            run(
                "rbhostile",
                "console.log(require('rbhostile'), require('rbvictim2'), require.resolve('rbhostile'))",
            ),
        )
        .await;
        assert!(
            o.text.starts_with("hostile victim "),
            "{at}: rbhostile: {}",
            o.text
        );
        let o = common::http_call(
            &b,
            "run-code",
            run("rbimpostor", "console.log(require('rbimpostor'))"),
        )
        .await;
        let impostor = (o.is_error, o.text.lines().next().unwrap_or("").to_string());
        let o = common::http_call(
            &a,
            "session_start",
            json!({"language": "javascript", "packages": ["rbvictim"]}),
        )
        .await;
        assert!(!o.is_error, "{at}: {}", o.text);
        let sa = o.s("session_id").to_string();
        let o = common::http_call(
            &a,
            "session_eval",
            json!({"session_id": sa, "code": "console.log(require('rbvictim'), require.resolve('rbvictim'))"}),
        )
        .await;
        let said = o.structured["output"]
            .as_str()
            .unwrap_or("")
            .trim()
            .to_string();
        assert!(
            said.starts_with("victim "),
            "{at}: A's rbvictim: {}",
            o.text
        );
        assert!(
            !said.contains("rbhostile") && !said.contains("rbimpostor"),
            "{at}: A's rbvictim is B's: {said}"
        );
        // The impostor, when npm takes it, is what B asked for, under the name B asked for.
        assert!(
            impostor.0 || impostor.1 == "impostor",
            "{at}: rbimpostor: {impostor:?}"
        );
        // Nothing left the layers; nothing outside changed.
        let bad = escapes(&cache.join("layers"));
        assert!(bad.is_empty(), "{at}: {bad:#?}");
        let up = cache.parent().expect("a parent");
        for p in [
            cache.join("rbescape.js"),
            cache.join("rbesc-bin"),
            cache.join("rbesc-target.js"),
            up.join("rbescape.js"),
            up.join("rbesc-bin"),
            std::path::PathBuf::from("/tmp/rbescape-abs.js"),
            std::path::PathBuf::from("/rbescape.js"),
        ] {
            assert!(!p.exists(), "{at}: {} planted", p.display());
        }
        assert_eq!(key(), secret, "{at}: the store's secret changed");
        let now = std::fs::metadata("/etc/passwd").expect("/etc/passwd");
        assert_eq!(
            (now.mode(), now.uid()),
            (passwd.mode(), passwd.uid()),
            "{at}: /etc/passwd"
        );
        // The store's layers: sealed (nothing writable, set-uid or set-gid).
        let store = cache.join("layers/shared");
        let mut stack: Vec<std::path::PathBuf> = std::fs::read_dir(&store)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect();
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
            if m.is_dir() {
                stack.extend(
                    std::fs::read_dir(&p)
                        .expect("dir")
                        .flatten()
                        .map(|e| e.path()),
                );
            }
        }
        drop((a, b));
        s.stop().await;
        let _ = std::fs::remove_dir_all(&cache);
    }
    drop(files);
}

/// Two trees with every package at the same place and version, one key: npm takes a
/// package named as another's alias (`rbalias@1.0.0`, asked for beside `rbdep`) for that
/// alias (`rbdep`'s `rbalias`, `npm:rbvictim@^1.0.0`), and its lockfile then differs from
/// the honest tree's (`rbdep` alone) only in the alias's `name` and `integrity`. Principal
/// B asks for `rbdep` and `rbalias@1.0.0` first; principal A's `rbdep` must still require
/// the registry's `rbvictim`, not B's `rbalias` from B's layer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_of_other_packages_at_the_same_places_and_versions_is_not_shared() {
    if !common::require("javascript", "node") || !common::require("npm", "npm") {
        return;
    }
    let files = crate::package_cache::Dir::new("alias-npm-registry");
    let registry =
        crate::package_cache::serve_npm_docs(files.0.clone(), |base| hostile_npm(&files.0, base));
    let cache = crate::package_cache::Dir::new("alias-npm-cache");
    let s = common::Server::http()
        .token("alias-npm-principal-a-0123456789")
        .token("alias-npm-principal-b-0123456789")
        .args(["--package-cache", &cache.s(), "--npm-registry", &registry])
        .start()
        .await;
    let a = s.connect("alias-npm-principal-a-0123456789").await;
    let b = s.connect("alias-npm-principal-b-0123456789").await;
    let code = "console.log(require('rbdep'), require.resolve('rbdep'))";
    let o = common::http_call(
        &b,
        "run-code",
        json!({"languageId": "javascript", "packages": ["rbdep", "rbalias@1.0.0"], "code": code}),
    )
    .await;
    assert!(o.text.starts_with("EVIL "), "B's own tree: {}", o.text);
    for start in [false, true] {
        let said = if start {
            let o = common::http_call(
                &a,
                "session_start",
                json!({"language": "javascript", "packages": ["rbdep"]}),
            )
            .await;
            assert!(!o.is_error, "{}", o.text);
            let id = o.s("session_id").to_string();
            let o = common::http_call(&a, "session_eval", json!({"session_id": id, "code": code}))
                .await;
            o.structured["output"].as_str().unwrap_or("").to_string()
        } else {
            let o = common::http_call(
                &a,
                "run-code",
                json!({"languageId": "javascript", "packages": ["rbdep"], "code": code}),
            )
            .await;
            o.text
        };
        assert!(
            said.starts_with("victim "),
            "A's rbdep (session: {start}) requires B's rbalias: {said}"
        );
    }
    drop((a, b));
    s.stop().await;
    drop(files);
}
