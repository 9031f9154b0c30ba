//! Output shaping: a bounded head+tail buffer, and the terminal renderer that turns what an
//! interpreter wrote to its PTY into the text a person would have seen.

use std::collections::VecDeque;

/// Keeps the first `head_cap` and the last `tail_cap` bytes of a stream and counts the rest.
/// Memory is O(cap) however much is pushed.
#[derive(Debug, Clone)]
pub struct HeadTail {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    head_cap: usize,
    tail_cap: usize,
    total: u64,
}

impl HeadTail {
    /// A buffer keeping `cap` bytes in all: half from the start, half from the end.
    pub fn new(cap: usize) -> Self {
        let head_cap = cap / 2;
        Self::with_caps(head_cap, cap - head_cap)
    }

    pub fn with_caps(head_cap: usize, tail_cap: usize) -> Self {
        Self {
            head: Vec::new(),
            tail: VecDeque::new(),
            head_cap,
            tail_cap,
            total: 0,
        }
    }

    pub fn push(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len() as u64;
        if self.head.len() < self.head_cap {
            let n = bytes.len().min(self.head_cap - self.head.len());
            self.head.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
        }
        if bytes.is_empty() || self.tail_cap == 0 {
            return;
        }
        if bytes.len() >= self.tail_cap {
            self.tail.clear();
            self.tail.extend(&bytes[bytes.len() - self.tail_cap..]);
        } else {
            let overflow = (self.tail.len() + bytes.len()).saturating_sub(self.tail_cap);
            self.tail.drain(..overflow);
            self.tail.extend(bytes);
        }
    }

    /// Bytes not kept.
    pub fn omitted(&self) -> u64 {
        self.total - (self.head.len() + self.tail.len()) as u64
    }

    /// The kept text, with a line saying how many bytes were left out between head and tail.
    /// Invalid UTF-8 becomes U+FFFD; a character cut by the head or tail boundary is counted
    /// as omitted rather than shown broken.
    pub fn finish(&self) -> (String, u64) {
        let mut tail: Vec<u8> = self.tail.iter().copied().collect();
        if self.omitted() == 0 {
            let mut all = self.head.clone();
            all.extend_from_slice(&tail);
            return (String::from_utf8_lossy(&all).into_owned(), 0);
        }
        let mut head = self.head.clone();
        let cut_head = incomplete_suffix(&head);
        head.truncate(head.len() - cut_head);
        let cut_tail = continuation_prefix(&tail);
        tail.drain(..cut_tail);
        let omitted = self.omitted() + cut_head as u64 + cut_tail as u64;
        let mut text = String::from_utf8_lossy(&head).into_owned();
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&format!("… {} bytes omitted …\n", group_thousands(omitted)));
        text.push_str(&String::from_utf8_lossy(&tail));
        (text, omitted)
    }
}

/// Length of an incomplete UTF-8 sequence at the end of `b`.
fn incomplete_suffix(b: &[u8]) -> usize {
    for back in 1..=b.len().min(3) {
        let byte = b[b.len() - back];
        if byte & 0xC0 == 0x80 {
            continue; // continuation byte: keep looking for the lead
        }
        let need = if byte >= 0xF0 {
            4
        } else if byte >= 0xE0 {
            3
        } else if byte >= 0xC0 {
            2
        } else {
            1
        };
        return if need > back { back } else { 0 };
    }
    0
}

/// Number of UTF-8 continuation bytes at the start of `b` (the rest of a cut character).
fn continuation_prefix(b: &[u8]) -> usize {
    b.iter().take(3).take_while(|&&c| c & 0xC0 == 0x80).count()
}

pub fn group_thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Turns raw terminal output into plain text, line by line, into a [`HeadTail`].
///
/// Lines are collected in small blocks. A block of plain lines (the vast majority) is copied
/// as it is, minus the `\r` the terminal adds before `\n`. A block holding escape sequences,
/// carriage returns or backspaces is rendered through a `vt100` screen, so colours vanish,
/// `\r` progress lines collapse to their final text and cursor movement within the block
/// (multi-line progress bars) is honoured.
pub struct Renderer {
    out: HeadTail,
    /// Complete lines not yet committed, each ending in `\n`.
    block: Vec<u8>,
    block_lines: usize,
    block_special: bool,
    /// Bytes of the current, unterminated line.
    partial: Vec<u8>,
}

/// Bounds on what is held before rendering, so memory stays bounded whatever the program
/// writes and a terminal screen never gets large.
const BLOCK_LINES: usize = 64;
const BLOCK_BYTES: usize = 16 * 1024;
const PARTIAL_BYTES: usize = 64 * 1024;

impl Renderer {
    pub fn new(cap: usize) -> Self {
        Self {
            out: HeadTail::new(cap),
            block: Vec::new(),
            block_lines: 0,
            block_special: false,
            partial: Vec::new(),
        }
    }

