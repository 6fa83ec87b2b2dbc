"""Seeded synthetic workloads for the simulator (deterministic for a given seed; numpy
``Generator``). Each returns a ``list[TraceRequest]`` in arrival order.

* :func:`multi_turn_chat` — conversations whose turn k prompt is turn k-1's prompt + answer +
  new user text.
* :func:`shared_system_prompt` — independent requests drawing one of a few system prompts.
* :func:`agentic_loop` — agents whose context grows by the action and a tool output each step.
* :func:`replay_microbenchmark` — A, an unrelated B, then A again (vLLM #43447).

:data:`WORKLOADS` maps CLI names to generators with sensible defaults; :func:`get_workload`
builds one by name with keyword overrides. The generators take their shape as keyword
arguments with defaults (a workload is named by the knobs that differ from them).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from hybridkv.core.validation import check_int
from hybridkv.sim.traffic.traces import TraceRequest, is_int

__all__ = [
    "DEFAULT_VOCAB",
    "WORKLOADS",
    "LengthSpec",
    "agentic_loop",
    "get_workload",
    "multi_turn_chat",
    "replay_microbenchmark",
    "shared_system_prompt",
]

DEFAULT_VOCAB = 32_000
"""Vocabulary of the synthetic generators' random tokens."""

LengthSpec = int | tuple[int, int]
"""A token count: an exact int, or ``(lo, hi)`` drawn uniformly from ``[lo, hi]``."""


def _check_count(name: str, value: int, minimum: int = 1) -> None:
    check_int(name, value, minimum)


def _draw_len(rng: np.random.Generator, name: str, spec: LengthSpec, minimum: int = 0) -> int:
    """Resolve a :data:`LengthSpec`; raises ValueError for a bad spec."""
    if isinstance(spec, tuple):
        lo, hi = spec
        if not (is_int(lo) and is_int(hi)) or lo < minimum or hi < lo:
            raise ValueError(f"{name} range must satisfy {minimum} <= lo <= hi, got {spec!r}")
        return int(rng.integers(lo, hi + 1))
    if not is_int(spec) or spec < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum} or a (lo, hi) range, got {spec!r}")
    return spec


def _tokens(rng: np.random.Generator, n: int, vocab: int) -> np.ndarray:
    return rng.integers(0, vocab, size=n, dtype=np.int64)


def _arrivals(rng: np.random.Generator, n: int, rate: float | None) -> np.ndarray:
    """Poisson arrival times at ``rate`` requests/s (first at 0); None: all at time 0."""
    if rate is None:
        return np.zeros(n)
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"arrival rate must be a positive finite number or None, got {rate!r}")
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
    _check_count("number of sessions", num_sessions)
    _check_count("steps", steps)
    _check_count("concurrency", concurrency)
    _check_count("shared tokens", shared_tokens, minimum=0)
    _check_count("vocab_size", vocab_size, minimum=2)
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


def multi_turn_chat(
    num_conversations: int = 64,
    turns: int = 6,
    system_tokens: int = 1024,
    user_tokens: LengthSpec = (64, 512),
    answer_tokens: LengthSpec = (64, 512),
    concurrency: int = 16,
    arrival_rate: float | None = 4.0,
    seed: int = 0,
    vocab_size: int = DEFAULT_VOCAB,
) -> list[TraceRequest]:
    """Multi-turn chat: turn k's prompt = turn k-1's prompt + its answer + new user text.

    All conversations share one ``system_tokens`` system prompt. The answer of each turn is a
    deterministic random token sequence of the request's ``output_len`` tokens, and the next
    turn's prompt contains it, as a real chat history would. ``concurrency`` conversations are
    open at a time and their turns interleave randomly; arrivals are Poisson at
    ``arrival_rate`` requests/s (None: all at time 0). Ids are ``chat-s<conv>-t<turn>``,
    sessions ``chat-s<conv>``.
    """
    return _growing_sessions(
        prefix="chat", num_sessions=num_conversations, steps=turns, shared_tokens=system_tokens,
        first_tokens=user_tokens, step_tokens=user_tokens, output_tokens=answer_tokens,
        concurrency=concurrency, arrival_rate=arrival_rate, seed=seed, vocab_size=vocab_size,
    )


