//! One interpreter process behind a PTY and the evaluation protocol that drives it.
//!
//! A reader task owns the PTY's read side: it splits the stream with the [`Scanner`] and
//! files output under the evaluation in flight (or, between evaluations, a small
//! background buffer), records end markers and prompts, and notices the end of the
//! process (the PTY reports EIO once the whole tree is gone). An evaluation writes the code
//! to a cell file, types the one eval line, and waits on the shared state.

mod input;
mod recover;
mod stream;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::scan::EndMarker;
use crate::exec::child::ChildEnv;
use crate::exec::pty::{self, PtyMaster};
use crate::exec::{self, Proc, SpawnSpec, Stdio3};
use crate::lang::SessionSpec;
use crate::lang::protocol::{INTERRUPT_FILE, SYNC_BASE};
use crate::output::{Rendered, Renderer};
use crate::progress::Progress;
use crate::sandbox::{Jail, Sandbox};
use stream::{Check, Shared, read_loop};

/// How to (re)start the interpreter.
#[derive(Debug, Clone)]
pub struct Launch {
    pub sandbox: Arc<Sandbox>,
    pub jail: Jail,
    pub argv: Vec<String>,
    pub env: ChildEnv,
    pub cwd: PathBuf,
    pub ctl: PathBuf,
    pub nonce: String,
    /// `spec.init` with its placeholders filled in.
    pub init: Vec<String>,
    pub spec: SessionSpec,
    pub output_cap: usize,
    /// Bytes of an evaluation's output kept whole when it passes `output_cap`.
    pub whole_output_cap: usize,
}

/// Why an interpreter did not start (a session's, or its restart after an interrupt).
#[derive(Debug, thiserror::Error)]
pub enum InterpError {
    #[error("cannot open a terminal: {0}")]
    OpenPty(std::io::Error),
    #[error("cannot inspect the terminal: {0}")]
    InspectPty(std::io::Error),
    #[error("cannot give the terminal to uid {uid}: {error}")]
    GivePty { uid: u32, error: std::io::Error },
    #[error("cannot start {program}: {error}")]
    Spawn {
        program: String,
        error: std::io::Error,
    },
    #[error("cannot write to the interpreter: {0}")]
    Write(std::io::Error),
    /// It did not answer its first evaluation (`how`); what it printed meanwhile, if
    /// anything, is said after.
    #[error("the interpreter {how} while starting{}", printed(.output))]
    NotReady { how: NotReady, output: String },
}

fn printed(output: &str) -> String {
    if output.is_empty() {
        String::new()
    } else {
        format!(". It printed:\n{output}")
    }
}

/// What an interpreter that did not start did instead.
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    #[error("exited ({0})")]
    ExitedWith(std::process::ExitStatus),
    #[error("exited")]
    Exited,
    /// Its first evaluation could not be started (why).
    #[error("could not be driven ({0})")]
    Failed(String),
    #[error("did not answer within {} ms", .0.as_millis())]
    Silent(Duration),
}

