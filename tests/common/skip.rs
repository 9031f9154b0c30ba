//! Checks that cannot run on this host are skipped with a reason, never silently.
//!
//! [`skip`] prints `SKIP: reason` and appends `test<TAB>required<TAB>reason` to the run's
//! skip log, so that a run whose output is captured (nextest keeps a passing test's output
//! to itself) still ends with the count and the reasons: `.ci/test` prints them. With
//! `REPLBOX_REQUIRE_ALL=1` (CI) such a skip is a failure instead. [`skip_optional`] is for
//! what CI does not promise (a run-code language the README does not list): recorded and
//! printed the same way, never a failure.

use std::io::Write;

/// Whether every check must run (`REPLBOX_REQUIRE_ALL=1`, as in CI).
pub fn require_all() -> bool {
    std::env::var("REPLBOX_REQUIRE_ALL").is_ok_and(|v| v == "1")
}

/// Where skips are recorded: `REPLBOX_SKIP_LOG`, else `skips.log` in cargo's directory for
/// the tests' scratch files (`target/tmp`).
pub fn skip_log() -> std::path::PathBuf {
    match std::env::var_os("REPLBOX_SKIP_LOG") {
        Some(p) => p.into(),
        None => std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("skips.log"),
    }
}

/// Skip the check at hand: say why (stderr and the skip log); under
/// `REPLBOX_REQUIRE_ALL=1` fail instead. Returns `false`, for `if !x { return skip(..) }`.
pub fn skip(reason: impl std::fmt::Display) -> bool {
    let reason = reason.to_string();
    record("required", &reason);
    if require_all() {
        panic!("SKIP: {reason}, and REPLBOX_REQUIRE_ALL=1 requires it to run");
    }
    eprintln!("SKIP: {reason}");
    false
}

/// Skip a check that no setup promises to run (CI included): said and recorded, never a
/// failure. Returns `false`.
pub fn skip_optional(reason: impl std::fmt::Display) -> bool {
    let reason = reason.to_string();
    record("optional", &reason);
    eprintln!("SKIP: {reason}");
    false
}

/// Append one line to the skip log: one `write` with O_APPEND, so concurrent tests'
/// lines never interleave.
fn record(kind: &str, reason: &str) {
    let test = std::env::var("NEXTEST_TEST_NAME")
        .ok()
        .or_else(|| std::thread::current().name().map(String::from))
        .unwrap_or_else(|| "?".into());
    let binary = std::env::var("NEXTEST_BINARY_ID").unwrap_or_else(|_| {
        std::env::args()
            .next()
            .and_then(|a| {
                std::path::Path::new(&a)
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
            })
            .unwrap_or_default()
    });
    let line = format!(
        "{binary} {test}\t{kind}\t{}\n",
        reason.replace(['\n', '\t'], " ")
    );
    let path = skip_log();
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
    {
        let _ = f.write_all(line.as_bytes());
    }
}

/// Whether an executable is on PATH.
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
        .unwrap_or(false)
}

/// The languages the README lists as supported: a missing one is skipped (in CI, a
/// failure).
pub fn require(language: &str, program: &str) -> bool {
    on_path(program)
        || skip(format!(
            "{language} tests skipped: {program} is not on PATH"
        ))
}

/// Whether python3 imports matplotlib, pandas and numpy (the data tests' stack); skipped
/// when not (in CI, a failure: `.ci/run` installs them).
pub fn require_data_stack() -> bool {
    if !require("python", "python3") {
        return false;
    }
    let ok = std::process::Command::new("python3")
        .args(["-c", "import matplotlib, pandas, numpy"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok || skip("data tests skipped: python3 cannot import matplotlib, pandas and numpy")
}
