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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

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
}

struct Entry {
    owner: Caller,
    task: Task,
    state: State,
    cancel: CancellationToken,
    created: Instant,
    /// When it ended; what the retention counts from.
    ended: Option<Instant>,
    /// Questions asked so far (keys are unique over the task's life).
    asked: u64,
    /// Flips to true when the task ends (for callers waiting on its result).
    done: watch::Sender<bool>,
    /// The caller's idempotency key and the fingerprint of the call it was given with.
    key: Option<(String, u64)>,
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

impl Tasks {
    pub fn new(keep: Duration) -> Self {
        Self {
            inner: Mutex::new(HashMap::new()),
            keep,
        }
    }

    /// A new working task of `owner`, whose work should end within `runs_for`.
    #[cfg(test)]
    pub fn create(
        self: &Arc<Self>,
        owner: &Caller,
        runs_for: Duration,
    ) -> Result<(Task, TaskHandle), TaskError> {
        match self.claim(owner, runs_for, None)? {
            Claim::New(task, handle) => Ok((task, handle)),
            Claim::Existing { .. } => Err(TaskError::Unknown(String::new())),
        }
    }

    /// A new task of `owner`, or, when `key` (an idempotency key and the fingerprint of the
    /// call) names one of its tasks still kept, that task.
    pub fn claim(
        self: &Arc<Self>,
        owner: &Caller,
        runs_for: Duration,
        key: Option<(String, u64)>,
    ) -> Result<Claim, TaskError> {
        let mut map = lock(&self.inner);
        self.sweep(&mut map, owner);
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
        map.insert(
            id.clone(),
            Entry {
                owner: owner.clone(),
                task: task.clone(),
                state: State::Working,
                cancel: cancel.clone(),
                created: Instant::now(),
                ended: None,
                asked: 0,
                done: watch::channel(false).0,
                key,
            },
        );
        let handle = TaskHandle {
            id,
            tasks: self.clone(),
            cancel,
        };
        Ok(Claim::New(task, handle))
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
    /// [`KEPT_PER_PRINCIPAL`].
    fn sweep(&self, map: &mut HashMap<String, Entry>, owner: &Caller) {
        map.retain(|_, e| e.ended.is_none_or(|t| t.elapsed() < self.keep));
        let mut ended: Vec<(Instant, String)> = map
            .iter()
            .filter(|(_, e)| e.owner == *owner)
            .filter_map(|(id, e)| e.ended.map(|t| (t, id.clone())))
            .collect();
        if ended.len() > KEPT_PER_PRINCIPAL {
            ended.sort();
            for (_, id) in ended.iter().take(ended.len() - KEPT_PER_PRINCIPAL) {
                map.remove(id);
            }
        }
    }

    /// `tasks/get`: the task as it is now.
    pub fn get(&self, caller: &Caller, id: &str) -> Result<DetailedTask, TaskError> {
        let mut map = lock(&self.inner);
        self.sweep(&mut map, caller);
        let e = owned(&mut map, caller, id)?;
        Ok(e.detailed())
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

    /// The task ended: `completed` with `result`, `failed` with `error`, or `cancelled`.
    pub fn end(&self, payload: TaskPayload, message: Option<String>) {
        let keep = self.tasks.keep;
        self.with(|e| {
            if e.ended.is_some() {
                return;
            }
            e.task.status = payload.status();
            e.state = State::Ended(payload);
            e.ended = Some(Instant::now());
            e.task.ttl_ms = Some(millis(e.created.elapsed() + keep));
            if let Some(m) = message {
                e.task.status_message = Some(m);
            }
            e.touch();
            e.done.send_replace(true);
        });
    }
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
}
