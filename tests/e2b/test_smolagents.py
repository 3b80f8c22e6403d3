"""A framework that ships an E2B integration, unchanged: smolagents' ``CodeAgent`` with its
``E2BExecutor`` (``executor_type="e2b"``) and a scripted OpenAI-compatible model. The
agent's code runs in a sandboxd sandbox through E2B's SDK; its final answer comes back the
way smolagents expects it from E2B (a ``FinalAnswerException`` raised in the kernel)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.client.scripted_llm import Reply, ScriptedLLM
from tests.e2b.conftest import E2bDaemon
from tests.support.audit import audit_records

pytestmark = pytest.mark.docker

ACTION = "Thought: I compute it in the sandbox.\n<code>\nanswer = sum(range(10)) * 2\n" \
         "print('computed', answer)\nfinal_answer(answer)\n</code>"


def completion(text: str) -> Reply:
    return Reply(json_body={
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "scripted",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})


def test_smolagents_e2b_executor_runs_against_sandboxd(e2b_env: E2bDaemon) -> None:
    from smolagents import CodeAgent, OpenAIServerModel

    def script(body: dict[str, Any], n: int) -> Reply:
        return completion(ACTION)

    with ScriptedLLM(script, strict=False) as llm:
        model = OpenAIServerModel(model_id="scripted", api_base=llm.url, api_key="unused")
        agent = CodeAgent(tools=[], model=model, executor_type="e2b", max_steps=2)
        try:
            answer = agent.run("What is twice the sum of 0..9?")
        finally:
            agent.cleanup()
    assert answer == 90
    ran = [r for r in audit_records(e2b_env.daemon.audit_path, "decision")
           if r["transport"] == "e2b" and "sum(range(10))" in str(r["args_preview"])]
    assert ran and all(r["decision"] == "allow" for r in ran), ran
