//! The terminal's byte-stream parser: the states of a VT500-series terminal that matter for
//! text (ground, escape, control sequence, and the strings OSC, DCS, SOS, PM and APC).
//!
//! Everything it keeps is fixed-size: at most [`MAX_PARAMS`] parameters, each saturating at
//! `u16::MAX`; a string's contents are skipped, not kept, however long it is (only counted).
//! So memory does not depend on what a program prints, and each byte costs O(1).
//!
//! Why not the `vte` crate (tried, measured): its state table renders differently on hostile
//! output (BEL does not end a DCS, SOS, PM or APC string, so one unended string hides the
//! rest of a cell; ESC followed by DEL or a non-ASCII byte swallows what follows; C1 written
//! as UTF-8 cannot be told from a raw C1 byte): 1,490 of 2,067 inputs (the fuzz corpora and
//! seeded hostile streams) rendered to other text. Keeping our rendering would mean a scan
//! with these rules in front of it, so parsing every byte twice. It was also slower, 1.07x
//! (cursor flood) to 1.59x (coloured lines), optimised, in the same process. Its std build
//! keeps an OSC string's contents without a bound; without std it is bounded.

/// Parameters of a control sequence beyond this many make it ignored.
pub(super) const MAX_PARAMS: usize = 16;

/// A complete control sequence: `CSI [private] params [intermediate] final`.
#[derive(Debug, Default, Clone)]
pub(super) struct Csi {
    params: [u16; MAX_PARAMS],
    len: usize,
    /// The private marker (`?`, `>`, `<`, `=`), if the sequence began with one.
    pub(super) private: Option<u8>,
    /// Whether it had intermediate bytes (` `, `!`, `"`, …).
    pub(super) intermediate: bool,
    /// Too many parameters, or a byte out of place: the sequence is to be ignored.
    ignore: bool,
    /// Digits of the parameter being read (so an empty one reads as absent).
    digits: bool,
    current: u32,
}

impl Csi {
    /// Parameter `i`, or `default` when absent or 0 (as most sequences read them).
    pub(super) fn arg(&self, i: usize, default: u16) -> u16 {
        match self.params.get(i).copied() {
            Some(v) if i < self.len && v != 0 => v,
            _ => default,
        }
    }

    /// The parameters given.
    pub(super) fn params(&self) -> &[u16] {
        &self.params[..self.len]
    }

    fn reset(&mut self) {
        *self = Csi::default();
    }

    fn end_param(&mut self) {
        if self.len == MAX_PARAMS {
            self.ignore = true;
        } else {
            self.params[self.len] = self.current.min(u16::MAX as u32) as u16;
            self.len += 1;
        }
        self.current = 0;
        self.digits = false;
    }
}

/// What the parser finds, handed to the screen (or the stripper).
pub(super) trait Sink {
    /// A run of printable bytes: no C0 control and no DEL. UTF-8, possibly invalid; a
    /// character split across pushes is held back and handed over whole.
    fn text(&mut self, run: &[u8]);
    /// A C0 control other than ESC, CAN and SUB (which the parser handles).
    fn control(&mut self, byte: u8);
    fn csi(&mut self, csi: &Csi, action: u8);
    /// `ESC [intermediate] final`.
    fn esc(&mut self, intermediate: Option<u8>, action: u8);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum State {
    #[default]
    Ground,
    Escape,
    EscapeIntermediate,
    Csi,
    CsiIgnore,
    /// Inside OSC, DCS, SOS, PM or APC: skipped until BEL, ST (`ESC \`), CAN or SUB.
    Str,
    /// `ESC` inside a string: `\` ends it, anything else ends it and starts a sequence.
    StrEscape,
}

#[derive(Debug, Default)]
pub(super) struct Parser {
    state: State,
    csi: Csi,
    esc_intermediate: Option<u8>,
    /// The start of a UTF-8 character cut by the end of the last push.
    utf8: [u8; 4],
    utf8_len: usize,
    /// Bytes of the current string (OSC, DCS, …) skipped so far.
    string_bytes: u64,
}

const ESC: u8 = 0x1b;
const CAN: u8 = 0x18;
const SUB: u8 = 0x1a;
const BEL: u8 = 0x07;

impl Parser {
    /// In the ground state with nothing held back: the next byte starts afresh.
    pub(super) fn idle(&self) -> bool {
        self.state == State::Ground && self.utf8_len == 0
    }

    /// Bytes of an unterminated string skipped so far (0 outside strings).
    pub(super) fn open_string(&self) -> u64 {
        if matches!(self.state, State::Str | State::StrEscape) {
            self.string_bytes
        } else {
            0
        }
    }

