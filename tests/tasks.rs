//! `session_eval`, `session_input` and `run-code` as MCP tasks (the
//! `io.modelcontextprotocol/tasks` extension), through rmcp's client over stdio and HTTP:
//! the call returns a task at once; `tasks/get` shows the latest output line, then the
//! usual result; `tasks/cancel` interrupts the cell and the session keeps its state; a cell
//! waiting for input is `input_required` until `tasks/update` answers it; tasks belong to
//! their token and outlive the connection that started them. A client that does not
//! declare the extension gets plain results, as before.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, GetTaskParams, GetTaskResult,
    TaskPayload, TaskStatus, UpdateTaskParams,
};
use rmcp::{Peer, RoleClient};
use serde_json::{Value, json};

const TOKEN_A: &str = "tasks-token-a-0123456789abcdef";
const TOKEN_B: &str = "tasks-token-b-0123456789abcdef";

/// A cell that prints a line, then waits until the test creates `go` in its directory.
const WAITS_FOR_GO: &str = "import os, time\nprint('halfway 50%', flush=True)\nwhile not os.path.exists('go'):\n    time.sleep(0.02)\nprint('done')";

/// Call `tool` expecting a task; its id.
async fn start_task(peer: &Peer<RoleClient>, tool: &str, args: Value) -> String {
    let obj = args.as_object().cloned().expect("object");
    let r = peer
        .call_tool_once(CallToolRequestParams::new(tool.to_string()).with_arguments(obj))
        .await
        .unwrap_or_else(|e| panic!("{tool} as a task failed at the protocol level: {e}"));
    match r {
        CallToolResponse::Task(t) => {
            assert_eq!(t.task.status, TaskStatus::Working, "{t:?}");
            t.task.task_id
        }
        other => panic!("{tool} did not return a task: {other:?}"),
    }
}

