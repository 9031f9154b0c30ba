//! Splits an interpreter's PTY stream into user output and the control strings the
//! bootstrap writes: the prompt, the continuation prompt, the start-of-evaluation marker
//! `ESC _ rbx;NONCE;s;N ESC \` and the end-of-evaluation marker
//! `ESC _ rbx;NONCE;e;N;STATUS;PAYLOAD ESC \`. Every control string carries the session's
//! random nonce, so nothing a program prints by accident can be taken for one; a control
//! string split across reads is held back until it is complete.

use memchr::memmem;

/// What the scanner found, in stream order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Data(Vec<u8>),
    Prompt,
    Continuation,
    /// The bootstrap began running evaluation N.
    Started(u64),
    End(EndMarker),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndMarker {
    pub n: u64,
    pub status: String,
    /// Base64 of a JSON object `{type, message}` (may be empty).
    pub payload: String,
}

/// A marker body longer than this is not ours (or is broken): pass it through as data.
pub const MAX_MARKER: usize = 16 * 1024;

pub struct Scanner {
    prompt: Vec<u8>,
    continuation: Option<Vec<u8>>,
    end_prefix: Vec<u8>,
    start_prefix: Vec<u8>,
    carry: Vec<u8>,
}

impl Scanner {
    pub fn new(nonce: &str, prompt: &str, continuation: Option<&str>) -> Self {
        Self {
            prompt: prompt.as_bytes().to_vec(),
            continuation: continuation.map(|c| c.as_bytes().to_vec()),
            end_prefix: format!("\x1b_rbx;{nonce};e;").into_bytes(),
            start_prefix: format!("\x1b_rbx;{nonce};s;").into_bytes(),
            carry: Vec::new(),
        }
    }