    pub(super) fn advance(&mut self, sink: &mut impl Sink, bytes: &[u8]) {
        let mut i = 0;
        if self.utf8_len > 0 {
            i = self.finish_char(sink, bytes);
        }
        while i < bytes.len() {
            match self.state {
                State::Ground => i += self.ground(sink, &bytes[i..]),
                State::Str => i += self.skip_string(&bytes[i..]),
                _ => {
                    self.byte(sink, bytes[i]);
                    i += 1;
                }
            }
        }
    }

    /// Complete the character held back from the last push with the continuation bytes at
    /// the start of `bytes`; returns how many were used.
    fn finish_char(&mut self, sink: &mut impl Sink, bytes: &[u8]) -> usize {
        let need = utf8_len(self.utf8[0]);
        let mut used = 0;
        while self.utf8_len < need
            && used < bytes.len()
            && bytes[used] & 0xC0 == 0x80
            && self.state == State::Ground
        {
            self.utf8[self.utf8_len] = bytes[used];
            self.utf8_len += 1;
            used += 1;
        }
        if self.utf8_len == need || used < bytes.len() {
            // Complete, or cut short by something else: either way it goes now (an
            // incomplete one renders as U+FFFD).
            let held = self.utf8;
            let n = std::mem::take(&mut self.utf8_len);
            sink.text(&held[..n]);
        }
        used
    }

    /// Ground state: a run of printable bytes, then the byte that ended it.
    fn ground(&mut self, sink: &mut impl Sink, bytes: &[u8]) -> usize {
        let run = bytes
            .iter()
            .position(|&b| b < 0x20 || b == 0x7f)
            .unwrap_or(bytes.len());
        if run > 0 {
            let mut text = &bytes[..run];
            if run == bytes.len() {
                // Hold back a character cut by the end of this push.
                let cut = incomplete_suffix(text);
                if cut > 0 {
                    self.utf8[..cut].copy_from_slice(&text[text.len() - cut..]);
                    self.utf8_len = cut;
                    text = &text[..text.len() - cut];
                }
            }
            if !text.is_empty() {
                sink.text(text);
            }
        }
        if run < bytes.len() {
            self.byte(sink, bytes[run]);
            run + 1
        } else {
            run
        }
    }

    /// Skip string contents up to the next byte that can end the string.
    fn skip_string(&mut self, bytes: &[u8]) -> usize {
        let end = memchr::memchr3(BEL, ESC, CAN, bytes).unwrap_or(bytes.len());
        let end = memchr::memchr(SUB, &bytes[..end]).unwrap_or(end);
        self.string_bytes += end as u64;
        if end < bytes.len() {
            self.state = match bytes[end] {
                ESC => State::StrEscape,
                _ => State::Ground,
            };
            end + 1
        } else {
            end
        }
    }

