//! The screen a session's output is drawn on: [`ROWS`] rows, the cursor, the scroll region,
//! and what has left the screen (the scrollback, kept in a [`HeadTail`]).
//!
//! What a terminal's scrollback would keep is kept: rows that scroll off the top, and the
//! whole screen when it is cleared (`ESC[2J`), reset (`ESC c`) or swapped for the alternate
//! screen, so a program that clears the screen does not hide what it printed before.
//! Everything is bounded: a row holds at most [`COLS`] cells, the screen [`ROWS`] rows, and
//! every cursor position is clamped to them; each operation returns its cost, which the
//! caller counts against its budget.

use std::collections::VecDeque;

use unicode_width::UnicodeWidthChar;

use super::HeadTail;

/// Rows of the screen: the session terminal's (`exec::pty::ROWS`), so a program moving the
/// cursor up or home lands where it would on the terminal it was given.
pub const ROWS: usize = 50;
/// Cells of a row. Wider than the terminal's 200 columns, so a long line redrawn with `\r`
/// still collapses to one line; longer lines wrap and are joined again when written out.
pub const COLS: usize = 2000;

/// A cell never written, or erased.
const EMPTY: u32 = 0x11_0000;
/// The right half of a wide character.
const TAIL: u32 = 0x11_0001;
/// Zero-width characters (combining marks, joiners) kept per row.
const MAX_EXTRAS: usize = 256;

/// One row. A plain line is kept as its bytes (`text`) until something edits it; then it
/// becomes cells, one per column.
#[derive(Debug, Default)]
pub(super) struct Row {
    text: Vec<u8>,
    cells: Vec<u32>,
    /// Zero-width characters written after the cell at a column.
    extras: Vec<(u32, char)>,
    edited: bool,
    /// The row continues on the next one (it was wrapped, not ended by a line feed).
    pub(super) wrapped: bool,
}

impl Row {
    pub(super) fn plain(text: &[u8], wrapped: bool) -> Self {
        Row {
            text: text.to_vec(),
            wrapped,
            ..Row::default()
        }
    }

    fn is_blank(&self) -> bool {
        if self.edited {
            // Cells end with a written one (see `trim`).
            self.cells.is_empty() && self.extras.is_empty()
        } else {
            self.text.is_empty()
        }
    }

    /// The row's text (no line end). Erased cells inside it are spaces; trailing ones are
    /// left out.
    pub(super) fn write_to(&self, out: &mut Vec<u8>) {
        if !self.edited {
            out.extend_from_slice(&self.text);
            return;
        }
        let Some(last) = self.cells.iter().rposition(|&c| c != EMPTY) else {
            return;
        };
        let mut extras = self.extras.clone();
        extras.sort_by_key(|e| e.0);
        let mut next = extras.iter().peekable();
        let mut buf = [0u8; 4];
        for (i, &c) in self.cells[..=last].iter().enumerate() {
            match c {
                EMPTY => out.push(b' '),
                TAIL => {}
                c => {
                    let ch = char::from_u32(c).unwrap_or('\u{FFFD}');
                    out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                }
            }
            while let Some((_, ch)) = next.next_if(|e| e.0 as usize == i) {
                out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
            }
        }
    }

    /// The cells, made from the text on first use. Costs the text's length once.
    fn cells(&mut self) -> &mut Vec<u32> {
        if !self.edited {
            self.edited = true;
            let text = std::mem::take(&mut self.text);
            let mut x = 0;
            for ch in String::from_utf8_lossy(&text).chars() {
                if ch == '\t' {
                    x = next_tab(x);
                } else {
                    match ch.width() {
                        Some(0) => self.attach(x, ch),
                        Some(w) if x + w <= COLS => {
                            self.put(x, ch, w);
                            x += w;
                        }
                        _ => {}
                    }
                }
            }
        }
        &mut self.cells
    }

