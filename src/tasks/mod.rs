//! Long tool calls as MCP tasks (the `io.modelcontextprotocol/tasks` extension): the call
//! answers at once with a task, the work goes on detached from the request that started it,
//! and `tasks/get`, `tasks/update` and `tasks/cancel` reach it from any connection of the
//! same principal.
//!
//! This module keeps the books only (who owns which task, its status, its latest line, the
//! question it waits on, its result); `mcp` runs the work and reports into a [`TaskHandle`].
//! Results are kept for `--task-keep-s` after the task ended, and at most
//! [`KEPT_PER_PRINCIPAL`] ended tasks per principal (the oldest forgotten first); each
//! result is bounded as the tool's own result is.
//!
//! With `--state-dir`, tasks outlive the server (`store`): a task that was running when the
//! server stopped is `failed` after the restart, saying so ([`stopped_error`]); an ended
//! one's result stays fetchable, and its idempotency key remembered, until its retention
//! ends. A server that stops waits a little for running tasks ([`Tasks::stop`]), then
//! interrupts them.

mod store;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use rmcp::model::{DetailedTask, InputRequest, JsonObject, Task, TaskPayload, TaskStatus};
use rmcp::task_manager::current_timestamp;
use serde_json::Value;
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::identity::Caller;

/// Ended tasks kept per principal; past it the oldest ended one is forgotten.
pub const KEPT_PER_PRINCIPAL: usize = 256;

/// Tasks running at once per principal (each also holds a session's interpreter or a
/// run's share, which have their own limits; this bounds the books).
pub const RUNNING_PER_PRINCIPAL: usize = 256;

/// The poll interval suggested to clients.
const POLL_INTERVAL_MS: u64 = 1_000;

/// Every task of the server, whatever connection started it.
pub struct Tasks {
    inner: Mutex<HashMap<String, Entry>>,
    /// How long an ended task's result is kept.
    keep: Duration,
    /// Where tasks are kept across restarts (`--state-dir`).
    store: Option<store::Store>,
    /// The server is stopping: work cancelled now was stopped by it, not by its client.
    stopping: AtomicBool,
    /// Tasks ended so far (their order, for forgetting the oldest first).
    ends: AtomicU64,
}

struct Entry {
    owner: Caller,
    /// The tool it runs.
    tool: String,
    task: Task,
    state: State,
    cancel: CancellationToken,
    /// Unix milliseconds.
    created: u64,
    /// When it ended (unix milliseconds); what the retention counts from.
    ended: Option<u64>,
    /// Its client cancelled it (`tasks/cancel`).
    cancelled_by_client: bool,
    /// The order it ended in, in this server (0: ended in an earlier one).
    order: u64,
    /// Questions asked so far (keys are unique over the task's life).
    asked: u64,
    /// Flips to true when the task ends (for callers waiting on its result).
    done: watch::Sender<bool>,
    /// The caller's idempotency key and the fingerprint of the call it was given with.
    key: Option<(String, String)>,
}

/// What [`Tasks::claim`] found or made.
pub enum Claim {
    /// A new task: the caller runs the work and reports through the handle.
    New(Task, TaskHandle),
    /// The caller's task with that idempotency key: `same` when it was given to the same
    /// call (tool and arguments); `done` flips when it ends.
    Existing {
        task: Task,
        same: bool,
        done: watch::Receiver<bool>,
    },
}

enum State {
    Working,
    /// The work waits for `tasks/update` to answer `request` under `key`.
    InputRequired {
        key: String,
        request: Box<InputRequest>,
        reply: oneshot::Sender<Value>,
    },
    Ended(TaskPayload),
}

fn lock(m: &Mutex<HashMap<String, Entry>>) -> MutexGuard<'_, HashMap<String, Entry>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why a task request was refused. Another principal's task is unknown, like one that
/// never existed.
#[derive(Debug, PartialEq, Eq)]
pub enum TaskError {
    Unknown(String),
    Ended(String, TaskStatus),
    TooMany(usize),
}

