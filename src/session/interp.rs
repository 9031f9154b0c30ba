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
use crate::exec::pty::{self, PtyMaster, ReadOutcome};
use crate::exec::{self, Proc, SpawnSpec, Stdio3};
use crate::lang::{SessionSpec, expand};
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
    pub spec: SessionSpec,
    pub output_cap: usize,
}

/// State shared between the reader task and evaluations.
struct StreamState {
    scanner: Scanner,
    /// Protocol number of the evaluation in flight.
    current: Option<u64>,
    out: Renderer,
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

    fn feed(&self, bytes: &[u8]) {
        let mut st = self.lock();
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
                Event::End(m) => {
                    if st.current == Some(m.n) && st.end.is_none() {
                        st.end = Some(m);
                    }
                    // Otherwise stale (an interrupted evaluation finishing late): ignore.
                }
            }
        }
        drop(st);
        self.tick.send_modify(|v| *v = v.wrapping_add(1));
    }

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
}

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
    pub helper_pid: u32,
    pub pid: u32,
    /// Internal evaluations (readiness, resynchronisation) are numbered from SYNC_BASE so
    /// that user evaluation N is `<cell N>` in tracebacks.
    next_sync: u64,
    launch: Arc<Launch>,
}

const SYNC_BASE: u64 = 1 << 40;

impl Drop for Interp {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Interp {
    /// Start the interpreter and wait until it has answered an empty evaluation.
    pub async fn start(launch: Arc<Launch>, timeout: Duration) -> Result<Self, String> {
        let (master, slave) = pty::open().map_err(|e| format!("cannot open a terminal: {e}"))?;
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
                    &expand(&spec.prompt, &[("nonce", &launch.nonce)]),
                    spec.continuation
                        .as_deref()
                        .map(|c| expand(c, &[("nonce", &launch.nonce)]))
                        .as_deref(),
                ),
                current: None,
                out: Renderer::new(launch.output_cap),
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
        };
        for line in &me.launch.spec.init {
            let line = expand(
                line,
                &[
                    ("nonce", &me.launch.nonce),
                    ("ctl", &path_str(&me.launch.ctl)),
                ],
            );
            me.type_line(&line).await?;
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
                me.kill().await;
                let what = match other {
                    Ending::Exited(Some(st)) => format!("exited ({st})"),
                    Ending::Exited(None) => "exited".to_string(),
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
    async fn sync(&mut self, deadline: Instant, cancel: &CancellationToken) -> Outcome {
        self.next_sync += 1;
        Box::pin(self.eval(self.next_sync, "", deadline, cancel)).await
    }

    /// Run evaluation number `n`. The deadline interrupts; `cancel` interrupts too.
    pub async fn eval(
        &mut self,
        n: u64,
        code: &str,
        deadline: Instant,
        cancel: &CancellationToken,
    ) -> Outcome {
        let spec = &self.launch.spec;
        let n_s = n.to_string();
        let cell = self
            .launch
            .ctl
            .join(expand(&spec.cell_file, &[("n", &n_s)]));
        let body = match &spec.cell_template {
            Some(t) => expand(t, &[("code", code), ("n", &n_s)]),
            None => code.to_string(),
        };
        if let Err(e) = std::fs::write(&cell, body) {
            return self.fail_now(format!("cannot write the cell file: {e}"));
        }
        let background = {
            let mut st = self.shared.lock();
            st.current = Some(n);
            st.end = None;
            st.continuation = false;
            st.out = Renderer::new(self.launch.output_cap);
            std::mem::replace(
                &mut st.background,
                Renderer::new(self.launch.output_cap / 4),
            )
        };
        let line = expand(&spec.eval, &[("n", &n_s), ("cell", &path_str(&cell))]);
        let typed = self.type_line(&line).await;
        let ending = match typed {
            Err(_) => self.wait_exit().await,
            Ok(()) => self.wait(n, deadline, cancel).await,
        };
        let _ = std::fs::remove_file(&cell);
        let mut output = {
            let mut st = self.shared.lock();
            st.current = None;
            std::mem::replace(&mut st.out, Renderer::new(0)).finish()
        };
        let bg = background.finish();
        if !bg.text.is_empty() {
            output.text = format!("{}{}", bg.text, output.text);
            output.omitted += bg.omitted;
        }
        Outcome { ending, output }
    }

    fn fail_now(&self, reason: String) -> Outcome {
        Outcome {
            ending: Ending::Failed(reason),
            output: Renderer::new(0).finish(),
        }
    }

    /// Wait for the end marker of evaluation `n`.
    async fn wait(&mut self, n: u64, deadline: Instant, cancel: &CancellationToken) -> Ending {
        let mut rx = self.shared.tick.subscribe();
        loop {
            match self.check(n) {
                Check::End(end) => return Ending::Done(end),
                Check::Closed => return self.wait_exit().await,
                Check::Continuation => {
                    let _ = self.interrupt_and_recover(n).await;
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
                _ = tokio::time::sleep_until(deadline) => {
                    return match self.interrupt_and_recover(n).await {
                        Recovery::Back(marker) => Ending::TimedOut { marker },
                        Recovery::Exited(st) => Ending::Exited(st),
                        Recovery::Restarted(reason) => Ending::Restarted { reason },
                    };
                }
                _ = cancel.cancelled() => {
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
        let prompts_before = self.shared.lock().prompts;
        let interrupt = self.launch.spec.interrupt.clone();
        if self.master.write_all(interrupt.as_bytes()).await.is_err() {
            return match self.wait_exit().await {
                Ending::Exited(st) => Recovery::Exited(st),
                _ => Recovery::Exited(None),
            };
        }
        let until = Instant::now() + grace;
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
                _ = tokio::time::sleep_until(until) => {
                    return match self.restart().await {
                        Ok(()) => Recovery::Restarted("the interpreter did not stop when interrupted".into()),
                        Err(e) => Recovery::Restarted(e),
                    };
                }
            }
        };
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
        match master.read(&mut buf).await {
            Ok(ReadOutcome::Data(n)) => shared.feed(&buf[..n]),
            Ok(ReadOutcome::Closed) | Err(_) => {
                shared.close();
                return;
            }
        }
    }
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}
