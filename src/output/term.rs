//! The renderer proper, synchronous: bytes in, the text a person would have seen out.
//!
//! Plain lines (no control byte but tab, ending in `\r\n` or `\n`) that start at a fresh line
//! are taken as they are, found with `memchr`: that is nearly all output. Everything else is
//! parsed ([`Parser`]) and drawn on the [`Screen`]. Drawing costs at most a few cells per byte
//! until a cursor jump or an edit of whole rows makes one sequence cost a row or the screen;
//! so drawing is paid from a budget per evaluation ([`BUDGET`]). Once it is spent, the rest
//! of the output is passed through with its escape sequences removed, not applied, and a
//! note says so.

use super::parse::{Csi, Parser, Sink};
use super::screen::{COLS, ROWS, Row, Screen};
use super::{Rendered, group_thousands};

/// Drawing work per evaluation (about a cell, a byte or a row each). A program's own
/// output, coloured and redrawn, uses a small part.
pub const BUDGET: u64 = 64 << 20;

/// Bytes handed to the parser at a time, so the budget is checked often...
const SLICE: usize = 4096;
/// ...and when the caller limits the work, more often still (a slice of hostile sequences
/// can cost a few hundred units a byte).
const LIMITED_SLICE: usize = 256;

pub struct Term {
    screen: Screen,
    parser: Parser,
    /// Drawing work done, against [`BUDGET`].
    work: u64,
    /// All work done, plain lines included (for callers that render a bounded amount at a
    /// time).
    effort: u64,
    /// The budget is spent: text only from here on.
    stripping: bool,
    notes: Vec<String>,
}

impl Term {
    pub fn new(cap: usize) -> Self {
        Self::with_whole(cap, 0)
    }

