//! `replbox-bench` runs every section against the built server and reports well-formed
//! numbers. Nothing here asserts on speed: timings on a shared machine are too noisy for that.
//!
//! The tests that start servers run the bench for minutes, so they run only with
//! `REPLBOX_BENCH_TEST=1` (they build the server first, `cargo build -p replbox`, so that
//! the bench finds it beside itself); without it they say they were skipped.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

const BENCH: &str = env!("CARGO_BIN_EXE_replbox-bench");

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
        .unwrap_or(false)
}

/// Whether the slow tests run (`REPLBOX_BENCH_TEST=1`); when they do, the server binary is
/// built beside the bench's (in the same profile), where the bench looks for it.
fn slow_test(name: &str) -> bool {
    if std::env::var("REPLBOX_BENCH_TEST").as_deref() != Ok("1") {
        eprintln!(
            "SKIP: {name}: it runs the bench against a built server for minutes; \
             set REPLBOX_BENCH_TEST=1 to run it"
        );
        return false;
    }
    // Once per test process (the tests run on threads of one process).
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut build = Command::new(env!("CARGO"));
        build
            .arg("build")
            .arg("--manifest-path")
            .arg(root.join("Cargo.toml"))
            .args(["-p", "replbox", "--bins"]);
        if !cfg!(debug_assertions) {
            build.arg("--release");
        }
        let status = build.status().expect("run cargo build -p replbox");
        assert!(status.success(), "cargo build -p replbox failed: {status}");
    });
    let beside = Path::new(BENCH).with_file_name("replbox");
    assert!(beside.is_file(), "no server at {}", beside.display());
    true
}

