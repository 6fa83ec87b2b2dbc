"""Continuous-batching scheduler shared by the simulator and the reference engine."""

from hybridkv.sched.acceptance import AcceptanceModel
from hybridkv.sched.queues import POLICIES, FCFSQueue, PriorityQueue, WaitingQueue
from hybridkv.sched.request import EngineRequest, RequestStatus, useful_drafts
from hybridkv.sched.output import KVLoad, ScheduledRequest, SchedulerOutput
from hybridkv.sched.scheduler import ExternalKV, Scheduler, SchedulerConfig

__all__ = ["AcceptanceModel", "EngineRequest", "ExternalKV", "FCFSQueue", "KVLoad", "POLICIES",
           "PriorityQueue", "RequestStatus", "ScheduledRequest", "Scheduler", "SchedulerConfig",
           "SchedulerOutput", "WaitingQueue", "useful_drafts"]