    /// See [`super::Renderer::with_whole`].
    pub fn with_whole(cap: usize, whole_cap: usize) -> Self {
        Term {
            screen: Screen::new(cap, whole_cap),
            parser: Parser::default(),
            work: 0,
            effort: 0,
            stripping: false,
            notes: Vec::new(),
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.push_some(bytes, u64::MAX);
    }

    /// Render a prefix of `bytes` costing about `limit` units of work (at least one slice);
    /// returns how many bytes were taken.
    pub fn push_some(&mut self, mut bytes: &[u8], limit: u64) -> usize {
        let len = bytes.len();
        let until = self.effort.saturating_add(limit);
        let slice = if limit == u64::MAX {
            SLICE
        } else {
            LIMITED_SLICE
        };
        while !bytes.is_empty() && self.effort < until {
            if !self.stripping && self.parser.idle() && self.screen.at_fresh_line() {
                let n = self.plain_lines(bytes);
                bytes = &bytes[n..];
                self.effort += (n / 64) as u64 + 1;
                if n > 0 {
                    continue;
                }
            }
            // Up to the next line end, so plain lines after it take the fast way again.
            let end = memchr::memchr(b'\n', &bytes[..bytes.len().min(slice)])
                .map_or(bytes.len().min(slice), |i| i + 1);
            let mut parser = std::mem::take(&mut self.parser);
            let before = self.work;
            parser.advance(self, &bytes[..end]);
            self.parser = parser;
            self.effort += self.work - before + end as u64 / 8;
            bytes = &bytes[end..];
        }
        len - bytes.len()
    }

    /// Take the plain lines at the start of `bytes` as they are; returns the bytes taken.
    fn plain_lines(&mut self, bytes: &[u8]) -> usize {
        let mut taken = 0;
        while let Some(nl) = memchr::memchr(b'\n', &bytes[taken..]) {
            let mut line = &bytes[taken..taken + nl];
            while let [rest @ .., b'\r'] = line {
                line = rest;
            }
            if !is_plain(line) {
                break;
            }
            // A line wider than a row wraps (and is joined again when written out).
            while line.len() > COLS {
                // At a character's start, unless the bytes are not UTF-8 at all.
                let mut cut = COLS;
                while cut > COLS - 3 && line[cut] & 0xC0 == 0x80 {
                    cut -= 1;
                }
                self.screen.plain_line(Row::plain(&line[..cut], true));
                line = &line[cut..];
            }
            self.screen.plain_line(Row::plain(line, false));
            taken += nl + 1;
        }
        taken
    }

    /// Count `cost` against the budget. Checked after every character and sequence, so
    /// where stripping starts depends on the bytes only, not on how they were cut into reads.
    fn spend(&mut self, cost: u64) {
        self.work += cost;
        if !self.stripping && self.work > BUDGET {
            self.start_stripping();
        }
    }

    /// The budget is spent: the screen goes out as it stands, then text only.
    fn start_stripping(&mut self) {
        self.screen.flush();
        self.stripping = true;
        self.notes.push(
            "escape sequences and redraws used up the terminal rendering budget; past that \
point the output is shown with its escape sequences removed, not applied"
                .to_string(),
        );
    }

    /// Render what is left and return the bounded text.
    pub fn finish(mut self) -> Rendered {
        self.screen.flush();
        let hidden = self.parser.open_string();
        if hidden > 0 {
            self.notes.push(format!(
                "the output ended inside an escape string (OSC, DCS or APC) that was never \
terminated; its {} bytes are not shown",
                group_thousands(hidden)
            ));
        }
        let (text, omitted) = self.screen.out.finish();
        Rendered {
            text,
            omitted,
            notes: self.notes,
            whole: self.screen.out.whole(),
        }
    }

    /// The last non-empty line so far, rendered (for progress messages).
    pub fn last_line(&self) -> String {
        if let Some(line) = self.screen.last_text() {
            return line;
        }
        let recent = self.screen.out.tail_bytes(1024);
        String::from_utf8_lossy(&recent)
            .trim_end()
            .rsplit('\n')
            .next()
            .unwrap_or("")
            .to_string()
    }

    fn csi_dispatch(&mut self, csi: &Csi, action: u8) -> u64 {
        let s = &mut self.screen;
        let n = |i: usize| csi.arg(i, 1) as usize;
        if let Some(private) = csi.private {
            if private == b'?' && matches!(action, b'h' | b'l') {
                let on = action == b'h';
                let mut cost = 1;
                for &mode in csi.params() {
                    match mode {
                        47 | 1047 | 1049 => cost += s.alternate(on),
                        1048 if on => s.save_cursor(),
                        1048 => s.restore_cursor(),
                        _ => {}
                    }
                }
                return cost;
            }
            return 1;
        }
        if csi.intermediate {
            return 1;
        }
        match action {
            b'A' => s.move_rows(-(n(0) as isize)),
            b'B' | b'e' => s.move_rows(n(0) as isize),
            b'C' | b'a' => s.move_cols(n(0) as isize),
            b'D' => s.move_cols(-(n(0) as isize)),
            b'E' => {
                s.move_rows(n(0) as isize);
                s.carriage_return();
            }
            b'F' => {
                s.move_rows(-(n(0) as isize));
                s.carriage_return();
            }
            b'G' | b'`' => {
                let y = s.y;
                s.goto(y, n(0) - 1);
            }
            b'd' => {
                let x = s.x;
                s.goto(n(0) - 1, x);
            }
            b'H' | b'f' => s.goto(n(0) - 1, n(1) - 1),
            b'J' => return s.erase_display(csi.arg(0, 0)),
            b'K' => return s.erase_line(csi.arg(0, 0)),
            b'X' => return s.erase_chars(n(0)),
            b'@' => return s.insert_chars(n(0)),
            b'P' => return s.delete_chars(n(0)),
            b'L' => return s.insert_or_delete_rows(n(0), true),
            b'M' => return s.insert_or_delete_rows(n(0), false),
            b'S' => return s.scroll_up(n(0)),
            b'T' if csi.params().len() <= 1 => return s.scroll_down(n(0)),
            b'r' => s.set_region(n(0) - 1, csi.arg(1, ROWS as u16) as usize - 1),
            b's' if csi.params().is_empty() => s.save_cursor(),
            b'u' => s.restore_cursor(),
            _ => {}
        }
        1
    }
}

impl Sink for Term {
    fn text(&mut self, run: &[u8]) {
        if self.stripping {
            self.screen.out.push(run);
            return;
        }
        if run.is_ascii() {
            for (i, &b) in run.iter().enumerate() {
                let cost = self.screen.print(b as char);
                self.spend(cost);
                if self.stripping {
                    self.screen.out.push(&run[i + 1..]);
                    return;
                }
            }
        } else {
            let text = String::from_utf8_lossy(run);
            for (i, ch) in text.char_indices() {
                let cost = self.screen.print(ch);
                self.spend(cost);
                if self.stripping {
                    self.screen.out.push(text[i + ch.len_utf8()..].as_bytes());
                    return;
                }
            }
        }
    }