def agentic_loop(
    num_agents: int = 16,
    steps: int = 20,
    system_tokens: int = 4096,
    task_tokens: LengthSpec = (256, 1024),
    tool_tokens: LengthSpec = (256, 2048),
    action_tokens: LengthSpec = (16, 128),
    concurrency: int = 8,
    arrival_rate: float | None = 2.0,
    seed: int = 0,
    vocab_size: int = DEFAULT_VOCAB,
) -> list[TraceRequest]:
    """Agent loops: long, growing contexts with short outputs.

    Step 0's prompt is the shared system/tool-definition prompt + the agent's task; step k's
    prompt is step k-1's prompt + its action (the output) + a tool output. Interleaving and
    arrivals as in :func:`multi_turn_chat`. Ids ``agent-s<agent>-t<step>``.
    """
    return _growing_sessions(
        prefix="agent", num_sessions=num_agents, steps=steps, shared_tokens=system_tokens,
        first_tokens=task_tokens, step_tokens=tool_tokens, output_tokens=action_tokens,
        concurrency=concurrency, arrival_rate=arrival_rate, seed=seed, vocab_size=vocab_size,
    )


def shared_system_prompt(
    num_requests: int = 512,
    num_prompts: int = 8,
    system_tokens: LengthSpec = 2048,
    user_tokens: LengthSpec = (32, 512),
    output_tokens: LengthSpec = (32, 256),
    zipf_s: float = 0.0,
    arrival_rate: float | None = 16.0,
    seed: int = 0,
    vocab_size: int = DEFAULT_VOCAB,
) -> list[TraceRequest]:
    """Independent requests, each = one of ``num_prompts`` system prompts + unique user text.

    Prompt ``j`` is chosen with probability proportional to ``(j + 1) ** -zipf_s`` (0: uniform).
    Ids ``sys-<n>``; ``session`` is None. ``system_tokens`` is one length for every system
    prompt or a ``(lo, hi)`` range drawn per prompt. Each request marks the end of its system
    prompt as a checkpoint position (``checkpoints``; served with ``SimConfig.checkpoint_marks``).
    """
    _check_count("num_requests", num_requests)
    _check_count("num_prompts", num_prompts)
    if not (zipf_s >= 0 and math.isfinite(zipf_s)):
        raise ValueError(f"zipf_s must be a finite number >= 0, got {zipf_s!r}")
    rng = np.random.default_rng(seed)
    systems = [_tokens(rng, _draw_len(rng, "system_tokens", system_tokens), vocab_size)
               for _ in range(num_prompts)]
    weights = np.arange(1, num_prompts + 1, dtype=float) ** -zipf_s
    choice = rng.choice(num_prompts, size=num_requests, p=weights / weights.sum())
    arrivals = _arrivals(rng, num_requests, arrival_rate)
    out: list[TraceRequest] = []
    for n in range(num_requests):
        user = _tokens(rng, _draw_len(rng, "user_tokens", user_tokens), vocab_size)
        prompt = np.concatenate([systems[int(choice[n])], user])
        out_len = _draw_len(rng, "output_tokens", output_tokens)
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
"""Built-in workloads by CLI name; each is called with keyword overrides of its defaults."""


def get_workload(name: str, **overrides: Any) -> list[TraceRequest]:
    """Build the built-in workload ``name`` with keyword ``overrides``.

    Raises:
        ValueError: for an unknown name, listing the valid names.
    """
    try:
        factory = WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; valid workloads: {', '.join(sorted(WORKLOADS))}") from None
    return factory(**overrides)
