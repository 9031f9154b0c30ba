//! One process of a run: started with pipes, fed its stdin, both streams captured within
//! the cap, and waited for until it ends, the deadline passes or the call is cancelled.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use super::{RunReport, Runner};
use crate::exec::child::Child;
use crate::exec::{self, SpawnSpec, Stdio3};
use crate::output::HeadTail;
use crate::progress::Progress;

/// What a step is watched for: its deadline, the call's cancellation, and whom to tell
/// its progress.
#[derive(Clone, Copy)]
pub(super) struct Watch<'a> {
    pub(super) deadline: tokio::time::Instant,
    pub(super) cancel: &'a CancellationToken,
    pub(super) progress: Option<&'a Progress>,
}

pub(super) struct Step {
    pub(super) status: Option<std::process::ExitStatus>,
    stdout: HeadTail,
    stderr: HeadTail,
    pub(super) timed_out: bool,
    pub(super) cancelled: bool,
    pub(super) spawn_error: Option<String>,
}

impl Runner {
    pub(super) fn fill(report: &mut RunReport, step: Step) {
        let (stdout, o1) = step.stdout.finish();
        let (stderr, o2) = step.stderr.finish();
        report.stdout = stdout;
        report.stderr = stderr;
        report.truncated = o1 > 0 || o2 > 0;
        report.timed_out = step.timed_out;
        if let Some(status) = &step.status {
            let (code, sig) = exec::describe_status(status);
            report.exit_code = code;
            report.signal = sig;
        }
        if step.timed_out {
            // The tree was killed; whatever status the helper mirrored, it was our SIGKILL.
            report.exit_code = None;
            report.signal = Some("SIGKILL".into());
        }
        if let Some(e) = step.spawn_error {
            report.error = Some(e);
        } else if step.cancelled {
            report.error = Some("cancelled by the client".into());
        }
    }

    pub(super) async fn step(
        &self,
        spec: SpawnSpec,
        stdin: Option<Vec<u8>>,
        watch: Watch<'_>,
    ) -> Step {
        let program = spec.argv.first().cloned().unwrap_or_default();
        match exec::spawn(&self.sandbox, spec) {
            Ok(proc) => self.supervise(proc, stdin.unwrap_or_default(), watch).await,
            Err(e) => {
                let mut step = self.empty_step();
                step.spawn_error = Some(format!("failed to start {program}: {e}"));
                step
            }
        }
    }

    fn empty_step(&self) -> Step {
        let cap = self.config.output_cap;
        Step {
            status: None,
            stdout: HeadTail::new(cap),
            stderr: HeadTail::new(cap),
            timed_out: false,
            cancelled: false,
            spawn_error: None,
        }
    }

    /// Feed `stdin` (then close it), capture both streams, and wait for the end, the
    /// deadline or a cancel (which kill the tree).
    pub(super) async fn supervise(
        &self,
        mut proc: exec::Proc,
        stdin: Vec<u8>,
        watch: Watch<'_>,
    ) -> Step {
        let Watch {
            deadline,
            cancel,
            progress,
        } = watch;
        let cap = self.config.output_cap;
        let mut step = self.empty_step();
        if let Some(mut pipe) = proc.child.stdin.take() {
            tokio::spawn(async move {
                // A program that does not read its input is not an error.
                let _ = pipe.write_all(&stdin).await;
                let _ = pipe.shutdown().await;
            });
        }
        // The last bytes written to either stream, for progress messages.
        let recent = Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
        let out_task = proc
            .child
            .stdout
            .take()
            .map(|p| tokio::spawn(capture(p, cap, recent.clone())));
        let err_task = proc
            .child
            .stderr
            .take()
            .map(|p| tokio::spawn(capture(p, cap, recent.clone())));

        let every = Duration::from_millis(500);
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                status = proc.wait() => { step.status = status.ok(); break; }
                _ = tokio::time::sleep_until(deadline) => {
                    step.timed_out = true;
                    step.status = proc.kill_tree().await;
                    break;
                }
                _ = cancel.cancelled() => {
                    step.cancelled = true;
                    step.status = proc.kill_tree().await;
                    break;
                }
                _ = tick.tick(), if progress.is_some() => {
                    if let Some(report) = progress {
                        let bytes = recent.lock().map(|b| b.clone()).unwrap_or_default();
                        report(last_line(&bytes));
                    }
                }
            }
        }
        // The helper has killed the tree, so the pipes close; bound the wait anyway in case
        // something outside the tree holds them.
        for (task, slot) in [(out_task, &mut step.stdout), (err_task, &mut step.stderr)] {
            if let Some(task) = task {
                match tokio::time::timeout(Duration::from_secs(2), task).await {
                    Ok(Ok(buf)) => *slot = buf,
                    _ => slot.push(b"\n[output stream did not close; capture stopped]\n"),
                }
            }
        }
        step
    }
}

/// A program with its three streams on pipes; stdin is closed after its input (if any).
pub(super) fn pipes(argv: Vec<String>, child: &Child, cwd: &Path) -> SpawnSpec {
    SpawnSpec {
        argv,
        env: child.env.merged(),
        cwd: cwd.to_path_buf(),
        stdio: Stdio3::Pipes,
        jail: child.jail.clone(),
    }
}

/// Read a pipe to its end, keeping head and tail, and the most recent bytes in `recent`.
async fn capture(
    mut pipe: impl AsyncRead + Unpin,
    cap: usize,
    recent: Arc<std::sync::Mutex<Vec<u8>>>,
) -> HeadTail {
    const RECENT: usize = 512;
    let mut buf = HeadTail::new(cap);
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                buf.push(&chunk[..n]);
                if let Ok(mut r) = recent.lock() {
                    r.extend_from_slice(&chunk[n.saturating_sub(RECENT)..n]);
                    let excess = r.len().saturating_sub(RECENT);
                    r.drain(..excess);
                }
            }
        }
    }
    buf
}

/// The last non-empty line of some output, as a person would read it.
fn last_line(bytes: &[u8]) -> String {
    let text = crate::output::render_all(bytes, 4096).text;
    text.trim_end()
        .rsplit('\n')
        .next()
        .unwrap_or("")
        .chars()
        .take(200)
        .collect()
}
