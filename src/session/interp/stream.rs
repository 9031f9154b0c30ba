//! The PTY stream of one interpreter: a reader task splits it with the [`Scanner`] and
//! files output, prompts and markers in state shared with the evaluation in flight.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::{Interp, Launch};
use crate::exec::pty::{PtyMaster, ReadOutcome};
use crate::output::Renderer;
use crate::session::scan::{EndMarker, Event, Scanner};

// The renderer's screen is the terminal the interpreter was given.
const _: () = assert!(crate::output::SCREEN_ROWS == crate::exec::pty::ROWS as usize);

/// State shared between the reader task and evaluations.
pub(super) struct StreamState {
    pub(super) scanner: Scanner,
    /// Protocol number of the evaluation in flight.
    pub(super) current: Option<u64>,
    pub(super) out: Renderer,
    /// The bootstrap announced that evaluation N began running.
    pub(super) started: Option<u64>,
    pub(super) end: Option<EndMarker>,
    /// The last end marker of an evaluation no longer in flight: an interrupted one whose
    /// REPL showed its prompt before writing it (node), read once the REPL is back.
    pub(super) late: Option<EndMarker>,
    /// Output that arrived between evaluations: the earlier cells' (a thread, a timer, a
    /// background job), reported beside the next evaluation's output, never in it.
    pub(super) background: Renderer,
    /// Output of the evaluation in flight from before it announced its start (a language
    /// that announces it): the earlier cells' too, once the start came.
    pub(super) early: Renderer,
    /// The language's bootstrap announces each evaluation's start.
    pub(super) announces: bool,
    pub(super) prompts: u64,
    pub(super) continuation: bool,
    pub(super) closed: bool,
}

pub(super) struct Shared {
    pub(super) state: Mutex<StreamState>,
    pub(super) tick: watch::Sender<u64>,
}

impl Shared {
    /// The state of a fresh interpreter's stream: nothing in flight, the prompt and
    /// continuation patterns of its language with its nonce.
    pub(super) fn new(launch: &Launch) -> Self {
        let spec = &launch.spec;
        Shared {
            state: Mutex::new(StreamState {
                scanner: Scanner::new(
                    &launch.nonce,
                    &spec.prompt_for(&launch.nonce),
                    spec.continuation_for(&launch.nonce).as_deref(),
                ),
                current: None,
                out: Renderer::new(launch.output_cap),
                started: None,
                end: None,
                late: None,
                background: Renderer::new(launch.output_cap / 4),
                early: Renderer::new(launch.output_cap / 4),
                announces: spec.announces_start,
                prompts: 0,
                continuation: false,
                closed: false,
            }),
            tick: watch::channel(0).0,
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, StreamState> {
        // A panic while holding this lock would be a bug in this module; keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl StreamState {
    pub(super) fn feed(&mut self, bytes: &[u8]) {
        let st = self;
        let events = st.scanner.feed(bytes);
        for ev in events {
            match ev {
                Event::Data(d) => {
                    if st.current.is_some() && st.end.is_none() {
                        if st.announces && st.started != st.current {
                            st.early.push(&d);
                        } else {
                            st.out.push(&d);
                        }
                    } else {
                        st.background.push(&d);
                    }
                }
                Event::Prompt => st.prompts += 1,
                Event::Continuation => st.continuation = true,
                Event::Started(n) => {
                    if st.current == Some(n) {
                        st.started = Some(n);
                    }
                }
                Event::End(m) => {
                    if st.current == Some(m.n) && st.end.is_none() {
                        st.end = Some(m);
                    } else {
                        // Stale (an interrupted evaluation finishing late): kept aside only.
                        st.late = Some(m);
                    }
                }
            }
        }
    }
}

impl Shared {
    pub(super) fn close(&self) {
        let mut st = self.lock();
        let rest = st.scanner.pending().to_vec();
        if !rest.is_empty() {
            if st.current.is_some() && st.end.is_none() {
                st.out.push(&rest);
            } else {
                st.background.push(&rest);
            }
        }
        st.closed = true;
        drop(st);
        self.tick.send_modify(|v| *v = v.wrapping_add(1));
    }
}

impl Interp {
    /// What the stream says about evaluation `n` right now.
    pub(super) fn check(&self, n: u64) -> Check {
        self.check_since(n, u64::MAX)
    }

    /// Like [`check`](Self::check), also reporting a prompt printed after `prompts_before`.
    pub(super) fn check_since(&self, n: u64, prompts_before: u64) -> Check {
        let st = self.shared.lock();
        if let Some(end) = st.end.as_ref().filter(|e| e.n == n) {
            Check::End(end.clone())
        } else if st.closed {
            Check::Closed
        } else if st.continuation {
            Check::Continuation
        } else if prompts_before != u64::MAX && st.prompts > prompts_before {
            Check::Prompt
        } else {
            Check::Pending
        }
    }
}

pub(super) enum Check {
    End(EndMarker),
    Closed,
    Continuation,
    Prompt,
    Pending,
}

/// Reads coming within this long of each other...
const BURST_GAP: Duration = Duration::from_millis(2);
/// ...this many in a row mean a program printing many short lines. Then, after a read
/// smaller than [`SMALL_READ`], the reader waits [`BATCH_WAIT`] so the next read takes
/// many lines at once: otherwise each line costs a wake-up, a read and a context switch
/// (200,000 printed lines cost as many). A program writing faster than `SMALL_READ` per
/// `BATCH_WAIT` fills its reads and is never waited for; a short evaluation never is (the
/// count starts again with each evaluation, and stops at its end marker).
const BURST_READS: u32 = 32;
const SMALL_READ: usize = 2048;
const BATCH_WAIT: Duration = Duration::from_millis(1);

pub(super) async fn read_loop(master: Arc<PtyMaster>, shared: Arc<Shared>) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut last_read = Instant::now();
    let mut burst = 0u32;
    let mut burst_eval = None;
    loop {
        // Read and file the bytes under the stream lock, so that whoever holds the lock
        // sees either the bytes still unread in the terminal or their effect, never neither.
        let res = master
            .on_readable(|m| {
                let mut st = shared.lock();
                match m.read_now(&mut buf)? {
                    ReadOutcome::Data(n) => {
                        st.feed(&buf[..n]);
                        let waiting = st.current.is_some() && st.end.is_none();
                        Ok(Some((n, st.current, waiting)))
                    }
                    ReadOutcome::Closed => Ok(None),
                }
            })
            .await;
        let (n, eval, waiting) = match res {
            Ok(Some(read)) => read,
            Ok(None) | Err(_) => {
                shared.close();
                return;
            }
        };
        shared.tick.send_modify(|v| *v = v.wrapping_add(1));
        let now = Instant::now();
        // A burst is one evaluation's: evaluations called back to back are no burst.
        if eval != burst_eval {
            burst_eval = eval;
            burst = 0;
        }
        burst = if now - last_read < BURST_GAP {
            burst.saturating_add(1)
        } else {
            0
        };
        last_read = now;
        // Only while an evaluation's output is still coming: once its end marker is in,
        // what follows (the prompt) is wanted at once.
        if waiting && burst >= BURST_READS && n < SMALL_READ {
            tokio::time::sleep(BATCH_WAIT).await;
            // The gap to the next read is the program's, not this wait's.
            last_read = Instant::now();
        }
        // Rendering that has fallen behind (on the blocking pool) holds reading back, so
        // the bytes waiting stay bounded and the program waits, as on a slow terminal.
        let behind = {
            let st = shared.lock();
            st.out.backlog().or_else(|| st.background.backlog())
        };
        if let Some(caught_up) = behind {
            caught_up.await;
        }
    }
}