/// Poll `tasks/get` (bounded) until `done` holds.
async fn poll(
    peer: &Peer<RoleClient>,
    id: &str,
    what: &str,
    done: impl Fn(&GetTaskResult) -> bool,
) -> GetTaskResult {
    let mut last = None;
    for _ in 0..1500 {
        let t = peer
            .get_task(GetTaskParams::new(id))
            .await
            .expect("tasks/get");
        if done(&t) {
            return t;
        }
        last = Some(t);
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    panic!("task {id} never became {what}: last {last:?}");
}

fn status_is(s: TaskStatus) -> impl Fn(&GetTaskResult) -> bool {
    move |t| t.task.status() == s
}

/// The completed task's tool result, as (structured content, text).
fn completed(t: &GetTaskResult) -> (Value, String) {
    let TaskPayload::Completed { result } = &t.task.payload else {
        panic!("not completed: {t:?}");
    };
    let text = result["content"][0]["text"]
        .as_str()
        .unwrap_or("")
        .to_string();
    (result["structuredContent"].clone(), text)
}

async fn session(peer: &Peer<RoleClient>) -> (String, PathBuf) {
    let o = http_call(peer, "session_start", json!({"language": "python"})).await;
    assert!(!o.is_error, "{}", o.text);
    (o.s("session_id").to_string(), PathBuf::from(o.s("cwd")))
}

/// Over stdio: working with the latest line as the status message, then completed with the
/// usual result; tasks/cancel interrupts a cell and the session keeps its state; run-code
/// too.
#[tokio::test(flavor = "multi_thread")]
async fn a_cell_as_a_task_shows_its_latest_line_then_its_result_and_cancel_keeps_state() {
    if !require_language("python") {
        return;
    }
    let s = Server::stdio().tasks().start().await;
    let peer = s.client.peer();
    let (sid, cwd) = session(peer).await;
    // A tasks client gets a task even for a short cell.
    let id = start_task(
        peer,
        "session_eval",
        json!({"session_id": sid, "code": "x = 41"}),
    )
    .await;
    poll(peer, &id, "completed", status_is(TaskStatus::Completed)).await;

    let id = start_task(
        peer,
        "session_eval",
        json!({"session_id": sid, "code": WAITS_FOR_GO, "timeout_ms": 120_000}),
    )
    .await;
    let working = poll(peer, &id, "working with its line", |t| {
        t.task.status() == TaskStatus::Working
            && t.task.task.status_message.as_deref() == Some("halfway 50%")
    })
    .await;
    assert!(working.task.task.ttl_ms.is_some_and(|ms| ms >= 120_000));
    std::fs::write(cwd.join("go"), "").expect("write go");
    let done = poll(peer, &id, "completed", status_is(TaskStatus::Completed)).await;
    let (structured, text) = completed(&done);
    assert_eq!(structured["status"], "ok", "{structured}");
    assert_eq!(structured["output"], "halfway 50%\ndone\n", "{structured}");
    assert!(text.contains("done"), "{text}");

    // tasks/cancel: the cell is interrupted, x survives.
    let id = start_task(
        peer,
        "session_eval",
        json!({"session_id": sid, "code": "import time\nprint('spinning', flush=True)\nwhile True:\n    time.sleep(0.02)", "timeout_ms": 120_000}),
    )
    .await;
    poll(peer, &id, "spinning", |t| {
        t.task.task.status_message.as_deref() == Some("spinning")
    })
    .await;
    peer.cancel_task(CancelTaskParams::new(&id))
        .await
        .expect("tasks/cancel");
    poll(peer, &id, "cancelled", status_is(TaskStatus::Cancelled)).await;
    let again = peer.cancel_task(CancelTaskParams::new(&id)).await;
    assert!(again.is_err(), "cancelling an ended task is refused");
    let id = start_task(
        peer,
        "session_eval",
        json!({"session_id": sid, "code": "print(x + 1)"}),
    )
    .await;
    let t = poll(peer, &id, "completed", status_is(TaskStatus::Completed)).await;
    assert_eq!(completed(&t).0["output"], "42\n");

    // run-code as a task.
    let id = start_task(
        peer,
        "run-code",
        json!({"languageId": "python", "code": "print('ran once')"}),
    )
    .await;
    let t = poll(peer, &id, "completed", status_is(TaskStatus::Completed)).await;
    let (structured, text) = completed(&t);
    assert_eq!(structured["stdout"], "ran once\n", "{structured}");
    assert_eq!(text, "ran once\n");
    s.stop().await;
}

/// A cell waiting for input is input_required with an elicitation for the text; tasks/update
/// types the answer (as session_input does) and the task completes; an answer without text
/// is asked again, a declined one interrupts the cell.
#[tokio::test(flavor = "multi_thread")]
async fn a_cell_waiting_for_input_is_answered_by_tasks_update() {
    if !require_language("python") {
        return;
    }
    let s = Server::stdio().tasks().start().await;
    let peer = s.client.peer();
    let (sid, _) = session(peer).await;
    let id = start_task(
        peer,
        "session_eval",
        json!({"session_id": sid, "code": "name = input('name? ')\nprint('hello', name)"}),
    )
    .await;
    let asked = poll(
        peer,
        &id,
        "input_required",
        status_is(TaskStatus::InputRequired),
    )
    .await;
    let TaskPayload::InputRequired { input_requests } = &asked.task.payload else {
        panic!("{asked:?}");
    };
    let (key, request) = input_requests.iter().next().expect("one question");
    let request = serde_json::to_value(request).expect("json");
    assert_eq!(request["method"], "elicitation/create", "{request}");
    let message = request["params"]["message"].as_str().unwrap_or("");
    assert!(message.ends_with("name? "), "{message}");

    // Not an answer: asked again under a new key.
    let update =
        |k: &str, v: Value| UpdateTaskParams::new(&id, [(k.to_string(), v)].into_iter().collect());
    peer.update_task(update(key, json!({"action": "accept", "content": {}})))
        .await
        .expect("tasks/update");
    let key1 = key.clone();
    let asked = poll(peer, &id, "asked again", |t| match &t.task.payload {
        TaskPayload::InputRequired { input_requests } => !input_requests.contains_key(&key1),
        _ => false,
    })
    .await;
    let TaskPayload::InputRequired { input_requests } = &asked.task.payload else {
        panic!("{asked:?}");
    };
    let key = input_requests.keys().next().expect("a key").clone();
    peer.update_task(update(
        &key,
        json!({"action": "accept", "content": {"text": "Ada"}}),
    ))
    .await
    .expect("tasks/update");
    let t = poll(peer, &id, "completed", status_is(TaskStatus::Completed)).await;
    let (structured, _) = completed(&t);
    assert_eq!(structured["status"], "ok", "{structured}");
    assert!(
        structured["output"]
            .as_str()
            .unwrap_or("")
            .contains("hello Ada"),
        "{structured}"
    );

    // Declined: the cell is interrupted, the task completes with that result.
    let id2 = start_task(
        peer,
        "session_eval",
        json!({"session_id": sid, "code": "input('again? ')"}),
    )
    .await;
    let asked = poll(
        peer,
        &id2,
        "input_required",
        status_is(TaskStatus::InputRequired),
    )
    .await;
    let TaskPayload::InputRequired { input_requests } = &asked.task.payload else {
        panic!("{asked:?}");
    };
    let key = input_requests.keys().next().expect("a key").clone();
    let decline = UpdateTaskParams::new(
        &id2,
        [(key, json!({"action": "decline"}))].into_iter().collect(),
    );
    peer.update_task(decline).await.expect("tasks/update");
    let t = poll(peer, &id2, "completed", status_is(TaskStatus::Completed)).await;
    let (structured, _) = completed(&t);
    assert_eq!(structured["interrupted"], true, "{structured}");

    // session_input is a task too: while a cell's task waits for input, the answer given
    // by session_input (called as a task) is typed, and that task ends with the rest of
    // the cell; the cell's own task ends as a plain call would have: paused for input.
    let id3 = start_task(
        peer,
        "session_eval",
        json!({"session_id": sid, "code": "v = input('v? ')\nprint('got', v)"}),
    )
    .await;
    poll(
        peer,
        &id3,
        "input_required",
        status_is(TaskStatus::InputRequired),
    )
    .await;
    let id4 = start_task(
        peer,
        "session_input",
        json!({"session_id": sid, "text": "7"}),
    )
    .await;
    let t = poll(peer, &id4, "completed", status_is(TaskStatus::Completed)).await;
    let (structured, _) = completed(&t);
    assert_eq!(structured["status"], "ok", "{structured}");
    assert_eq!(structured["output"], "got 7\n", "{structured}");
    let t = poll(peer, &id3, "completed", status_is(TaskStatus::Completed)).await;
    let (structured, _) = completed(&t);
    assert_eq!(structured["status"], "awaiting_input", "{structured}");
    assert_eq!(structured["output"], "v? ", "{structured}");
    let o = http_call(peer, "session_list", json!({})).await;
    assert_eq!(o.structured["sessions"][0]["busy"], false, "{o:?}");
    s.stop().await;
}

/// A client that does not declare the extension gets today's results, and no tasks/*.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_without_the_extension_gets_plain_results() {
    if !require_language("python") {
        return;
    }
    let s = TestServer::start().await;
    let o = s.run("python", "print(6 * 7)").await;
    assert_eq!(o.text, "42\n");
    let id = s.start_session("python").await;
    let o = s.eval(&id, "print('plain')").await;
    assert_eq!(status(&o), "ok");
    assert_eq!(output(&o), "plain\n");
    let r = s.client.get_task(GetTaskParams::new("anything")).await;
    assert!(r.is_err(), "tasks/get without the extension: {r:?}");
    s.stop().await;
}

