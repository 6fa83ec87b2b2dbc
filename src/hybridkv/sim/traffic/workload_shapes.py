"""The shapes of the seeded workload generators (:mod:`~hybridkv.sim.traffic.workloads`): one
frozen record per generator, validated when built.

* :class:`ChatWorkload` — :func:`~hybridkv.sim.traffic.workloads.multi_turn_chat`.
* :class:`AgentWorkload` — :func:`~hybridkv.sim.traffic.workloads.agentic_loop`.
* :class:`SystemPromptWorkload` — :func:`~hybridkv.sim.traffic.workloads.shared_system_prompt`.

A token count is a :data:`LengthSpec`. The seed is not part of a shape: the generators take it
beside the record (``simulate --seed``), so one shape serves many seeds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hybridkv.core.validation import check_int
from hybridkv.sim.traffic.traces import is_int

__all__ = ["DEFAULT_VOCAB", "AgentWorkload", "ChatWorkload", "LengthSpec", "SystemPromptWorkload",
           "check_length"]

DEFAULT_VOCAB = 32_000
"""Vocabulary of the synthetic generators' random tokens."""

LengthSpec = int | tuple[int, int]
"""A token count: an exact int, or ``(lo, hi)`` drawn uniformly from ``[lo, hi]``."""


def check_length(name: str, spec: object, minimum: int = 0) -> None:
    """ValueError unless ``spec`` is a :data:`LengthSpec` whose counts are >= ``minimum``."""
    if isinstance(spec, tuple):
        if len(spec) != 2:
            raise ValueError(f"{name} range must be a (lo, hi) pair, got {spec!r}")
        lo, hi = spec
        if not (is_int(lo) and is_int(hi)) or lo < minimum or hi < lo:
            raise ValueError(f"{name} range must satisfy {minimum} <= lo <= hi, got {spec!r}")
        return
    if not is_int(spec) or spec < minimum:  # type: ignore[operator]
        raise ValueError(f"{name} must be an integer >= {minimum} or a (lo, hi) range, got {spec!r}")


def _check_rate(arrival_rate: float | None) -> None:
    if arrival_rate is None:
        return
    if isinstance(arrival_rate, bool) or not isinstance(arrival_rate, (int, float)) \
            or not (arrival_rate > 0 and math.isfinite(arrival_rate)):
        raise ValueError(f"arrival rate must be a positive finite number or None, got {arrival_rate!r}")


@dataclass(frozen=True)
class ChatWorkload:
    """Multi-turn chat (:func:`~hybridkv.sim.traffic.workloads.multi_turn_chat`).

    Attributes:
        num_conversations: >= 1 conversations.
        turns: >= 1 turns per conversation.
        system_tokens: >= 0: the one system prompt all conversations share.
        user_tokens: each turn's new user text.
        answer_tokens: each turn's answer (the request's output).
        concurrency: >= 1 conversations open at a time.
        arrival_rate: Poisson arrivals in requests/s (> 0); None: all at time 0.
        vocab_size: >= 2: tokens are drawn from ``[0, vocab_size)``.
    """

    num_conversations: int = 64
    turns: int = 6
    system_tokens: int = 1024
    user_tokens: LengthSpec = (64, 512)
    answer_tokens: LengthSpec = (64, 512)
    concurrency: int = 16
    arrival_rate: float | None = 4.0
    vocab_size: int = DEFAULT_VOCAB

    def __post_init__(self) -> None:
        check_int("num_conversations", self.num_conversations, 1)
        check_int("turns", self.turns, 1)
        check_int("system_tokens", self.system_tokens, 0)
        check_length("user_tokens", self.user_tokens)
        check_length("answer_tokens", self.answer_tokens)
        check_int("concurrency", self.concurrency, 1)
        _check_rate(self.arrival_rate)
        check_int("vocab_size", self.vocab_size, 2)


@dataclass(frozen=True)
class AgentWorkload:
    """Agent loops (:func:`~hybridkv.sim.traffic.workloads.agentic_loop`).

    Attributes:
        num_agents: >= 1 agents.
        steps: >= 1 steps per agent.
        system_tokens: >= 0: the shared system/tool-definition prompt.
        task_tokens: an agent's task (step 0's own text).
        tool_tokens: a tool's output (each later step's new text).
        action_tokens: an action (each step's output).
        concurrency: >= 1 agents running at a time.
        arrival_rate: Poisson arrivals in requests/s (> 0); None: all at time 0.
        vocab_size: >= 2: tokens are drawn from ``[0, vocab_size)``.
    """

    num_agents: int = 16
    steps: int = 20
    system_tokens: int = 4096
    task_tokens: LengthSpec = (256, 1024)
    tool_tokens: LengthSpec = (256, 2048)
    action_tokens: LengthSpec = (16, 128)
    concurrency: int = 8
    arrival_rate: float | None = 2.0
    vocab_size: int = DEFAULT_VOCAB

    def __post_init__(self) -> None:
        check_int("num_agents", self.num_agents, 1)
        check_int("steps", self.steps, 1)
        check_int("system_tokens", self.system_tokens, 0)
        check_length("task_tokens", self.task_tokens)
        check_length("tool_tokens", self.tool_tokens)
        check_length("action_tokens", self.action_tokens)
        check_int("concurrency", self.concurrency, 1)
        _check_rate(self.arrival_rate)
        check_int("vocab_size", self.vocab_size, 2)


@dataclass(frozen=True)
class SystemPromptWorkload:
    """Independent requests on a few system prompts
    (:func:`~hybridkv.sim.traffic.workloads.shared_system_prompt`).

    Attributes:
        num_requests: >= 1 requests.
        num_prompts: >= 1 system prompts.
        system_tokens: one length for every system prompt, or a range drawn per prompt.
        user_tokens: each request's unique user text.
        output_tokens: each request's output.
        zipf_s: >= 0, finite: prompt ``j`` is drawn with weight ``(j + 1) ** -zipf_s``
            (0: uniform).
        arrival_rate: Poisson arrivals in requests/s (> 0); None: all at time 0.
        vocab_size: >= 2: tokens are drawn from ``[0, vocab_size)``.
    """

    num_requests: int = 512
    num_prompts: int = 8
    system_tokens: LengthSpec = 2048
    user_tokens: LengthSpec = (32, 512)
    output_tokens: LengthSpec = (32, 256)
    zipf_s: float = 0.0
    arrival_rate: float | None = 16.0
    vocab_size: int = DEFAULT_VOCAB

    def __post_init__(self) -> None:
        check_int("num_requests", self.num_requests, 1)
        check_int("num_prompts", self.num_prompts, 1)
        check_length("system_tokens", self.system_tokens)
        check_length("user_tokens", self.user_tokens)
        check_length("output_tokens", self.output_tokens)
        z = self.zipf_s
        if isinstance(z, bool) or not isinstance(z, (int, float)) or not (z >= 0 and math.isfinite(z)):
            raise ValueError(f"zipf_s must be a finite number >= 0, got {z!r}")
        _check_rate(self.arrival_rate)
        check_int("vocab_size", self.vocab_size, 2)