    /// Write `ch`, `w` (1 or 2) columns wide, at column `x`. Returns the cells touched.
    fn put(&mut self, x: usize, ch: char, w: usize) -> u64 {
        let cells = self.cells();
        let grown = (x + w).saturating_sub(cells.len());
        if grown > 0 {
            cells.resize(x + w, EMPTY);
        }
        // Overwriting half of a wide character blanks its other half.
        if cells[x] == TAIL && x > 0 {
            cells[x - 1] = EMPTY;
        }
        if cells.get(x + w) == Some(&TAIL) {
            cells[x + w] = EMPTY;
        }
        cells[x] = ch as u32;
        if w == 2 {
            cells[x + 1] = TAIL;
        }
        self.trim();
        1 + grown as u64 + self.drop_extras(x, x + w)
    }

    /// Drop erased cells at the end, so a row ends with a written cell (each cell is
    /// dropped at most once for each time it was added).
    fn trim(&mut self) {
        while self.cells.last() == Some(&EMPTY) {
            self.cells.pop();
        }
    }

    /// A zero-width character joins the character before column `x`.
    fn attach(&mut self, x: usize, ch: char) {
        if x == 0 || self.extras.len() >= MAX_EXTRAS {
            return;
        }
        let cells = self.cells();
        if cells.is_empty() {
            return;
        }
        let mut at = x.min(cells.len()) - 1;
        if cells.get(at) == Some(&TAIL) && at > 0 {
            at -= 1;
        }
        self.extras.push((at as u32, ch));
    }

    /// Forget the zero-width characters of columns `from..to`; returns the cost.
    fn drop_extras(&mut self, from: usize, to: usize) -> u64 {
        let n = self.extras.len();
        if n > 0 {
            self.extras
                .retain(|&(c, _)| (c as usize) < from || c as usize >= to);
        }
        n as u64
    }

    /// Erase columns `from..to`. Returns the cells touched.
    fn erase(&mut self, from: usize, to: usize) -> u64 {
        let cells = self.cells();
        let to = to.min(cells.len());
        if from >= to {
            return 1;
        }
        if cells[from] == TAIL && from > 0 {
            cells[from - 1] = EMPTY;
        }
        if cells.get(to) == Some(&TAIL) {
            cells[to] = EMPTY;
        }
        if to == cells.len() {
            cells.truncate(from);
        } else {
            cells[from..to].fill(EMPTY);
        }
        self.trim();
        (to - from) as u64 + self.drop_extras(from, to)
    }

    /// Insert `n` blank cells at `x`, pushing the rest right (cells past the row's end are
    /// lost).
    fn insert_blanks(&mut self, x: usize, n: usize) -> u64 {
        let cells = self.cells();
        if x >= cells.len() {
            return 1;
        }
        let n = n.min(COLS - x);
        cells.splice(x..x, std::iter::repeat_n(EMPTY, n));
        cells.truncate(COLS);
        self.trim();
        self.extras.clear();
        self.cells.len() as u64
    }

    /// Delete `n` cells at `x`, pulling the rest left.
    fn delete(&mut self, x: usize, n: usize) -> u64 {
        let cells = self.cells();
        if x >= cells.len() {
            return 1;
        }
        let to = (x + n).min(cells.len());
        cells.drain(x..to);
        self.trim();
        self.extras.clear();
        self.cells.len() as u64 + 1
    }
}

fn next_tab(x: usize) -> usize {
    ((x / 8 + 1) * 8).min(COLS - 1)
}

/// The screen, its cursor and its scrollback.
pub(super) struct Screen {
    /// Text that left the screen, in order.
    pub(super) out: HeadTail,
    /// Rows from the top; rows past the end are blank.
    pub(super) rows: VecDeque<Row>,
    /// Cursor column; `COLS` means "after the last column" (the next character wraps).
    pub(super) x: usize,
    pub(super) y: usize,
    /// Scroll region, inclusive.
    pub(super) top: usize,
    pub(super) bottom: usize,
    saved: (usize, usize),
    /// The cursor when the alternate screen was entered.
    alternate: Option<usize>,
    scratch: Vec<u8>,
}

