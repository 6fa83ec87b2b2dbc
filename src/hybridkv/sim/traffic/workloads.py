"""Seeded synthetic workloads for the simulator (deterministic for a given seed; numpy
``Generator``). Each returns a ``list[TraceRequest]`` in arrival order.

* :func:`multi_turn_chat` — conversations whose turn k prompt is turn k-1's prompt + answer +
  new user text.
* :func:`shared_system_prompt` — independent requests drawing one of a few system prompts.
* :func:`agentic_loop` — agents whose context grows by the action and a tool output each step.
* :func:`replay_microbenchmark` — A, an unrelated B, then A again (vLLM #43447).

:data:`WORKLOADS` maps CLI names to generators; :func:`get_workload` builds one by name with
keyword overrides of its shape (:data:`WORKLOAD_SHAPES`, :mod:`~hybridkv.sim.traffic.workload_shapes`:
one frozen record per generator; a workload is named by the fields that differ from it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from hybridkv.core.validation import check_int
from hybridkv.sim.traffic.traces import TraceRequest
from hybridkv.sim.traffic.workload_shapes import (DEFAULT_VOCAB, AgentWorkload, ChatWorkload, LengthSpec,
                                                  SystemPromptWorkload, check_length)

__all__ = [
    "DEFAULT_VOCAB",
    "WORKLOADS",
    "WORKLOAD_SHAPES",
    "AgentWorkload",
    "ChatWorkload",
    "LengthSpec",
    "SystemPromptWorkload",
    "agentic_loop",
    "get_workload",
    "multi_turn_chat",
    "replay_microbenchmark",
    "shared_system_prompt",
    "workload_keys",
]


def _check_count(name: str, value: int, minimum: int = 1) -> None:
    check_int(name, value, minimum)


def _draw_len(rng: np.random.Generator, name: str, spec: LengthSpec, minimum: int = 0) -> int:
    """Resolve a :data:`LengthSpec`; raises ValueError for a bad spec."""
    check_length(name, spec, minimum)
    if isinstance(spec, tuple):
        lo, hi = spec
        return int(rng.integers(lo, hi + 1))
    return spec


def _tokens(rng: np.random.Generator, n: int, vocab: int) -> np.ndarray:
    return rng.integers(0, vocab, size=n, dtype=np.int64)


def _arrivals(rng: np.random.Generator, n: int, rate: float | None) -> np.ndarray:
    """Poisson arrival times at ``rate`` requests/s (first at 0; the shape records check it);
    None: all at time 0."""
    if rate is None:
        return np.zeros(n)
    gaps = rng.exponential(1.0 / rate, size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def _session_order(rng: np.random.Generator, sessions: int, steps: int, concurrency: int) -> list[int]:
    """Interleave ``sessions`` x ``steps`` requests, at most ``concurrency`` sessions open.

    Returns the session index of each request in order: the next request comes from a uniformly
    random open session; a finished session is replaced by the next unopened one.
    """
    open_: list[int] = list(range(min(concurrency, sessions)))
    next_session = len(open_)
    left = [steps] * sessions
    order: list[int] = []
    while open_:
        k = int(rng.integers(len(open_)))
        s = open_[k]
        order.append(s)
        left[s] -= 1
        if left[s] == 0:
            if next_session < sessions:
                open_[k] = next_session
                next_session += 1
            else:
                open_.pop(k)
    return order


def _growing_sessions(
    *,
    prefix: str,
    num_sessions: int,
    steps: int,
    shared_tokens: int,
    first_tokens: LengthSpec,
    step_tokens: LengthSpec,
    output_tokens: LengthSpec,
    concurrency: int,
    arrival_rate: float | None,
    seed: int,
    vocab_size: int,
) -> list[TraceRequest]:
    """Sessions whose step k prompt = step k-1 prompt + step k-1 output + new input.

    Step 0's prompt is the shared prefix (same for all sessions) + ``first_tokens`` session
    tokens. Outputs are pre-drawn random tokens, so the next step's prompt contains them.
    """
    rng = np.random.default_rng(seed)
    shared = _tokens(rng, shared_tokens, vocab_size)
    order = _session_order(rng, num_sessions, steps, concurrency)
    arrivals = _arrivals(rng, len(order), arrival_rate)
    context: list[np.ndarray | None] = [None] * num_sessions
    last_output: list[np.ndarray] = [np.empty(0, np.int64)] * num_sessions
    step_no = [0] * num_sessions
    out: list[TraceRequest] = []
    for n, s in enumerate(order):
        k = step_no[s]
        if k == 0:
            new = _tokens(rng, _draw_len(rng, "first tokens", first_tokens), vocab_size)
            prompt = np.concatenate([shared, new])
        else:
            new = _tokens(rng, _draw_len(rng, "step tokens", step_tokens), vocab_size)
            prompt = np.concatenate([context[s], last_output[s], new])  # type: ignore[list-item]
        if prompt.size == 0:
            raise ValueError("a generated prompt is empty; give at least one prompt token")
        out_len = _draw_len(rng, "output tokens", output_tokens)
        last_output[s] = _tokens(rng, out_len, vocab_size)
        context[s] = prompt
        step_no[s] = k + 1
        out.append(
            TraceRequest(f"{prefix}-s{s}-t{k}", float(arrivals[n]), prompt, out_len, f"{prefix}-s{s}",
                         output_ids=last_output[s])
        )
    return out


def multi_turn_chat(shape: ChatWorkload | None = None, seed: int = 0) -> list[TraceRequest]:
    """Multi-turn chat: turn k's prompt = turn k-1's prompt + its answer + new user text.

    All conversations share one ``shape.system_tokens`` system prompt. The answer of each turn
    is a deterministic random token sequence of the request's ``output_len`` tokens, and the
    next turn's prompt contains it, as a real chat history would. ``shape.concurrency``
    conversations are open at a time and their turns interleave randomly; arrivals are Poisson
    at ``shape.arrival_rate`` requests/s (None: all at time 0). Ids are
    ``chat-s<conv>-t<turn>``, sessions ``chat-s<conv>``. ``shape``: default
    :class:`ChatWorkload`.
    """
    c = shape if shape is not None else ChatWorkload()
    return _growing_sessions(
        prefix="chat", num_sessions=c.num_conversations, steps=c.turns, shared_tokens=c.system_tokens,
        first_tokens=c.user_tokens, step_tokens=c.user_tokens, output_tokens=c.answer_tokens,
        concurrency=c.concurrency, arrival_rate=c.arrival_rate, seed=seed, vocab_size=c.vocab_size,
    )


def agentic_loop(shape: AgentWorkload | None = None, seed: int = 0) -> list[TraceRequest]:
    """Agent loops: long, growing contexts with short outputs.

    Step 0's prompt is the shared system/tool-definition prompt + the agent's task; step k's
    prompt is step k-1's prompt + its action (the output) + a tool output. Interleaving and
    arrivals as in :func:`multi_turn_chat`. Ids ``agent-s<agent>-t<step>``. ``shape``: default
    :class:`AgentWorkload`.
    """
    a = shape if shape is not None else AgentWorkload()
    return _growing_sessions(
        prefix="agent", num_sessions=a.num_agents, steps=a.steps, shared_tokens=a.system_tokens,
        first_tokens=a.task_tokens, step_tokens=a.tool_tokens, output_tokens=a.action_tokens,
        concurrency=a.concurrency, arrival_rate=a.arrival_rate, seed=seed, vocab_size=a.vocab_size,
    )


def shared_system_prompt(shape: SystemPromptWorkload | None = None, seed: int = 0) -> list[TraceRequest]:
    """Independent requests, each = one of ``shape.num_prompts`` system prompts + unique user text.

    Prompt ``j`` is chosen with probability proportional to ``(j + 1) ** -zipf_s`` (0: uniform).
    Ids ``sys-<n>``; ``session`` is None. ``system_tokens`` is one length for every system
    prompt or a ``(lo, hi)`` range drawn per prompt. Each request marks the end of its system
    prompt as a checkpoint position (``checkpoints``; served with ``SimConfig.checkpoint_marks``).
    ``shape``: default :class:`SystemPromptWorkload`.
    """
    w = shape if shape is not None else SystemPromptWorkload()
    num_requests, num_prompts, vocab_size = w.num_requests, w.num_prompts, w.vocab_size
    rng = np.random.default_rng(seed)
    systems = [_tokens(rng, _draw_len(rng, "system_tokens", w.system_tokens), vocab_size)
               for _ in range(num_prompts)]
    weights = np.arange(1, num_prompts + 1, dtype=float) ** -w.zipf_s
    choice = rng.choice(num_prompts, size=num_requests, p=weights / weights.sum())
    arrivals = _arrivals(rng, num_requests, w.arrival_rate)
    out: list[TraceRequest] = []
    for n in range(num_requests):
        user = _tokens(rng, _draw_len(rng, "user_tokens", w.user_tokens), vocab_size)
        prompt = np.concatenate([systems[int(choice[n])], user])
        out_len = _draw_len(rng, "output_tokens", w.output_tokens)
        system = systems[int(choice[n])].size
        out.append(TraceRequest(f"sys-{n}", float(arrivals[n]), prompt, out_len,
                                checkpoints=(system,) if system else ()))
    return out


def replay_microbenchmark(
    a_tokens: int = 8192,
    b_tokens: int = 8192,
    output_len: int = 1,
    gap_s: float = 5.0,
    seed: int = 0,
    vocab_size: int = DEFAULT_VOCAB,
) -> list[TraceRequest]:
    """The vLLM #43447 scenario: request A, an unrelated request B, then A's prompt again.

    Arrivals are ``0, gap_s, 2 * gap_s`` so the three run one after another. A perfect cache
    hits all of A on the third request (up to the manager's alignment); SWA churn from B is
    what used to flush it. Ids ``replay-A``, ``replay-B``, ``replay-A2``.
    """
    _check_count("a_tokens", a_tokens)
    _check_count("b_tokens", b_tokens)
    _check_count("output_len", output_len, minimum=0)
    rng = np.random.default_rng(seed)
    a = _tokens(rng, a_tokens, vocab_size)
    b = _tokens(rng, b_tokens, vocab_size)
    return [
        TraceRequest("replay-A", 0.0, a, output_len),
        TraceRequest("replay-B", float(gap_s), b, output_len),
        TraceRequest("replay-A2", 2.0 * gap_s, a, output_len),
    ]


WORKLOADS: dict[str, Callable[..., list[TraceRequest]]] = {
    "chat": multi_turn_chat,
    "system-prompt": shared_system_prompt,
    "agentic": agentic_loop,
    "replay": replay_microbenchmark,
}
"""Built-in workloads by CLI name (build one with :func:`get_workload`)."""

WORKLOAD_SHAPES: dict[str, type] = {
    "chat": ChatWorkload,
    "system-prompt": SystemPromptWorkload,
    "agentic": AgentWorkload,
}
"""The shape record of each built-in workload that has one (the others take keywords)."""


def workload_keys(name: str) -> list[str]:
    """The keyword overrides :func:`get_workload` takes for workload ``name`` besides ``seed``,
    in declaration order (the shape record's fields, or the generator's keywords); ValueError
    for an unknown name, listing the valid names."""
    import dataclasses
    import inspect
    factory = _factory(name)
    shape = WORKLOAD_SHAPES.get(name)
    if shape is not None:
        return [f.name for f in dataclasses.fields(shape)]
    return [k for k in inspect.signature(factory).parameters if k != "seed"]


def _factory(name: str) -> Callable[..., list[TraceRequest]]:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; valid workloads: "
                         f"{', '.join(sorted(WORKLOADS))}") from None


def get_workload(name: str, **overrides: Any) -> list[TraceRequest]:
    """Build the built-in workload ``name`` with keyword ``overrides`` (``seed``, and the fields
    of its shape record, :data:`WORKLOAD_SHAPES`, or its generator's keywords).

    Raises:
        ValueError: for an unknown name, listing the valid names, or a bad value.
    """
    factory = _factory(name)
    shape = WORKLOAD_SHAPES.get(name)
    if shape is None:
        return factory(**overrides)
    seed = overrides.pop("seed", 0)
    return factory(shape(**overrides), seed=seed)
