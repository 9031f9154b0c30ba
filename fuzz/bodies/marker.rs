//! An end marker's payload (`session::report::apply_marker`): base64 JSON that user code can
//! forge once it has the nonce. The harness encodes the fuzzed bytes, so the fuzzer explores
//! the JSON rather than base64.
//!
//! Properties, besides no panic: the status is the marker's (or, for `?`, the error
//! pattern's); the report's text grows by a bounded trailer only.

use base64::Engine;
use replbox::fuzzing::{EndMarker, EvalReport, EvalStatus, apply_marker};

const STATUSES: [&str; 5] = ["ok", "error", "interrupted", "?", "bogus"];

/// A language's fallback error pattern (compiled once: compiling it per input would be
/// most of the time spent).
static PATTERN: std::sync::LazyLock<Option<regex::Regex>> =
    std::sync::LazyLock::new(|| regex::Regex::new(r"(?m)^(\w+Error): (.*)$").ok());

/// Check one input (libFuzzer's, or a corpus file's).
pub fn run(data: &[u8]) {
    let Some((&sel, json)) = data.split_first() else {
        return;
    };
    let status = STATUSES[usize::from(sel) % STATUSES.len()];
    // Payloads reach the server inside a marker body of at most MAX_MARKER bytes.
    let payload = if sel & 0x80 != 0 {
        String::from_utf8_lossy(json).into_owned()
    } else {
        base64::engine::general_purpose::STANDARD.encode(json)
    };
    let marker = EndMarker {
        n: 1,
        status: status.into(),
        payload,
    };
    let mut report = EvalReport::empty("s", 1);
    report.output = "Traceback\nValueError: bad\n".into();
    apply_marker(&mut report, &marker, PATTERN.as_ref());
    let expected = match status {
        "ok" => EvalStatus::Ok,
        "error" | "interrupted" | "?" | "bogus" => EvalStatus::Error,
        _ => unreachable!(),
    };
    // `?` and unknown statuses fall back to the pattern, which matches this output.
    assert_eq!(report.status, expected, "{status}");
    let text = report.text();
    assert!(
        text.len() <= report.output.len() + 2 * json.len() + 256,
        "a {}-byte payload made a {}-byte text",
        json.len(),
        text.len()
    );
}
