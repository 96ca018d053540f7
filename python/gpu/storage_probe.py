"""Checks, on the GPU machine, what xseg's CUDA graph tree support relies on:
a finalizer on the Python object of a storage fires when the storage itself
dies, not when one Python reference to it goes. Prints PROBE ok|FAIL."""
import gc
import weakref

import torch

fired = []
x = torch.empty(1024, device="cuda")
cdata = x.untyped_storage()._cdata
st = torch.UntypedStorage._new_with_weak_ptr(cdata)
weakref.finalize(st, fired.append, 1)
del st
gc.collect()
early = bool(fired)
y = x.view(32, 32)  # another C++ reference
del x
gc.collect()
mid = bool(fired)
del y
gc.collect()
print(f"PROBE {'ok' if not early and not mid and fired else 'FAIL'} early={early} mid={mid} at_death={bool(fired)}")
