//! Numbers and how they are shown: statistics over samples, the report `--json` prints, and
//! the human table.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::time::Duration;

use serde::Serialize;

/// Milliseconds, rounded to the microsecond.
pub fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// Summary of one set of samples, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stats {
    pub median_ms: f64,
    pub p10_ms: f64,
    pub p90_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
}

impl Stats {
    /// Statistics of `samples`, or `None` when there are none.
    pub fn of(samples: &[Duration]) -> Option<Self> {
        let mut sorted: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        sorted.sort_by(f64::total_cmp);
        let round = |x: f64| (x * 1e3).round() / 1e3;
        Some(Self {
            median_ms: round(percentile(&sorted, 0.5)?),
            p10_ms: round(percentile(&sorted, 0.1)?),
            p90_ms: round(percentile(&sorted, 0.9)?),
            min_ms: round(*sorted.first()?),
            max_ms: round(*sorted.last()?),
        })
    }
}

/// The `q` quantile of sorted values, interpolating linearly between the two nearest ranks
/// (so the median of an even count is the mean of the middle two).
fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let pos = q.clamp(0.0, 1.0) * last as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64))
}

/// Samples in the order they were taken, and their statistics.
#[derive(Debug, Serialize)]
pub struct Series {
    pub samples_ms: Vec<f64>,
    #[serde(flatten)]
    pub stats: Stats,
}

impl Series {
    pub fn new(samples: &[Duration]) -> Option<Self> {
        Some(Self {
            samples_ms: samples.iter().copied().map(ms).collect(),
            stats: Stats::of(samples)?,
        })
    }
}

/// The baseline a section is compared with.
#[derive(Debug, Serialize)]
pub struct FloorReport {
    /// What exactly was run as the floor.
    pub what: String,
    #[serde(flatten)]
    pub series: Series,
}

#[derive(Debug, Serialize)]
pub struct SectionReport {
    /// `section` or `section:language`.
    pub name: String,
    pub title: String,
    #[serde(flatten)]
    pub ours: Series,
    pub floor: Option<FloorReport>,
    /// Our median over the floor's median (null when the section has no floor).
    pub ratio: Option<f64>,
    /// Figures beside the times (memory, descriptor counts, correct answers).
    pub metrics: BTreeMap<String, f64>,
}

impl SectionReport {
    pub fn new(
        name: impl Into<String>,
        title: impl Into<String>,
        ours: Series,
        floor: Option<FloorReport>,
        metrics: BTreeMap<String, f64>,
    ) -> Self {
        let ratio = floor.as_ref().and_then(|f| {
            let base = f.series.stats.median_ms;
            (base > 0.0).then(|| ((ours.stats.median_ms / base) * 1e3).round() / 1e3)
        });
        Self {
            name: name.into(),
            title: title.into(),
            ours,
            floor,
            ratio,
            metrics,
        }
    }

    fn metric(&self, name: &str) -> Option<f64> {
        self.metrics.get(name).copied()
    }
}

/// Where and how the bench ran.
#[derive(Debug, Serialize)]
pub struct Machine {
    pub cpus: usize,
    /// /proc/loadavg (1, 5 and 15 minutes) when the bench started and when it ended.
    pub load_before: Option<[f64; 3]>,
    pub load_after: Option<[f64; 3]>,
    /// How long the whole bench took.
    pub seconds: u64,
    /// `--pool` of the servers measured (sections about sessions run with 0).
    pub pool: usize,
    /// The replbox binary measured.
    pub server: String,
    /// The helper every child runs under.
    pub helper: String,
    /// `language version (executable)` of the interpreters measured.
    pub interpreters: Vec<String>,
}

