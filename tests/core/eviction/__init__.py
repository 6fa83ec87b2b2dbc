"""Tests of the eviction policies (``hybridkv.core.eviction``): one file per policy module, the
registry, and what every policy promises.

A policy decides *which* cached free block is reused next, so the observable is the eviction
order: most tests drive a :class:`~hybridkv.core.policy_pool.PolicyBlockPool` (the pool every
non-LRU policy is attached to) through the documented seam — compute a chain, hit its cached
prefix, free it tail first, allocate until victims are taken — and assert the contents
evicted, first victim first, with the order derived by hand from the policy's documented
algorithm (the comments walk through each derivation). Helpers: :mod:`tests.support.policies`.
"""
