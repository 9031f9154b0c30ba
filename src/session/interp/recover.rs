//! Interrupting an evaluation and getting the REPL back: interrupt, wait for it to answer,
//! resynchronise, or replace the interpreter when it does not come back.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::stream::Check;
use super::{Ending, Interp, InterpError, interrupt_flag};
use crate::output::Renderer;
use crate::session::scan::EndMarker;

/// How often an unanswered interrupt is repeated.
const REPEAT_INTERRUPT: Duration = Duration::from_secs(1);
/// How many times more a resynchronising line the REPL dropped is typed.
const RESYNC_TRIES: usize = 3;
/// How often an interrupted REPL whose prompt did not come is looked at under /proc.
const LOOK_AGAIN: Duration = Duration::from_millis(150);

impl Interp {
    /// Send the interrupt, wait briefly for the REPL to come back (its end marker, or a
    /// fresh prompt), re-synchronise with an empty evaluation, and replace the interpreter
    /// if it does not come back.
    pub(super) async fn interrupt_and_recover(&mut self, n: u64) -> Recovery {
        let grace = Duration::from_millis(self.launch.spec.interrupt_grace_ms);
        // Interrupt only user code: until the cell announced its start the REPL may still be
        // reading or preparing it, and an interrupt then can hit the REPL itself.
        if self.launch.spec.announces_start {
            let until = Instant::now() + grace;
            let mut rx = self.shared.tick.subscribe();
            loop {
                {
                    let st = self.shared.lock();
                    if st.started == Some(n)
                        || st.closed
                        || st.end.as_ref().is_some_and(|e| e.n == n)
                    {
                        break;
                    }
                }
                if tokio::time::timeout_at(until, rx.changed()).await.is_err() {
                    break; // never started: the interrupt below finds out whether it is stuck
                }
            }
        }
        let prompts_before = {
            let mut st = self.shared.lock();
            st.late = None;
            st.prompts
        };
        // Tell the bootstrap before interrupting: a REPL that goes on with input it has
        // queued (ghci runs the rest of a macro's commands after "Interrupted.") can look
        // for this file and stop there. Removed when the evaluation ends.
        let flag = interrupt_flag(&self.launch.ctl, n);
        let _ = tokio::task::spawn_blocking(move || crate::workspace::write_ctl(&flag, b"")).await;
        if !self.send_interrupt().await {
            return match self.wait_exit().await {
                Ending::Exited(st) => Recovery::Exited(st),
                _ => Recovery::Exited(None),
            };
        }
        let until = Instant::now() + grace;
        // An interrupt that arrives at a bad moment (or gets lost on a loaded machine) is
        // repeated every second until the grace period ends; only then is the tree killed.
        // Not for a REPL whose bootstrap defers it to the user's code: there it is never
        // lost, and a handler of the code's own would run once more per repetition.
        let mut again =
            tokio::time::interval_at(Instant::now() + REPEAT_INTERRUPT, REPEAT_INTERRUPT);
        let mut look = tokio::time::interval_at(Instant::now() + LOOK_AGAIN, LOOK_AGAIN);
        // Sightings in a row of the REPL reading its terminal: back at a prompt that is not
        // ours (the user's code set its own).
        let mut reading = 0;
        let mut rx = self.shared.tick.subscribe();
        let marker = loop {
            match self.check_since(n, prompts_before) {
                Check::End(end) => break Some(end),
                Check::Prompt => break None,
                Check::Closed => {
                    return match self.wait_exit().await {
                        Ending::Exited(st) => Recovery::Exited(st),
                        _ => Recovery::Exited(None),
                    };
                }
                Check::Continuation | Check::Pending => {}
            }
            tokio::select! {
                changed = rx.changed() => { if changed.is_err() { break None; } }
                _ = again.tick(), if self.launch.spec.repeat_interrupt => {
                    let _ = self.send_interrupt().await;
                }
                _ = look.tick() => {
                    reading = if self.repl_reads() { reading + 1 } else { 0 };
                    if reading >= 2 {
                        // Look again: `select!` takes a ready branch at random, so the end
                        // marker may have been filed since the check above, and the REPL be
                        // reading at its own prompt after it. Once the terminal is seen
                        // drained, whatever the REPL wrote before reading is filed (the
                        // reader takes bytes out only under the stream's lock).
                        if let Check::End(end) = self.check_since(n, prompts_before) {
                            break Some(end);
                        }
                        break None;
                    }
                }
                _ = tokio::time::sleep_until(until) => {
                    return match self.restart_keeping_output().await {
                        Ok(()) => Recovery::Restarted("the interpreter did not stop when interrupted".into()),
                        Err(e) => Recovery::Restarted(e.to_string()),
                    };
                }
            }
        };
        self.after_interrupt(n, marker, grace).await
    }