/// A session's interpreter did not start: neither the caller's mistake nor a refusal.
impl From<InterpError> for crate::error::ToolError {
    fn from(e: InterpError) -> Self {
        Self::new(crate::error::ErrorKind::StartFailed, e.to_string())
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
    /// The code replaced the interpreter with another program (`exec`), found waiting for
    /// input where the REPL was (its command name): its tree was killed.
    Replaced(String),
}

/// How often a running evaluation checks whether it is blocked reading the terminal.
const INPUT_POLL: Duration = Duration::from_millis(200);
/// How long an end marker may follow a prompt that came before it (see `drop_watch`).
const DROPPED_GRACE: Duration = Duration::from_millis(300);
/// How a resynchronising evaluation whose line the REPL dropped ends.
const LINE_DROPPED: &str = "the REPL dropped the line";

/// How often progress is reported.
const PROGRESS_EVERY: Duration = Duration::from_millis(500);

pub struct Outcome {
    pub ending: Ending,
    pub output: Rendered,
    /// What the agent should know besides the output (said in the result's notes).
    pub notes: Vec<String>,
    /// Everything `session_input` typed into the evaluation (its last 64 KiB), once it is
    /// over: the end marker says how much of it the program left unread.
    pub typed: Vec<u8>,
    /// Output of earlier cells that arrived after the previous evaluation ended and before
    /// this one's code began.
    pub background: Rendered,
}

impl Outcome {
    fn new(ending: Ending, output: Rendered) -> Self {
        Self {
            ending,
            output,
            notes: Vec::new(),
            typed: Vec::new(),
            background: Rendered::default(),
        }
    }
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
    /// Resynchronising after an interrupt: the prompts counted when the line was typed. A
    /// prompt after them with no end marker means the REPL dropped the line (a late
    /// interrupt reached it): the evaluation then ends as [`LINE_DROPPED`].
    drop_watch: Option<u64>,
    /// Files of finished evaluations (cells, interrupt flags), removed with the next cell's
    /// write: one trip to the blocking pool per evaluation.
    finished: Vec<PathBuf>,
    /// What `session_input` typed into the evaluation in flight.
    typed: Vec<u8>,
    /// Whether the control directory says so yet (`input-N`).
    typed_flag: bool,
    /// The helper's pid once the interpreter answered (it stays the same for its life):
    /// looked up in /proc once rather than at every evaluation.
    helper_seen: Option<u32>,
    /// The interpreter's program as it answered first (`proc::exec_id`): another one in
    /// its process means the code replaced it.
    exec_id: Option<(u64, u64)>,
}

impl Drop for Interp {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Interp {
    /// Start the interpreter and wait until it has answered an empty evaluation.
    pub async fn start(launch: Arc<Launch>, timeout: Duration) -> Result<Self, InterpError> {
        let (proc, master, tty) = spawn_on_pty(&launch)?;
        let shared = Arc::new(Shared::new(&launch));
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
            drop_watch: None,
            finished: Vec::new(),
            typed: Vec::new(),
            typed_flag: false,
            helper_seen: None,
            exec_id: None,
        };
        me.ready(timeout).await?;
        Ok(me)
    }

    /// Type the language's init lines and wait for the answer to an empty evaluation; when
    /// none comes, kill the tree and say what it printed.
    async fn ready(&mut self, timeout: Duration) -> Result<(), InterpError> {
        for line in &self.launch.init {
            self.type_line(line).await.map_err(InterpError::Write)?;
        }
        let deadline = Instant::now() + timeout;
        let never = CancellationToken::new();
        let ready = self.sync(deadline, &never).await;
        let how = match ready.ending {
            Ending::Done(_) => {
                self.pid = self.proc.program_pid().unwrap_or(self.helper_pid);
                self.helper_seen = self.proc.helper_pid();
                self.exec_id = crate::proc::exec_id(self.pid);
                // Whatever the interpreter printed while starting (banners) is not output.
                self.shared.lock().background = Renderer::new(self.launch.output_cap / 4);
                return Ok(());
            }
            Ending::Exited(Some(st)) => NotReady::ExitedWith(st),
            Ending::Exited(None) => NotReady::Exited,
            Ending::Failed(e) => NotReady::Failed(e),
            _ => NotReady::Silent(timeout),
        };
        tracing::warn!(
            tree = %crate::proc::describe_tree(self.helper_pid),
            "interpreter did not start"
        );
        self.kill().await;
        let output = ready.output.text.trim().to_string();
        Err(InterpError::NotReady { how, output })
    }