    pub fn push(&mut self, mut bytes: &[u8]) {
        while let Some(nl) = memchr::memchr(b'\n', bytes) {
            self.partial.extend_from_slice(&bytes[..nl]);
            self.line_done();
            bytes = &bytes[nl + 1..];
        }
        self.partial.extend_from_slice(bytes);
        if self.partial.len() > PARTIAL_BYTES {
            // An endless line (a progress bar that never prints a newline, or one huge
            // line): render it now and keep only its visible text.
            self.flush_block();
            let line = std::mem::take(&mut self.partial);
            if needs_terminal(&line) {
                let text = render(&line);
                if text.len() > PARTIAL_BYTES {
                    self.out.push(text.as_bytes());
                } else {
                    self.partial = text.into_bytes();
                }
            } else {
                self.out.push(&line);
            }
        }
    }

    fn line_done(&mut self) {
        let mut line = std::mem::take(&mut self.partial);
        while line.last() == Some(&b'\r') {
            line.pop();
        }
        self.block_special |= needs_terminal(&line);
        self.block.extend_from_slice(&line);
        self.block.push(b'\n');
        self.block_lines += 1;
        self.partial = line;
        self.partial.clear();
        if self.block_lines >= BLOCK_LINES || self.block.len() > BLOCK_BYTES {
            self.flush_block();
        }
    }

    fn flush_block(&mut self) {
        if self.block.is_empty() {
            return;
        }
        if self.block_special {
            let text = render(&self.block);
            self.out.push(text.as_bytes());
        } else {
            self.out.push(&self.block);
        }
        self.block.clear();
        self.block_lines = 0;
        self.block_special = false;
    }

    /// Render what is left and return the bounded text.
    pub fn finish(mut self) -> Rendered {
        if !self.partial.is_empty() {
            // The unterminated last line joins the block, so it may move the cursor too.
            self.block_special |= needs_terminal(&self.partial);
            let partial = std::mem::take(&mut self.partial);
            self.block.extend_from_slice(&partial);
        }
        self.flush_block();
        let (text, omitted) = self.out.finish();
        Rendered { text, omitted }
    }

    /// The last non-empty line so far, rendered (for progress messages).
    pub fn last_line(&self) -> String {
        if !self.partial.is_empty() {
            let text = render(&self.partial);
            if !text.trim().is_empty() {
                return text.trim_end().to_string();
            }
        }
        let recent: Vec<u8> = if !self.block.is_empty() {
            let start = self.block.len().saturating_sub(1024);
            self.block[start..].to_vec()
        } else {
            self.out.tail_bytes(1024)
        };
        let text = if needs_terminal(&recent) {
            render(&recent)
        } else {
            String::from_utf8_lossy(&recent).into_owned()
        };
        text.trim_end()
            .rsplit('\n')
            .next()
            .unwrap_or("")
            .to_string()
    }
}

impl HeadTail {
    /// The last `n` bytes kept (for previews).
    pub fn tail_bytes(&self, n: usize) -> Vec<u8> {
        if !self.tail.is_empty() {
            let skip = self.tail.len().saturating_sub(n);
            self.tail.iter().skip(skip).copied().collect()
        } else {
            let skip = self.head.len().saturating_sub(n);
            self.head[skip..].to_vec()
        }
    }
}

/// The result of rendering an evaluation's output.
#[derive(Debug, Clone)]
pub struct Rendered {
    pub text: String,
    /// Rendered bytes left out (0 when nothing was cut).
    pub omitted: u64,
}

/// Does this line need the terminal emulator (any control byte other than tab)?
fn needs_terminal(line: &[u8]) -> bool {
    line.iter()
        .any(|&b| (b < 0x20 && b != b'\t' && b != b'\n') || b == 0x7f)
}

/// Render lines (each ending in `\n`, the last one possibly unterminated) through a vt100
/// screen large enough that nothing scrolls off. The result has one `\n` per completed row.
fn render(block: &[u8]) -> String {
    let lines: Vec<&[u8]> = block.split(|&b| b == b'\n').collect();
    let widest = lines
        .iter()
        .map(|l| String::from_utf8_lossy(l).chars().count())
        .max()
        .unwrap_or(1);
    // Wide characters take two columns; cap the screen and let longer lines wrap.
    let cols = (widest * 2).clamp(1, 2000);
    let rows: usize = lines
        .iter()
        .map(|l| (l.len() * 2).div_ceil(cols).max(1))
        .sum::<usize>()
        + 1;
    let rows = rows.min(u16::MAX as usize) as u16;
    let cols = cols as u16;
    let mut parser = vt100::Parser::new(rows, cols, 0);
    // The lines reach us without the terminal's \r\n; restore it.
    let mut fed = Vec::with_capacity(block.len() + lines.len());
    for (i, line) in lines.iter().enumerate() {
        if i > 0 {
            fed.extend_from_slice(b"\r\n");
        }
        fed.extend_from_slice(line);
    }
    parser.process(&fed);
    let screen = parser.screen();
    let texts: Vec<String> = screen.rows(0, cols).collect();
    let (cur_row, _) = screen.cursor_position();
    let last_content = texts.iter().rposition(|t| !t.is_empty()).unwrap_or(0);
    let end_row = (cur_row as usize).max(last_content);
    let mut out = String::new();
    for (i, text) in texts.iter().enumerate().take(end_row + 1) {
        out.push_str(text);
        if i < end_row && !screen.row_wrapped(i as u16) {
            out.push('\n');
        }
    }
    out
}

