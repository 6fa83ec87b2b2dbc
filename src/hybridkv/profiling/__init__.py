"""``hybridkv profile``: measure step times of a preset's shapes on this machine's device and
fit the calibrated cost model to them (needs PyTorch).

* :mod:`hybridkv.profiling.layers` — random-weight layers and one engine step over them;
* :mod:`hybridkv.profiling.timing` — warm-ups, repetitions, CUDA events and CUDA graphs;
* :mod:`hybridkv.profiling.runner` — the grid, reference rates, copies, fit, the file;

The command is ``hybridkv profile`` (:mod:`hybridkv.cli.profile`); the file format is
:mod:`hybridkv.cost.profile`'s.
"""