    async fn type_line(&self, line: &str) -> std::io::Result<()> {
        let mut bytes = line.as_bytes().to_vec();
        bytes.push(b'\n');
        self.master.write_all(&bytes).await
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

    /// Change the server's variables its restarts get (`f` on them): a warm session given
    /// its packages' search path after it started is then restarted as a cold start with
    /// them would have been.
    pub fn update_launch_env(&mut self, f: impl FnOnce(&mut Vec<(String, String)>)) {
        let mut launch = (*self.launch).clone();
        f(&mut launch.env.server);
        self.launch = Arc::new(launch);
    }

    /// An internal evaluation of `code` that answers a question about the session
    /// (`session_vars`): numbered like the others from SYNC_BASE, never paused for input;
    /// at the deadline it is interrupted and the REPL recovered as for a user evaluation.
    /// Output that arrived between evaluations stays for the next one.
    pub async fn internal(&mut self, code: &str, deadline: Instant) -> Outcome {
        self.next_sync += 1;
        let n = self.next_sync;
        let cap = self.launch.output_cap / 4;
        let bg = std::mem::replace(&mut self.shared.lock().background, Renderer::new(cap));
        let out = self
            .run_cell(n, code, deadline, &CancellationToken::new(), None, false)
            .await;
        // What arrived meanwhile (before this evaluation's start, or since its end) stays
        // too, after what was there.
        let after = {
            let mut st = self.shared.lock();
            let after = std::mem::replace(&mut st.background, bg);
            st.background.push(out.background.text.as_bytes());
            after
        };
        let after = after.finish().await;
        self.shared.lock().background.push(after.text.as_bytes());
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
        let code = unix_newlines(code);
        self.run_cell(n, &code, deadline, cancel, progress, true)
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
        self.forget_typed();
        let spec = &self.launch.spec;
        let n_s = n.to_string();
        let cell = self.launch.ctl.join(spec.cell_name(n));
        let body = match &spec.cell_template {
            Some(t) => crate::lang::expand(t, &[("code", code), ("n", &n_s)]),
            None => code.to_string(),
        };
        let finished = std::mem::take(&mut self.finished);
        let written = if body.len() <= INLINE_CELL {
            // A few small writes in the server's own directory: cheaper here than the trip
            // to the blocking pool and back (two thread wake-ups per evaluation).
            write_cell(finished, &cell, body)
        } else {
            let path = cell.clone();
            tokio::task::spawn_blocking(move || write_cell(finished, &path, body))
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e)))
        };
        if let Err(e) = written {
            return self.fail_now(format!("cannot write the cell file: {e}"));
        }
        let background = {
            let mut st = self.shared.lock();
            st.current = Some(n);
            st.started = None;
            st.end = None;
            st.continuation = false;
            st.out = Renderer::with_whole(self.launch.output_cap, self.launch.whole_output_cap);
            st.early = Renderer::new(self.launch.output_cap / 4);
            std::mem::replace(
                &mut st.background,
                Renderer::new(self.launch.output_cap / 4),
            )
        };
        if detect_input {
            // Keys typed without Enter that no program read are still in the terminal's
            // line buffer; the eval line must not be appended to them.
            self.master.flush_input();
        }
        let line = spec.eval_line(n, &cell);
        if self.drop_watch.is_some() {
            self.drop_watch = Some(self.shared.lock().prompts);
        }
        let ending = match self.type_line(&line).await {
            Err(_) => self.wait_exit().await,
            Ok(()) => self.wait(n, deadline, cancel, progress, detect_input).await,
        };
        let mut outcome = self.finish(n, ending).await;
        let (early, started) = {
            let mut st = self.shared.lock();
            let cap = self.launch.output_cap / 4;
            (
                std::mem::replace(&mut st.early, Renderer::new(cap)),
                st.started == Some(n),
            )
        };
        let mut bg = background.finish().await;
        let early = early.finish().await;
        if started {
            bg.text.push_str(&early.text);
            bg.omitted += early.omitted;
        } else if !early.text.is_empty() {
            // It never started (the REPL refused the line, or died): what it printed is the
            // answer to this evaluation.
            outcome.output.text = format!("{}{}", early.text, outcome.output.text);
            outcome.output.omitted += early.omitted;
        }
        outcome.background = bg;
        outcome
    }

    /// Interrupt an evaluation paused waiting for input.
    pub async fn interrupt_paused(&mut self) -> Outcome {
        let Some(n) = self.paused.take() else {
            return self.fail_now("no evaluation is waiting for input".into());
        };
        let ending = self.interrupt_and_recover(n).await.ending(false);
        self.finish(n, ending).await
    }

    /// The outcome of this part of evaluation `n` (see [`end_part`](Self::end_part)); with
    /// what was typed into it, when it is over.
    async fn finish(&mut self, n: u64, ending: Ending) -> Outcome {
        let output = self.end_part(n, &ending).await;
        let mut outcome = Outcome::new(ending, output);
        if !matches!(outcome.ending, Ending::AwaitingInput) {
            outcome.typed = std::mem::take(&mut self.typed);
        }
        outcome
    }

    /// Collect the output of this part of evaluation `n`; unless it paused for input, the
    /// evaluation is over.
    async fn end_part(&mut self, n: u64, ending: &Ending) -> Rendered {
        let awaiting = matches!(ending, Ending::AwaitingInput);
        let part = {
            let mut st = self.shared.lock();
            if !awaiting {
                st.current = None;
            }
            std::mem::replace(&mut st.out, Renderer::new(self.launch.output_cap))
        };
        if awaiting {
            self.paused = Some(n);
        } else {
            self.finished
                .push(self.launch.ctl.join(self.launch.spec.cell_name(n)));
            self.finished.push(interrupt_flag(&self.launch.ctl, n));
            self.finished.push(input::input_flag(&self.launch.ctl, n));
        }
        part.finish().await
    }

    fn fail_now(&self, reason: String) -> Outcome {
        Outcome::new(Ending::Failed(reason), Rendered::default())
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
        progress_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        // A first sighting of "waiting for input", with the output version at that moment
        // (see `input::confirm`).
        let mut suspected: Option<input::Suspicion> = None;
        // When a prompt came instead of the end marker (see `drop_watch`): the marker may
        // still be on its way, for a moment.
        let mut dropped: Option<Instant> = None;
        loop {
            let check = match self.drop_watch {
                Some(p) => self.check_since(n, p),
                None => self.check(n),
            };
            match check {
                Check::End(end) => return Ending::Done(end),
                Check::Prompt if dropped.is_none() && self.drop_watch.is_some() => {
                    dropped = Some(Instant::now() + DROPPED_GRACE);
                }
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
                    let version = *rx.borrow();
                    let polled = self.poll(n, detect_input, version, &mut suspected).await;
                    if let Some(ending) = polled {
                        return ending;
                    }
                }
                _ = progress_tick.tick(), if progress.is_some() => {
                    if let Some(report) = progress {
                        report(self.last_line());
                    }
                }
                _ = tokio::time::sleep_until(dropped.unwrap_or(deadline)), if dropped.is_some() => {
                    return Ending::Failed(LINE_DROPPED.into());
                }
                _ = tokio::time::sleep_until(deadline) => return self.stop(n, true).await,
                _ = cancel.cancelled() => return self.stop(n, false).await,
            }
        }
    }

    /// One poll of evaluation `n`'s processes: the end of the tree, or the code waiting for
    /// input, confirmed at the same output `version` (`suspected` keeps the first sighting).
    async fn poll(
        &mut self,
        n: u64,
        detect_input: bool,
        version: u64,
        suspected: &mut Option<input::Suspicion>,
    ) -> Option<Ending> {
        // The helper's own exit is the authority on the tree being gone, whatever else may
        // still hold the terminal open.
        if let Ok(Some(_)) = self.proc.child.try_wait() {
            self.settle().await;
            if let Check::End(end) = self.check(n) {
                return Some(Ending::Done(end));
            }
            // The exact status (the helper's record, not bwrap's summary).
            return Some(self.wait_exit().await);
        }
        let wait = if detect_input && self.running_user_code(n) {
            self.input_wait()
        } else {
            None
        };
        match wait {
            Some(w) if self.nothing_unread(n) => {
                if input::confirm(suspected, version, w.timeout, Instant::now()) {
                    if let Some(program) = self.replaced() {
                        tracing::info!(program = %program, "the interpreter was replaced");
                        self.kill().await;
                        return Some(Ending::Replaced(program));
                    }
                    return Some(Ending::AwaitingInput);
                }
            }
            _ => *suspected = None,
        }
        None
    }

    /// The deadline passed (`timed_out`) or the call was cancelled: interrupt evaluation
    /// `n` and get the REPL back. An internal evaluation does not recover by itself.
    async fn stop(&mut self, n: u64, timed_out: bool) -> Ending {
        // The cell may have ended as the deadline passed: then it is over, not interrupted.
        if let Check::End(end) = self.check(n) {
            return Ending::Done(end);
        }
        if self.in_sync {
            return if timed_out {
                Ending::TimedOut { marker: None }
            } else {
                Ending::Cancelled
            };
        }
        self.interrupt_and_recover(n).await.ending(timed_out)
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

    /// The helper's pid (bwrap's child when wrapped): what tears the tree down on SIGTERM.
    pub fn helper(&self) -> u32 {
        self.helper_seen
            .or_else(|| self.proc.helper_pid())
            .unwrap_or(self.helper_pid)
    }

    /// Whether the tree has ended (the helper exited): for a warm session waiting unused.
    pub fn ended(&mut self) -> bool {
        !matches!(self.proc.child.try_wait(), Ok(None))
    }

    /// Kill the whole tree and reap it.
    pub async fn kill(&mut self) -> Option<std::process::ExitStatus> {
        let st = self.proc.kill_tree().await;
        self.reader.abort();
        st
    }

    /// The program that now runs in the interpreter's process, when the code replaced the
    /// interpreter with it (`exec bash`, `os.execv`): what reads the terminal then is no
    /// REPL this session can drive.
    fn replaced(&self) -> Option<String> {
        let was = self.exec_id?;
        let now = crate::proc::exec_id(self.pid)?;
        (now != was).then(|| crate::proc::comm(self.pid).unwrap_or_else(|| "?".into()))
    }

    /// The last line printed so far by the evaluation in flight.
    pub fn last_line(&self) -> String {
        self.shared.lock().out.last_line()
    }
}

