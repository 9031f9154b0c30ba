//! Input: telling a program that waits for an answer from one that waits a moment by
//! itself, and typing the answer (`session_input`) so that only the program ever reads it.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::recover::Recovery;
use super::{Ending, Interp, Outcome, unix_newlines};
use crate::lang::protocol::INPUT_FILE;
use crate::lang::spec::InputWait;
use crate::progress::Progress;
use crate::session::stdin_wait::{self, Terminal, Wait};

/// A timed wait longer than this is taken for a prompt, as an untimed one is: whoever
/// wrote it expects an answer (`read -t 60 -p 'Continue? '`). Short, because an event loop
/// waiting for input has a timer of its own pending now and then (node's wakes V8's heap
/// tasks every 8 s), and the answer must not wait for it.
const LONG_WAIT: Duration = Duration::from_secs(2);

/// The most bytes typed into one evaluation that are remembered, to say which of them the
/// program left unread.
const TYPED_KEPT: usize = 64 * 1024;

/// A wait for input seen on a poll, not yet taken for a prompt.
#[derive(Debug, Clone, Copy)]
pub(super) struct Suspicion {
    /// The output version when it was first seen: any output since means the program moved.
    version: u64,
    since: Instant,
    /// The longest timeout of the timed waits seen since.
    longest: Duration,
}

/// Whether the wait seen now (at output `version`) is one the agent must answer. An
/// untimed (or long) wait must be seen on two polls in a row with no output in between:
/// runtimes arm their terminal reads briefly while doing other things. A short timed wait
/// ends by itself, so it counts only once the program has gone on waiting past its
/// timeout (a loop of short waits is a wait).
pub(super) fn confirm(
    slot: &mut Option<Suspicion>,
    version: u64,
    timeout: Option<Duration>,
    now: Instant,
) -> bool {
    match slot {
        Some(s) if s.version == version => match timeout {
            None => true,
            Some(t) if t > LONG_WAIT => true,
            Some(t) => {
                s.longest = s.longest.max(t);
                now.duration_since(s.since) > s.longest
            }
        },
        _ => {
            *slot = Some(Suspicion {
                version,
                since: now,
                longest: timeout.unwrap_or_default(),
            });
            false
        }
    }
}

/// The bytes `session_input` types for `text`: exactly `text` without `enter`; with it,
/// line endings made Unix ones and Enter (`enter_key`, see `PtyMaster::enter_key`) added
/// when the text does not end a line already or end the input (Ctrl-D).
fn keys(text: &str, enter: bool, enter_key: u8) -> Vec<u8> {
    if !enter {
        return text.as_bytes().to_vec();
    }
    let mut bytes = unix_newlines(text).into_owned().into_bytes();
    if !bytes.ends_with(b"\n") && !bytes.ends_with(b"\x04") {
        bytes.push(enter_key);
    }
    bytes
}

