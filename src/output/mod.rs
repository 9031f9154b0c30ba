//! Output shaping: a bounded head+tail buffer, and the terminal renderer that turns what an
//! interpreter wrote to its PTY into the text a person would have seen.

mod parse;
mod screen;
mod term;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use parse::incomplete_suffix;
pub use screen::ROWS as SCREEN_ROWS;
use term::Term;

/// Keeps the first `head_cap` and the last `tail_cap` bytes of a stream and counts the rest.
/// Memory is O(cap) however much is pushed.
#[derive(Debug, Clone)]
pub struct HeadTail {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    head_cap: usize,
    tail_cap: usize,
    total: u64,
    /// A second, larger buffer of the same stream: the whole output when this one is cut
    /// (kept apart to be read later), itself head and tail past its own cap.
    whole: Option<Box<HeadTail>>,
}

/// The most a finished text adds to the bytes it keeps: the line break after the head and
/// the line saying how many bytes were left out (20 digits and their 6 commas at most).
pub const OMISSION_ROOM: usize = 64;

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
            whole: None,
        }
    }

    /// A buffer of `cap` bytes that also keeps the same stream within `whole_cap` bytes
    /// (see [`whole`](Self::whole)), its text, the line saying what it left out included,
    /// never longer (what holds it drops a longer one, and its link would lead nowhere); a
    /// `whole_cap` that leaves no more than `cap` keeps nothing more.
    pub fn with_whole(cap: usize, whole_cap: usize) -> Self {
        let mut b = Self::new(cap);
        let room = whole_cap.saturating_sub(OMISSION_ROOM);
        if room > cap {
            b.whole = Some(Box::new(Self::new(room)));
        }
        b
    }

    /// When this buffer left bytes out and keeps a larger one: that one's text (itself
    /// head and tail, with a line saying what it left out, past its own cap).
    /// With the bytes it left out itself.
    pub fn whole(&self) -> Option<(String, u64)> {
        let w = self.whole.as_ref().filter(|_| self.omitted() > 0)?;
        Some(w.finish())
    }

    pub fn push(&mut self, mut bytes: &[u8]) {
        if let Some(w) = self.whole.as_mut() {
            w.push(bytes);
        }
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

/// Turns what a program wrote to its terminal into the text a person would have seen, into
/// a bounded [`HeadTail`]: colours vanish, `\r` progress lines and cursor-up redraws
/// collapse to their final state, and what scrolls off or is cleared stays in the
/// scrollback (see [`screen`] and [`term`]).
///
/// Rendering stays off the async workers: a push renders at most [`INLINE_WORK`] on the
/// caller's thread (plain lines, the bulk of any output, cost next to nothing); the rest
/// goes to a job on the blocking pool, which takes the bytes that arrive meanwhile. Those
/// wait in a queue; past [`BACKLOG`] bytes [`backlog`](Self::backlog) tells the reader to
/// stop reading until the job catches up, so memory stays bounded and a program printing
/// faster than it can be rendered is slowed down, as a terminal would slow it.
pub struct Renderer {
    inner: Arc<Inner>,
}

struct Inner {
    slot: Mutex<Slot>,
    /// A job took bytes from the queue or gave the renderer back.
    changed: Notify,
}

#[derive(Default)]
struct Slot {
    /// The renderer, while no job has it (then the queue is empty).
    term: Option<Box<Term>>,
    /// Bytes for the job in progress.
    queue: Vec<u8>,
    /// The last line as the job last saw it.
    last: String,
    /// A job was dropped without giving the renderer back (the runtime is shutting down).
    lost: bool,
}

/// Work (about a cell or a byte each) rendered on the caller's thread per push.
const INLINE_WORK: u64 = 16 * 1024;
/// Bytes waiting for a job beyond which the reader should wait.
const BACKLOG: usize = 256 * 1024;

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Slot> {
        // Nothing here panics while holding the lock; if it did, keep serving.
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait until `done` holds for the slot.
    async fn until(&self, mut done: impl FnMut(&mut Slot) -> bool) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if done(&mut self.lock()) {
                return;
            }
            changed.await;
        }
    }
}