impl std::fmt::Display for TaskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TaskError::Unknown(id) => write!(
                f,
                "no task {id:?}: it never existed, belongs to another caller, or ended and was \
forgotten"
            ),
            TaskError::Ended(id, status) => write!(
                f,
                "task {id} has already ended ({}); tasks/get returns its result",
                status_word(*status)
            ),
            TaskError::TooMany(n) => write!(
                f,
                "{n} tasks of yours are running; wait for one to end or cancel one with \
tasks/cancel"
            ),
        }
    }
}

fn status_word(s: TaskStatus) -> &'static str {
    match s {
        TaskStatus::Working => "working",
        TaskStatus::InputRequired => "input_required",
        TaskStatus::Completed => "completed",
        TaskStatus::Failed => "failed",
        TaskStatus::Cancelled => "cancelled",
        _ => "ended",
    }
}

/// Unix milliseconds now.
fn now_ms() -> u64 {
    millis(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default(),
    )
}

/// Why a task that ran when the server stopped did not end, as the `error` of its `failed`
/// state (a JSON-RPC error object; `data.kind` is `server_restarted`).
pub fn stopped_error(tool: &str) -> JsonObject {
    let message = if tool == "run-code" {
        "the server restarted while this run ran: it was stopped and is not run again"
    } else {
        "the server restarted while this cell ran: the cell did not finish and is not run \
again; the session was restored up to the cell before (its next session_eval or \
session_restore brings it back)"
    };
    let mut e = JsonObject::new();
    e.insert("code".into(), Value::from(-32603));
    e.insert("message".into(), Value::from(message));
    e.insert(
        "data".into(),
        serde_json::json!({"kind": "server_restarted"}),
    );
    e
}

impl Tasks {
    /// The books, in memory only.
    pub fn new(keep: Duration) -> Self {
        Self {
            inner: Mutex::new(HashMap::new()),
            keep,
            store: None,
            stopping: AtomicBool::new(false),
            ends: AtomicU64::new(0),
        }
    }

    /// The books kept in `state_dir` too: the tasks a stopped server left are read back,
    /// those that were running become `failed` ([`stopped_error`]).
    pub fn open(keep: Duration, state_dir: &std::path::Path) -> anyhow::Result<Self> {
        let store = store::Store::open(state_dir).map_err(|e| {
            anyhow::anyhow!(
                "state directory {}: cannot keep tasks in it: {e}",
                state_dir.display()
            )
        })?;
        let mut tasks = Self::new(keep);
        let now = now_ms();
        let keep_ms = millis(keep);
        let (mut restored, mut failed) = (0, 0);
        let mut map = HashMap::new();
        for mut s in store.load() {
            if s.ended_ms.is_some_and(|t| now.saturating_sub(t) >= keep_ms) {
                store.remove(&s.task.task_id);
                continue;
            }
            let outcome = match s.outcome.take() {
                Some(o) if s.ended_ms.is_some() => o,
                _ => {
                    // Running when the server stopped: it never ends now.
                    let o = store::Outcome::Failed {
                        error: stopped_error(&s.tool),
                    };
                    s.ended_ms = Some(now);
                    s.task.status = TaskStatus::Failed;
                    s.task.status_message = Some("the server restarted while it ran".into());
                    s.task.last_updated_at = current_timestamp();
                    s.task.ttl_ms = Some(now.saturating_sub(s.created_ms) + keep_ms);
                    s.outcome = Some(o.clone());
                    if let Err(e) = store.save(&s) {
                        tracing::error!(task = %s.task.task_id, error = %e, "cannot write the task's file");
                    }
                    failed += 1;
                    o
                }
            };
            let (done, _) = watch::channel(true);
            let id = s.task.task_id.clone();
            map.insert(
                id,
                Entry {
                    owner: Caller { principal: s.owner },
                    tool: s.tool,
                    task: s.task,
                    state: State::Ended(outcome.payload()),
                    cancel: CancellationToken::new(),
                    created: s.created_ms,
                    ended: s.ended_ms,
                    cancelled_by_client: false,
                    order: 0,
                    asked: 0,
                    done,
                    key: s.key,
                },
            );
            restored += 1;
        }
        if restored > 0 {
            tracing::info!(
                restored,
                failed,
                "tasks found in the state directory ({failed} were running when the server stopped)"
            );
        }
        tasks.inner = Mutex::new(map);
        tasks.store = Some(store);
        Ok(tasks)
    }

