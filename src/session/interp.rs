//! One interpreter process behind a PTY and the evaluation protocol that drives it.
//!
//! A reader task owns the PTY's read side: it splits the stream with the [`Scanner`] and
//! files output under the evaluation in flight (or, between evaluations, a small
//! background buffer), records end markers and prompts, and notices the end of the
//! process (the PTY reports EIO once the whole tree is gone). An evaluation writes the code
//! to a cell file, types the one eval line, and waits on the shared state.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::scan::{EndMarker, Event, Scanner};
use super::stdin_wait;
use crate::exec::pty::{self, PtyMaster, ReadOutcome};
use crate::exec::{self, Proc, SpawnSpec, Stdio3};
use crate::lang::SessionSpec;
use crate::lang::protocol::{INTERRUPT_FILE, SYNC_BASE};
use crate::lang::spec::InputWait;
use crate::output::{Rendered, Renderer};
use crate::sandbox::{Jail, Sandbox};

/// How to (re)start the interpreter.
#[derive(Debug, Clone)]
pub struct Launch {
    pub sandbox: Arc<Sandbox>,
    pub jail: Jail,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub ctl: PathBuf,
    pub nonce: String,
    /// `spec.init` with its placeholders filled in.
    pub init: Vec<String>,
    pub spec: SessionSpec,
    pub output_cap: usize,
}

/// State shared between the reader task and evaluations.
struct StreamState {
    scanner: Scanner,
    /// Protocol number of the evaluation in flight.
    current: Option<u64>,
    out: Renderer,
    /// The bootstrap announced that evaluation N began running.
    started: Option<u64>,
    end: Option<EndMarker>,
    /// Output that arrived between evaluations (shown before the next one's).
    background: Renderer,
    prompts: u64,
    continuation: bool,
    closed: bool,
}