    /// Deliver the interrupt; false when the terminal is gone.
    async fn send_interrupt(&self) -> bool {
        let interrupt = &self.launch.spec.interrupt;
        // A program reading keys in raw mode gets Ctrl-C as data; deliver what the key would
        // have delivered with the terminal in its normal mode: SIGINT to the foreground group.
        if interrupt == "\u{3}"
            && !self.master.signals_enabled()
            && let Some(pgrp) = self.master.foreground_pgrp()
        {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pgrp),
                nix::sys::signal::Signal::SIGINT,
            );
            return true;
        }
        self.master.write_all(interrupt.as_bytes()).await.is_ok()
    }

    /// After the REPL answered an interrupt: keep what the interrupted evaluation printed,
    /// then drain any stray output of the interrupt with an empty evaluation.
    async fn after_interrupt(
        &mut self,
        n: u64,
        marker: Option<EndMarker>,
        grace: Duration,
    ) -> Recovery {
        // Keep what the interrupted evaluation printed; then drain any stray output of the
        // interrupt (a REPL that was already idle prints its own notice) with an empty
        // evaluation whose output is thrown away.
        let (kept, early, started) = {
            let mut st = self.shared.lock();
            let out = std::mem::replace(&mut st.out, Renderer::new(0));
            (
                out,
                std::mem::replace(&mut st.early, Renderer::new(0)),
                st.started,
            )
        };
        // What was typed into the interrupted code and not read (a line without Enter) must
        // not prefix the resynchronising line (the terminal keeps it: NOFLSH).
        self.master.flush_input();
        // An interrupt the REPL takes late (bash, ghci and irb act on it between commands)
        // can drop the resynchronising line itself: it is typed again, a few times.
        let until = Instant::now() + grace;
        self.drop_watch = Some(0);
        let mut sync = self.sync(until, &CancellationToken::new()).await;
        for _ in 0..RESYNC_TRIES {
            if !matches!(&sync.ending, Ending::Failed(e) if e == super::LINE_DROPPED) {
                break;
            }
            sync = self.sync(until, &CancellationToken::new()).await;
        }
        self.drop_watch = None;
        {
            let mut st = self.shared.lock();
            st.out = kept;
            st.early = early;
            st.started = started;
        }
        match sync.ending {
            Ending::Done(_) => {
                let mut st = self.shared.lock();
                // Output between the interrupt and the sync is noise of the interrupt.
                st.background = Renderer::new(self.launch.output_cap / 4);
                // A REPL that shows its prompt before the end marker (node) was back at
                // the prompt with the marker on its way: it came before the sync's own.
                let late = st.late.take().filter(|m| m.n == n);
                Recovery::Back(marker.or(late))
            }
            Ending::Exited(st) => Recovery::Exited(st),
            _ => match self.restart_keeping_output().await {
                Ok(()) => {
                    Recovery::Restarted("the interpreter did not recover after an interrupt".into())
                }
                Err(e) => Recovery::Restarted(e.to_string()),
            },
        }
    }

    /// Restart, keeping what the evaluation in flight printed before (it is returned with the
    /// note that the state is lost).
    async fn restart_keeping_output(&mut self) -> Result<(), InterpError> {
        let kept = std::mem::replace(&mut self.shared.lock().out, Renderer::new(0));
        let restarted = self.restart().await;
        self.shared.lock().out = kept;
        restarted
    }

    /// Kill this interpreter's tree and start a fresh one in its place.
    async fn restart(&mut self) -> Result<(), InterpError> {
        self.kill().await;
        let timeout = Duration::from_millis(self.launch.spec.start_timeout_ms);
        let fresh = Box::pin(Interp::start(self.launch.clone(), timeout)).await?;
        *self = fresh;
        Ok(())
    }
}

pub(super) enum Recovery {
    Back(Option<EndMarker>),
    Exited(Option<std::process::ExitStatus>),
    Restarted(String),
}

impl Recovery {
    /// How the evaluation ended, after an interrupt for its deadline (`timed_out`) or for a
    /// cancel.
    pub(super) fn ending(self, timed_out: bool) -> Ending {
        match self {
            Recovery::Back(marker) if timed_out => Ending::TimedOut { marker },
            Recovery::Back(_) => Ending::Cancelled,
            Recovery::Exited(st) => Ending::Exited(st),
            Recovery::Restarted(reason) => Ending::Restarted { reason },
        }
    }
}