    /// A new working task of `owner`, whose work should end within `runs_for`.
    #[cfg(test)]
    pub fn create(
        self: &Arc<Self>,
        owner: &Caller,
        runs_for: Duration,
    ) -> Result<(Task, TaskHandle), TaskError> {
        match self.claim(owner, "session_eval", runs_for, None)? {
            Claim::New(task, handle) => Ok((task, handle)),
            Claim::Existing { .. } => Err(TaskError::Unknown(String::new())),
        }
    }

    /// A new task of `owner` running `tool`, or, when `key` (an idempotency key and the
    /// fingerprint of the call) names one of its tasks still kept, that task.
    pub fn claim(
        self: &Arc<Self>,
        owner: &Caller,
        tool: &str,
        runs_for: Duration,
        key: Option<(String, String)>,
    ) -> Result<Claim, TaskError> {
        let forgotten = self.sweep(&mut lock(&self.inner), owner);
        self.forget(forgotten);
        let mut map = lock(&self.inner);
        if let Some((k, fingerprint)) = &key
            && let Some(e) = map
                .values()
                .find(|e| e.owner == *owner && e.key.as_ref().is_some_and(|(ek, _)| ek == k))
        {
            let same = e.key.as_ref().is_some_and(|(_, f)| f == fingerprint);
            return Ok(Claim::Existing {
                task: e.task.clone(),
                same,
                done: e.done.subscribe(),
            });
        }
        let running = map
            .values()
            .filter(|e| e.owner == *owner && e.ended.is_none())
            .count();
        if running >= RUNNING_PER_PRINCIPAL {
            return Err(TaskError::TooMany(running));
        }
        let id = uuid::Uuid::new_v4().to_string();
        let now = current_timestamp();
        let mut task = Task::new(id.clone(), TaskStatus::Working, now.clone(), now)
            .with_poll_interval_ms(POLL_INTERVAL_MS)
            .with_ttl_ms(millis(runs_for + self.keep));
        task.status_message = Some("started".into());
        let cancel = CancellationToken::new();
        let entry = Entry {
            owner: owner.clone(),
            tool: tool.to_string(),
            task: task.clone(),
            state: State::Working,
            cancel: cancel.clone(),
            created: now_ms(),
            ended: None,
            cancelled_by_client: false,
            order: 0,
            asked: 0,
            done: watch::channel(false).0,
            key,
        };
        let stored = self.store.is_some().then(|| entry.stored());
        map.insert(id.clone(), entry);
        drop(map);
        // On disk before the work starts: a restart while it runs must find it.
        self.save(stored);
        let handle = TaskHandle {
            id,
            tasks: self.clone(),
            cancel,
        };
        Ok(Claim::New(task, handle))
    }

    fn save(&self, stored: Option<store::Stored>) {
        if let (Some(st), Some(s)) = (&self.store, stored)
            && let Err(e) = st.save(&s)
        {
            tracing::error!(task = %s.task.task_id, error = %e, "cannot write the task's file: it will not outlive a restart");
        }
    }

    fn forget(&self, ids: Vec<String>) {
        if let Some(st) = &self.store {
            for id in ids {
                st.remove(&id);
            }
        }
    }

    /// The server is stopping: wait up to `grace` for running tasks to end, then cancel
    /// those still running (a cell is interrupted, a run killed) and wait up to `grace`
    /// again for them to record it; they end `failed` ([`stopped_error`]). One that still
    /// runs stays `working` on disk and is `failed` after the restart.
    pub async fn stop(&self, grace: Duration) {
        let running = |tasks: &Self| -> Vec<watch::Receiver<bool>> {
            lock(&tasks.inner)
                .values()
                .filter(|e| e.ended.is_none())
                .map(|e| e.done.subscribe())
                .collect()
        };
        let all_end = |rxs: Vec<watch::Receiver<bool>>| async move {
            for mut rx in rxs {
                let _ = rx.wait_for(|d| *d).await;
            }
        };
        let waiting = running(self);
        if waiting.is_empty() {
            return;
        }
        tracing::info!(
            running = waiting.len(),
            grace_ms = millis(grace),
            "stopping: waiting for running tasks"
        );
        if tokio::time::timeout(grace, all_end(waiting)).await.is_ok() {
            return;
        }
        self.stopping.store(true, Ordering::SeqCst);
        for e in lock(&self.inner).values().filter(|e| e.ended.is_none()) {
            e.cancel.cancel();
        }
        let left = running(self);
        tracing::warn!(
            tasks = left.len(),
            "stopping: interrupting the tasks still running"
        );
        if tokio::time::timeout(grace, all_end(left)).await.is_err() {
            tracing::warn!("stopping: tasks still running; they are failed after the restart");
        }
    }