/// The load average, from /proc/loadavg.
pub fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = text.split_whitespace().map(|x| x.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

/// One performance target of replbox, and what this run measured for it.
#[derive(Debug, Serialize)]
pub struct TargetReport {
    pub what: String,
    pub target: String,
    pub measured: String,
    pub met: bool,
}

/// replbox's performance targets (docs/performance.md), judged on the rows measured; a
/// target whose row was not measured is left out.
pub fn targets(sections: &[SectionReport]) -> Vec<TargetReport> {
    let find = |name: &str| sections.iter().find(|s| s.name == name);
    let mut out = Vec::new();
    let mut median_at_most = |row: &str, what: &str, limit_ms: f64| {
        if let Some(s) = find(row) {
            let m = s.ours.stats.median_ms;
            out.push(TargetReport {
                what: what.into(),
                target: format!("median <= {limit_ms} ms"),
                measured: format!("median {m:.2} ms"),
                met: m <= limit_ms,
            });
        }
    };
    median_at_most("run_code:python", "run-code python print(1+1)", 10.0);
    median_at_most(
        "run_code_back_to_back:python",
        "run-code python print(1+1), 50 calls back to back",
        10.0,
    );
    median_at_most("session_eval:python", "session_eval 1+1 (python)", 1.5);
    median_at_most("initialize", "server start -> initialize reply", 20.0);
    median_at_most(
        "session_pool",
        "session_start + importing pandas, numpy, pyplot (warm session)",
        150.0,
    );
    median_at_most(
        "sessions_sleep",
        "4 sessions each sleeping 1 s at once",
        1100.0,
    );
    // A pooled run-code costs at most 0.3x the interpreter's own start (or 3 ms).
    for lang in ["javascript", "ruby", "shellscript"] {
        if let Some(s) = find(&format!("run_code:{lang}"))
            && let Some(f) = &s.floor
        {
            let (ours, spawn) = (s.ours.stats.median_ms, f.series.stats.median_ms);
            let limit = (0.3 * spawn).max(3.0);
            out.push(TargetReport {
                what: format!("run-code {lang} (warm pool), agent-paced"),
                target: "median <= max(0.3x its spawn, 3 ms)".into(),
                measured: format!(
                    "median {ours:.2} ms = {:.2}x its spawn ({spawn:.2} ms)",
                    ours / spawn
                ),
                met: ours <= limit,
            });
        }
    }
    // The budget for confinement: about 10 ms per run-code, nothing per evaluation.
    for level in ["landlock", "bwrap"] {
        for (row, what, limit_ms, target) in [
            ("run_code", "run-code", 10.0, "<= 10 ms per call"),
            (
                "session_eval",
                "session_eval",
                0.5,
                "unchanged (within 0.5 ms)",
            ),
        ] {
            if let Some(s) = find(&format!("sandbox:{row}:{level}"))
                && let Some(f) = &s.floor
            {
                let (ours, none) = (s.ours.stats.median_ms, f.series.stats.median_ms);
                let extra = ours - none;
                out.push(TargetReport {
                    what: format!("{what} cost of the {level} sandbox over none"),
                    target: format!("{target} (median against median)"),
                    measured: format!("{extra:+.2} ms ({ours:.2} against {none:.2} ms)"),
                    met: extra <= limit_ms,
                });
            }
        }
    }
    // Evaluation overhead: at most 0.3 ms over the interpreter's own round trip.
    for row in [
        "session_eval:python",
        "session_eval:javascript",
        "session_eval:ruby",
        "session_eval:shellscript",
        "session_eval_files:python",
    ] {
        if let Some(s) = find(row)
            && let Some(f) = &s.floor
        {
            let (ours, raw) = (s.ours.stats.median_ms, f.series.stats.median_ms);
            out.push(TargetReport {
                what: s.title.clone(),
                target: "<= raw PTY round trip + 0.3 ms (median against median)".into(),
                measured: format!("{:+.2} ms ({ours:.2} against {raw:.2} ms)", ours - raw),
                met: ours - raw <= 0.3,
            });
        }
    }
    // Long ghci cells: linear, within 2x of ghci taking the same lines itself.
    for row in [
        "ghci_cell:let300",
        "ghci_cell:let1000",
        "ghci_cell:decl10000",
    ] {
        if let Some(s) = find(row)
            && let Some(f) = &s.floor
        {
            let (ours, ghci) = (s.ours.stats.median_ms, f.series.stats.median_ms);
            out.push(TargetReport {
                what: s.title.clone(),
                target: "<= 2x ghci itself (median against median)".into(),
                measured: format!("{:.2}x ({ours:.0} against {ghci:.0} ms)", ours / ghci),
                met: ours <= 2.0 * ghci,
            });
        }
    }
    if let Some(s) = find("concurrent_run_code") {
        let m = s.ours.stats.median_ms;
        let one = s
            .floor
            .as_ref()
            .map_or(f64::NAN, |f| f.series.stats.median_ms);
        let right = s.metric("least_right").unwrap_or(0.0);
        let calls = s.metric("calls").unwrap_or(0.0);
        out.push(TargetReport {
            what: "8 concurrent run-code".into(),
            target: "all correct, median <= 2x one call".into(),
            measured: format!(
                "{right}/{calls} correct in every round, median {m:.1} ms = {:.2}x one call ({one:.1} ms); \
the same 8 pythons spawned directly at once: {:.1} ms",
                m / one,
                s.metric("direct_8_at_once_median_ms").unwrap_or(f64::NAN)
            ),
            met: right == calls && calls > 0.0 && m <= 2.0 * one,
        });
    }
    for row in ["big_output:session", "big_output:run_code"] {
        if let Some(s) = find(row) {
            let m = s.ours.stats.median_ms;
            let largest = s.metric("largest_text_bytes").unwrap_or(f64::INFINITY);
            let flagged = s.metric("truncation_flagged") == Some(1.0);
            // The cap, plus the line saying how much was left out.
            let limit = s.metric("output_cap_bytes").unwrap_or(65536.0) + 64.0;
            out.push(TargetReport {
                what: format!("200,000 printed lines ({})", &row["big_output:".len()..]),
                target: "<= 1 s, head + tail within the 64 KiB cap, flagged".into(),
                measured: format!(
                    "median {m:.0} ms, {largest} bytes returned, truncation {}",
                    if flagged { "flagged" } else { "NOT flagged" }
                ),
                met: m <= 1000.0 && largest <= limit && flagged,
            });
        }
    }
    if let Some(s) = find("big_output:session")
        && let Some(f) = &s.floor
    {
        let (m, pipe) = (s.ours.stats.median_ms, f.series.stats.median_ms);
        out.push(TargetReport {
            what: "200,000 printed lines through a session, against python to a pipe".into(),
            target: "<= 1.3x (median against median)".into(),
            measured: format!("{:.2}x ({m:.0} against {pipe:.0} ms)", m / pipe),
            met: m <= 1.3 * pipe,
        });
    }
    if let Some(s) = find("render_flood") {
        let timeout = s.metric("timeout_ms").unwrap_or(f64::NAN);
        let longest = s.ours.samples_ms.iter().copied().fold(0.0, f64::max);
        out.push(TargetReport {
            what: "4 MB cursor-escape flood through a session".into(),
            target: "every one within its timeout_ms, status ok".into(),
            measured: format!(
                "median {:.0} ms, longest {longest:.0} ms, against timeout_ms {timeout:.0}",
                s.ours.stats.median_ms
            ),
            met: longest < timeout,
        });
    }
    if let Some(s) = find("render_flood:bystander")
        && let Some(f) = &s.floor
    {
        let (m, alone) = (s.ours.stats.median_ms, f.series.stats.median_ms);
        out.push(TargetReport {
            what: "run-code print(1) while two sessions flood, against it alone".into(),
            target: "answered while the floods run; median <= 5x alone".into(),
            measured: format!("{:.2}x ({m:.1} against {alone:.1} ms)", m / alone),
            met: m <= 5.0 * alone,
        });
    }
    if let Some(s) = find("idle_memory")
        && let Some(per) = s.metric("per_session_kib")
    {
        out.push(TargetReport {
            what: "server memory per idle session (interpreter excluded)".into(),
            target: "<= 200 KiB".into(),
            measured: format!(
                "{per:.1} KiB ({} sessions: RSS {} -> {} KiB)",
                s.metric("sessions").unwrap_or(0.0),
                s.metric("rss_kib_before").unwrap_or(0.0),
                s.metric("rss_kib_open").unwrap_or(0.0)
            ),
            met: per <= 200.0,
        });
    }
    if let Some(s) = find("soak") {
        let g = |k: &str| s.metric(k).unwrap_or(f64::NAN);
        let grew = g("rss_kib_after") - g("rss_kib_before");
        out.push(TargetReport {
            what: format!(
                "{} evaluations across {} sessions",
                g("evals"),
                g("sessions")
            ),
            target: "fds, threads and memory flat (RSS growth <= 1 MiB)".into(),
            measured: format!(
                "fds {} -> {}, threads {} -> {}, RSS {} -> {} KiB ({grew:+} KiB)",
                g("fds_before"),
                g("fds_after"),
                g("threads_before"),
                g("threads_after"),
                g("rss_kib_before"),
                g("rss_kib_after")
            ),
            met: g("fds_after") <= g("fds_before")
                && g("threads_after") <= g("threads_before")
                && grew <= 1024.0,
        });
    }
    // Code mode: a tool call from a cell costs at most 1 ms more than a direct MCP call.
    if let Some(s) = find("code_mode_call")
        && let Some(f) = &s.floor
    {
        let over = s.ours.stats.median_ms - f.series.stats.median_ms;
        out.push(TargetReport {
            what: "code mode: one tool call from a cell, over a direct MCP call".into(),
            target: "median overhead <= 1 ms".into(),
            measured: format!("median overhead {over:.2} ms"),
            met: over <= 1.0,
        });
    }
    out
}

/// Everything one `replbox-bench` run measured.
#[derive(Debug, Serialize)]
pub struct Report {
    /// What the server measured says it is.
    pub replbox_version: String,
    /// `debug` or `release`: the cargo profile directory the server measured lies in
    /// (`unknown` elsewhere).
    pub build: &'static str,
    pub iterations: usize,
    pub machine: Machine,
    pub sections: Vec<SectionReport>,
    pub targets: Vec<TargetReport>,
    /// Sections or languages skipped, and why.
    pub notes: Vec<String>,
}

/// The human table: one row per section, then what each floor was.
pub fn print_table(report: &Report, out: &mut impl Write) -> io::Result<()> {
    writeln!(
        out,
        "replbox {} bench ({} build), {} iterations per section, times in ms",
        report.replbox_version, report.build, report.iterations
    )?;
    let name_width = report
        .sections
        .iter()
        .map(|s| s.name.len())
        .chain(["SECTION".len()])
        .max()
        .unwrap_or(0);
    writeln!(
        out,
        "{:<name_width$}  {:>9}  {:>9}  {:>9}  {:>12}  {:>10}  WHAT",
        "SECTION", "MEDIAN", "P10", "P90", "FLOOR MEDIAN", "OURS/FLOOR"
    )?;
    for s in &report.sections {
        let floor = s.floor.as_ref().map_or("-".to_string(), |f| {
            format!("{:.2}", f.series.stats.median_ms)
        });
        let ratio = s.ratio.map_or("-".to_string(), |r| format!("{r:.2}x"));
        writeln!(
            out,
            "{:<name_width$}  {:>9.2}  {:>9.2}  {:>9.2}  {:>12}  {:>10}  {}",
            s.name,
            s.ours.stats.median_ms,
            s.ours.stats.p10_ms,
            s.ours.stats.p90_ms,
            floor,
            ratio,
            s.title
        )?;
    }
    for s in &report.sections {
        if let Some(f) = &s.floor {
            let st = &f.series.stats;
            writeln!(
                out,
                "floor of {}: {} (median {:.2}, p10 {:.2}, p90 {:.2})",
                s.name, f.what, st.median_ms, st.p10_ms, st.p90_ms
            )?;
        }
    }
    for s in report.sections.iter().filter(|s| !s.metrics.is_empty()) {
        let list: Vec<String> = s.metrics.iter().map(|(k, v)| format!("{k}={v}")).collect();
        writeln!(out, "figures of {}: {}", s.name, list.join(" "))?;
    }
    if !report.targets.is_empty() {
        writeln!(out)?;
        writeln!(out, "TARGET")?;
        for t in &report.targets {
            writeln!(
                out,
                "{:<6}  {}: {} -- {}",
                if t.met { "met" } else { "MISSED" },
                t.what,
                t.target,
                t.measured
            )?;
        }
    }
    let m = &report.machine;
    let load = |l: &Option<[f64; 3]>| {
        l.map_or("?".to_string(), |l| {
            format!("{:.2} {:.2} {:.2}", l[0], l[1], l[2])
        })
    };
    writeln!(out)?;
    writeln!(
        out,
        "machine: {} cpus, load average {} at the start, {} at the end; {} s in all; pool {}; server {}; helper {}",
        m.cpus,
        load(&m.load_before),
        load(&m.load_after),
        m.seconds,
        m.pool,
        m.server,
        m.helper
    )?;
    for i in &m.interpreters {
        writeln!(out, "interpreter: {i}")?;
    }
    for n in &report.notes {
        writeln!(out, "note: {n}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn durations(ms: &[u64]) -> Vec<Duration> {
        ms.iter().map(|&m| Duration::from_millis(m)).collect()
    }

    #[test]
    fn stats_from_unsorted_samples() {
        let s = Stats::of(&durations(&[4, 1, 3, 2])).expect("stats");
        assert_eq!(s.median_ms, 2.5);
        assert_eq!((s.min_ms, s.max_ms), (1.0, 4.0));
        assert!((s.p10_ms - 1.3).abs() < 1e-9, "{}", s.p10_ms);
        assert!((s.p90_ms - 3.7).abs() < 1e-9, "{}", s.p90_ms);
        let one = Stats::of(&durations(&[7])).expect("stats");
        assert_eq!((one.median_ms, one.p10_ms, one.p90_ms), (7.0, 7.0, 7.0));
        assert!(Stats::of(&[]).is_none());
    }

    #[test]
    fn ratio_and_table() {
        let with_floor = SectionReport::new(
            "a",
            "thing a",
            Series::new(&durations(&[6, 6, 6])).expect("series"),
            Some(FloorReport {
                what: "the floor".into(),
                series: Series::new(&durations(&[2, 2, 2])).expect("series"),
            }),
            BTreeMap::new(),
        );
        assert_eq!(with_floor.ratio, Some(3.0));
        let without = SectionReport::new(
            "b",
            "thing b",
            Series::new(&durations(&[5])).expect("series"),
            None,
            BTreeMap::from([("per_session_kib".to_string(), 150.0)]),
        );
        assert_eq!(without.ratio, None);
        let sections = vec![with_floor, without];
        let report = Report {
            replbox_version: "0".into(),
            build: "debug",
            iterations: 3,
            machine: Machine {
                cpus: 2,
                load_before: Some([1.0, 2.0, 3.0]),
                load_after: None,
                seconds: 1,
                pool: 2,
                server: "/t/replbox".into(),
                helper: "/t/replbox-exec".into(),
                interpreters: vec!["python 3 (/usr/bin/python3)".into()],
            },
            targets: targets(&sections),
            sections,
            notes: vec!["peer: not measured".into()],
        };
        let mut out = Vec::new();
        print_table(&report, &mut out).expect("prints");
        let text = String::from_utf8(out).expect("utf-8");
        assert!(text.contains("3.00x"), "{text}");
        assert!(text.contains("floor of a: the floor"), "{text}");
        assert!(text.contains("figures of b: per_session_kib=150"), "{text}");
        assert!(text.contains("load average 1.00 2.00 3.00"), "{text}");
        assert!(
            text.contains("server /t/replbox; helper /t/replbox-exec"),
            "{text}"
        );
        assert!(text.contains("note: peer: not measured"), "{text}");
        let json = serde_json::to_value(&report).expect("serializes");
        assert_eq!(json["sections"][0]["median_ms"], 6.0);
        assert_eq!(json["sections"][0]["floor"]["median_ms"], 2.0);
        assert!(json["sections"][1]["ratio"].is_null());
        assert_eq!(json["sections"][1]["metrics"]["per_session_kib"], 150.0);
    }

    #[test]
    fn targets_are_judged_on_the_rows_measured() {
        let row = |name: &str, ms: &[u64], floor: Option<&[u64]>, metrics: &[(&str, f64)]| {
            SectionReport::new(
                name,
                name,
                Series::new(&durations(ms)).expect("series"),
                floor.map(|f| FloorReport {
                    what: "floor".into(),
                    series: Series::new(&durations(f)).expect("series"),
                }),
                metrics.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            )
        };
        let sections = vec![
            row("run_code:python", &[8, 9, 30], Some(&[20]), &[]),
            row("initialize", &[25], None, &[]),
            row(
                "concurrent_run_code",
                &[30],
                Some(&[20]),
                &[("calls", 8.0), ("least_right", 8.0)],
            ),
            row(
                "idle_memory",
                &[100],
                None,
                &[("per_session_kib", 250.0), ("sessions", 100.0)],
            ),
            row(
                "soak",
                &[1],
                None,
                &[
                    ("fds_before", 10.0),
                    ("fds_after", 10.0),
                    ("threads_before", 4.0),
                    ("threads_after", 4.0),
                    ("rss_kib_before", 1000.0),
                    ("rss_kib_after", 1500.0),
                ],
            ),
        ];
        let t = targets(&sections);
        let met: Vec<(&str, bool)> = t.iter().map(|t| (t.what.as_str(), t.met)).collect();
        assert_eq!(
            met,
            [
                ("run-code python print(1+1)", true),
                ("server start -> initialize reply", false),
                ("8 concurrent run-code", true),
                (
                    "server memory per idle session (interpreter excluded)",
                    false
                ),
                ("NaN evaluations across NaN sessions", true),
            ]
        );
    }
}
