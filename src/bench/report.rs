//! Numbers and how they are shown: statistics over samples, the report `--json` prints, and
//! the human table.

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
    pub name: &'static str,
    pub title: &'static str,
    #[serde(flatten)]
    pub ours: Series,
    pub floor: Option<FloorReport>,
    /// Our median over the floor's median (null when the section has no floor).
    pub ratio: Option<f64>,
}

impl SectionReport {
    pub fn new(
        name: &'static str,
        title: &'static str,
        ours: Series,
        floor: Option<FloorReport>,
    ) -> Self {
        let ratio = floor.as_ref().and_then(|f| {
            let base = f.series.stats.median_ms;
            (base > 0.0).then(|| ((ours.stats.median_ms / base) * 1e3).round() / 1e3)
        });
        Self {
            name,
            title,
            ours,
            floor,
            ratio,
        }
    }
}

/// Everything one `replbox bench` run measured.
#[derive(Debug, Serialize)]
pub struct Report {
    pub replbox_version: &'static str,
    /// `debug` or `release`: the server measured is this same binary.
    pub build: &'static str,
    pub iterations: usize,
    pub sections: Vec<SectionReport>,
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
        );
        assert_eq!(with_floor.ratio, Some(3.0));
        let without = SectionReport::new(
            "b",
            "thing b",
            Series::new(&durations(&[5])).expect("series"),
            None,
        );
        assert_eq!(without.ratio, None);
        let report = Report {
            replbox_version: "0",
            build: "debug",
            iterations: 3,
            sections: vec![with_floor, without],
        };
        let mut out = Vec::new();
        print_table(&report, &mut out).expect("prints");
        let text = String::from_utf8(out).expect("utf-8");
        assert!(text.contains("3.00x"), "{text}");
        assert!(text.contains("floor of a: the floor"), "{text}");
        let json = serde_json::to_value(&report).expect("serializes");
        assert_eq!(json["sections"][0]["median_ms"], 6.0);
        assert_eq!(json["sections"][0]["floor"]["median_ms"], 2.0);
        assert!(json["sections"][1]["ratio"].is_null());
    }
}