    /// One byte outside the ground state's runs.
    fn byte(&mut self, sink: &mut impl Sink, b: u8) {
        match (self.state, b) {
            // Anywhere: CAN and SUB abort a sequence, ESC starts a new one.
            (State::StrEscape, b'\\') => self.state = State::Ground,
            (_, CAN | SUB) => self.state = State::Ground,
            (_, ESC) => {
                self.state = State::Escape;
                self.esc_intermediate = None;
            }
            (State::StrEscape, _) => {
                // The string ended; the byte is read as if after ESC.
                self.state = State::Escape;
                self.esc_intermediate = None;
                self.byte(sink, b);
            }
            (State::Ground, 0x7f) => {}
            (_, 0x00..=0x1f) => sink.control(b),
            (State::Ground, _) => {}
            (State::Escape, b'[') => {
                self.csi.reset();
                self.state = State::Csi;
            }
            (State::Escape, b']' | b'P' | b'X' | b'^' | b'_') => {
                self.string_bytes = 0;
                self.state = State::Str;
            }
            (State::Escape | State::EscapeIntermediate, 0x20..=0x2f) => {
                self.esc_intermediate.get_or_insert(b);
                self.state = State::EscapeIntermediate;
            }
            (State::Escape | State::EscapeIntermediate, 0x30..=0x7e) => {
                self.state = State::Ground;
                sink.esc(self.esc_intermediate, b);
            }
            (State::Escape | State::EscapeIntermediate, _) => self.state = State::Ground,
            (State::Csi, b'0'..=b'9') => {
                let c = &mut self.csi;
                c.current = (c.current * 10 + (b - b'0') as u32).min(u16::MAX as u32);
                c.digits = true;
            }
            (State::Csi, b';' | b':') => self.csi.end_param(),
            (State::Csi, 0x3c..=0x3f) => {
                if self.csi.len == 0 && !self.csi.digits && self.csi.private.is_none() {
                    self.csi.private = Some(b);
                } else {
                    self.state = State::CsiIgnore;
                }
            }
            (State::Csi, 0x20..=0x2f) => self.csi.intermediate = true,
            (State::Csi, 0x40..=0x7e) => {
                self.state = State::Ground;
                if self.csi.digits || self.csi.len > 0 {
                    self.csi.end_param();
                }
                if !self.csi.ignore {
                    sink.csi(&self.csi, b);
                }
            }
            (State::Csi, _) => self.state = State::CsiIgnore,
            (State::CsiIgnore, 0x40..=0x7e) => self.state = State::Ground,
            (State::CsiIgnore, _) => {}
            (State::Str, _) => self.string_bytes += 1,
        }
    }
}

/// Bytes in a UTF-8 character that starts with `lead` (1 for anything that is not a lead).
fn utf8_len(lead: u8) -> usize {
    match lead {
        0xF0..=0xF7 => 4,
        0xE0..=0xEF => 3,
        0xC0..=0xDF => 2,
        _ => 1,
    }
}

/// Length of an incomplete UTF-8 character at the end of `b` (0 when it ends whole).
pub(super) fn incomplete_suffix(b: &[u8]) -> usize {
    for back in 1..=b.len().min(3) {
        let byte = b[b.len() - back];
        if byte & 0xC0 == 0x80 {
            continue; // continuation byte: keep looking for the lead
        }
        return if utf8_len(byte) > back { back } else { 0 };
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records what the parser found, as text.
    #[derive(Default)]
    struct Log(Vec<String>);

    impl Sink for Log {
        fn text(&mut self, run: &[u8]) {
            self.0.push(format!("T{}", String::from_utf8_lossy(run)));
        }
        fn control(&mut self, byte: u8) {
            self.0.push(format!("C{byte}"));
        }
        fn csi(&mut self, csi: &Csi, action: u8) {
            let p: Vec<String> = csi.params().iter().map(|p| p.to_string()).collect();
            let private = csi.private.map(|c| c as char).unwrap_or(' ');
            self.0
                .push(format!("S{private}{}{}", p.join(";"), action as char));
        }
        fn esc(&mut self, intermediate: Option<u8>, action: u8) {
            let i = intermediate.map(|c| c as char).unwrap_or(' ');
            self.0.push(format!("E{i}{}", action as char));
        }
    }

    fn parse(chunks: &[&[u8]]) -> Vec<String> {
        let mut p = Parser::default();
        let mut log = Log::default();
        for c in chunks {
            p.advance(&mut log, c);
        }
        log.0
    }

    #[test]
    fn sequences_and_text() {
        assert_eq!(
            parse(&[b"ab\x1b[1;22Hc\r\n\x1b[?1049h\x1b7\x1b(B"]),
            [
                "Tab", "S 1;22H", "Tc", "C13", "C10", "S?1049h", "E 7", "E(B"
            ]
        );
    }

    /// Adjacent text runs joined (a split may cut a run in two).
    fn merged(log: Vec<String>) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for e in log {
            match (out.last_mut(), e.strip_prefix('T')) {
                (Some(last), Some(t)) if last.starts_with('T') => last.push_str(t),
                _ => out.push(e),
            }
        }
        out
    }

    #[test]
    fn split_anywhere_gives_the_same() {
        let stream = "x\x1b[12;3Hé世\x1b]0;title\x07y\x1b_apc\x1b\\z\x1b[?25l".as_bytes();
        let whole = parse(&[stream]);
        assert_eq!(whole, ["Tx", "S 12;3H", "Té世", "Ty", "Tz", "S?25l"]);
        for cut in 0..stream.len() {
            let split = parse(&[&stream[..cut], &stream[cut..]]);
            assert_eq!(merged(split), merged(whole.clone()), "cut at {cut}");
        }
    }

    #[test]
    fn strings_are_skipped_not_kept() {
        let mut p = Parser::default();
        let mut log = Log::default();
        p.advance(&mut log, b"\x1b]0;");
        for _ in 0..1000 {
            p.advance(&mut log, &[b'x'; 4096]);
        }
        assert_eq!(p.open_string(), 4096 * 1000 + 2);
        assert!(log.0.is_empty());
        p.advance(&mut log, b"\x1b\\ok");
        assert_eq!(p.open_string(), 0);
        assert_eq!(log.0, ["Tok"]);
    }

    #[test]
    fn huge_parameters_saturate_and_too_many_are_ignored() {
        let mut many = b"\x1b[".to_vec();
        for _ in 0..100_000 {
            many.extend_from_slice(b"1;");
        }
        many.extend_from_slice(b"Hz\x1b[99999999999999;7A");
        assert_eq!(parse(&[&many]), ["Tz", "S 65535;7A"]);
    }

    #[test]
    fn controls_inside_a_sequence_and_aborts() {
        assert_eq!(
            parse(&[b"\x1b[2\r;3Ha\x1b[5\x18b\x1b[?1;2\x1b[Kc"]),
            ["C13", "S 2;3H", "Ta", "Tb", "S K", "Tc"]
        );
    }
}
