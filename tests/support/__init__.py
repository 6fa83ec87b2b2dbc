"""What tests and benchmarks share; no test lives here.

* :mod:`.oracle` — the independent hit oracle (what is cached, from KV events only; the hit
  rules from the attention definitions and vLLM's lookup).
* :mod:`.random_ops` — the property tests' strategies and :class:`~.random_ops.Model`, which
  drives a manager and checks every hit against the oracle and a shadow record of contents.
* :mod:`.eager_pool` — the eager block pool, the reference of the lazy one
  (``benchmarks/bench_pool.py`` and ``bench_manager_pools.py`` time both).
* :mod:`.helpers` — builders (specs, configs, managers) and drivers of the core tests.
* :mod:`.policies` — the eviction-policy tests' cache, workloads and clock.
* :mod:`.compiled_trace` — the random trace the compiled-vs-pure test runs in both builds.
* :mod:`.tier_workload` — the model and workload the engine's and the simulator's tier tests
  share.
"""