impl Interp {
    /// The session's terminal, as `stdin_wait` judges waits on it.
    fn terminal(&self) -> Terminal<'_> {
        Terminal {
            rdev: self.tty,
            signals: &self.launch.spec.input_wait,
            read_timeout: self.master.read_timeout(),
        }
    }

    /// How the program waits for input from the terminal, if it does (see `stdin_wait`).
    pub(super) fn input_wait(&self) -> Option<Wait> {
        let term = self.terminal();
        if let Some(w) = stdin_wait::tree_wait(self.helper_pid, &term) {
            tracing::debug!(how = %w.who, timeout = ?w.timeout, "waiting for input");
            return Some(w);
        }
        if term.signals.contains(&InputWait::Raw) && self.master.is_raw() {
            tracing::debug!("waiting for input: the terminal is in raw mode");
            return Some(Wait {
                who: "raw mode".into(),
                timeout: None,
            });
        }
        None
    }

    /// Whether the REPL itself is back at its prompt as far as /proc tells: its own process
    /// blocked reading the terminal with no timeout, and nothing it wrote unread. What the
    /// REPL prints as its prompt is up to the user's code (`PS1=...`), so this is how an
    /// interrupted REPL is known to be back when its prompt is not ours.
    pub(super) fn repl_reads(&self) -> bool {
        self.master.unread() == 0
            && stdin_wait::process_wait(self.pid, &self.terminal())
                .is_some_and(|w| w.timeout.is_none())
    }

    /// Whether the REPL has taken the eval line and is running the cell: until then the REPL
    /// itself is (rightly) reading the terminal. Without a start marker, assume it has.
    pub(super) fn running_user_code(&self, n: u64) -> bool {
        !self.launch.spec.announces_start || self.shared.lock().started == Some(n)
    }

    /// After seeing the program wait for input: has everything it wrote before that been
    /// read, without an end marker for `n`? Otherwise the wait seen was the REPL's own,
    /// after the evaluation ended.
    pub(super) fn nothing_unread(&self, n: u64) -> bool {
        let st = self.shared.lock();
        st.end.as_ref().is_none_or(|e| e.n != n) && !st.closed && self.master.unread() == 0
    }

    /// Continue an evaluation paused waiting for input: type `text` (see [`keys`]) and
    /// wait as for an evaluation. Text is typed only to a program still waiting: one that
    /// gave up waiting meanwhile (a timed read) goes on without it, and nothing typed can
    /// reach the REPL as code. Ctrl-C in the text, with the terminal's signals on, is an
    /// interrupt, as the key is.
    pub async fn resume(
        &mut self,
        text: &str,
        enter: bool,
        deadline: Instant,
        cancel: &CancellationToken,
        progress: Option<&Progress>,
    ) -> Outcome {
        let Some(n) = self.paused.take() else {
            return self.fail_now("no evaluation is waiting for input".into());
        };
        if !self.still_waiting(n).await {
            let ending = self.wait(n, deadline, cancel, progress, true).await;
            let mut outcome = self.finish(n, ending).await;
            outcome.notes.push(
                "the program had stopped waiting for input by itself: the text was not typed"
                    .into(),
            );
            return outcome;
        }
        let bytes = keys(text, enter, self.master.enter_key());
        let interrupt = self.launch.spec.interrupt.as_bytes();
        let ctrl_c = (interrupt == b"\x03" && self.master.signals_enabled())
            .then(|| bytes.iter().position(|&b| b == 3))
            .flatten();
        let typed = &bytes[..ctrl_c.unwrap_or(bytes.len())];
        if !typed.is_empty() {
            self.note_typed(n, typed).await;
            // The call's deadline covers typing: a program that read one line and went on
            // with other work leaves the rest of a long answer waiting for room in the
            // terminal for as long as it likes.
            let mut sent = 0;
            let typing = tokio::select! {
                r = self.master.write_counted(typed, &mut sent) => Some(r),
                _ = tokio::time::sleep_until(deadline) => None,
                _ = cancel.cancelled() => None,
            };
            match typing {
                Some(Ok(())) => {}
                Some(Err(_)) => {
                    let ending = self.wait_exit().await;
                    return self.finish(n, ending).await;
                }
                None => {
                    // What was typed and not read goes (it would be read as the REPL's next
                    // line), which also leaves room for the interrupt.
                    self.master.flush_input();
                    let ending = self.stop(n, !cancel.is_cancelled()).await;
                    let mut outcome = self.finish(n, ending).await;
                    outcome.notes.push(format!(
                        "{sent} of the answer's {} bytes were typed before the deadline; the \
rest was not typed, and what the program had not read was discarded",
                        typed.len()
                    ));
                    return outcome;
                }
            }
        }
        let ending = match ctrl_c {
            Some(_) => match self.interrupt_and_recover(n).await {
                Recovery::Back(Some(marker)) => Ending::Done(marker),
                other => other.ending(false),
            },
            None => self.wait(n, deadline, cancel, progress, true).await,
        };
        self.finish(n, ending).await
    }

    /// Whether evaluation `n` still waits for input: not ended, and a process blocked reading
    /// the terminal. A program that waits in a loop of short timed waits is between two of
    /// them now and then, so it is looked at a few times over a moment.
    async fn still_waiting(&self, n: u64) -> bool {
        for _ in 0..5 {
            if !self.nothing_unread(n) {
                return false;
            }
            if self.input_wait().is_some() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// Remember what is typed into evaluation `n`, and tell the bootstrap (the file
    /// `input-N` in the control directory) that input was typed: at the end of the cell it
    /// discards what the program left unread and reports how much, before the REPL reads
    /// its next line.
    async fn note_typed(&mut self, n: u64, bytes: &[u8]) {
        if !self.typed_flag {
            self.typed_flag = true;
            let flag = input_flag(&self.launch.ctl, n);
            let _ =
                tokio::task::spawn_blocking(move || crate::workspace::write_ctl(&flag, b"")).await;
        }
        self.typed.extend_from_slice(bytes);
        if self.typed.len() > TYPED_KEPT {
            let cut = self.typed.len() - TYPED_KEPT;
            self.typed.drain(..cut);
        }
    }

    /// A fresh evaluation: nothing typed into it yet.
    pub(super) fn forget_typed(&mut self) {
        self.typed.clear();
        self.typed_flag = false;
    }
}

/// The file that exists in the control directory once input was typed into evaluation `n`.
pub(super) fn input_flag(ctl: &std::path::Path, n: u64) -> std::path::PathBuf {
    ctl.join(crate::lang::expand(INPUT_FILE, &[("n", &n.to_string())]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enter_is_added_as_the_terminal_expects_it() {
        assert_eq!(keys("Ada", true, b'\n'), b"Ada\n");
        assert_eq!(keys("Ada", true, b'\r'), b"Ada\r");
        assert_eq!(keys("a\r\nb\r\n", true, b'\n'), b"a\nb\n");
        assert_eq!(keys("abc\n\x04", true, b'\n'), b"abc\n\x04");
        assert_eq!(keys("q", false, b'\n'), b"q");
        assert_eq!(keys("\x1b[A", false, b'\n'), b"\x1b[A");
    }

    #[test]
    fn untimed_waits_are_confirmed_on_the_second_poll() {
        let t0 = Instant::now();
        let mut slot = None;
        assert!(!confirm(&mut slot, 1, None, t0));
        assert!(confirm(&mut slot, 1, None, t0 + Duration::from_millis(200)));
        // Output in between starts over.
        let mut slot = None;
        assert!(!confirm(&mut slot, 1, None, t0));
        assert!(!confirm(
            &mut slot,
            2,
            None,
            t0 + Duration::from_millis(200)
        ));
        assert!(confirm(&mut slot, 2, None, t0 + Duration::from_millis(400)));
    }

    #[test]
    fn short_timed_waits_count_only_past_their_timeout() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut slot = None;
        let short = Some(ms(1500));
        assert!(!confirm(&mut slot, 1, short, t0));
        assert!(!confirm(&mut slot, 1, short, t0 + ms(1400)));
        assert!(confirm(&mut slot, 1, short, t0 + ms(1600)));
        let mut slot = None;
        let long = Some(LONG_WAIT + ms(1));
        assert!(!confirm(&mut slot, 1, long, t0));
        assert!(confirm(&mut slot, 1, long, t0 + ms(200)));
    }
}
