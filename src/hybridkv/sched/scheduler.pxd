# Augments scheduler.py when compiled: the request types' C layouts, so the step loops'
# locals typed Request / EngineRequest read their fields as C struct members.
from hybridkv.core.request cimport Request
from hybridkv.sched.request cimport EngineRequest