/// Start the interpreter on a new terminal: its master side, and the terminal's device
/// number (to recognise a process reading it).
fn spawn_on_pty(launch: &Launch) -> Result<(Proc, PtyMaster, u64), InterpError> {
    let (master, slave) = pty::open().map_err(InterpError::OpenPty)?;
    let tty = pty::rdev(&slave).map_err(InterpError::InspectPty)?;
    // The terminal belongs to the user the session runs as (as login programs do), so the
    // interpreter can reopen it (node's bootstrap does, through /proc/self/fd/0).
    if let Some(uid) = launch.jail.uid {
        pty::give_to(&slave, uid, uid).map_err(|error| InterpError::GivePty { uid, error })?;
    }
    let proc = exec::spawn(
        &launch.sandbox,
        SpawnSpec {
            argv: launch.argv.clone(),
            env: launch.env.merged(),
            cwd: launch.cwd.clone(),
            stdio: Stdio3::Pty(slave),
            jail: launch.jail.clone(),
        },
    )
    .map_err(|error| InterpError::Spawn {
        program: launch.argv[0].clone(),
        error,
    })?;
    Ok((proc, master, tty))
}

/// Cells up to this size are written on the async worker itself.
const INLINE_CELL: usize = 16 * 1024;

/// Remove the files of finished evaluations, then write the cell file.
fn write_cell(finished: Vec<PathBuf>, path: &Path, body: String) -> std::io::Result<()> {
    for f in finished {
        let _ = std::fs::remove_file(f);
    }
    crate::workspace::write_ctl(path, body)
}