/// Over HTTP: another token can neither see, poll, answer nor cancel a task; the owner
/// polls it from a new connection after the one that started it is gone, while the cell
/// runs on.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_belongs_to_its_token_and_outlives_its_connection() {
    if !require_language("python") {
        return;
    }
    let h = Server::http().token(TOKEN_A).token(TOKEN_B).start().await;
    let a = h.connect_tasks(TOKEN_A).await;
    let (sid, cwd) = session(a.peer()).await;
    let id = start_task(
        a.peer(),
        "session_eval",
        json!({"session_id": sid, "code": WAITS_FOR_GO, "timeout_ms": 120_000}),
    )
    .await;
    poll(a.peer(), &id, "working", |t| {
        t.task.task.status_message.as_deref() == Some("halfway 50%")
    })
    .await;

    // The attack: B knows the id.
    let b = h.connect_tasks(TOKEN_B).await;
    let e = b
        .peer()
        .get_task(GetTaskParams::new(&id))
        .await
        .expect_err("B polls A's task");
    assert!(e.to_string().contains("no task"), "{e}");
    let e = b
        .peer()
        .cancel_task(CancelTaskParams::new(&id))
        .await
        .expect_err("B cancels");
    assert!(e.to_string().contains("no task"), "{e}");
    let answers = [(
        "input-1".to_string(),
        json!({"action": "accept", "content": {"text": "x"}}),
    )];
    let e = b
        .peer()
        .update_task(UpdateTaskParams::new(&id, answers.into_iter().collect()))
        .await
        .expect_err("B answers");
    assert!(e.to_string().contains("no task"), "{e}");
    // An unknown id reads the same as A's.
    let e2 = b
        .peer()
        .get_task(GetTaskParams::new("no-such-task"))
        .await
        .expect_err("unknown");
    assert_eq!(
        e.to_string().replace(&id, "ID"),
        e2.to_string().replace("no-such-task", "ID")
    );

    // A's connection goes away mid-cell; the cell runs on and A polls from a new one.
    a.cancel().await.expect("close A's first connection");
    let a2 = h.connect_tasks(TOKEN_A).await;
    let t = a2
        .peer()
        .get_task(GetTaskParams::new(&id))
        .await
        .expect("A polls again");
    assert_eq!(t.task.status(), TaskStatus::Working, "{t:?}");
    std::fs::write(cwd.join("go"), "").expect("write go");
    let t = poll(
        a2.peer(),
        &id,
        "completed",
        status_is(TaskStatus::Completed),
    )
    .await;
    assert_eq!(completed(&t).0["output"], "halfway 50%\ndone\n");
    // Idempotency keys are per token too: B's call with A's key and arguments runs anew.
    let run = json!({"languageId": "python", "code": "import uuid\nprint(uuid.uuid4())", "idempotency_key": "shared-key"});
    let ta = start_task(a2.peer(), "run-code", run.clone()).await;
    assert_eq!(
        start_task(a2.peer(), "run-code", run.clone()).await,
        ta,
        "A's retry"
    );
    let tb = start_task(b.peer(), "run-code", run.clone()).await;
    assert_ne!(ta, tb);
    let ra = poll(
        a2.peer(),
        &ta,
        "completed",
        status_is(TaskStatus::Completed),
    )
    .await;
    let rb = poll(b.peer(), &tb, "completed", status_is(TaskStatus::Completed)).await;
    assert_ne!(completed(&ra).0["stdout"], completed(&rb).0["stdout"]);

    // B still sees nothing of it, ended.
    assert!(b.peer().get_task(GetTaskParams::new(&id)).await.is_err());
    drop(b);
    drop(a2);
    h.stop().await;
}

