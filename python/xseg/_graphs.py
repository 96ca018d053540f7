"""CUDA graph trees (torch.compile mode="reduce-overhead") under xseg: the
torch._C functions they call, routed to xseg."""

from __future__ import annotations

import json
import threading
import weakref

from . import _lib


# torch.compile(mode="reduce-overhead") runs CUDA graph trees
# (torch/_inductor/cudagraph_trees.py), which reach the allocator through a
# few torch._C functions besides the hooks above. PyTorch implements them
# for its own allocator only (the pluggable allocator raises "does not yet
# support"), so install() replaces them with versions that ask xseg, and
# leaves every call about memory that is not xseg's to the original:
#
# - _cuda_checkPoolLiveAllocations: are the pool's allocated blocks exactly
#   the live storages?
# - _cuda_getCheckpointState / _cuda_setCheckpointPoolState: remember which
#   blocks of the pool were allocated after a recording, and put the pool
#   back to that before the next recording (a replay changes bytes, not
#   books). Storages that replays made hold no deleter; PyTorch gives the
#   live ones the allocator's deleter at that point. A pluggable allocator
#   cannot hand out such a deleter from Python, so xseg frees their blocks
#   when the storage dies instead (a finalizer on the storage, which PyTorch
#   keeps alive exactly as long as the storage).
# - _cuda_cudaCachingAllocator_raw_delete, _free_And_Remove_DeleterFn,
#   _has_Standard_Deleter: free, and answer for, those blocks.

class _PoolCheckpoint:
    """What _cuda_getCheckpointState returns under xseg: the pool's
    allocated blocks, as libxseg's JSON."""

    __slots__ = ("device", "pool", "data")

    def __init__(self, device, pool, data):
        self.device, self.pool, self.data = device, pool, data


_graph_lock = threading.Lock()
_tracked = {}      # StorageImpl address -> (finalizer, data ptr, device)
_restored = {}     # data ptr -> device: allocated again by a restore, no owner yet
_graph_originals = {}


def _free_block(ptr, device):
    lib = _lib.loaded()
    if lib is not None:
        lib.xseg_free(ptr, 0, device, None)


def _storage_died(cdata, ptr, device):
    with _graph_lock:
        _tracked.pop(cdata, None)
    _free_block(ptr, device)


def _check_pool_live_allocations(device, pool, expected):
    try:
        live = _lib.pool_allocations(tuple(pool), device)
    except _lib.XsegError:
        return len(expected) == 0
    return set(live) == set(expected)


def _get_checkpoint_state(device, pool):
    first, second = pool
    data = _lib.call_json(lambda lib: lib.xseg_pool_json(int(device), first, second, 1), "getCheckpointState")
    return _PoolCheckpoint(int(device), (first, second), json.dumps(data).encode())


def _set_checkpoint_pool_state(device, state, stale_storages, storages_to_add_deleters_to=()):
    import torch
    if not isinstance(state, _PoolCheckpoint):
        return _graph_originals["_cuda_setCheckpointPoolState"](device, state, stale_storages,
                                                                 storages_to_add_deleters_to)
    device = int(device)
    stale = list(dict.fromkeys(stale_storages))
    with _graph_lock:
        untracked = [c for c in stale if c not in _tracked]
    if untracked:
        raise NotImplementedError(
            "xseg: setCheckpointPoolState with stale storages that still hold the allocator's deleter "
            "is not supported under a pluggable allocator (PyTorch's CUDA graph trees pass none)")
    res = _lib.call_json(lambda lib: lib.xseg_pool_restore(device, state.data, len(state.data)),
                     "setCheckpointPoolState")
    allocated, freed = set(res["allocated"]), res["freed"]
    with _graph_lock:
        for c in stale:
            fin, _, _ = _tracked.pop(c)
            fin.detach()
        definite = [p for p in freed if p not in allocated]
        for p in definite:
            _restored.pop(p, None)
        for p in allocated:
            _restored[p] = device
    if len(stale) < len(definite):
        raise RuntimeError("Any stale tensors which are being manually freed must be passed to set checkpoint")
    for cdata in storages_to_add_deleters_to:
        st = torch.UntypedStorage._new_with_weak_ptr(cdata)
        ptr = st.data_ptr()
        with _graph_lock:
            if _restored.pop(ptr, None) is None:
                raise RuntimeError(f"xseg: setCheckpointPoolState: storage at {ptr:#x} is not a block "
                                   "the checkpoint allocated")
            fin = weakref.finalize(st, _storage_died, cdata, ptr, device)
            fin.atexit = False
            _tracked[cdata] = (fin, ptr, device)
        del st


def _raw_delete(ptr):
    with _graph_lock:
        device = _restored.pop(ptr, None)
    if device is None:
        return _graph_originals["_cuda_cudaCachingAllocator_raw_delete"](ptr)
    _free_block(ptr, device)


def _free_and_remove_deleter(cdata):
    with _graph_lock:
        entry = _tracked.pop(cdata, None)
    if entry is None:
        return _graph_originals["_free_And_Remove_DeleterFn"](cdata)
    fin, ptr, device = entry
    fin.detach()
    _free_block(ptr, device)


def _has_standard_deleter(cdata):
    with _graph_lock:
        if cdata in _tracked:
            return True
    return _graph_originals["_has_Standard_Deleter"](cdata)


def graph_tree_calls():
    """How many times each torch._C function of CUDA graph trees that
    install() routes to xseg has been called (for tests and diagnosis)."""
    with _graph_lock:
        return dict(_graph_calls)


_graph_calls = {}


def _counted(name, fn):
    def call(*args):
        with _graph_lock:
            _graph_calls[name] = _graph_calls.get(name, 0) + 1
        return fn(*args)
    call.__name__ = call.__qualname__ = name
    call.__doc__ = fn.__doc__
    return call


_GRAPH_TREE_PATCHES = {
    "_cuda_checkPoolLiveAllocations": _check_pool_live_allocations,
    "_cuda_getCheckpointState": _get_checkpoint_state,
    "_cuda_setCheckpointPoolState": _set_checkpoint_pool_state,
    "_cuda_cudaCachingAllocator_raw_delete": _raw_delete,
    "_free_And_Remove_DeleterFn": _free_and_remove_deleter,
    "_has_Standard_Deleter": _has_standard_deleter,
}


def patch_graph_trees(torch):
    """Route the torch._C functions of CUDA graph trees to xseg (once)."""
    with _graph_lock:
        for name, fn in _GRAPH_TREE_PATCHES.items():
            if name in _graph_originals or not hasattr(torch._C, name):
                continue
            _graph_originals[name] = getattr(torch._C, name)
            setattr(torch._C, name, _counted(name, fn))
