//! The PTY scanner (`session::scan`) on bytes user code can print, and each end marker's
//! payload (`session::report::apply_marker`).
//!
//! Properties, besides no panic:
//! - faithful: the events rebuild the input exactly (data verbatim, and every prompt or
//!   marker event stands for a control string with the session's nonce at that place), so
//!   the scanner never yields a marker without the nonce and never loses or invents output;
//! - the same events whatever the reads' sizes;
//! - bounded: what it holds back is never more than one marker's worth.

use super::common;
use replbox::fuzzing::{EvalReport, Event, MAX_MARKER, Scanner, apply_marker};

fn scanner() -> Scanner {
    Scanner::new(common::NONCE, common::PROMPT, Some(common::CONTINUATION))
}

fn merged(events: Vec<Event>) -> Vec<Event> {
    let mut out: Vec<Event> = Vec::new();
    for e in events {
        match (out.last_mut(), e) {
            (Some(Event::Data(a)), Event::Data(b)) => a.extend(b),
            (_, e) => out.push(e),
        }
    }
    out
}

/// The body of a control string with `prefix` at `input[at..]`, and where it ends.
fn body(input: &[u8], at: usize, prefix: &[u8]) -> (String, usize) {
    assert!(
        input[at..].starts_with(prefix),
        "a marker event at {at} without the nonce's prefix there"
    );
    let start = at + prefix.len();
    let len = input[start..]
        .windows(2)
        .position(|w| w == b"\x1b\\")
        .expect("a marker event without its terminator");
    let text = std::str::from_utf8(&input[start..start + len]).expect("a marker body is UTF-8");
    (text.to_string(), start + len + 2)
}

fn check_faithful(input: &[u8], events: &[Event], pending: &[u8]) {
    let start_prefix = format!("\x1b_rbx;{};s;", common::NONCE).into_bytes();
    let end_prefix = format!("\x1b_rbx;{};e;", common::NONCE).into_bytes();
    let mut p = 0;
    for ev in events {
        match ev {
            Event::Data(d) => {
                assert!(!d.is_empty(), "an empty data event");
                assert_eq!(
                    &input[p..p + d.len()],
                    &d[..],
                    "data at {p} is not the input"
                );
                p += d.len();
            }
            Event::Prompt => {
                assert!(input[p..].starts_with(common::PROMPT.as_bytes()));
                p += common::PROMPT.len();
            }
            Event::Continuation => {
                assert!(input[p..].starts_with(common::CONTINUATION.as_bytes()));
                p += common::CONTINUATION.len();
            }
            Event::Started(n) => {
                let (text, next) = body(input, p, &start_prefix);
                assert!(
                    text.len() <= MAX_MARKER,
                    "a {} byte marker body",
                    text.len()
                );
                assert_eq!(text.parse::<u64>().ok(), Some(*n));
                p = next;
            }
            Event::End(m) => {
                let (text, next) = body(input, p, &end_prefix);
                assert!(
                    text.len() <= MAX_MARKER,
                    "a {} byte marker body",
                    text.len()
                );
                let mut parts = text.splitn(3, ';');
                assert_eq!(parts.next().and_then(|n| n.parse::<u64>().ok()), Some(m.n));
                assert_eq!(parts.next(), Some(m.status.as_str()));
                assert_eq!(parts.next().unwrap_or(""), m.payload);
                p = next;
            }
        }
    }
    assert_eq!(
        &input[p..],
        pending,
        "the held-back bytes are not the rest of the input"
    );
}

/// A language's fallback error pattern (compiled once: compiling it per input would be
/// most of the time spent).
static PATTERN: std::sync::LazyLock<Option<regex::Regex>> =
    std::sync::LazyLock::new(|| regex::Regex::new(r"(?m)^(\w+Error): (.*)$").ok());

/// Check one input (libFuzzer's, or a corpus file's).
pub fn run(data: &[u8]) {
    let Some((&seed, input)) = data.split_first() else {
        return;
    };
    let mut whole = scanner();
    let events = whole.feed(input);
    check_faithful(input, &events, whole.pending());

    // Reads of any size give the same events (after joining adjacent data).
    let mut split = scanner();
    let mut chunked = Vec::new();
    for c in common::chunks(input, seed, 1 + usize::from(seed) * 64) {
        chunked.extend(split.feed(c));
        assert!(
            split.pending().len() <= MAX_MARKER + 64,
            "the scanner holds {} bytes back",
            split.pending().len()
        );
    }
    assert_eq!(split.pending(), whole.pending());
    let chunked = merged(chunked);
    assert_eq!(
        merged(events.clone()),
        chunked,
        "events depend on read sizes"
    );

    // An end marker's payload is user-forgeable: it must never break the report.
    for ev in &events {
        if let Event::End(m) = ev {
            let mut report = EvalReport::empty("s", m.n);
            report.output = String::from_utf8_lossy(input).into_owned();
            apply_marker(&mut report, m, PATTERN.as_ref());
            let _ = report.text();
        }
    }
}
