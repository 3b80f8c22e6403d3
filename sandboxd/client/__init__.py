"""The thin client of sandboxd: :class:`SandboxClient` (sync), :class:`AsyncSandboxClient`,
and :class:`Agent`, a multi-round tool-calling loop for OpenAI-compatible local LLMs.

Light on purpose: importing it pulls in httpx and pydantic (for the shared result models),
never the daemon's server stack. Install with ``pip install sandboxd[client]``.

>>> from sandboxd.client import SandboxClient, Agent
>>> sandbox = SandboxClient("http://127.0.0.1:8765", token="...")
>>> agent = Agent("http://localhost:1234/v1", "qwen2.5-7b-instruct", sandbox=sandbox)
>>> print(agent.act("What is 12345 * 54321?", tools=["python"]).text)
"""

from sandboxd.client.agent import Agent
from sandboxd.client.async_sandbox import AsyncSandboxClient
from sandboxd.client.base import ToolFailed
from sandboxd.client.errors import (
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
from sandboxd.client.events import StreamBroken, ToolOutput
from sandboxd.client.records import (
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
from sandboxd.client.render import format_result
from sandboxd.client.sandbox import SandboxClient
from sandboxd.client.schema import ToolDefinitionError, function_tool_schema
from sandboxd.client.session import AsyncSession, Session, SessionInfo
from sandboxd.client.stream import ToolCallRequest

__all__ = [
    "ActResult",
    "Agent",
    "AsyncSandboxClient",
    "AsyncSession",
    "AuthenticationError",
    "BadRequest",
    "ConnectionFailed",
    "Fragment",
    "InvalidArguments",
    "LLMError",
    "LocalTool",
    "NotFound",
    "PayloadTooLarge",
    "PermissionDenied",
    "ProblemError",
    "RateLimited",
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
    "Unavailable",
    "format_result",
    "function_tool_schema",
    "tool",
    "truncate_middle",
]