    /// Feed bytes; returns the events they complete.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<Event> {
        let mut buf = std::mem::take(&mut self.carry);
        buf.extend_from_slice(bytes);
        let mut events = Vec::new();
        let mut pos = 0;
        loop {
            let rest = &buf[pos..];
            let Some((at, kind)) = self.earliest(rest) else {
                break;
            };
            if at > 0 {
                events.push(Event::Data(rest[..at].to_vec()));
            }
            let start = pos + at;
            match kind {
                Kind::Prompt => {
                    events.push(Event::Prompt);
                    pos = start + self.prompt.len();
                }
                Kind::Continuation => {
                    events.push(Event::Continuation);
                    pos = start + self.continuation.as_ref().map_or(0, |c| c.len());
                }
                Kind::End | Kind::Start => {
                    let prefix_len = if matches!(kind, Kind::End) {
                        self.end_prefix.len()
                    } else {
                        self.start_prefix.len()
                    };
                    let body_start = start + prefix_len;
                    match memmem::find(&buf[body_start..], b"\x1b\\") {
                        // Over the bound whether it came in one read or in many.
                        Some(len) if len <= MAX_MARKER => {
                            let body = &buf[body_start..body_start + len];
                            let parsed = if matches!(kind, Kind::End) {
                                parse_end(body).map(Event::End)
                            } else {
                                std::str::from_utf8(body)
                                    .ok()
                                    .and_then(|b| b.parse().ok())
                                    .map(Event::Started)
                            };
                            match parsed {
                                Some(ev) => events.push(ev),
                                None => events
                                    .push(Event::Data(buf[start..body_start + len + 2].to_vec())),
                            }
                            pos = body_start + len + 2;
                        }
                        Some(_) => {
                            events.push(Event::Data(buf[start..body_start].to_vec()));
                            pos = body_start;
                        }
                        None if buf.len() - body_start > MAX_MARKER => {
                            // Not a marker after all; release it as output.
                            events.push(Event::Data(buf[start..body_start].to_vec()));
                            pos = body_start;
                        }
                        None => {
                            // Incomplete: wait for the rest.
                            self.carry = buf[start..].to_vec();
                            return events;
                        }
                    }
                }
            }
        }
        // Hold back a tail that could be the start of a control string.
        let rest = &buf[pos..];
        let hold = self.partial_suffix(rest);
        if rest.len() > hold {
            events.push(Event::Data(rest[..rest.len() - hold].to_vec()));
        }
        self.carry = rest[rest.len() - hold..].to_vec();
        events
    }

    /// The earliest control string in `rest`: where it starts, and which it is.
    fn earliest(&self, rest: &[u8]) -> Option<(usize, Kind)> {
        let mut best: Option<(usize, Kind)> = None;
        let mut consider = |at: Option<usize>, kind: Kind| {
            if let Some(at) = at
                && best.is_none_or(|(b, _)| at < b)
            {
                best = Some((at, kind));
            }
        };
        consider(memmem::find(rest, &self.end_prefix), Kind::End);
        consider(memmem::find(rest, &self.start_prefix), Kind::Start);
        consider(memmem::find(rest, &self.prompt), Kind::Prompt);
        if let Some(c) = &self.continuation {
            consider(memmem::find(rest, c), Kind::Continuation);
        }
        best
    }

    /// Bytes held back (an incomplete control string at the end of the stream so far).
    pub fn pending(&self) -> &[u8] {
        &self.carry
    }

    /// Length of the longest suffix of `b` that is a proper prefix of a control string.
    /// Only suffixes starting with a pattern's first byte can be one, so those are found
    /// with `memchr` in the last bytes: O(pattern length) per read, not its square.
    fn partial_suffix(&self, b: &[u8]) -> usize {
        let mut best = 0;
        let pats = [
            Some(&self.end_prefix),
            Some(&self.start_prefix),
            Some(&self.prompt),
            self.continuation.as_ref(),
        ];
        for p in pats.into_iter().flatten() {
            let Some(&first) = p.first() else {
                continue;
            };
            let window = (p.len() - 1).min(b.len());
            let tail = &b[b.len() - window..];
            // Longest first: the earliest start in the window.
            for at in memchr::memchr_iter(first, tail) {
                let len = window - at;
                if len <= best {
                    break;
                }
                if tail[at..] == p[..len] {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

#[derive(Clone, Copy)]
enum Kind {
    End,
    Start,
    Prompt,
    Continuation,
}

fn parse_end(body: &[u8]) -> Option<EndMarker> {
    let s = std::str::from_utf8(body).ok()?;
    let mut parts = s.splitn(3, ';');
    let n = parts.next()?.parse().ok()?;
    let status = parts.next()?.to_string();
    let payload = parts.next().unwrap_or("").to_string();
    if status.is_empty()
        || !status
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '?' || c == '_')
    {
        return None;
    }
    Some(EndMarker { n, status, payload })
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "\x1b_rbx;abc;p\x1b\\";

    fn scanner() -> Scanner {
        Scanner::new("abc", P, Some("\x1b_rbx;abc;c\x1b\\"))
    }

    fn collect(s: &mut Scanner, chunks: &[&[u8]]) -> Vec<Event> {
        let mut out = Vec::new();
        for c in chunks {
            out.extend(s.feed(c));
        }
        // merge adjacent data for easy comparison
        let mut merged: Vec<Event> = Vec::new();
        for e in out {
            match (merged.last_mut(), e) {
                (Some(Event::Data(a)), Event::Data(b)) => a.extend(b),
                (_, e) => merged.push(e),
            }
        }
        merged
    }

    #[test]
    fn splits_output_marker_and_prompt() {
        let mut s = scanner();
        let ev = collect(
            &mut s,
            &[b"2\r\n\x1b_rbx;abc;e;7;error;eyJ9\x1b\\\x1b_rbx;abc;p\x1b\\"],
        );
        assert_eq!(
            ev,
            vec![
                Event::Data(b"2\r\n".to_vec()),
                Event::End(EndMarker {
                    n: 7,
                    status: "error".into(),
                    payload: "eyJ9".into()
                }),
                Event::Prompt
            ]
        );
    }

    #[test]
    fn byte_by_byte_gives_the_same_events() {
        let stream =
            b"hi\x1b_rbx;abc;p\x1b\\th\x1b_rbx;abc;s;12\x1b\\ere\x1b_rbx;abc;e;12;ok;\x1b\\tail";
        let whole = collect(&mut scanner(), &[stream]);
        let chunks: Vec<&[u8]> = stream.chunks(1).collect();
        let split = collect(&mut scanner(), &chunks);
        assert_eq!(whole, split);
        assert_eq!(
            whole,
            vec![
                Event::Data(b"hi".to_vec()),
                Event::Prompt,
                Event::Data(b"th".to_vec()),
                Event::Started(12),
                Event::Data(b"ere".to_vec()),
                Event::End(EndMarker {
                    n: 12,
                    status: "ok".into(),
                    payload: String::new()
                }),
                Event::Data(b"tail".to_vec()),
            ]
        );
    }

    #[test]
    fn lookalikes_are_output() {
        let mut s = scanner();
        // another nonce, a plain REPL prompt, a partial prefix followed by other text
        let text: &[u8] = b">>> \x1b_rbx;xyz;e;1;ok;\x1b\\ \x1b_rbx;ab!";
        let ev = collect(&mut s, &[text, b" more"]);
        let mut expected = text.to_vec();
        expected.extend_from_slice(b" more");
        assert_eq!(ev, vec![Event::Data(expected)]);
    }

    #[test]
    fn a_cut_control_string_is_held_back_and_nothing_else() {
        let mut s = scanner();
        // Text ending in the start of an end marker: the start waits, the rest goes.
        let ev = s.feed(b"abc\x1b\x1b_rbx;ab");
        assert_eq!(ev, vec![Event::Data(b"abc\x1b".to_vec())]);
        assert_eq!(s.pending(), b"\x1b_rbx;ab");
        let ev = s.feed(b"c;e;3;ok;\x1b\\");
        assert_eq!(
            ev[0],
            Event::End(EndMarker {
                n: 3,
                status: "ok".into(),
                payload: String::new()
            })
        );
        // Text with escapes that cannot start one goes at once.
        let ev = s.feed(b"x\x1b[1m\x1b");
        assert_eq!(ev, vec![Event::Data(b"x\x1b[1m".to_vec())]);
        assert_eq!(s.pending(), b"\x1b");
    }

    #[test]
    fn continuation_is_reported() {
        let mut s = scanner();
        let ev = collect(&mut s, &[b"\x1b_rbx;abc;c\x1b\\"]);
        assert_eq!(ev, vec![Event::Continuation]);
    }

    #[test]
    fn a_marker_body_over_the_bound_is_output_however_it_is_read() {
        let mut stream = b"\x1b_rbx;abc;e;3;ok;".to_vec();
        stream.extend(std::iter::repeat_n(b'A', MAX_MARKER));
        stream.extend_from_slice(b"\x1b\\after");
        let whole = collect(&mut scanner(), &[&stream]);
        let chunks: Vec<&[u8]> = stream.chunks(4096).collect();
        let split = collect(&mut scanner(), &chunks);
        assert_eq!(whole, split);
        assert_eq!(whole, vec![Event::Data(stream.clone())]);
        // At the bound it is still a marker.
        let mut at = b"\x1b_rbx;abc;e;3;ok;".to_vec();
        at.extend(std::iter::repeat_n(b'A', MAX_MARKER - "3;ok;".len()));
        at.extend_from_slice(b"\x1b\\");
        let ev = collect(&mut scanner(), &[&at]);
        assert!(
            matches!(ev.as_slice(), [Event::End(m)] if m.n == 3),
            "{ev:?}"
        );
    }

    #[test]
    fn malformed_marker_is_output() {
        let mut s = scanner();
        let ev = collect(&mut s, &[b"\x1b_rbx;abc;e;notanumber;ok;\x1b\\x"]);
        assert_eq!(
            ev,
            vec![Event::Data(
                b"\x1b_rbx;abc;e;notanumber;ok;\x1b\\x".to_vec()
            )]
        );
    }
}