impl Renderer {
    pub fn new(cap: usize) -> Self {
        Self::with_whole(cap, 0)
    }

    /// A renderer whose text is cut at `cap` bytes and which also keeps the whole text up
    /// to `whole_cap` (see [`Rendered::whole`]).
    pub fn with_whole(cap: usize, whole_cap: usize) -> Self {
        Renderer {
            inner: Arc::new(Inner {
                slot: Mutex::new(Slot {
                    term: Some(Box::new(Term::with_whole(cap, whole_cap))),
                    ..Slot::default()
                }),
                changed: Notify::new(),
            }),
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        let mut slot = self.inner.lock();
        let Some(term) = slot.term.as_mut() else {
            if !slot.lost {
                slot.queue.extend_from_slice(bytes);
            }
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            term.push(bytes);
            return;
        };
        let taken = term.push_some(bytes, INLINE_WORK);
        if taken == bytes.len() {
            return;
        }
        slot.queue.extend_from_slice(&bytes[taken..]);
        let job = Job {
            inner: self.inner.clone(),
            term: slot.term.take(),
        };
        drop(slot);
        runtime.spawn_blocking(move || job.run());
    }

    /// When rendering has fallen behind: a future that resolves once it has caught up.
    pub fn backlog(&self) -> Option<impl Future<Output = ()> + Send + 'static> {
        if self.inner.lock().queue.len() < BACKLOG {
            return None;
        }
        let inner = self.inner.clone();
        Some(async move {
            inner
                .until(|slot| slot.queue.len() < BACKLOG || slot.lost)
                .await
        })
    }

    /// Wait for rendering to catch up, render what is left and return the bounded text.
    pub async fn finish(self) -> Rendered {
        let mut term = None;
        self.inner
            .until(|slot| {
                term = slot.term.take();
                term.is_some() || slot.lost
            })
            .await;
        term.map(|t| t.finish()).unwrap_or_default()
    }

    /// The last non-empty line so far, rendered (for progress messages).
    pub fn last_line(&self) -> String {
        let slot = self.inner.lock();
        match &slot.term {
            Some(term) => term.last_line(),
            None => slot.last.clone(),
        }
    }
}

/// Rendering on the blocking pool: renders the queue until it is empty, then gives the
/// renderer back.
struct Job {
    inner: Arc<Inner>,
    term: Option<Box<Term>>,
}

