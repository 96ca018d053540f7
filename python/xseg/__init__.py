"""xseg: GPU memory with expandable segments, as PyTorch's CUDA allocator.

::

    import xseg
    xseg.install()                     # first thing, before CUDA is touched
    import torch
    x = torch.empty(1 << 20, device="cuda")
    print(torch.cuda.memory_allocated(), xseg.get_memory_stats())

The library (libxseg.so, built from Go) ships inside the package; $XSEG_LIB
names another. The functions over the library itself (malloc, free,
share_block, open_block, stats, configure, ...) need no torch and run on
xseg's host backend (XSEG_BACKEND=host) without a GPU; install() and the
tensor functions need PyTorch 2.3 or newer.

Pause and resume (see xseg._pause): ``with xseg.region("kv"):`` tags the
allocations made inside; ``xseg.pause("weights", backup=True)`` gives the
tag's GPU memory back while every address stays valid, ``xseg.resume()``
maps it again at the same addresses (CUDA graphs captured before replay).
vLLM's names (``sleep(offload_tags=...)``, ``wake_up(tags=...)``,
``use_memory_pool(tag=...)``) and torch_memory_saver's (``region``,
``pause``, ``resume``) work too.
"""

from ._lib import (
    Mapping,
    OutOfMemoryError,
    PausedError,
    XsegError,
    cache_info,
    configure,
    find_library,
    free,
    history,
    last_error,
    load,
    malloc,
    malloc_at_most,
    malloc_in_pool,
    memory_fraction,
    open_block,
    pool_release,
    pool_retain,
    record_history,
    record_stream,
    thread_error,
    reset_accumulated_stats,
    set_log_level,
    set_memory_fraction,
    share_block,
    unshare,
    version,
)
from ._graphs import graph_tree_calls
from ._pause import (
    pause,
    region,
    resume,
    sleep,
    tag_stats,
    tags,
    use_memory_pool,
    wake_up,
)
from ._torch import (
    MemPool,
    allocate_tensor,
    clear_cache,
    empty_cache,
    get_memory_stats,
    get_retry_count,
    install,
    installed,
    is_installed,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_free,
    memory_reserved,
    memory_total,
    memory_used,
    num_alloc_retries,
    num_ooms,
    open_tensor,
    peak_memory,
    pool_allocations,
    reset_peak_stats,
    setup_allocator,
    share,
    snapshot,
    stats,
    uninstall,
)

__version__ = "0.1.0"

__all__ = [
    "Mapping", "MemPool", "OutOfMemoryError", "PausedError", "XsegError", "allocate_tensor", "cache_info", "clear_cache",
    "configure",
    "empty_cache", "find_library", "free", "get_memory_stats", "get_retry_count", "graph_tree_calls",
    "history", "install", "installed", "is_installed", "last_error", "load", "malloc", "malloc_at_most", "malloc_in_pool",
    "max_memory_allocated", "max_memory_reserved", "memory_allocated", "memory_fraction", "memory_free",
    "memory_reserved", "memory_total", "memory_used", "num_alloc_retries", "num_ooms", "open_block",
    "open_tensor", "pause", "peak_memory", "pool_allocations", "pool_release", "pool_retain", "record_history",
    "record_stream", "region", "reset_accumulated_stats", "reset_peak_stats", "resume", "set_log_level",
    "set_memory_fraction", "setup_allocator", "share", "share_block", "sleep", "snapshot", "stats", "tag_stats",
    "tags", "thread_error", "uninstall", "unshare", "use_memory_pool", "version", "wake_up",
]
