"""Continuous-batching scheduler (planned: see the scheduler/simulator issue)."""