impl Job {
    fn run(mut self) {
        loop {
            let chunk = {
                let mut slot = self.inner.lock();
                if slot.queue.is_empty() {
                    if let Some(term) = self.term.take() {
                        slot.last = term.last_line();
                        slot.term = Some(term);
                    }
                    drop(slot);
                    self.inner.changed.notify_waiters();
                    return;
                }
                std::mem::take(&mut slot.queue)
            };
            self.inner.changed.notify_waiters();
            // A panic here drops the job with the renderer in it: `Drop` says it is lost.
            if let Some(term) = self.term.as_mut() {
                term.push(&chunk);
            }
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if self.term.is_some() {
            let mut slot = self.inner.lock();
            slot.lost = true;
            slot.queue = Vec::new();
            drop(slot);
            self.inner.changed.notify_waiters();
        }
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
#[derive(Debug, Clone, Default)]
pub struct Rendered {
    pub text: String,
    /// Rendered bytes left out (0 when nothing was cut).
    pub omitted: u64,
    /// What the agent should know about how the text was rendered (a budget spent).
    pub notes: Vec<String>,
    /// When the text was cut and the renderer kept more: the whole text and the bytes it
    /// left out itself (see [`HeadTail::whole`]).
    pub whole: Option<(String, u64)>,
}

/// Render a complete byte string on this thread (for tests and small previews).
pub fn render_all(bytes: &[u8], cap: usize) -> Rendered {
    let mut t = Term::new(cap);
    t.push(bytes);
    t.finish()
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
    fn the_whole_is_kept_only_when_the_text_is_cut() {
        let mut small = HeadTail::with_whole(8, 100 + OMISSION_ROOM);
        small.push(b"0123");
        assert_eq!(small.whole(), None, "nothing cut, nothing kept apart");
        let mut b = HeadTail::with_whole(8, 100 + OMISSION_ROOM);
        let all: Vec<u8> = (0..60u8).map(|i| b'a' + i % 26).collect();
        b.push(&all[..30]);
        b.push(&all[30..]);
        assert!(b.omitted() > 0);
        assert_eq!(
            b.whole(),
            Some((String::from_utf8(all.clone()).expect("ascii"), 0))
        );
        // Past its own cap the whole is head and tail too.
        let mut big = HeadTail::with_whole(8, 20 + OMISSION_ROOM);
        big.push(&all);
        let (w, left_out) = big.whole().expect("whole");
        assert_eq!(left_out, 40);
        assert!(w.starts_with("abcdefghij\n… 40 bytes omitted …\n"), "{w}");
        assert!(w.ends_with("yzabcdefgh"), "{w}");
    }

    /// The whole's text, with its omission line, is within its cap however much was left
    /// out: a longer one would be dropped by the history and its link lead nowhere.
    #[test]
    fn the_whole_text_stays_within_its_cap() {
        for (whole_cap, len) in [(1 << 20, 3 << 20), (4096, 10_000_000), (100, 1000)] {
            let mut b = HeadTail::with_whole(16, whole_cap);
            let line = b"0123456789abcdef\n".repeat(1024);
            let mut pushed = 0;
            while pushed < len {
                b.push(&line);
                pushed += line.len();
            }
            let (w, left_out) = b.whole().expect("kept whole");
            assert!(left_out > 0);
            assert!(w.len() <= whole_cap, "{} > {whole_cap}", w.len());
        }
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
        let mut r = Term::new(1000);
        for i in 0..200_000 {
            r.push(format!("\r{i:>6}").as_bytes());
        }
        let out = r.finish();
        assert_eq!(out.text.trim(), "199999");
    }

    #[test]
    fn many_lines_bounded() {
        let mut r = Term::new(1000);
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

    /// Under a runtime, hostile output is rendered on the blocking pool, in order, with the
    /// same result as on one thread; a push never does more than a slice of work itself.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn renderer_hands_heavy_work_to_the_blocking_pool() {
        let mut stream = b"before\r\n".to_vec();
        stream.extend(
            "\x1b[999;999Hx\x1b[2J\x1b[1;1H\x1b[999L"
                .repeat(50_000)
                .bytes(),
        );
        stream.extend_from_slice(b"\x1b[31mafter\x1b[0m\r\n");
        let expected = render_all(&stream, 64 * 1024);
        let mut r = Renderer::new(64 * 1024);
        for chunk in stream.chunks(4096) {
            r.push(chunk);
            if let Some(caught_up) = r.backlog() {
                caught_up.await;
            }
            assert!(r.inner.lock().queue.len() < BACKLOG + 4096);
        }
        let got = r.finish().await;
        assert_eq!(got.text, expected.text);
        assert_eq!(got.notes, expected.notes);
        assert!(got.text.starts_with("before\n") && got.text.ends_with("after\n"));
    }

    #[tokio::test]
    async fn renderer_inline_for_small_output() {
        let mut r = Renderer::new(1000);
        r.push(b"10%\r100%\r\nlast ");
        assert_eq!(r.last_line(), "last");
        assert!(r.backlog().is_none());
        let out = r.finish().await;
        assert_eq!(out.text, "100%\nlast ");
    }
}
