"""Trace-driven simulator: workloads, model/GPU presets, cost model and offline-optimal bounds.

Submodules (import them directly; this package imports nothing eagerly):

* :mod:`hybridkv.sim.traces` — real traces (Mooncake, token JSONL) and seeded generators.
* :mod:`hybridkv.sim.optimal` — block-level LRU and Belady (offline optimum) simulations.
* :mod:`hybridkv.sim.presets` — model presets (KV-cache groups) and GPU presets.
* :mod:`hybridkv.sim.costmodel` — roofline per-step time.
"""
