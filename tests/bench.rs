//! `replbox bench` runs every section and reports well-formed numbers. Nothing here asserts
//! on speed: timings on a shared machine are too noisy for that.

use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_replbox");

#[test]
fn bench_json_has_every_section_with_its_samples() {
    let out = Command::new(BIN)
        .args(["bench", "--iterations", "3", "--json"])
        .output()
        .expect("run replbox bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("bench --json did not print JSON ({e}):\n{stdout}"));
    assert_eq!(report["iterations"], 3, "{report:#}");
    let sections = report["sections"].as_array().expect("sections array");
    let names: Vec<&str> = sections.iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(names, ["run_code", "initialize"], "{report:#}");
    for s in sections {
        let name = &s["name"];
        let samples = s["samples_ms"].as_array().expect("samples_ms");
        assert_eq!(samples.len(), 3, "{name}: {s:#}");
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
    }
    // run-code is compared with spawning python directly; server start has no floor.
    let run_code = &sections[0];
    let floor = &run_code["floor"];
    assert_eq!(
        floor["samples_ms"].as_array().map(Vec::len),
        Some(3),
        "{floor:#}"
    );
    assert!(
        floor["median_ms"].as_f64().is_some_and(|m| m > 0.0),
        "{floor:#}"
    );
    assert!(
        run_code["ratio"].as_f64().is_some_and(|r| r > 0.0),
        "{run_code:#}"
    );
    assert!(sections[1]["floor"].is_null() && sections[1]["ratio"].is_null());
}

#[test]
fn only_selects_sections_and_rejects_unknown_ones() {
    let out = Command::new(BIN)
        .args([
            "bench",
            "--iterations",
            "1",
            "--json",
            "--only",
            "initialize",
        ])
        .output()
        .expect("run replbox bench");
    assert!(out.status.success(), "{out:?}");
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let names: Vec<&str> = report["sections"]
        .as_array()
        .expect("sections")
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names, ["initialize"]);

    let out = Command::new(BIN)
        .args(["bench", "--only", "no_such_section"])
        .output()
        .expect("run replbox bench");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("run_code"), "lists the sections: {stderr}");
}