/// A retry with the same idempotency_key returns the first call's result instead of running
/// the cell again, during the cell and after it (the cell appends a line to a file, which
/// holds one); the same key with other arguments is refused. A client without the
/// extension.
#[tokio::test(flavor = "multi_thread")]
async fn a_retry_with_the_same_key_never_runs_twice() {
    if !require_language("python") {
        return;
    }
    let s = TestServer::start().await;
    let peer = s.client.peer().clone();
    let (sid, cwd) = session(&peer).await;
    let appends =
        "open('log.txt', 'a').write('ran\\n')\nprint(len(open('log.txt').read().splitlines()))";
    let call = json!({"session_id": sid, "code": appends, "idempotency_key": "k-after"});
    let first = http_call(&peer, "session_eval", call.clone()).await;
    assert_eq!(output(&first), "1\n", "{first:?}");
    let retry = http_call(&peer, "session_eval", call).await;
    assert_eq!(retry.structured, first.structured);
    assert_eq!(
        std::fs::read_to_string(cwd.join("log.txt")).unwrap(),
        "ran\n"
    );

    // During the cell: the retry waits for the first call's result.
    let code = format!("open('log2.txt', 'a').write('ran\\n')\n{WAITS_FOR_GO}");
    let call = json!({"session_id": sid, "code": code, "idempotency_key": "k-during", "timeout_ms": 120_000});
    let (p1, c1) = (peer.clone(), call.clone());
    let first = tokio::spawn(async move { http_call(&p1, "session_eval", c1).await });
    for _ in 0..1500 {
        if cwd.join("log2.txt").exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (p2, c2) = (peer.clone(), call.clone());
    let retry = tokio::spawn(async move { http_call(&p2, "session_eval", c2).await });
    // The first call still runs its cell: another one is refused as busy.
    let other = http_call(
        &peer,
        "session_eval",
        json!({"session_id": sid, "code": "1"}),
    )
    .await;
    assert_eq!(other.error_kind(), "busy", "{other:?}");
    std::fs::write(cwd.join("go"), "").expect("write go");
    let (first, retry) = (first.await.unwrap(), retry.await.unwrap());
    assert_eq!(status(&first), "ok", "{first:?}");
    assert_eq!(retry.structured, first.structured);
    assert_eq!(
        std::fs::read_to_string(cwd.join("log2.txt")).unwrap(),
        "ran\n"
    );

    // The same key for another call.
    let other = json!({"session_id": sid, "code": "print(2)", "idempotency_key": "k-after"});
    let refused = http_call(&peer, "session_eval", other).await;
    assert_eq!(refused.error_kind(), "invalid_argument", "{refused:?}");
    assert!(refused.text.contains("idempotency_key"), "{}", refused.text);
    s.stop().await;
}

/// `--task-keep-s`: an ended task is forgotten once its retention has passed (0: at the
/// first look after it ended), and says so.
#[tokio::test(flavor = "multi_thread")]
async fn an_ended_task_is_forgotten_after_task_keep_s() {
    if !require_language("python") {
        return;
    }
    let s = Server::stdio()
        .tasks()
        .args(["--task-keep-s", "0"])
        .start()
        .await;
    let peer = s.client.peer();
    let id = start_task(
        peer,
        "run-code",
        json!({"languageId": "python", "code": "print(1)"}),
    )
    .await;
    let mut gone = None;
    for _ in 0..1500 {
        match peer.get_task(GetTaskParams::new(&id)).await {
            Ok(t) => assert_eq!(t.task.status(), TaskStatus::Working, "{t:?}"),
            Err(e) => {
                gone = Some(e.to_string());
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    let gone = gone.expect("the task was forgotten");
    assert!(
        gone.contains("no task") && gone.contains("forgotten"),
        "{gone}"
    );
    s.stop().await;
}

/// A fresh state directory (`--state-dir`) under a 0700 temporary one of ours.
fn state_dir() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().expect("tempdir");
    let dir = std::fs::canonicalize(t.path())
        .expect("real path")
        .join("state");
    (t, dir)
}

/// The error of a failed task: (message, data.kind).
fn failed(t: &GetTaskResult) -> (String, String) {
    let TaskPayload::Failed { error } = &t.task.payload else {
        panic!("not failed: {t:?}");
    };
    let message = error["message"].as_str().unwrap_or("").to_string();
    let kind = error["data"]["kind"].as_str().unwrap_or("").to_string();
    (message, kind)
}

/// With `--state-dir`, tasks outlive a server killed (SIGKILL) while a cell ran as one: the
/// next server on the same directory reports that task `failed` with the reason, the task
/// that had completed keeps its result, a retry of the call (its idempotency key), before
/// and after the restart, never runs it again, another token reaches none of them (by id,
/// by a path of the state directory, by the same key), and the restored session is as it
/// was before that cell, which it did not run again.
#[tokio::test(flavor = "multi_thread")]
async fn tasks_outlive_a_killed_server_and_the_cell_it_ran_is_never_run_again() {
    if !require_language("python") {
        return;
    }
    let (_t, state) = state_dir();
    let args = ["--state-dir", state.to_str().expect("utf-8")];
    let mut h = Server::http()
        .token(TOKEN_A)
        .token(TOKEN_B)
        .args(args)
        .start()
        .await;
    let a = h.connect_tasks(TOKEN_A).await;
    let (sid, cwd) = session(a.peer()).await;
    let done = start_task(
        a.peer(),
        "session_eval",
        json!({"session_id": sid, "code": "x = 41\nprint('set')"}),
    )
    .await;
    let t = poll(
        a.peer(),
        &done,
        "completed",
        status_is(TaskStatus::Completed),
    )
    .await;
    let before = completed(&t).0;
    assert_eq!(before["output"], "set\n", "{before}");
    // The long cell appends a line to a file, then waits for a `go` that never comes.
    let code = format!("y = 1\nopen('log.txt', 'a').write('ran\\n')\n{WAITS_FOR_GO}");
    let call = json!({"session_id": sid, "code": code, "timeout_ms": 600_000, "idempotency_key": "the-long-cell"});
    let long = start_task(a.peer(), "session_eval", call.clone()).await;
    poll(a.peer(), &long, "working", |t| {
        t.task.task.status_message.as_deref() == Some("halfway 50%")
    })
    .await;
    // A retry from another connection, mid-cell: the same task, the cell ran once.
    a.cancel().await.expect("close A's connection");
    let a = h.connect_tasks(TOKEN_A).await;
    assert_eq!(
        start_task(a.peer(), "session_eval", call.clone()).await,
        long
    );
    assert_eq!(
        std::fs::read_to_string(cwd.join("log.txt")).expect("log.txt"),
        "ran\n"
    );
    drop(a);
    h.kill().await;

    let h = Server::http()
        .token(TOKEN_A)
        .token(TOKEN_B)
        .args(args)
        .start()
        .await;
    // The attacks first: B knows both ids, A's key, and where tasks are kept.
    let b = h.connect_tasks(TOKEN_B).await;
    let forged = [
        done.clone(),
        long.clone(),
        format!("{long}.task"),
        format!("../tasks/{long}"),
        format!("tasks/{long}.task"),
        format!("{}/tasks/{long}.task", state.display()),
    ];
    for id in &forged {
        let e = b
            .peer()
            .get_task(GetTaskParams::new(id))
            .await
            .expect_err("B polls A's task");
        assert!(e.to_string().contains("no task"), "{id}: {e}");
    }
    let e = b
        .peer()
        .cancel_task(CancelTaskParams::new(&long))
        .await
        .expect_err("B cancels A's task");
    assert!(e.to_string().contains("no task"), "{e}");
    let run =
        json!({"languageId": "python", "code": "print('b')", "idempotency_key": "the-long-cell"});
    let tb = start_task(b.peer(), "run-code", run).await;
    assert!(tb != long && tb != done);
    poll(b.peer(), &tb, "completed", status_is(TaskStatus::Completed)).await;

    let a = h.connect_tasks(TOKEN_A).await;
    let t = a
        .peer()
        .get_task(GetTaskParams::new(&long))
        .await
        .expect("A polls after the restart");
    assert_eq!(t.task.status(), TaskStatus::Failed, "{t:?}");
    let (message, kind) = failed(&t);
    assert!(
        message.starts_with("the server restarted while this cell ran")
            && message.contains("restored up to the cell before"),
        "{message}"
    );
    assert_eq!(kind, "server_restarted");
    let t = a
        .peer()
        .get_task(GetTaskParams::new(&done))
        .await
        .expect("the completed task");
    assert_eq!(completed(&t).0, before);
    // The retry after the restart: the failed task, not a new run.
    let r = a
        .peer()
        .call_tool_once(
            CallToolRequestParams::new("session_eval")
                .with_arguments(call.as_object().cloned().expect("object")),
        )
        .await
        .expect("retry");
    match r {
        CallToolResponse::Task(t) => {
            assert_eq!(t.task.task_id, long);
            assert_eq!(t.task.status, TaskStatus::Failed);
        }
        other => panic!("the retry was not the task: {other:?}"),
    }
    // The session comes back as it was after cell 1: cell 2 is not run again.
    let id = start_task(
        a.peer(),
        "session_eval",
        json!({"session_id": sid, "code": "print(x + 1, 'y' in dir())"}),
    )
    .await;
    let t = poll(a.peer(), &id, "completed", status_is(TaskStatus::Completed)).await;
    let out = completed(&t).0;
    assert_eq!(out["output"], "42 False\n", "{out}");
    assert_eq!(out["replayed"], 1, "{out}");
    assert_eq!(out["eval_id"], 3, "{out}");
    assert!(
        out["notes"].as_array().is_some_and(|n| n.iter().any(|n| n
            .as_str()
            .unwrap_or("")
            .starts_with("cell 2 was running when the server stopped; it was not run again"))),
        "{out}"
    );
    let hist = http_call(a.peer(), "session_history", json!({"session_id": sid})).await;
    let cell2 = &hist.structured["cells"][1];
    assert_eq!(cell2["eval_id"], 2, "{}", hist.structured);
    assert_eq!(cell2["error"]["type"], "ServerStopped", "{cell2}");
    assert!(
        cell2["code"].as_str().unwrap_or("").starts_with("y = 1"),
        "{cell2}"
    );
    drop((a, b));
    h.stop().await;
}

/// A server that stops (its client closes stdin) while a cell runs as a task waits
/// `--task-stop-grace-ms` for it, then interrupts it and records that: after the restart the
/// task is `failed` with the reason; each task's end has an audit line (who, which task and
/// tool, how it ended, how long it took; never the code); the restored session is as it
/// was before that cell.
#[tokio::test(flavor = "multi_thread")]
async fn a_stop_interrupts_a_running_task_and_records_it() {
    if !require_language("python") {
        return;
    }
    let (_t, state) = state_dir();
    let st = state.to_str().expect("utf-8");
    let args = ["--state-dir", st, "--task-stop-grace-ms", "300"];
    let s = Server::stdio()
        .tasks()
        .args(args)
        .env("REPLBOX_LOG", "warn,replbox::audit=info")
        .start()
        .await;
    let peer = s.client.peer();
    let (sid, _) = session(peer).await;
    let done = start_task(
        peer,
        "session_eval",
        json!({"session_id": sid, "code": "x = 41"}),
    )
    .await;
    poll(peer, &done, "completed", status_is(TaskStatus::Completed)).await;
    let canary = "canary_6f1d2e";
    let long = start_task(
        peer,
        "session_eval",
        json!({"session_id": sid, "code": format!("{canary} = 1\n{WAITS_FOR_GO}"), "timeout_ms": 600_000}),
    )
    .await;
    poll(peer, &long, "working", |t| {
        t.task.task.status_message.as_deref() == Some("halfway 50%")
    })
    .await;
    let log = s.stop_and_log().await;
    let audit = |id: &str| {
        log.lines()
            .find(|l| l.contains("task ended") && l.contains(id))
            .unwrap_or_else(|| panic!("no audit line for task {id} in:\n{log}"))
            .to_string()
    };
    let line = audit(&long);
    for part in [
        "replbox::audit",
        "principal=local",
        "tool=session_eval",
        "status=failed",
        "duration_ms=",
    ] {
        assert!(line.contains(part), "{part:?} not in {line}");
    }
    assert!(audit(&done).contains("status=completed"));
    assert!(!log.contains(canary), "the code reached the log:\n{log}");

    let s = Server::stdio().tasks().args(args).start().await;
    let peer = s.client.peer();
    let t = peer
        .get_task(GetTaskParams::new(&long))
        .await
        .expect("polled after the restart");
    let (message, kind) = failed(&t);
    assert!(
        message.starts_with("the server restarted while this cell ran"),
        "{message}"
    );
    assert_eq!(kind, "server_restarted");
    let id = start_task(
        peer,
        "session_eval",
        json!({"session_id": sid, "code": format!("print(x + 1, '{canary}' in dir())")}),
    )
    .await;
    let t = poll(peer, &id, "completed", status_is(TaskStatus::Completed)).await;
    let out = completed(&t).0;
    assert_eq!(out["output"], "42 False\n", "{out}");
    assert_eq!(out["replayed"], 1, "{out}");
    s.stop().await;
}

/// Over HTTP, SIGTERM while cells run as tasks: the server waits `--task-stop-grace-ms` for
/// them. A cell that ends within it completes, and its result is there after the restart;
/// one that does not is interrupted and `failed` after the restart, with the reason, and
/// its session, restored, is as it was before that cell, which it did not run again.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_over_http_lets_a_task_finish_within_the_grace_or_records_it() {
    if !require_language("python") {
        return;
    }
    let (_t, state) = state_dir();
    let start = |grace_ms: &str| {
        Server::http()
            .token(TOKEN_A)
            .arg("--state-dir")
            .arg(&state)
            .args(["--task-stop-grace-ms", grace_ms])
            .start()
    };

    // A long grace: the cell ends during it (the test lets it go once the server says it
    // waits), and then the server exits.
    let mut h = start("120000").await;
    let a = h.connect_tasks(TOKEN_A).await;
    let (sid, cwd) = session(a.peer()).await;
    let finishing = start_task(
        a.peer(),
        "session_eval",
        json!({"session_id": sid, "code": WAITS_FOR_GO, "timeout_ms": 600_000}),
    )
    .await;
    poll(a.peer(), &finishing, "working", |t| {
        t.task.task.status_message.as_deref() == Some("halfway 50%")
    })
    .await;
    let pid = nix::unistd::Pid::from_raw(h.pid as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let t0 = std::time::Instant::now();
    while !h.log().contains("stopping: waiting for running tasks") {
        assert!(t0.elapsed() < Duration::from_secs(60), "{}", h.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    std::fs::write(cwd.join("go"), "").expect("write go");
    let exited = tokio::time::timeout(Duration::from_secs(60), h.child().wait()).await;
    assert!(
        matches!(exited, Ok(Ok(st)) if st.success()),
        "{exited:?}\n{}",
        h.log()
    );
    assert!(!h.log().contains("interrupting the tasks"), "{}", h.log());
    drop(a);
    drop(h);

    // Restarted with a short grace: the finished task kept its result; a cell still
    // running at the next SIGTERM is interrupted and recorded.
    let h = start("300").await;
    let a = h.connect_tasks(TOKEN_A).await;
    let t = a
        .peer()
        .get_task(GetTaskParams::new(&finishing))
        .await
        .expect("polled after the restart");
    assert_eq!(completed(&t).0["output"], "halfway 50%\ndone\n");
    let (sid, _) = session(a.peer()).await;
    let id = start_task(
        a.peer(),
        "session_eval",
        json!({"session_id": sid, "code": "x = 41"}),
    )
    .await;
    poll(a.peer(), &id, "completed", status_is(TaskStatus::Completed)).await;
    let canary = "canary_5e0c9b";
    let cut = start_task(
        a.peer(),
        "session_eval",
        json!({"session_id": sid, "code": format!("{canary} = 1\n{WAITS_FOR_GO}"), "timeout_ms": 600_000}),
    )
    .await;
    poll(a.peer(), &cut, "working", |t| {
        t.task.task.status_message.as_deref() == Some("halfway 50%")
    })
    .await;
    drop(a);
    let log = h.log();
    let st = h.stop().await;
    assert!(st.is_some_and(|st| st.success()), "{st:?}\n{log}");

    let h = start("300").await;
    let a = h.connect_tasks(TOKEN_A).await;
    let t = a
        .peer()
        .get_task(GetTaskParams::new(&cut))
        .await
        .expect("polled after the restart");
    let (message, kind) = failed(&t);
    assert!(
        message.starts_with("the server restarted while this cell ran"),
        "{message}"
    );
    assert_eq!(kind, "server_restarted");
    let id = start_task(
        a.peer(),
        "session_eval",
        json!({"session_id": sid, "code": format!("print(x + 1, '{canary}' in dir())")}),
    )
    .await;
    let t = poll(a.peer(), &id, "completed", status_is(TaskStatus::Completed)).await;
    let out = completed(&t).0;
    assert_eq!(out["output"], "42 False\n", "{out}");
    assert_eq!(out["replayed"], 1, "{out}");
    drop(a);
    h.stop().await;
}

/// A client whose every request gives up after one second (many hosts cut a tool call
/// after a minute or three; scaled down) still gets the result of a twenty-second cell: the
/// call returns a task at once, and polls, each within that second, see it to the end.
/// The same cell as a plain call, from a client without the extension, is cut by that
/// client's timeout.
#[tokio::test(flavor = "multi_thread")]
async fn a_cell_longer_than_the_clients_timeout_is_polled_to_completion() {
    if !require_language("python") {
        return;
    }
    const CLIENT_TIMEOUT: Duration = Duration::from_secs(1);
    let cell = "import time\nprint('started', flush=True)\ntime.sleep(20)\nprint('slept')";
    let h = Server::http().token(TOKEN_A).start().await;

    let plain = h.connect(TOKEN_A).await;
    let (sid, _) = session(plain.peer()).await;
    let cut = tokio::time::timeout(
        CLIENT_TIMEOUT,
        http_call(
            plain.peer(),
            "session_eval",
            json!({"session_id": sid, "code": cell}),
        ),
    )
    .await;
    assert!(cut.is_err(), "a 20 s cell answered within 1 s: {cut:?}");

    let a = h.connect_tasks(TOKEN_A).await;
    let (sid, _) = session(a.peer()).await;
    let call = |key: usize| {
        CallToolRequestParams::new("session_eval").with_arguments(
            json!({"session_id": sid, "code": cell, "idempotency_key": format!("long-{key}")})
                .as_object()
                .cloned()
                .expect("object"),
        )
    };
    // The call answers at once with a task. A call the client's timeout cut (a loaded host)
    // is sent again with the same key, as a client would: its task, never a second run; if
    // the cut cancelled it, the retry says so, and a new key runs the cell.
    let (mut id, mut key, mut cut) = (None, 0, false);
    for _ in 0..10 {
        match tokio::time::timeout(CLIENT_TIMEOUT, a.peer().call_tool_once(call(key))).await {
            Ok(Ok(CallToolResponse::Task(t))) => {
                id = Some(t.task.task_id);
                break;
            }
            Ok(Ok(CallToolResponse::Complete(r))) if cut && r.is_error == Some(true) => key += 1,
            Ok(other) => panic!("not a task: {other:?}"),
            Err(_) => {
                cut = true;
                eprintln!("the call took over {CLIENT_TIMEOUT:?}: sent again");
            }
        }
    }
    let id = id.expect("a task within ten tries");
    let mut polls = 0;
    let result = loop {
        polls += 1;
        assert!(polls < 1500, "never completed");
        let t =
            tokio::time::timeout(CLIENT_TIMEOUT, a.peer().get_task(GetTaskParams::new(&id))).await;
        match t {
            Ok(Ok(t)) if t.task.status() == TaskStatus::Completed => break t,
            Ok(Ok(t)) => assert_eq!(t.task.status(), TaskStatus::Working, "{t:?}"),
            Ok(Err(e)) => panic!("tasks/get: {e}"),
            Err(_) => {} // cut by the client's timeout: poll again
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let out = completed(&result).0;
    assert_eq!(out["status"], "ok", "{out}");
    assert_eq!(out["output"], "started\nslept\n", "{out}");
    drop((plain, a));
    h.stop().await;
}

/// The official MCP Python SDK (2.x, `pip install mcp`) against the HTTP server, through
/// `tests/sdk/python_client.py`: a plain call from a client without the extension, then a
/// cell called as a task by a client that declares it through the SDK's extension API and
/// polls `tasks/get` to the result.
#[tokio::test(flavor = "multi_thread")]
async fn the_python_sdk_calls_a_cell_as_a_task_and_polls_it_to_its_result() {
    if !require_language("python") {
        return;
    }
    let sdk = std::process::Command::new("python3")
        .args(["-c", "import mcp.client.extension"])
        .output();
    if !sdk.is_ok_and(|o| o.status.success()) {
        skip("the MCP Python SDK 2.x is not installed for python3 (python3 -m pip install mcp)");
        return;
    }
    let h = Server::http().token(TOKEN_A).start().await;
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/python_client.py");
    let run = tokio::process::Command::new("python3")
        .arg(&script)
        .arg(h.url())
        .arg(TOKEN_A)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the SDK's client ended")
        .expect("run python3");
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("ok: plain call"), "{said}");
    assert!(said.contains("ok: a task over"), "{said}");
    h.stop().await;
}
