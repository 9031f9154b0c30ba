#!/usr/bin/env python3
"""Drive a replbox HTTP server with the official MCP Python SDK (`pip install mcp`).

usage: python_client.py URL TOKEN

The SDK (2.x) has no client for the Tasks extension of its own: it offers a generic
extension API (`ClientExtension` with a `ResultClaim` on `tools/call`), through which an
application declares `io.modelcontextprotocol/tasks` and finishes a `resultType: "task"`
result itself. This script does that (a claim whose resolver polls `tasks/get`), calls a
cell as a task (it waits until the resolver has seen the task working), and also makes a plain call from a client without the extension. Each check
prints one line `ok: ...`; the first failure exits 1 with `FAILED: ...`.
"""

import asyncio
import os
import sys
from typing import Any, ClassVar, Literal

import httpx2
from mcp.client.client import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, Request, RequestParams, Result
from pydantic import ConfigDict, Field

TASKS = "io.modelcontextprotocol/tasks"


class CreateTaskResult(Result):
    """A tools/call answered with a task (the extension's `resultType: "task"`)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    result_type: Literal["task"] = Field(alias="resultType")
    task_id: str = Field(alias="taskId")
    status: str


class GetTaskParams(RequestParams):
    task_id: str = Field(alias="taskId")


class GetTaskRequest(Request[GetTaskParams, Literal["tasks/get"]]):
    # The 2026-07-28 HTTP transport names the task in an Mcp-Name header.
    name_param: ClassVar[str | None] = "taskId"
    method: Literal["tasks/get"] = "tasks/get"
    params: GetTaskParams


class GetTaskResult(Result):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


seen: dict[str, Any] = {}


async def resolve(created: CreateTaskResult, ctx: ClaimContext) -> CallToolResult:
    """Poll tasks/get until the task ends; its result as the call's."""
    task_id = created.task_id
    seen["created"] = created.status
    statuses = []
    for _ in range(3000):
        got = await ctx.session.send_request(
            GetTaskRequest(params=GetTaskParams(taskId=task_id)), GetTaskResult
        )
        raw = got.model_dump(by_alias=True, mode="json", exclude_none=True)
        status = raw.get("status")
        statuses.append(status)
        if status == "working" and "go" in seen:
            # Seen working: let the cell end (it waits for this file in its directory).
            open(seen.pop("go"), "w").close()
        if status == "completed":
            seen["statuses"] = statuses
            return CallToolResult.model_validate(raw.get("result"))
        if status not in ("working", None):
            raise RuntimeError(f"task {task_id} ended {status}: {raw}")
        await asyncio.sleep(0.05)
    raise RuntimeError(f"task {task_id} never completed: {statuses[-5:]}")


class Tasks(ClientExtension):
    identifier = TASKS

    def claims(self):
        return [ResultClaim(result_type="task", model=CreateTaskResult, resolve=resolve)]


def fail(msg: str) -> None:
    print(f"FAILED: {msg}", flush=True)
    sys.exit(1)


def text(r: CallToolResult) -> str:
    return "".join(getattr(c, "text", "") for c in r.content)


async def main(url: str, token: str) -> None:
    def transport():
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
        return streamable_http_client(url, http_client=http)

    # A client without the extension: today's plain results.
    async with Client(transport()) as plain:
        r = await plain.call_tool("run-code", {"languageId": "python", "code": "print(6 * 7)"})
        if r.is_error or text(r) != "42\n":
            fail(f"plain run-code: {r}")
        print(f"ok: plain call over {plain.protocol_version}", flush=True)
        started = await plain.call_tool("session_start", {"language": "python"})
        sid = (started.structured_content or {}).get("session_id")
        cwd = (started.structured_content or {}).get("cwd")
        if not sid or not cwd:
            fail(f"session_start: {started}")
        seen["go"] = os.path.join(cwd, "go")

    # The same SDK with the extension declared: the cell runs as a task.
    async with Client(transport(), extensions=[Tasks()]) as client:
        code = (
            "import os, time\nprint('working', flush=True)\n"
            "while not os.path.exists('go'):\n    time.sleep(0.02)\nx = 6 * 7\nprint(x)"
        )
        r = await client.call_tool("session_eval", {"session_id": sid, "code": code})
        if "created" not in seen:
            fail(f"the call was not answered with a task (protocol {client.protocol_version}): {r}")
        out = (r.structured_content or {}).get("output")
        if r.is_error or out != "working\n42\n":
            fail(f"the task's result: {r}")
        if "working" not in seen["statuses"]:
            fail(f"never seen working: {seen['statuses']}")
        print(
            f"ok: a task over {client.protocol_version}, polled {len(seen['statuses'])} times to completed",
            flush=True,
        )


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    asyncio.run(main(sys.argv[1], sys.argv[2]))
