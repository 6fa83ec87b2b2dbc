"""Stop a simulation as soon as it has missed a TTFT target for sure.

A request that has produced no output token at simulated time ``t`` will have a TTFT above
``t - arrival``. Once more requests than a percentile allows
(:meth:`~hybridkv.sim.plan.bound.PrefillBound.over`) are known to exceed a TTFT limit, the
run's TTFT at that percentile exceeds it whatever happens next, so the rest of the run cannot
change the plan's verdict: :class:`StopAtMiss` raises :class:`SLOMissed` from a step hook and
the run ends there. A plan lists such a candidate as failing (its full ``simulate`` command
shows the same verdict with every metric).

The check looks at every instance's waiting and running requests every
:data:`CHECK_EVERY` steps, so it may count a late request later or not at all (one that got
its token between two checks): it stops late, never wrongly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

CHECK_EVERY = 32
MISSED = "SLOMissed"


class SLOMissed(RuntimeError):
    """A run stopped because a TTFT target is missed for sure (the message says which)."""


@dataclass(frozen=True)
class StopAtMiss:
    """A sweep job (:data:`hybridkv.sim.executors.Job`): ``job`` (a ``SimConfig`` or a
    ``ClusterJob``) run until ``over[i]`` of its requests are known to exceed ``limits_s[i]``
    of TTFT, for some i."""

    job: Any
    limits_s: tuple[float, ...]
    over: tuple[int, ...]

    def run(self, items: Sequence, progress: Callable[[int, int], None] | None = None):
        from hybridkv.sim.cluster.loop import ClusterJob
        from hybridkv.sim.simulator import Simulator
        if isinstance(self.job, ClusterJob):
            sim = self.job.simulator(progress)
            sims = [inst.sim for inst in sim.instances]
        else:
            sim = Simulator(self.job, progress=progress)
            sims = [sim]
        late: list[set] = [set() for _ in self.limits_s]
        steps = [0]

        def check(start: float, end: float, out: object) -> None:
            steps[0] += 1
            if steps[0] % CHECK_EVERY:
                return
            for s in sims:
                sched = s.scheduler
                for queue in (sched.waiting, sched.running):
                    for r in queue:
                        if r.num_output_tokens == 0:
                            waited = end - r.arrival_time
                            for i, limit in enumerate(self.limits_s):
                                if waited > limit:
                                    late[i].add(r.request.request_id)
            for i, limit in enumerate(self.limits_s):
                if len(late[i]) >= self.over[i]:
                    raise SLOMissed(f"{len(late[i])} requests had no first token {limit:g} s after "
                                    f"arriving by simulated time {end:,.1f} s (the percentile "
                                    f"allows {self.over[i] - 1})")
        for s in sims:
            s.step_hooks.append(check)
        return sim.run(items if isinstance(items, list) else list(items))


__all__ = ["CHECK_EVERY", "MISSED", "SLOMissed", "StopAtMiss"]
