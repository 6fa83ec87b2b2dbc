# Augments lookup.py when compiled: the coordinator's fields as a C type (base.pxd), so the
# lookup's methods read them as struct members.
from hybridkv.core.coordinator.base cimport _Fields