/// Render a complete byte string (convenience for tests and one-off uses).
pub fn render_all(bytes: &[u8], cap: usize) -> Rendered {
    let mut r = Renderer::new(cap);
    r.push(bytes);
    r.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_tail_keeps_both_ends() {
        let mut b = HeadTail::new(10);
        for i in 0..100u8 {
            b.push(&[b'a' + (i % 26)]);
        }
        assert_eq!(b.omitted(), 90, "100 pushed, 10 kept");
        let (text, omitted) = b.finish();
        assert_eq!(omitted, 90);
        assert!(text.starts_with("abcde\n… 90 bytes omitted …\n"), "{text}");
        // last five pushed: i = 95..99 → 95%26=17 → 'r'..'v'
        assert!(text.ends_with("rstuv"), "{text}");
    }

    #[test]
    fn head_tail_big_push_and_untruncated() {
        let mut b = HeadTail::new(8);
        b.push(b"0123");
        let (t, o) = b.finish();
        assert_eq!((t.as_str(), o), ("0123", 0));
        b.push(&[b'x'; 1000]);
        b.push(b"END");
        let (t, o) = b.finish();
        assert_eq!(o, 1004 + 3 - 8);
        assert!(t.starts_with("0123\n…"));
        assert!(t.ends_with("xEND"));
    }

    #[test]
    fn head_tail_never_splits_a_character() {
        let mut b = HeadTail::new(8);
        b.push("ééééééééééé".as_bytes()); // 22 bytes
        let (t, _) = b.finish();
        assert!(!t.contains('\u{FFFD}'), "{t}");
        assert!(t.starts_with("éé\n"), "{t}");
        assert!(t.ends_with("éé"), "{t}");
    }

    #[test]
    fn thousands() {
        assert_eq!(group_thousands(0), "0");
        assert_eq!(group_thousands(999), "999");
        assert_eq!(group_thousands(1234567), "1,234,567");
    }

    #[test]
    fn plain_lines_pass_through() {
        let r = render_all(b"hello\r\nworld\r\n\tx y  \r\n", 1000);
        assert_eq!(r.text, "hello\nworld\n\tx y  \n");
    }

    #[test]
    fn progress_collapses_and_colours_vanish() {
        let r = render_all(b"10%\r50%\r100%\r\n\x1b[31mred\x1b[0m text\r\ndone", 1000);
        assert_eq!(r.text, "100%\nred text\ndone");
    }

    #[test]
    fn erase_line_and_backspace() {
        let r = render_all(b"abcdef\r\x1b[Kxy\r\nab\x08c\r\n", 1000);
        assert_eq!(r.text, "xy\nac\n");
    }

    #[test]
    fn unicode_exact() {
        let s = "héllo 世界 🎉\r\n";
        assert_eq!(render_all(s.as_bytes(), 1000).text, "héllo 世界 🎉\n");
        let colored = "\x1b[1mhéllo 世界 🎉\x1b[0m\r\n";
        assert_eq!(render_all(colored.as_bytes(), 1000).text, "héllo 世界 🎉\n");
    }

    #[test]
    fn endless_progress_line_stays_bounded() {
        let mut r = Renderer::new(1000);
        for i in 0..200_000 {
            r.push(format!("\r{i:>6}").as_bytes());
        }
        let out = r.finish();
        assert_eq!(out.text.trim(), "199999");
    }

    #[test]
    fn many_lines_bounded() {
        let mut r = Renderer::new(1000);
        for i in 0..200_000 {
            r.push(format!("line {i}\r\n").as_bytes());
        }
        let out = r.finish();
        assert!(out.omitted > 0);
        assert!(out.text.len() < 1100);
        assert!(out.text.starts_with("line 0\nline 1\n"));
        assert!(out.text.ends_with("line 199999\n"));
    }

    #[test]
    fn cursor_up_within_a_block() {
        // two bars redrawn in place with cursor-up
        let r = render_all(b"a 0%\r\nb 0%\r\n\x1b[2A\ra 100%\r\n\rb 100%\r\n", 1000);
        assert_eq!(r.text, "a 100%\nb 100%\n");
    }
}