    fn control(&mut self, byte: u8) {
        if self.stripping {
            if matches!(byte, b'\n' | b'\t') {
                self.screen.out.push(&[byte]);
            }
            return;
        }
        let cost = match byte {
            b'\r' => {
                self.screen.carriage_return();
                1
            }
            b'\n' | 0x0b | 0x0c => self.screen.line_feed(),
            0x08 => {
                self.screen.backspace();
                1
            }
            b'\t' => {
                self.screen.tab();
                1
            }
            _ => 1,
        };
        self.spend(cost);
    }

    fn csi(&mut self, csi: &Csi, action: u8) {
        if !self.stripping {
            let cost = 4 + self.csi_dispatch(csi, action);
            self.spend(cost);
        }
    }

    fn esc(&mut self, intermediate: Option<u8>, action: u8) {
        if self.stripping || intermediate.is_some() {
            return;
        }
        let s = &mut self.screen;
        let cost = 4 + match action {
            b'7' => {
                s.save_cursor();
                1
            }
            b'8' => {
                s.restore_cursor();
                1
            }
            b'D' => s.line_feed(),
            b'E' => {
                s.carriage_return();
                s.line_feed()
            }
            b'M' => s.reverse_index(),
            b'c' => s.reset(),
            _ => 1,
        };
        self.spend(cost);
    }
}

/// No control byte but tab (the line end is already cut off).
fn is_plain(line: &[u8]) -> bool {
    // No early exit: this form is vectorised, and lines are short.
    !line.iter().fold(false, |bad, &b| {
        bad | ((b < 0x20) & (b != b'\t')) | (b == 0x7f)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(bytes: &[u8]) -> String {
        let mut t = Term::new(1 << 20);
        t.push(bytes);
        t.finish().text
    }

    #[test]
    fn clearing_the_screen_keeps_what_it_showed() {
        for clear in [
            "\x1b[2J\x1b[H",
            "\x1b[H\x1b[2J",
            "\x1b[2J",
            "\x1b[3J\x1b[H\x1b[2J",
            "\x1b[H\x1b[2J\x1b[3J",
            "\x1bc",
        ] {
            let stream = format!("before\r\n{clear}after\r\n");
            assert_eq!(render(stream.as_bytes()), "before\nafter\n", "{clear:?}");
        }
        // A full-screen redraw loop keeps each frame.
        assert_eq!(
            render(b"\x1b[H\x1b[2Jframe 1\r\n\x1b[H\x1b[2Jframe 2\r\n"),
            "frame 1\nframe 2\n"
        );
    }

    #[test]
    fn cursor_home_overwrites_the_screen_not_the_scrollback() {
        let mut stream = String::new();
        for i in 0..100 {
            stream.push_str(&format!("l{i}\r\n"));
        }
        stream.push_str("\x1b[HX");
        let text = render(stream.as_bytes());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 100, "{text}");
        // 51 rows scrolled off; the first of the 49 still shown was overwritten.
        assert_eq!(lines[50], "l50");
        assert_eq!(lines[51], "X51");
        assert_eq!(lines[99], "l99");
        assert!(text.ends_with("l99\n"));
    }

    #[test]
    fn progress_bars_collapse() {
        assert_eq!(render(b"10%\r50%\r100%\r\n"), "100%\n");
        // Two bars redrawn with cursor-up and erase-below, as multi-bar libraries do.
        let mut stream = b"a 0%\r\nb 0%\r\n".to_vec();
        for p in [10, 50, 100] {
            stream.extend_from_slice(format!("\x1b[2A\x1b[Ja {p}%\r\nb {p}%\r\n").as_bytes());
        }
        assert_eq!(render(&stream), "a 100%\nb 100%\n");
        // A bar redrawn with erase-line and cursor save/restore.
        assert_eq!(
            render(b"\x1b7step 1\x1b8\x1b[Kstep 2\x1b8\x1b[2Kdone\r\n"),
            "done\n"
        );
        // A bar whose cursor ends above its last line still ends that line.
        assert_eq!(render(b"a 0%\r\nb 0%\r\n\x1b[2A\ra 1%"), "a 1%\nb 0%\n");
    }

    #[test]
    fn alternate_screen_pictures_are_kept_in_order() {
        assert_eq!(
            render(b"main\r\n\x1b[?1049h\x1b[Hframe 1\x1b[H\x1b[2Jframe 2\x1b[?1049lafter\r\n"),
            "main\nframe 1\nframe 2\nafter\n"
        );
    }

    #[test]
    fn scroll_regions() {
        // Rows leaving a region at the top of the screen go to the scrollback...
        assert_eq!(render(b"\x1b[1;3ra\r\nb\r\nc\r\nd\r\n"), "a\nb\nc\nd\n");
        // ...rows leaving a region below it are lost, as on a terminal.
        assert_eq!(
            render(b"top\r\n\x1b[2;3r\x1b[2;1Ha\r\nb\r\nc\r\n"),
            "top\nc\n"
        );
        // Insert and delete lines, reverse index at the top.
        assert_eq!(
            render(b"1\r\n2\r\n3\x1b[2;1H\x1b[Lx\x1b[1;1H\x1b[M\x1b[1;1H\x1bMy"),
            "y\nx\n2\n3\n"
        );
    }

    #[test]
    fn wide_and_combining_characters() {
        assert_eq!(render("ab日\rX\r\n".as_bytes()), "Xb日\n");
        // Overwriting half of a wide character blanks the other half.
        assert_eq!(render("日本\x1b[2Gx\r\n".as_bytes()), " x本\n");
        // A combining accent stays with its letter when the row is redrawn.
        assert_eq!(render("xe\u{301}\rX\r\n".as_bytes()), "Xe\u{301}\n");
        // Tabs move the cursor; a plain line keeps them as they are.
        assert_eq!(
            render(b"a\tb\r\x1b[Cc\r\n\tplain\r\n"),
            "ac      b\n\tplain\n"
        );
    }

    #[test]
    fn parameters_are_clamped_to_the_screen() {
        let text = render(b"\x1b[99999;99999Hx\r\n");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), ROWS, "{text}");
        assert_eq!(lines[ROWS - 1].len(), COLS);
        assert!(lines[ROWS - 1].ends_with(" x"));
        assert_eq!(render(b"ab\x1b[99999Dc\x1b[99999Cd\r\n").len(), COLS + 1);
    }

