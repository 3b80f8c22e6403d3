"""The thin client of sandboxd: :class:`SandboxClient` (sync), :class:`AsyncSandboxClient`,
and :class:`Agent`, a multi-round tool-calling loop for OpenAI-compatible local LLMs.

A distribution of its own (``pip install ./client``: httpx, httpx-sse and pydantic, nothing of
the daemon). Its names are imported on first use: the daemon shares this package's answer
models (:mod:`sandboxd_client.models`) and deadline idiom without loading httpx and the
client's machinery on its serving path.

>>> from sandboxd_client import SandboxClient, Agent
>>> sandbox = SandboxClient("http://127.0.0.1:8765", token="...")
>>> agent = Agent("http://localhost:1234/v1", "qwen2.5-7b-instruct", sandbox=sandbox)
>>> print(agent.act("What is 12345 * 54321?", tools=["python"]).text)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
#: where a client (this package, the daemon's CLI, its stdio MCP bridge) finds a local daemon
DEFAULT_URL = "http://127.0.0.1:8765"

if TYPE_CHECKING:
    from sandboxd_client.agent import Agent
    from sandboxd_client.async_sandbox import AsyncSandboxClient
    from sandboxd_client.base import RetryHook, ToolFailed
    from sandboxd_client.errors import (
        AuthenticationError,
        BadRequest,
        ConnectionFailed,
        InvalidArguments,
        NotFound,
        PayloadTooLarge,
        PermissionDenied,
        ProblemError,
        RateLimited,
        SandboxError,
        ServerError,
        Unavailable,
    )
    from sandboxd_client.events import StreamBroken, ToolOutput
    from sandboxd_client.models import Result, ToolSpec
    from sandboxd_client.output_items import Output
    from sandboxd_client.records import (
        ActResult,
        Fragment,
        LLMError,
        LocalTool,
        ToolCallError,
        ToolCallEvent,
        ToolCallRecord,
        tool,
        truncate_middle,
    )
    from sandboxd_client.render import format_result
    from sandboxd_client.sandbox import SandboxClient
    from sandboxd_client.schema import ToolDefinitionError, function_tool_schema
    from sandboxd_client.session import AsyncSession, ForkInfo, Session, SessionInfo
    from sandboxd_client.stream import ToolCallRequest

#: each public name and the module that defines it (imported on first use)
_LAZY: dict[str, str] = {
    "ActResult": "sandboxd_client.records",
    "Agent": "sandboxd_client.agent",
    "AsyncSandboxClient": "sandboxd_client.async_sandbox",
    "AsyncSession": "sandboxd_client.session",
    "AuthenticationError": "sandboxd_client.errors",
    "BadRequest": "sandboxd_client.errors",
    "ConnectionFailed": "sandboxd_client.errors",
    "Fragment": "sandboxd_client.records",
    "InvalidArguments": "sandboxd_client.errors",
    "LLMError": "sandboxd_client.records",
    "LocalTool": "sandboxd_client.records",
    "NotFound": "sandboxd_client.errors",
    "Output": "sandboxd_client.output_items",
    "PayloadTooLarge": "sandboxd_client.errors",
    "PermissionDenied": "sandboxd_client.errors",
    "ProblemError": "sandboxd_client.errors",
    "RateLimited": "sandboxd_client.errors",
    "Result": "sandboxd_client.models",
    "RetryHook": "sandboxd_client.base",
    "SandboxClient": "sandboxd_client.sandbox",
    "SandboxError": "sandboxd_client.errors",
    "ServerError": "sandboxd_client.errors",
    "Session": "sandboxd_client.session",
    "ForkInfo": "sandboxd_client.session",
    "SessionInfo": "sandboxd_client.session",
    "StreamBroken": "sandboxd_client.events",
    "ToolCallError": "sandboxd_client.records",
    "ToolCallEvent": "sandboxd_client.records",
    "ToolCallRecord": "sandboxd_client.records",
    "ToolCallRequest": "sandboxd_client.stream",
    "ToolDefinitionError": "sandboxd_client.schema",
    "ToolFailed": "sandboxd_client.base",
    "ToolOutput": "sandboxd_client.events",
    "ToolSpec": "sandboxd_client.models",
    "Unavailable": "sandboxd_client.errors",
    "format_result": "sandboxd_client.render",
    "function_tool_schema": "sandboxd_client.schema",
    "tool": "sandboxd_client.records",
    "truncate_middle": "sandboxd_client.records",
}

__all__ = [
    "DEFAULT_URL",
    "ActResult",
    "Agent",
    "AsyncSandboxClient",
    "AsyncSession",
    "AuthenticationError",
    "BadRequest",
    "ConnectionFailed",
    "ForkInfo",
    "Fragment",
    "InvalidArguments",
    "LLMError",
    "LocalTool",
    "NotFound",
    "Output",
    "PayloadTooLarge",
    "PermissionDenied",
    "ProblemError",
    "RateLimited",
    "Result",
    "RetryHook",
    "SandboxClient",
    "SandboxError",
    "ServerError",
    "Session",
    "SessionInfo",
    "StreamBroken",
    "ToolCallError",
    "ToolCallEvent",
    "ToolCallRecord",
    "ToolCallRequest",
    "ToolDefinitionError",
    "ToolFailed",
    "ToolOutput",
    "ToolSpec",
    "Unavailable",
    "format_result",
    "function_tool_schema",
    "tool",
    "truncate_middle",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