#[test]
fn bench_json_has_every_section_with_its_samples() {
    if !slow_test("bench_json_has_every_section_with_its_samples") {
        return;
    }
    // Every section, kept small (and without the peer, which needs the npm registry).
    let out = Command::new(BENCH)
        .args([
            "--iterations",
            "2",
            "--json",
            "--idle-sessions",
            "3",
            "--soak-evals",
            "24",
            "--soak-sessions",
            "3",
            "--no-peer",
        ])
        .output()
        .expect("run replbox-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("bench --json did not print JSON ({e}):\n{stdout}"));
    assert_eq!(report["iterations"], 2, "{report:#}");
    let sections = report["sections"].as_array().expect("sections array");
    let names: Vec<&str> = sections.iter().filter_map(|s| s["name"].as_str()).collect();
    // (language, its run-code program, its REPL) in the bench's order.
    let langs = [
        ("python", "python3", "python3"),
        ("javascript", "node", "node"),
        ("ruby", "ruby", "ruby"),
        ("haskell", "runghc", "ghci"),
        ("shellscript", "bash", "bash"),
    ];
    let mut expected: Vec<String> = vec!["initialize".into()];
    for (id, run, _) in langs {
        if on_path(run) {
            expected.push(format!("run_code:{id}"));
        }
    }
    if on_path("python3") {
        expected.push("run_code_cold:python".into());
    }
    for (id, _, repl) in langs {
        if on_path(repl) {
            expected.push(format!("session_eval:{id}"));
        }
    }
    if on_path("python3") {
        // A level that does not work on this host is left out with a note (CI has both).
        let notes = report["notes"].to_string();
        for level in ["landlock", "bwrap"] {
            if notes.contains(&format!("sandbox {level}: skipped"))
                && std::env::var("REPLBOX_REQUIRE_ALL").as_deref() != Ok("1")
            {
                eprintln!(
                    "SKIP: the {level} rows of the sandbox section: the level does not work here"
                );
                continue;
            }
            expected.push(format!("sandbox:run_code:{level}"));
            expected.push(format!("sandbox:session_eval:{level}"));
        }
        expected.extend(
            [
                "sessions_sleep",
                "concurrent_run_code",
                "big_output:run_code",
                "big_output:session",
            ]
            .map(String::from),
        );
        // The reference analysis session needs pandas and matplotlib (else a note).
        let data_stack = Command::new("python3")
            .args(["-c", "import pandas, matplotlib"])
            .status()
            .is_ok_and(|s| s.success());
        if data_stack {
            expected.push("model_bytes".into());
        }
        expected.extend(
            [
                "render_flood",
                "render_flood:bystander",
                "idle_memory",
                "soak",
            ]
            .map(String::from),
        );
    }
    assert_eq!(names, expected, "{report:#}");
    for s in sections {
        let name = s["name"].as_str().unwrap_or_default();
        let samples = s["samples_ms"].as_array().expect("samples_ms");
        let want = match name {
            "idle_memory" => 3,
            "soak" => 24,
            _ => 2,
        };
        assert_eq!(samples.len(), want, "{name}: {s:#}");
        assert!(
            samples.iter().all(|x| x.as_f64().is_some_and(|v| v > 0.0)),
            "{name}: {s:#}"
        );
        let median = s["median_ms"].as_f64().expect("median_ms");
        assert!(median > 0.0, "{name}: {s:#}");
        for key in ["p10_ms", "p90_ms"] {
            assert!(s[key].as_f64().is_some(), "{name} has no {key}: {s:#}");
        }
        assert!(s.get("ratio").is_some(), "{name} has no ratio field: {s:#}");
        // Rows compared with a floor carry its samples and a ratio; the others neither.
        let has_floor = !matches!(name, "initialize" | "idle_memory" | "soak" | "render_flood");
        if has_floor {
            let floor = &s["floor"];
            assert_eq!(
                floor["samples_ms"].as_array().map(Vec::len),
                Some(want),
                "{name}: {floor:#}"
            );
            assert!(
                s["ratio"].as_f64().is_some_and(|r| r > 0.0),
                "{name}: {s:#}"
            );
        } else {
            assert!(
                s["floor"].is_null() && s["ratio"].is_null(),
                "{name}: {s:#}"
            );
        }
    }
    let metric = |row: &str, key: &str| {
        sections
            .iter()
            .find(|s| s["name"] == row)
            .and_then(|s| s["metrics"][key].as_f64())
    };
    if on_path("python3") {
        assert_eq!(metric("concurrent_run_code", "least_right"), Some(8.0));
        assert!(metric("idle_memory", "per_session_kib").is_some());
        for key in ["fds_before", "fds_after", "threads_after", "rss_kib_after"] {
            assert!(metric("soak", key).is_some_and(|v| v > 0.0), "soak {key}");
        }
        assert_eq!(
            metric("big_output:session", "truncation_flagged"),
            Some(1.0)
        );
        assert_eq!(metric("render_flood", "timeout_ms"), Some(60_000.0));
        // Every performance target is judged, met or not (two per sandbox level measured).
        let targets = report["targets"].as_array().expect("targets");
        let levels = names
            .iter()
            .filter(|n| n.starts_with("sandbox:run_code:"))
            .count();
        assert_eq!(targets.len(), 12 + 2 * levels, "{targets:#?}");
        assert!(targets.iter().all(|t| t["met"].is_boolean()));
    }
    // Where and how it ran, and that the peer was left out on request.
    let machine = &report["machine"];
    assert!(
        machine["cpus"].as_u64().is_some_and(|c| c > 0),
        "{machine:#}"
    );
    assert!(machine["load_before"].is_array(), "{machine:#}");
    let notes = report["notes"].as_array().expect("notes");
    assert!(
        notes
            .iter()
            .any(|n| n.as_str().is_some_and(|n| n.contains("--no-peer"))),
        "{notes:?}"
    );
}

#[test]
fn only_selects_sections() {
    if !slow_test("only_selects_sections") {
        return;
    }
    let out = Command::new(BENCH)
        .args(["--iterations", "1", "--json", "--only", "initialize"])
        .output()
        .expect("run replbox-bench");
    assert!(out.status.success(), "{out:?}");
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let names: Vec<&str> = report["sections"]
        .as_array()
        .expect("sections")
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names, ["initialize"]);
    assert!(report["targets"].as_array().is_some_and(|t| t.len() == 1));
    // The server measured is the one beside the bench, and says what it is.
    let beside = Path::new(BENCH).with_file_name("replbox");
    let beside = std::fs::canonicalize(beside).expect("server path");
    assert_eq!(
        report["machine"]["server"].as_str(),
        beside.to_str(),
        "{report:#}"
    );
    assert_eq!(report["replbox_version"], env!("CARGO_PKG_VERSION"));
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    assert_eq!(report["build"], profile);
}

/// Fast: nothing is measured, so this runs in every `cargo test`.
#[test]
fn rejects_unknown_sections_and_a_missing_server() {
    let out = Command::new(BENCH)
        .args(["--only", "no_such_section"])
        .output()
        .expect("run replbox-bench");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("run_code"), "lists the sections: {stderr}");
    assert!(stderr.contains("soak"), "lists the sections: {stderr}");

    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("replbox");
    let out = Command::new(BENCH)
        .arg("--server")
        .arg(&missing)
        .args(["--only", "initialize"])
        .output()
        .expect("run replbox-bench");
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("no replbox binary at {}", missing.display())),
        "{stderr}"
    );
}