impl Screen {
    pub(super) fn new(cap: usize, whole_cap: usize) -> Self {
        Screen {
            out: HeadTail::with_whole(cap, whole_cap),
            rows: VecDeque::new(),
            x: 0,
            y: 0,
            top: 0,
            bottom: ROWS - 1,
            saved: (0, 0),
            alternate: None,
            scratch: Vec::new(),
        }
    }

    /// The cursor is at the start of a row with nothing on it or below it, and line feeds
    /// scroll the whole screen: plain lines can be appended as they are.
    pub(super) fn at_fresh_line(&self) -> bool {
        self.x == 0 && self.y >= self.rows.len() && self.top == 0 && self.bottom == ROWS - 1
    }

    fn row(&mut self, y: usize) -> &mut Row {
        while self.rows.len() <= y {
            self.rows.push_back(Row::default());
        }
        &mut self.rows[y]
    }

    /// Write out one row that leaves the screen (with its line end unless it wraps, or
    /// `force_end`). Returns the bytes written.
    fn commit(&mut self, row: &Row, force_end: bool) -> u64 {
        row.write_to(&mut self.scratch);
        if force_end || !row.wrapped {
            self.scratch.push(b'\n');
        }
        self.out.push(&self.scratch);
        let n = self.scratch.len() as u64;
        self.scratch.clear();
        n
    }

    /// Append a plain line at the cursor (which is [at a fresh line](Self::at_fresh_line))
    /// and move to the next line.
    pub(super) fn plain_line(&mut self, row: Row) {
        if !row.text.is_empty() || row.wrapped {
            while self.rows.len() < self.y {
                self.rows.push_back(Row::default());
            }
            self.rows.push_back(row);
        }
        self.line_feed();
    }

    /// Print one character at the cursor. Returns the cells touched.
    pub(super) fn print(&mut self, ch: char) -> u64 {
        let w = match ch.width() {
            Some(w) => w,
            None => return 1, // a control character
        };
        let y = self.y;
        if w == 0 {
            let x = self.x.min(COLS);
            self.row(y).attach(x, ch);
            return 1;
        }
        let mut cost = 0;
        if self.x + w > COLS {
            self.row(y).wrapped = true;
            self.x = 0;
            cost += self.line_feed();
        }
        let (x, y) = (self.x, self.y);
        cost += self.row(y).put(x, ch, w);
        self.x += w;
        cost
    }

    pub(super) fn carriage_return(&mut self) {
        self.x = 0;
    }

    pub(super) fn backspace(&mut self) {
        self.x = self.x.min(COLS - 1).saturating_sub(1);
    }

    pub(super) fn tab(&mut self) {
        self.x = next_tab(self.x.min(COLS - 1));
    }

    /// Down one row, scrolling the region when at its bottom. Returns the rows touched.
    pub(super) fn line_feed(&mut self) -> u64 {
        if self.y == self.bottom {
            self.scroll_up(1)
        } else {
            if self.y < ROWS - 1 {
                self.y += 1;
            }
            1
        }
    }

    /// Up one row, scrolling the region down when at its top.
    pub(super) fn reverse_index(&mut self) -> u64 {
        if self.y == self.top {
            self.scroll_down(1)
        } else {
            self.y = self.y.saturating_sub(1);
            1
        }
    }

