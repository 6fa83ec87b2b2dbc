"""Continuous-batching scheduler shared by the simulator and the reference engine."""

from hybridkv.sched.acceptance import AcceptanceModel
from hybridkv.sched.request import EngineRequest, RequestStatus
from hybridkv.sched.scheduler import (POLICIES, ExternalKV, KVLoad, ScheduledRequest, Scheduler,
                                      SchedulerConfig, SchedulerOutput)

__all__ = ["AcceptanceModel", "EngineRequest", "ExternalKV", "KVLoad", "POLICIES", "RequestStatus", "ScheduledRequest",
           "Scheduler", "SchedulerConfig", "SchedulerOutput"]
