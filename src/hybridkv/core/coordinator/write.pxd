# Augments write.py when compiled: the per-request bookkeeping's C type (base.pxd), so
# cache()'s early exit reads its threshold as a struct member.
from hybridkv.core.coordinator.base cimport _ReqBlocks, _Fields