    #[test]
    fn long_lines_wrap_and_join() {
        let line = "é".repeat(3000);
        let text = render(format!("{line}\r\n{line}").as_bytes());
        assert_eq!(text, format!("{line}\n{line}"));
        let text = render(format!("{line}\rX\r\n").as_bytes());
        assert!(text.starts_with(&"é".repeat(2000)), "wrapped at COLS");
        assert!(text.ends_with(&format!("X{}\n", "é".repeat(999))));
    }

    /// Hostile streams: their work is bounded by the budget plus a little per byte, and
    /// what they print still comes out, escape sequences removed.
    #[test]
    fn hostile_streams_cost_at_most_the_budget() {
        let repeat = |unit: &str, n: usize| unit.repeat(n).into_bytes();
        let floods: Vec<(&str, Vec<u8>)> = vec![
            (
                "jump and clear",
                repeat("\x1b[999999;999999H\x1b[2J", 200_000),
            ),
            (
                "jump, print, clear",
                repeat("\x1b[999;999Hx\x1b[2J", 200_000),
            ),
            (
                "insert lines and chars",
                repeat("\x1b[999;1Hx\x1b[1;1H\x1b[999L\x1b[999@", 200_000),
            ),
            (
                "scroll a region",
                repeat("\x1b[2;49r\x1b[49;1H\n\n\n\x1b[9S\x1b[9T", 200_000),
            ),
            (
                "alternate screens",
                repeat("\x1b[?1049hframe\r\n\x1b[?1049l", 200_000),
            ),
            ("backspaces", repeat("\x08", 1 << 20)),
            (
                "combining marks",
                repeat("\x1b[1;1Ha\u{301}\u{302}\u{303}\u{304}", 200_000),
            ),
        ];
        for (what, mut bytes) in floods {
            bytes.extend_from_slice(b"\r\nthe end\r\n");
            let mut t = Term::new(64 * 1024);
            t.push(&bytes);
            let (work, effort) = (t.work, t.effort);
            let out = t.finish();
            assert!(work <= BUDGET + (4 << 20), "{what}: {work} work");
            assert!(
                effort <= BUDGET + (4 << 20) + bytes.len() as u64,
                "{what}: {effort} effort for {} bytes",
                bytes.len()
            );
            assert!(out.text.len() <= 64 * 1024 + 64, "{what}");
            assert!(out.text.ends_with("the end\n"), "{what}: {}", out.text);
        }
    }