    /// Scroll the region up `n` rows. Rows leaving a region that starts at the top of the
    /// screen go to the scrollback, as on a terminal; others are lost.
    pub(super) fn scroll_up(&mut self, n: usize) -> u64 {
        let n = n.min(self.bottom - self.top + 1);
        let mut cost = n as u64;
        if self.top == 0 && self.bottom == ROWS - 1 {
            for _ in 0..n {
                let row = self.rows.pop_front().unwrap_or_default();
                cost += self.commit(&row, false);
            }
            return cost;
        }
        self.row(self.bottom);
        for _ in 0..n {
            let row = self.rows.remove(self.top).unwrap_or_default();
            if self.top == 0 {
                cost += self.commit(&row, false);
            }
            self.rows.insert(self.bottom, Row::default());
        }
        cost + (n * ROWS) as u64
    }

    /// Scroll the region down `n` rows (rows pushed off its bottom are lost).
    pub(super) fn scroll_down(&mut self, n: usize) -> u64 {
        let n = n.min(self.bottom - self.top + 1);
        self.row(self.bottom);
        for _ in 0..n {
            self.rows.remove(self.bottom);
            self.rows.insert(self.top, Row::default());
        }
        (n * ROWS) as u64
    }

    /// Insert (`insert`) or delete `n` rows at the cursor's, within the scroll region.
    pub(super) fn insert_or_delete_rows(&mut self, n: usize, insert: bool) -> u64 {
        if self.y < self.top || self.y > self.bottom {
            return 1;
        }
        let n = n.min(self.bottom - self.y + 1);
        self.row(self.bottom);
        for _ in 0..n {
            if insert {
                self.rows.remove(self.bottom);
                self.rows.insert(self.y, Row::default());
            } else {
                self.rows.remove(self.y);
                self.rows.insert(self.bottom, Row::default());
            }
        }
        self.x = 0;
        (n * ROWS) as u64
    }

    /// Move the cursor to row `y`, column `x`, clamped to the screen.
    pub(super) fn goto(&mut self, y: usize, x: usize) {
        self.y = y.min(ROWS - 1);
        self.x = x.min(COLS - 1);
    }

    /// Move the cursor up (`by < 0`) or down, stopping at the scroll region's edge when it
    /// starts inside it.
    pub(super) fn move_rows(&mut self, by: isize) {
        let y = self.y;
        self.y = if by < 0 {
            let stop = if y >= self.top { self.top } else { 0 };
            y.saturating_sub(by.unsigned_abs()).max(stop)
        } else {
            let stop = if y <= self.bottom {
                self.bottom
            } else {
                ROWS - 1
            };
            y.saturating_add(by as usize).min(stop)
        };
    }

    pub(super) fn move_cols(&mut self, by: isize) {
        let x = self.x.min(COLS - 1);
        self.x = if by < 0 {
            x.saturating_sub(by.unsigned_abs())
        } else {
            x.saturating_add(by as usize).min(COLS - 1)
        };
    }

    /// Erase in display: 0 below the cursor, 1 above it, 2 all (into the scrollback),
    /// 3 the scrollback (kept: the agent gets everything that was printed).
    pub(super) fn erase_display(&mut self, mode: u16) -> u64 {
        match mode {
            0 => {
                let dropped = self.rows.len().saturating_sub(self.y + 1);
                self.rows.truncate(self.y + 1);
                dropped as u64 + self.erase_line(0)
            }
            1 => {
                let above = self.y.min(self.rows.len());
                for row in self.rows.iter_mut().take(above) {
                    *row = Row::default();
                }
                above as u64 + self.erase_line(1)
            }
            2 => self.screen_into_scrollback(),
            _ => 1,
        }
    }

    /// Erase in line: 0 from the cursor, 1 up to it, 2 the whole row.
    pub(super) fn erase_line(&mut self, mode: u16) -> u64 {
        let (x, y) = (self.x.min(COLS - 1), self.y);
        let Some(row) = self.rows.get_mut(y) else {
            return 1;
        };
        match mode {
            0 => row.erase(x, COLS),
            1 => row.erase(0, x + 1),
            _ => {
                let wrapped = row.wrapped;
                *row = Row::default();
                row.wrapped = wrapped;
                1
            }
        }
    }

