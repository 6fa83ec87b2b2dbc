# Augments allocate.py when compiled: the per-request bookkeeping's C type, so the decode
# step's locals typed _ReqBlocks read its fields as struct members.
from hybridkv.core.coordinator.base cimport _ReqBlocks, _Fields
from hybridkv.core.request cimport Request