    #[test]
    fn a_spent_budget_strips_the_rest_and_says_so() {
        let mut t = Term::new(1 << 20);
        t.push(&"\x1b[999;999Hx\x1b[2J".repeat(100_000).into_bytes());
        assert!(t.stripping, "{} work", t.work);
        t.push(b"\x1b[31mred\x1b[0m\r\n10%\r20%\r\n");
        let out = t.finish();
        assert!(
            out.text.ends_with("xxred\n10%20%\n"),
            "{}",
            &out.text[out.text.len() - 40..]
        );
        assert_eq!(out.notes.len(), 1, "{:?}", out.notes);
        assert!(out.notes[0].contains("rendering budget"), "{:?}", out.notes);
    }

    #[test]
    fn an_unterminated_string_is_hidden_and_noted() {
        let mut t = Term::new(1000);
        t.push(b"shown\r\n\x1b]0;");
        t.push(&[b'x'; 100_000]);
        let out = t.finish();
        assert_eq!(out.text, "shown\n");
        assert!(out.notes[0].contains("100,002 bytes"), "{:?}", out.notes);
    }

    #[test]
    fn limited_pushes_take_part_and_resume() {
        let bytes = "\x1b[999;999Hx\x1b[2J".repeat(10_000).into_bytes();
        let whole = render(&bytes);
        let mut t = Term::new(1 << 20);
        let mut rest = &bytes[..];
        let mut pushes = 0;
        while !rest.is_empty() {
            let before = t.effort;
            let n = t.push_some(rest, 16 * 1024);
            assert!(n > 0);
            assert!(
                t.effort - before <= 16 * 1024 + 256 * 4096,
                "one slice at most beyond"
            );
            rest = &rest[n..];
            pushes += 1;
        }
        assert!(pushes > 10);
        assert_eq!(t.finish().text, whole);
    }
}
