# Augments lookup.py when compiled: the coordinator's fields as a C type (base.pxd), so the
# lookup's methods read them as struct members, and the pool's native hash index.
from hybridkv.core.coordinator.base cimport _Fields
from hybridkv.core.hash_index_native cimport HashIndex