/// `text` with Windows (CRLF) and old Mac (CR) line endings made Unix ones: a REPL reads
/// a carriage return as part of the line (bash would run `cd d1\r`).
pub fn unix_newlines(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains('\r') {
        return std::borrow::Cow::Borrowed(text);
    }
    std::borrow::Cow::Owned(text.replace("\r\n", "\n").replace('\r', "\n"))
}

/// The file that exists in the control directory while evaluation `n` is being interrupted.
pub fn interrupt_flag(ctl: &Path, n: u64) -> PathBuf {
    ctl.join(crate::lang::expand(
        INTERRUPT_FILE,
        &[("n", &n.to_string())],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_messages_are_pinned() {
        let e = |how, output: &str| {
            InterpError::NotReady {
                how,
                output: output.into(),
            }
            .to_string()
        };
        assert_eq!(
            e(NotReady::Silent(Duration::from_secs(10)), ""),
            "the interpreter did not answer within 10000 ms while starting"
        );
        assert_eq!(
            e(
                NotReady::Exited,
                "Traceback (most recent call last):\n  ..."
            ),
            "the interpreter exited while starting. It printed:\nTraceback (most recent call \
             last):\n  ..."
        );
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            e(
                NotReady::ExitedWith(std::process::ExitStatus::from_raw(1 << 8)),
                ""
            ),
            "the interpreter exited (exit status: 1) while starting"
        );
        assert_eq!(
            e(NotReady::Failed("the terminal is gone".into()), ""),
            "the interpreter could not be driven (the terminal is gone) while starting"
        );
        let spawn = InterpError::Spawn {
            program: "/usr/bin/python3".into(),
            error: std::io::Error::from_raw_os_error(13),
        };
        assert_eq!(
            spawn.to_string(),
            "cannot start /usr/bin/python3: Permission denied (os error 13)"
        );
        let e: crate::error::ToolError = spawn.into();
        assert_eq!(e.kind, crate::error::ErrorKind::StartFailed);
    }

    #[test]
    fn line_endings_become_unix_ones() {
        assert_eq!(unix_newlines("a\r\nb\r\n"), "a\nb\n");
        assert_eq!(unix_newlines("a\rb"), "a\nb");
        assert_eq!(unix_newlines("a\r\r\nb"), "a\n\nb");
        assert!(matches!(
            unix_newlines("plain\n"),
            std::borrow::Cow::Borrowed(_)
        ));
    }
}
