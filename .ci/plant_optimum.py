#!/usr/bin/env python3
"""Plant one-block differences in the Belady bound and check that the brute-force search of
tests/sim/test_sim_optimal.py finds each (``PYTHONPATH=src:. python3 .ci/plant_optimum.py``).

Each plant edits ``belady_block_hit_rate``'s source in memory (nothing is written) and runs
the property ``planted == brute_force_optimum`` with the test's strategy at the default
profile's reach and at the ``deep`` profile's (longer chains, more requests, larger caches).
Exits 1 if a plant meant for a reach is not found there."""
import inspect
import sys
import time
from hypothesis import given, settings, HealthCheck, strategies as st
import hybridkv.sim.bounds.optimal as opt
from tests.sim.test_sim_optimal import traces, brute_force_optimum, BRUTE

src = inspect.getsource(opt.belady_block_hit_rate)
PLANTS = {
    "tie: shallower first": ("depth_span - 1 - depth) * seq_span", "depth) * seq_span"),
    "one block less room at capacity 3": ("        while len(cache) > capacity_blocks:\n            s = pop(heap)",
                                          "        while len(cache) > capacity_blocks - (capacity_blocks == 3):\n            s = pop(heap)"),
    "a full 3-block hit counted as 2": ("        hits_per_request.append(h)", "        h -= (h == limit == 3)\n        hits_per_request.append(h)"),
    "a 4-block chain hit counted as 3 (deep only)": ("        hits_per_request.append(h)", "        h -= (h == 4)\n        hits_per_request.append(h)"),
}
missed = []
DEEP = dict(max_requests=7, max_len=4, alphabet=3, capacity=5)
for name, (a, b) in PLANTS.items():
    for prof, B, n in (("default", BRUTE, 60), ("deep", DEEP, 300)):
        assert a in src, name
        ns = dict(vars(opt))
        exec(src.replace(a, b).replace("def belady_block_hit_rate", "def planted"), ns)
        planted = ns["planted"]
        @settings(max_examples=n, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(traces(B["max_requests"], B["max_len"], B["alphabet"]), st.integers(0, B["capacity"]))
        def prop(requests, capacity):
            got = planted(requests, capacity).block_hits
            want = brute_force_optimum(requests, capacity)
            assert got == want, (got, want)
        t = time.time()
        try:
            prop()
            print(f"{name} [{prof}]: NOT found in {n} examples ({time.time()-t:.1f}s)")
            if prof == "deep" or "deep only" not in name:
                missed.append((name, prof))
        except AssertionError as e:
            print(f"{name} [{prof}]: found ({time.time()-t:.1f}s): {str(e).splitlines()[0][:200]}")

sys.exit(1 if missed else 0)
