# Augments release.py when compiled: the per-request bookkeeping's C type (base.pxd), so
# the release reads its tables and threshold as struct members.
from hybridkv.core.coordinator.base cimport _ReqBlocks, _Fields
