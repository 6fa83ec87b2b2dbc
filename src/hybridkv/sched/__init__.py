"""Continuous-batching scheduler shared by the simulator and the reference engine."""

from importlib.machinery import EXTENSION_SUFFIXES as _EXTENSION_SUFFIXES

from hybridkv.sched.acceptance import AcceptanceModel
from hybridkv.sched.queues import POLICIES, FCFSQueue, PriorityQueue, WaitingQueue
from hybridkv.sched.request import EngineRequest, RequestStatus, useful_drafts
from hybridkv.sched.output import KVLoad, ScheduledRequest, SchedulerOutput
from hybridkv.sched import scheduler as _scheduler
from hybridkv.sched.scheduler import ExternalKV, Scheduler, SchedulerConfig

#: True when the scheduler runs from the optional compiled build (setup.py compiles it with the
#: core); False for the pure-Python source.
COMPILED: bool = (_scheduler.__file__ or "").endswith(tuple(_EXTENSION_SUFFIXES))

__all__ = ["COMPILED", "AcceptanceModel", "EngineRequest", "ExternalKV", "FCFSQueue", "KVLoad",
           "POLICIES", "PriorityQueue", "RequestStatus", "ScheduledRequest", "Scheduler",
           "SchedulerConfig", "SchedulerOutput", "WaitingQueue", "useful_drafts"]