    /// How the caller's task `id` ended, once it has.
    pub fn outcome(&self, caller: &Caller, id: &str) -> Option<TaskPayload> {
        let mut map = lock(&self.inner);
        match &owned(&mut map, caller, id).ok()?.state {
            State::Ended(p) => Some(p.clone()),
            _ => None,
        }
    }

    /// Forget ended tasks past their retention, and `owner`'s oldest ended ones past
    /// [`KEPT_PER_PRINCIPAL`]; the ids forgotten (their files go after the lock).
    fn sweep(&self, map: &mut HashMap<String, Entry>, owner: &Caller) -> Vec<String> {
        let (now, keep) = (now_ms(), millis(self.keep));
        let mut forgotten = Vec::new();
        map.retain(|id, e| {
            let kept = e.ended.is_none_or(|t| now.saturating_sub(t) < keep);
            if !kept {
                forgotten.push(id.clone());
            }
            kept
        });
        let mut ended: Vec<(u64, u64, String)> = map
            .iter()
            .filter(|(_, e)| e.owner == *owner)
            .filter_map(|(id, e)| e.ended.map(|t| (e.order, t, id.clone())))
            .collect();
        if ended.len() > KEPT_PER_PRINCIPAL {
            ended.sort();
            for (_, _, id) in ended.iter().take(ended.len() - KEPT_PER_PRINCIPAL) {
                map.remove(id);
                forgotten.push(id.clone());
            }
        }
        forgotten
    }

    /// `tasks/get`: the task as it is now.
    pub fn get(&self, caller: &Caller, id: &str) -> Result<DetailedTask, TaskError> {
        let mut map = lock(&self.inner);
        let forgotten = self.sweep(&mut map, caller);
        let got = owned(&mut map, caller, id).map(|e| e.detailed());
        drop(map);
        self.forget(forgotten);
        got
    }

    /// `tasks/cancel`: ask the work to stop (a cell is interrupted, its session kept). A
    /// question outstanding is withdrawn.
    pub fn cancel(&self, caller: &Caller, id: &str) -> Result<(), TaskError> {
        let mut map = lock(&self.inner);
        let e = owned(&mut map, caller, id)?;
        if let State::Ended(p) = &e.state {
            return Err(TaskError::Ended(id.to_string(), p.status()));
        }
        e.cancel.cancel();
        e.cancelled_by_client = true;
        if matches!(e.state, State::InputRequired { .. }) {
            // Dropping the reply tells the waiting work that no answer will come.
            e.state = State::Working;
        }
        e.task.status_message = Some("cancelling".into());
        e.touch();
        Ok(())
    }

    /// `tasks/update`: answer the outstanding question. Answers to keys not outstanding
    /// are ignored (a repeated update is harmless).
    pub fn update(
        &self,
        caller: &Caller,
        id: &str,
        mut responses: std::collections::BTreeMap<String, Value>,
    ) -> Result<(), TaskError> {
        let mut map = lock(&self.inner);
        let e = owned(&mut map, caller, id)?;
        if let State::Ended(p) = &e.state {
            return Err(TaskError::Ended(id.to_string(), p.status()));
        }
        let answered = match &e.state {
            State::InputRequired { key, .. } => responses.remove(key),
            _ => None,
        };
        if let Some(answer) = answered
            && let State::InputRequired { reply, .. } =
                std::mem::replace(&mut e.state, State::Working)
        {
            let _ = reply.send(answer);
            e.task.status_message = Some("answered".into());
            e.touch();
        }
        Ok(())
    }
}

