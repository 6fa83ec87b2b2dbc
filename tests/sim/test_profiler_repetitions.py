"""The profiler's repetition counts, exactly: warm-ups, then as many timed repetitions as fit
in ``target_s`` (the first one's duration decides), clamped to ``[min_repeats, max_repeats]``
(``hybridkv.profiling.timing``); the median and minimum of what was timed; and which options
``hybridkv profile`` passes for each device. A fake clock makes every duration exact (powers of
two: their sums and quotients are exact in binary floating point)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hybridkv.profiling import timing as timing_mod  # noqa: E402
from hybridkv.profiling.timing import TimingOptions, time_call  # noqa: E402

CPU = torch.device("cpu")


class FakeClock:
    """``time.perf_counter`` for the timing module; each call of the timed function advances it
    by the next of ``durations`` (the last one repeats)."""

    def __init__(self, durations: list[float]) -> None:
        self.now = 1.0e6                   # far from 0: the timer must subtract
        self.durations = list(durations)
        self.calls = 0

    def __call__(self) -> float:
        return self.now

    def fn(self) -> None:
        d = self.durations[min(self.calls, len(self.durations) - 1)]
        self.calls += 1
        self.now += d


@pytest.fixture
def clock(monkeypatch):
    def make(durations):
        c = FakeClock(durations)
        monkeypatch.setattr(timing_mod.time, "perf_counter", c)
        return c
    return make


@pytest.mark.parametrize("d, opts, repeats", [
    # target 1 s: 1 / 0.125 = 8 repetitions fit, inside [6, 20]
    (0.125, TimingOptions(warmup=2, min_repeats=6, max_repeats=20, target_s=1.0), 8),
    # 1 / 2**-6 = 64 fit: clamped to 20
    (2.0 ** -6, TimingOptions(warmup=2, min_repeats=6, max_repeats=20, target_s=1.0), 20),
    # 1 / 0.25 = 4 fit: raised to 6
    (0.25, TimingOptions(warmup=2, min_repeats=6, max_repeats=20, target_s=1.0), 6),
    # the CPU defaults (1, 3, 10, 0.05): 0.05 / 2**-8 = 12.8 -> 12, clamped to 10
    (2.0 ** -8, TimingOptions(1, 3, 10, 0.05), 10),
    # 0.05 / 2**-6 = 3.2 -> 3
    (2.0 ** -6, TimingOptions(1, 3, 10, 0.05), 3),
    # 0.05 / 2**-7 = 6.4 -> 6
    (2.0 ** -7, TimingOptions(1, 3, 10, 0.05), 6),
    # no warm-up at all; a step slower than the target: min_repeats
    (2.0, TimingOptions(warmup=0, min_repeats=2, max_repeats=5, target_s=1.0), 2),
    # min == max: exactly that many whatever the duration
    (2.0 ** -10, TimingOptions(warmup=3, min_repeats=4, max_repeats=4, target_s=1.0), 4),
])
def test_warmups_then_the_repetitions_that_fit_the_target(clock, d, opts, repeats) -> None:
    c = clock([d])
    t = time_call(c.fn, CPU, opts)
    assert c.calls == opts.warmup + repeats
    assert t.seconds == (d,) * repeats
    assert t.median_s == d and t.min_s == d and t.host_s == d and t.unqueued == 0


def test_the_first_timed_repetition_not_a_warmup_sizes_the_count(clock) -> None:
    """Warm-ups take 1 s each (a cold start); the first timed repetition takes 1/16 s: 16 fit
    in the 1 s target, not 1."""
    c = clock([1.0, 1.0, 2.0 ** -4])
    t = time_call(c.fn, CPU, TimingOptions(warmup=2, min_repeats=3, max_repeats=50, target_s=1.0))
    assert len(t.seconds) == 16 and c.calls == 18


def test_median_and_minimum_of_the_timed_repetitions_only(clock) -> None:
    """Warm-up 4 s (excluded), then 0.5, 0.25, 0.75, 0.125, 1.0 (5 repetitions: target 1 s,
    1 / 0.5 = 2, raised to 5): median 0.5, minimum 0.125."""
    c = clock([4.0, 0.5, 0.25, 0.75, 0.125, 1.0])
    t = time_call(c.fn, CPU, TimingOptions(warmup=1, min_repeats=5, max_repeats=5, target_s=1.0))
    assert t.seconds == (0.5, 0.25, 0.75, 0.125, 1.0)
    assert (t.median_s, t.min_s, t.host_s) == (0.5, 0.125, 0.5)


def test_even_count_median_is_the_mean_of_the_middle_two(clock) -> None:
    c = clock([0.25, 0.5, 0.125, 1.0])
    t = time_call(c.fn, CPU, TimingOptions(warmup=0, min_repeats=4, max_repeats=4, target_s=1.0))
    assert t.median_s == (0.25 + 0.5) / 2


def test_the_profile_command_passes_the_repetition_options_per_device(monkeypatch, tmp_path) -> None:
    """``--warmup`` and ``--repeats`` on a CPU start from the CPU defaults (1 warm-up, 3:10,
    0.05 s); nothing given: the runner's own per-device defaults (None)."""
    import hybridkv.profiling.runner as runner
    from hybridkv.cli import main
    import hybridkv.cli.profile as cli_profile
    seen = []

    def fake_run(req, out=None, progress=True):
        seen.append(req.timing)
        return None
    monkeypatch.setattr(runner, "run_profile", fake_run)
    monkeypatch.setattr(cli_profile, "_print_summary", lambda prof, out: None)
    out = str(tmp_path / "p.json")
    base = ["profile", "--device", "cpu", "--out", out, "--no-progress", "--grid", "none",
            "--point", "16@0"]
    for extra in ([], ["--warmup", "4"], ["--repeats", "2:7"], ["--no-queue-ahead"],
                  ["--warmup", "0", "--repeats", "5:5"]):
        assert main([*base, *extra]) == 0
    assert seen == [None, TimingOptions(4, 3, 10, 0.05), TimingOptions(1, 2, 7, 0.05),
                    TimingOptions(1, 3, 10, 0.05, queue_ahead=False), TimingOptions(0, 5, 5, 0.05)]
