//! replbox installed in a Python environment's `bin/` (what a wheel installs): a launcher
//! that puts that `bin/` first on PATH (`uvx`) must not make replbox take the
//! environment's own Python for the user's; an environment the user activated is theirs.
//! The full path (build the wheel, install it, run code) is `.ci/packages`.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::BIN;

/// A Python environment's layout in the target directory (same filesystem as the built
/// binary, so it can be hard-linked): `pyvenv.cfg`, `bin/replbox` with its helper
/// `bin/replbox-exec`, and a `bin/python3` that says it is Python 3.99.0 and that it is its
/// own executable.
fn fake_env() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let root = t.path().join("env");
    let bin = root.join("bin");
    std::fs::create_dir_all(&bin).expect("mkdir");
    std::fs::write(root.join("pyvenv.cfg"), "home = /usr/bin\n").expect("pyvenv.cfg");
    // current_exe() resolves symlinks: the binary itself must be in bin/.
    for (built, name) in [
        (BIN, "replbox"),
        (env!("CARGO_BIN_EXE_replbox-exec"), "replbox-exec"),
    ] {
        if std::fs::hard_link(built, bin.join(name)).is_err() {
            std::fs::copy(built, bin.join(name)).expect("copy the binary");
        }
    }
    let python = bin.join("python3");
    std::fs::write(
        &python,
        "#!/bin/sh\ncase \"$1\" in --version) echo 'Python 3.99.0' ;; *) echo \"$0\" ;; esac\n",
    )
    .expect("python3");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    (t, root)
}

/// The `python` row of `replbox languages` run from `root/bin` with that directory first
/// on PATH.
fn python_row(root: &Path, virtual_env: Option<&Path>) -> String {
    let bin = root.join("bin");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new(bin.join("replbox"));
    cmd.arg("languages")
        .env("PATH", path)
        .env("REPLBOX_POOL", "0")
        .env("REPLBOX_SESSION_POOL", "0");
    match virtual_env {
        Some(v) => cmd.env("VIRTUAL_ENV", v),
        None => cmd.env_remove("VIRTUAL_ENV"),
    };
    let out = cmd.output().expect("run replbox languages");
    assert!(out.status.success(), "replbox languages: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.starts_with("python "))
        .unwrap_or_else(|| panic!("no python row in {out:?}"))
        .to_string()
}

#[test]
fn a_launchers_environment_is_not_the_users_python() {
    if !common::require("python", "python3") {
        return;
    }
    let (_t, root) = fake_env();
    let row = python_row(&root, None);
    assert!(
        !row.contains("3.99.0") && !row.contains(&root.display().to_string()),
        "replbox took its own environment's python: {row}"
    );
    assert!(row.contains("installed"), "{row}");
}

#[test]
fn an_activated_environment_is_the_users_python() {
    let (_t, root) = fake_env();
    let row = python_row(&root, Some(&root));
    let fake = root.join("bin").join("python3");
    assert!(
        row.contains("3.99.0") && row.contains(&fake.display().to_string()),
        "the activated environment's python was not used: {row}"
    );
}