fn owned<'a>(
    map: &'a mut HashMap<String, Entry>,
    caller: &Caller,
    id: &str,
) -> Result<&'a mut Entry, TaskError> {
    match map.get_mut(id) {
        Some(e) if e.owner == *caller => Ok(e),
        _ => Err(TaskError::Unknown(id.to_string())),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Entry {
    /// What its file keeps.
    fn stored(&self) -> store::Stored {
        store::Stored {
            version: store::Stored::new_version(),
            task: self.task.clone(),
            owner: self.owner.principal.clone(),
            tool: self.tool.clone(),
            created_ms: self.created,
            ended_ms: self.ended,
            key: self.key.clone(),
            outcome: match &self.state {
                State::Ended(p) => store::Outcome::of(p),
                _ => None,
            },
        }
    }

    fn touch(&mut self) {
        self.task.last_updated_at = current_timestamp();
    }

    fn detailed(&self) -> DetailedTask {
        let payload = match &self.state {
            State::Working => TaskPayload::Working,
            State::InputRequired { key, request, .. } => TaskPayload::InputRequired {
                input_requests: [(key.clone(), (**request).clone())].into_iter().collect(),
            },
            State::Ended(p) => p.clone(),
        };
        DetailedTask::new(self.task.clone(), payload)
    }
}

/// What the work of one task reports through.
#[derive(Clone)]
pub struct TaskHandle {
    id: String,
    tasks: Arc<Tasks>,
    cancel: CancellationToken,
}

impl TaskHandle {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Cancelled by `tasks/cancel`.
    pub fn cancel_token(&self) -> &CancellationToken {
        &self.cancel
    }

    fn with<R>(&self, f: impl FnOnce(&mut Entry) -> R) -> Option<R> {
        lock(&self.tasks.inner).get_mut(&self.id).map(f)
    }

    /// The latest line of output, as the status message of a working task.
    pub fn status(&self, line: String) {
        self.with(|e| {
            if matches!(e.state, State::Working) && !e.cancel.is_cancelled() {
                e.task.status_message = Some(line);
                e.touch();
            }
        });
    }

    /// Ask the client (`input_required`, answered by `tasks/update`); `Err` when the task
    /// was cancelled instead, or is gone.
    pub async fn ask(&self, request: InputRequest, message: String) -> Result<Value, ()> {
        let (tx, rx) = oneshot::channel();
        let asked = self.with(|e| {
            if e.cancel.is_cancelled() || !matches!(e.state, State::Working) {
                return false;
            }
            e.asked += 1;
            e.state = State::InputRequired {
                key: format!("input-{}", e.asked),
                request: Box::new(request),
                reply: tx,
            };
            e.task.status_message = Some(message);
            e.touch();
            true
        });
        if asked != Some(true) {
            return Err(());
        }
        rx.await.map_err(|_| ())
    }

    /// The task ended: `completed` with `result`, `failed` with `error`, or `cancelled`
    /// (cancelled by the server's stop rather than its client, `failed` saying so). What
    /// it was, for the audit line: (tool, status, duration); None if it had ended already.
    pub fn end(
        &self,
        mut payload: TaskPayload,
        mut message: Option<String>,
    ) -> Option<(String, TaskStatus, Duration)> {
        let keep = millis(self.tasks.keep);
        let stopping = self.tasks.stopping.load(Ordering::SeqCst);
        let ended = self.with(|e| {
            if e.ended.is_some() {
                return None;
            }
            if stopping && !e.cancelled_by_client && matches!(payload, TaskPayload::Cancelled) {
                payload = TaskPayload::Failed {
                    error: stopped_error(&e.tool),
                };
                message = Some("the server stopped while it ran".into());
            }
            let now = now_ms();
            e.task.status = payload.status();
            e.state = State::Ended(payload);
            e.ended = Some(now);
            e.order = self.tasks.ends.fetch_add(1, Ordering::Relaxed) + 1;
            e.task.ttl_ms = Some(now.saturating_sub(e.created) + keep);
            if let Some(m) = message {
                e.task.status_message = Some(m);
            }
            e.touch();
            e.done.send_replace(true);
            let took = Duration::from_millis(now.saturating_sub(e.created));
            let stored = self.tasks.store.is_some().then(|| e.stored());
            Some((e.tool.clone(), e.task.status, took, stored))
        });
        let (tool, status, took, stored) = ended.flatten()?;
        self.tasks.save(stored);
        Some((tool, status, took))
    }
}

/// A task status as the protocol spells it.
pub fn status_name(s: TaskStatus) -> &'static str {
    status_word(s)
}