    pub(super) fn erase_chars(&mut self, n: usize) -> u64 {
        let x = self.x.min(COLS - 1);
        match self.rows.get_mut(self.y) {
            Some(row) => row.erase(x, x.saturating_add(n)),
            None => 1,
        }
    }

    pub(super) fn insert_chars(&mut self, n: usize) -> u64 {
        let x = self.x.min(COLS - 1);
        match self.rows.get_mut(self.y) {
            Some(row) => row.insert_blanks(x, n),
            None => 1,
        }
    }

    pub(super) fn delete_chars(&mut self, n: usize) -> u64 {
        let x = self.x.min(COLS - 1);
        match self.rows.get_mut(self.y) {
            Some(row) => row.delete(x, n),
            None => 1,
        }
    }

    /// Push everything on the screen into the scrollback and start over at its top (the
    /// cursor keeps its column): what a clear, a reset or a switch of screens leaves.
    pub(super) fn screen_into_scrollback(&mut self) -> u64 {
        let mut cost = 1;
        if let Some(last) = self.rows.iter().rposition(|r| !r.is_blank()) {
            let rows: Vec<Row> = self.rows.drain(..=last).collect();
            for (i, row) in rows.iter().enumerate() {
                cost += self.commit(row, i == last);
            }
        }
        self.rows.clear();
        self.y = 0;
        cost
    }

    pub(super) fn set_region(&mut self, top: usize, bottom: usize) {
        let bottom = bottom.min(ROWS - 1);
        if top < bottom {
            self.top = top;
            self.bottom = bottom;
            self.goto(0, 0);
        }
    }

    pub(super) fn save_cursor(&mut self) {
        self.saved = (self.x, self.y);
    }

    pub(super) fn restore_cursor(&mut self) {
        (self.x, self.y) = self.saved;
    }

    /// Enter (`on`) or leave the alternate screen. Whatever either screen shows goes to
    /// the scrollback first, so a full-screen program's last picture is kept in order.
    pub(super) fn alternate(&mut self, on: bool) -> u64 {
        let cost = self.screen_into_scrollback();
        if on {
            self.alternate = Some(self.x);
        } else if let Some(x) = self.alternate.take() {
            self.x = x;
        }
        cost
    }

    /// `ESC c`: everything to the scrollback, every setting back to its start.
    pub(super) fn reset(&mut self) -> u64 {
        let cost = self.screen_into_scrollback();
        self.x = 0;
        self.top = 0;
        self.bottom = ROWS - 1;
        self.saved = (0, 0);
        self.alternate = None;
        cost
    }

    /// Write out every row down to the cursor's or the last one with something on it, with
    /// line ends between them (none after the last): the screen as it stands at the end.
    pub(super) fn flush(&mut self) {
        let last = self.rows.iter().rposition(|r| !r.is_blank());
        let end = match last {
            Some(l) => l.max(self.y),
            None if self.y > 0 => self.y,
            None => {
                self.rows.clear();
                return;
            }
        };
        // Rows below the cursor were left behind by moving up: the last one was ended.
        let ended = self.y < end;
        for i in 0..=end {
            let row = self.rows.get(i);
            if let Some(row) = row {
                row.write_to(&mut self.scratch);
            }
            if (i < end || ended) && !row.is_some_and(|r| r.wrapped) {
                self.scratch.push(b'\n');
            }
            self.out.push(&self.scratch);
            self.scratch.clear();
        }
        self.rows.clear();
        self.x = 0;
        self.y = 0;
    }

    /// The last row with something on it (for progress messages).
    pub(super) fn last_text(&self) -> Option<String> {
        let mut buf = Vec::new();
        for row in self.rows.iter().rev() {
            buf.clear();
            row.write_to(&mut buf);
            let text = String::from_utf8_lossy(&buf);
            if !text.trim().is_empty() {
                return Some(text.trim_end().to_string());
            }
        }
        None
    }
}