struct Shared {
    state: Mutex<StreamState>,
    tick: watch::Sender<u64>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, StreamState> {
        // A panic while holding this lock would be a bug in this module; keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl StreamState {
    fn feed(&mut self, bytes: &[u8]) {
        let st = self;
        let events = st.scanner.feed(bytes);
        for ev in events {
            match ev {
                Event::Data(d) => {
                    if st.current.is_some() && st.end.is_none() {
                        st.out.push(&d);
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
                    }
                    // Otherwise stale (an interrupted evaluation finishing late): ignore.
                }
            }
        }
    }
}

impl Shared {
    fn close(&self) {
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

/// How an evaluation ended, before it is turned into a report.
#[derive(Debug)]
pub enum Ending {
    /// The end marker arrived.
    Done(EndMarker),
    /// The deadline passed; the interpreter was interrupted and answered (state kept).
    TimedOut { marker: Option<EndMarker> },
    /// The caller went away; interrupted like a timeout.
    Cancelled,
    /// The interpreter did not come back from the interrupt and was replaced.
    Restarted { reason: String },
    /// The interpreter ended (its exit status, if it could be read).
    Exited(Option<std::process::ExitStatus>),
    /// The REPL asked for more input: our one line was incomplete (a driver bug).
    Incomplete,
    /// The evaluation could not be started.
    Failed(String),
    /// The code is blocked reading the terminal; the evaluation is paused.
    AwaitingInput,
}

/// Receives the latest output line of a running evaluation, about twice a second.
pub type Progress = dyn Fn(String) + Send + Sync;

/// How often a running evaluation checks whether it is blocked reading the terminal.
const INPUT_POLL: Duration = Duration::from_millis(200);
/// How often progress is reported.
const PROGRESS_EVERY: Duration = Duration::from_millis(500);
/// How often an unanswered interrupt is repeated.
const REPEAT_INTERRUPT: Duration = Duration::from_secs(1);

pub struct Outcome {
    pub ending: Ending,
    pub output: Rendered,
}

/// A running interpreter.
pub struct Interp {
    proc: Proc,
    master: Arc<PtyMaster>,
    shared: Arc<Shared>,
    reader: tokio::task::JoinHandle<()>,
    /// The pid of the process the server started (the helper, or bwrap) and the
    /// interpreter's.
    helper_pid: u32,
    pub pid: u32,
    /// Internal evaluations (readiness, resynchronisation) are numbered from SYNC_BASE so
    /// that user evaluation N is `<cell N>` in tracebacks.
    next_sync: u64,
    launch: Arc<Launch>,
    /// Device number of the PTY (to recognise a process reading it).
    tty: u64,
    /// Evaluation paused waiting for input.
    paused: Option<u64>,
    /// An internal evaluation is running (see [`sync`](Self::sync)).
    in_sync: bool,
}

impl Drop for Interp {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Interp {
    /// Start the interpreter and wait until it has answered an empty evaluation.
    pub async fn start(launch: Arc<Launch>, timeout: Duration) -> Result<Self, String> {
        let (master, slave) = pty::open().map_err(|e| format!("cannot open a terminal: {e}"))?;
        let tty = pty::rdev(&slave).map_err(|e| format!("cannot inspect the terminal: {e}"))?;
        // The terminal belongs to the user the session runs as (as login programs do), so the
        // interpreter can reopen it (node's bootstrap does, through /proc/self/fd/0).
        if let Some(uid) = launch.jail.uid {
            pty::give_to(&slave, uid, uid)
                .map_err(|e| format!("cannot give the terminal to uid {uid}: {e}"))?;
        }
        let proc = exec::spawn(
            &launch.sandbox,
            SpawnSpec {
                argv: launch.argv.clone(),
                env: launch.env.clone(),
                cwd: launch.cwd.clone(),
                stdio: Stdio3::Pty(slave),
                jail: launch.jail.clone(),
            },
        )
        .map_err(|e| format!("cannot start {}: {e}", launch.argv[0]))?;
        let spec = &launch.spec;
        let shared = Arc::new(Shared {
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
                background: Renderer::new(launch.output_cap / 4),
                prompts: 0,
                continuation: false,
                closed: false,
            }),
            tick: watch::channel(0).0,
        });
        let master = Arc::new(master);
        let reader = tokio::spawn(read_loop(master.clone(), shared.clone()));
        let helper_pid = proc.pid;
        let mut me = Self {
            proc,
            master,
            shared,
            reader,
            helper_pid,
            pid: helper_pid,
            next_sync: SYNC_BASE,
            launch,
            tty,
            paused: None,
            in_sync: false,
        };
        for line in &me.launch.init {
            me.type_line(line).await?;
        }
        let deadline = Instant::now() + timeout;
        let never = CancellationToken::new();
        let ready = me.sync(deadline, &never).await;
        match ready.ending {
            Ending::Done(_) => {
                me.pid = me.proc.program_pid().unwrap_or(helper_pid);
                // Whatever the interpreter printed while starting (banners) is not output.
                me.shared.lock().background = Renderer::new(me.launch.output_cap / 4);
                Ok(me)
            }
            other => {
                tracing::warn!(tree = %replbox_exec::procfs::describe_tree(helper_pid), "interpreter did not start");
                me.kill().await;
                let what = match other {
                    Ending::Exited(Some(st)) => format!("exited ({st})"),
                    Ending::Exited(None) => "exited".to_string(),
                    Ending::Failed(e) => format!("could not be driven ({e})"),
                    _ => format!("did not answer within {} ms", timeout.as_millis()),
                };
                let output = ready.output.text.trim().to_string();
                Err(if output.is_empty() {
                    format!("the interpreter {what} while starting")
                } else {
                    format!("the interpreter {what} while starting. It printed:\n{output}")
                })
            }
        }
    }

    async fn type_line(&self, line: &str) -> Result<(), String> {
        let mut bytes = line.as_bytes().to_vec();
        bytes.push(b'\n');
        self.master
            .write_all(&bytes)
            .await
            .map_err(|e| format!("cannot write to the interpreter: {e}"))
    }

    /// An internal empty evaluation (readiness, resynchronisation).
    /// An internal evaluation never tries to recover by itself (its caller decides, by
    /// restarting), so recovery cannot recurse into recovery.
    async fn sync(&mut self, deadline: Instant, cancel: &CancellationToken) -> Outcome {
        self.next_sync += 1;
        self.in_sync = true;
        let out = Box::pin(self.run_cell(self.next_sync, "", deadline, cancel, None, false)).await;
        self.in_sync = false;
        out
    }

    /// Run evaluation number `n`. The deadline interrupts; `cancel` interrupts too. If the
    /// code blocks reading the terminal the evaluation pauses (`Ending::AwaitingInput`) and
    /// is continued with [`resume`](Self::resume).
    pub async fn eval(
        &mut self,
        n: u64,
        code: &str,
        deadline: Instant,
        cancel: &CancellationToken,
        progress: Option<&Progress>,
    ) -> Outcome {
        self.run_cell(n, code, deadline, cancel, progress, true)
            .await
    }

    async fn run_cell(
        &mut self,
        n: u64,
        code: &str,
        deadline: Instant,
        cancel: &CancellationToken,
        progress: Option<&Progress>,
        detect_input: bool,
    ) -> Outcome {
        let spec = &self.launch.spec;
        let n_s = n.to_string();
        let cell = self.launch.ctl.join(spec.cell_name(n));
        let body = match &spec.cell_template {
            Some(t) => crate::lang::expand(t, &[("code", code), ("n", &n_s)]),
            None => code.to_string(),
        };
        if let Err(e) = crate::workspace::write_ctl(&cell, body) {
            return self.fail_now(format!("cannot write the cell file: {e}"));
        }
        let background = {
            let mut st = self.shared.lock();
            st.current = Some(n);
            st.started = None;
            st.end = None;
            st.continuation = false;
            st.out = Renderer::new(self.launch.output_cap);
            std::mem::replace(
                &mut st.background,
                Renderer::new(self.launch.output_cap / 4),
            )
        };
        let line = spec.eval_line(n, &cell);
        let ending = match self.type_line(&line).await {
            Err(_) => self.wait_exit().await,
            Ok(()) => self.wait(n, deadline, cancel, progress, detect_input).await,
        };
        let mut output = self.end_part(n, &ending);
        let bg = background.finish();
        if !bg.text.is_empty() {
            output.text = format!("{}{}", bg.text, output.text);
            output.omitted += bg.omitted;
        }
        Outcome { ending, output }
    }

    /// Continue an evaluation paused waiting for input: type `text` (a newline is added
    /// when missing) and wait as for an evaluation.
    pub async fn resume(
        &mut self,
        text: &str,
        deadline: Instant,
        cancel: &CancellationToken,
        progress: Option<&Progress>,
    ) -> Outcome {
        let Some(n) = self.paused.take() else {
            return self.fail_now("no evaluation is waiting for input".into());
        };
        let mut bytes = text.as_bytes().to_vec();
        if !bytes.ends_with(b"\n") {
            bytes.push(b'\n');
        }
        let ending = match self.master.write_all(&bytes).await {
            Err(_) => self.wait_exit().await,
            Ok(()) => self.wait(n, deadline, cancel, progress, true).await,
        };
        let output = self.end_part(n, &ending);
        Outcome { ending, output }
    }

    /// Interrupt an evaluation paused waiting for input.
    pub async fn interrupt_paused(&mut self) -> Outcome {
        let Some(n) = self.paused.take() else {
            return self.fail_now("no evaluation is waiting for input".into());
        };
        let ending = match self.interrupt_and_recover(n).await {
            Recovery::Back(_) => Ending::Cancelled,
            Recovery::Exited(st) => Ending::Exited(st),
            Recovery::Restarted(reason) => Ending::Restarted { reason },
        };
        let output = self.end_part(n, &ending);
        Outcome { ending, output }
    }

    /// The evaluation number waiting for input, if any.
    pub fn paused(&self) -> Option<u64> {
        self.paused
    }

    /// Collect the output of this part of evaluation `n`; unless it paused for input, the
    /// evaluation is over.
    fn end_part(&mut self, n: u64, ending: &Ending) -> Rendered {
        let mut st = self.shared.lock();
        let part = std::mem::replace(&mut st.out, Renderer::new(self.launch.output_cap));
        if matches!(ending, Ending::AwaitingInput) {
            drop(st);
            self.paused = Some(n);
        } else {
            st.current = None;
            drop(st);
            let _ = std::fs::remove_file(self.launch.ctl.join(self.launch.spec.cell_name(n)));
            let _ = std::fs::remove_file(interrupt_flag(&self.launch.ctl, n));
        }
        part.finish()
    }

    fn fail_now(&self, reason: String) -> Outcome {
        Outcome {
            ending: Ending::Failed(reason),
            output: Renderer::new(0).finish(),
        }
    }

    /// Wait for the end marker of evaluation `n`, interrupting at the deadline, pausing
    /// when the code blocks reading the terminal, and reporting progress.
    async fn wait(
        &mut self,
        n: u64,
        deadline: Instant,
        cancel: &CancellationToken,
        progress: Option<&Progress>,
        detect_input: bool,
    ) -> Ending {
        let mut rx = self.shared.tick.subscribe();
        let now = Instant::now();
        let mut input_poll = tokio::time::interval_at(now + INPUT_POLL, INPUT_POLL);
        input_poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut progress_tick = tokio::time::interval_at(now + PROGRESS_EVERY, PROGRESS_EVERY);
        // A first sighting of "waiting for input", with the output version at that moment:
        // confirmed only if the next poll sees the same with no output in between. Runtimes
        // arm their terminal reads briefly while doing other things (ghci while it prints);
        // a program that waits for input stays silent and stays waiting.
        let mut suspected: Option<u64> = None;
        progress_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            match self.check(n) {
                Check::End(end) => return Ending::Done(end),
                Check::Closed => return self.wait_exit().await,
                Check::Continuation => {
                    if !self.in_sync {
                        let _ = self.interrupt_and_recover(n).await;
                    }
                    return Ending::Incomplete;
                }
                Check::Prompt | Check::Pending => {}
            }
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        return self.wait_exit().await;
                    }
                }
                _ = input_poll.tick() => {
                    // The helper's own exit is the authority on the tree being gone, whatever
                    // else may still hold the terminal open.
                                        if let Ok(Some(_)) = self.proc.child.try_wait() {
                        self.settle().await;
                        if let Check::End(end) = self.check(n) {
                            return Ending::Done(end);
                        }
                        // The exact status (the helper's record, not bwrap's summary).
                        return self.wait_exit().await;
                    }
                                                            let version = *rx.borrow();
                    if detect_input && self.running_user_code(n) && self.waits_for_input()
                        && self.nothing_unread(n)
                    {
                        if suspected == Some(version) {
                            return Ending::AwaitingInput;
                        }
                        suspected = Some(version);
                    } else {
                        suspected = None;
                    }
                }
                _ = progress_tick.tick(), if progress.is_some() => {
                    if let Some(report) = progress {
                        report(self.last_line());
                    }
                }
                                _ = tokio::time::sleep_until(deadline) => {
                    if self.in_sync {
                        return Ending::TimedOut { marker: None };
                    }
                    return match self.interrupt_and_recover(n).await {
                        Recovery::Back(marker) => Ending::TimedOut { marker },
                        Recovery::Exited(st) => Ending::Exited(st),
                        Recovery::Restarted(reason) => Ending::Restarted { reason },
                    };
                }
                                _ = cancel.cancelled() => {
                    if self.in_sync {
                        return Ending::Cancelled;
                    }
                    return match self.interrupt_and_recover(n).await {
                        Recovery::Back(_) => Ending::Cancelled,
                        Recovery::Exited(st) => Ending::Exited(st),
                        Recovery::Restarted(reason) => Ending::Restarted { reason },
                    };
                }
            }
        }
    }

    /// Send the interrupt, wait briefly for the REPL to come back (its end marker, or a
    /// fresh prompt), re-synchronise with an empty evaluation, and replace the interpreter
    /// if it does not come back.
    async fn interrupt_and_recover(&mut self, n: u64) -> Recovery {
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
        let prompts_before = self.shared.lock().prompts;
        // Tell the bootstrap before interrupting: a REPL that goes on with input it has
        // queued (ghci runs the rest of a macro's commands after "Interrupted.") can look
        // for this file and stop there. Removed when the evaluation ends.
        let _ = crate::workspace::write_ctl(&interrupt_flag(&self.launch.ctl, n), b"");
        if !self.send_interrupt().await {
            return match self.wait_exit().await {
                Ending::Exited(st) => Recovery::Exited(st),
                _ => Recovery::Exited(None),
            };
        }
        let until = Instant::now() + grace;
        // An interrupt that arrives at a bad moment (or gets lost on a loaded machine) is
        // repeated every second until the grace period ends; only then is the tree killed.
        let mut again =
            tokio::time::interval_at(Instant::now() + REPEAT_INTERRUPT, REPEAT_INTERRUPT);
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
                _ = again.tick() => { let _ = self.send_interrupt().await; }
                _ = tokio::time::sleep_until(until) => {
                    return match self.restart().await {
                        Ok(()) => Recovery::Restarted("the interpreter did not stop when interrupted".into()),
                        Err(e) => Recovery::Restarted(e),
                    };
                }
            }
        };
        self.after_interrupt(marker, grace).await
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
    async fn after_interrupt(&mut self, marker: Option<EndMarker>, grace: Duration) -> Recovery {
        // Keep what the interrupted evaluation printed; then drain any stray output of the
        // interrupt (a REPL that was already idle prints its own notice) with an empty
        // evaluation whose output is thrown away.
        let kept = std::mem::replace(&mut self.shared.lock().out, Renderer::new(0));
        let sync = self
            .sync(Instant::now() + grace, &CancellationToken::new())
            .await;
        self.shared.lock().out = kept;
        match sync.ending {
            Ending::Done(_) => {
                // Output between the interrupt and the sync is noise of the interrupt.
                self.shared.lock().background = Renderer::new(self.launch.output_cap / 4);
                Recovery::Back(marker)
            }
            Ending::Exited(st) => Recovery::Exited(st),
            _ => match self.restart().await {
                Ok(()) => {
                    Recovery::Restarted("the interpreter did not recover after an interrupt".into())
                }
                Err(e) => Recovery::Restarted(e),
            },
        }
    }

    /// Let the reader deliver what is still buffered: return once nothing new has arrived
    /// for a moment (bounded).
    async fn settle(&self) {
        let mut rx = self.shared.tick.subscribe();
        let until = Instant::now() + Duration::from_millis(500);
        while Instant::now() < until {
            if self.shared.lock().closed {
                return;
            }
            match tokio::time::timeout(Duration::from_millis(30), rx.changed()).await {
                Ok(Ok(())) => continue,
                _ => return,
            }
        }
    }

    /// Whether the REPL has taken the eval line and is running the cell: until then the REPL
    /// itself is (rightly) reading the terminal. Without a start marker, assume it has.
    fn running_user_code(&self, n: u64) -> bool {
        !self.launch.spec.announces_start || self.shared.lock().started == Some(n)
    }

    /// After seeing the program wait for input: has everything it wrote before that been
    /// read, without an end marker for `n`? Otherwise the wait seen was the REPL's own,
    /// after the evaluation ended.
    fn nothing_unread(&self, n: u64) -> bool {
        let st = self.shared.lock();
        st.end.as_ref().is_none_or(|e| e.n != n) && !st.closed && self.master.unread() == 0
    }

    /// Whether the program is blocked reading the terminal (see `stdin_wait`).
    fn waits_for_input(&self) -> bool {
        let signals = &self.launch.spec.input_wait;
        if signals.contains(&InputWait::Raw) && self.master.is_raw() {
            tracing::debug!("waiting for input: the terminal is in raw mode");
            return true;
        }
        match stdin_wait::tree_reader(self.helper_pid, self.tty, signals) {
            Some(how) => {
                tracing::debug!(%how, "waiting for input");
                true
            }
            None => false,
        }
    }

    /// What the stream says about evaluation `n` right now.
    fn check(&self, n: u64) -> Check {
        self.check_since(n, u64::MAX)
    }

    /// Like [`check`](Self::check), also reporting a prompt printed after `prompts_before`.
    fn check_since(&self, n: u64, prompts_before: u64) -> Check {
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

    /// Kill this interpreter's tree and start a fresh one in its place.
    async fn restart(&mut self) -> Result<(), String> {
        self.kill().await;
        let timeout = Duration::from_millis(self.launch.spec.start_timeout_ms);
        let fresh = Box::pin(Interp::start(self.launch.clone(), timeout)).await?;
        *self = fresh;
        Ok(())
    }

    /// The process ended: collect its status (the helper mirrors the interpreter's).
    async fn wait_exit(&mut self) -> Ending {
        match tokio::time::timeout(Duration::from_secs(3), self.proc.wait()).await {
            Ok(Ok(status)) => Ending::Exited(Some(status)),
            _ => {
                self.proc.kill_tree().await;
                Ending::Exited(None)
            }
        }
    }

    /// Whether the process has ended (the PTY closed).
    pub fn closed(&self) -> bool {
        self.shared.lock().closed
    }

    /// The helper's pid (bwrap's child when wrapped): what tears the tree down on SIGTERM.
    pub fn helper(&self) -> u32 {
        self.proc.helper_pid().unwrap_or(self.helper_pid)
    }

    /// Kill the whole tree and reap it.
    pub async fn kill(&mut self) -> Option<std::process::ExitStatus> {
        let st = self.proc.kill_tree().await;
        self.reader.abort();
        st
    }

    /// The last line printed so far by the evaluation in flight.
    pub fn last_line(&self) -> String {
        self.shared.lock().out.last_line()
    }
}

enum Check {
    End(EndMarker),
    Closed,
    Continuation,
    Prompt,
    Pending,
}

enum Recovery {
    Back(Option<EndMarker>),
    Exited(Option<std::process::ExitStatus>),
    Restarted(String),
}

async fn read_loop(master: Arc<PtyMaster>, shared: Arc<Shared>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // Read and file the bytes under the stream lock, so that whoever holds the lock
        // sees either the bytes still unread in the terminal or their effect, never neither.
        let res = master
            .on_readable(|m| {
                let mut st = shared.lock();
                match m.read_now(&mut buf)? {
                    ReadOutcome::Data(n) => {
                        st.feed(&buf[..n]);
                        Ok(true)
                    }
                    ReadOutcome::Closed => Ok(false),
                }
            })
            .await;
        match res {
            Ok(true) => shared.tick.send_modify(|v| *v = v.wrapping_add(1)),
            Ok(false) | Err(_) => {
                shared.close();
                return;
            }
        }
    }
}

/// The file that exists in the control directory while evaluation `n` is being interrupted.
pub fn interrupt_flag(ctl: &Path, n: u64) -> PathBuf {
    ctl.join(crate::lang::expand(
        INTERRUPT_FILE,
        &[("n", &n.to_string())],
    ))
}