/// A tool result as the `result` of a completed task.
pub fn result_object(result: &impl serde::Serialize) -> JsonObject {
    match serde_json::to_value(result) {
        Ok(Value::Object(o)) => o,
        _ => JsonObject::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(p: &str) -> Caller {
        Caller {
            principal: p.into(),
        }
    }

    #[tokio::test]
    async fn another_principal_sees_no_task() {
        let tasks = Arc::new(Tasks::new(Duration::from_secs(60)));
        let (task, h) = tasks.create(&caller("a"), Duration::from_secs(1)).unwrap();
        let id = task.task_id.as_str();
        assert!(tasks.get(&caller("a"), id).is_ok());
        let unknown = TaskError::Unknown(id.to_string());
        assert_eq!(tasks.get(&caller("b"), id).unwrap_err(), unknown);
        assert_eq!(tasks.cancel(&caller("b"), id).unwrap_err(), unknown);
        assert_eq!(
            tasks
                .update(&caller("b"), id, Default::default())
                .unwrap_err(),
            unknown
        );
        assert!(!h.cancel_token().is_cancelled());
    }

    #[tokio::test]
    async fn a_question_is_answered_once_and_cancel_withdraws_it() {
        let tasks = Arc::new(Tasks::new(Duration::from_secs(60)));
        let a = caller("a");
        let (task, h) = tasks.create(&a, Duration::from_secs(1)).unwrap();
        let id = task.task_id.clone();
        let req: InputRequest = serde_json::from_value(serde_json::json!({
            "method": "elicitation/create",
            "params": {"message": "?", "requestedSchema": {"type": "object", "properties": {}}}
        }))
        .unwrap();
        let h2 = h.clone();
        let asked = tokio::spawn(async move { h2.ask(req, "asks".into()).await });
        // The question is visible once asked.
        let mut rx = {
            let map = lock(&tasks.inner);
            map[&id].done.subscribe()
        };
        loop {
            if tasks.get(&a, &id).unwrap().status() == TaskStatus::InputRequired {
                break;
            }
            tokio::task::yield_now().await;
        }
        let answers = [("input-1".to_string(), serde_json::json!("x"))]
            .into_iter()
            .collect();
        tasks.update(&a, &id, answers).unwrap();
        assert_eq!(asked.await.unwrap(), Ok(serde_json::json!("x")));
        assert_eq!(tasks.get(&a, &id).unwrap().status(), TaskStatus::Working);
        h.end(TaskPayload::Cancelled, None);
        rx.wait_for(|d| *d).await.unwrap();
        assert_eq!(
            tasks.cancel(&a, &id).unwrap_err(),
            TaskError::Ended(id.clone(), TaskStatus::Cancelled)
        );
    }

    #[test]
    fn ended_tasks_past_the_cap_are_forgotten_oldest_first() {
        let tasks = Arc::new(Tasks::new(Duration::from_secs(60)));
        let a = caller("a");
        let mut ids = Vec::new();
        for _ in 0..KEPT_PER_PRINCIPAL + 2 {
            let (t, h) = tasks.create(&a, Duration::from_secs(1)).unwrap();
            h.end(TaskPayload::Cancelled, None);
            ids.push(t.task_id);
        }
        // The sweep runs at the next create or get.
        assert!(tasks.get(&a, &ids[KEPT_PER_PRINCIPAL + 1]).is_ok());
        assert!(tasks.get(&a, &ids[0]).is_err());
        assert!(tasks.get(&a, &ids[2]).is_ok());
    }

    #[tokio::test]
    async fn kept_tasks_outlive_the_server_and_running_ones_read_failed() {
        let d = tempfile::tempdir().unwrap();
        let keep = Duration::from_secs(60);
        let a = caller("a");
        let key = Some(("k".to_string(), "f".to_string()));
        let (done, running) = {
            let tasks = Arc::new(Tasks::open(keep, d.path()).unwrap());
            let Claim::New(t1, h1) = tasks
                .claim(&a, "session_eval", Duration::from_secs(1), None)
                .unwrap()
            else {
                panic!("new")
            };
            let result = [("isError".to_string(), Value::from(false))]
                .into_iter()
                .collect();
            let ended = h1.end(TaskPayload::Completed { result }, None).unwrap();
            assert_eq!(
                (ended.0.as_str(), ended.1),
                ("session_eval", TaskStatus::Completed)
            );
            let Claim::New(t2, _h2) = tasks
                .claim(&a, "run-code", Duration::from_secs(1), key.clone())
                .unwrap()
            else {
                panic!("new")
            };
            (t1.task_id, t2.task_id)
        };
        // A file that is not a task's, and one damaged, are skipped.
        let dir = d.path().join("tasks");
        std::fs::write(dir.join("notes.txt"), "x").unwrap();
        let bad = uuid::Uuid::new_v4().to_string();
        std::fs::write(dir.join(format!("{bad}.task")), "{").unwrap();
        // A file renamed to another id names the wrong task: skipped.
        let copied = uuid::Uuid::new_v4().to_string();
        std::fs::copy(
            dir.join(format!("{done}.task")),
            dir.join(format!("{copied}.task")),
        )
        .unwrap();

        let tasks = Arc::new(Tasks::open(keep, d.path()).unwrap());
        let t = tasks.get(&a, &done).unwrap();
        assert_eq!(t.status(), TaskStatus::Completed);
        let t = tasks.get(&a, &running).unwrap();
        assert_eq!(t.status(), TaskStatus::Failed);
        let TaskPayload::Failed { error } = tasks.outcome(&a, &running).unwrap() else {
            panic!("failed")
        };
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .starts_with("the server restarted while this run ran")
        );
        assert!(tasks.get(&caller("b"), &done).is_err());
        assert!(tasks.get(&a, &copied).is_err());
        assert!(dir.join(format!("{bad}.task.corrupt")).exists());
        // The key is remembered: a retry gets the failed task, it does not run again.
        match tasks
            .claim(&a, "run-code", Duration::from_secs(1), key.clone())
            .unwrap()
        {
            Claim::Existing { task, same, .. } => {
                assert!(same);
                assert_eq!(task.task_id, running);
            }
            Claim::New(..) => panic!("ran again"),
        }
        // Another principal's key of the same name is its own.
        assert!(matches!(
            tasks
                .claim(&caller("b"), "run-code", Duration::from_secs(1), key)
                .unwrap(),
            Claim::New(..)
        ));
    }

    #[tokio::test]
    async fn a_stop_interrupts_what_still_runs_and_records_it_failed() {
        let tasks = Arc::new(Tasks::new(Duration::from_secs(60)));
        let a = caller("a");
        let (task, h) = tasks.create(&a, Duration::from_secs(1)).unwrap();
        let (mine, h2) = tasks.create(&a, Duration::from_secs(1)).unwrap();
        // The work: ends cancelled once cancelled, as a cell interrupted does.
        let work = |h: TaskHandle| async move {
            h.cancel_token().cancelled().await;
            h.end(TaskPayload::Cancelled, None)
        };
        tasks.cancel(&a, &mine.task_id).unwrap();
        let w1 = tokio::spawn(work(h));
        let w2 = tokio::spawn(work(h2));
        assert_eq!(w2.await.unwrap().unwrap().1, TaskStatus::Cancelled);
        tasks.stop(Duration::from_millis(1)).await;
        assert_eq!(w1.await.unwrap().unwrap().1, TaskStatus::Failed);
        let TaskPayload::Failed { error } = tasks.outcome(&a, &task.task_id).unwrap() else {
            panic!("failed")
        };
        assert_eq!(error["data"]["kind"], "server_restarted");
    }
}
