"""Pause and resume: give GPU memory back while every address stays valid.

Allocations made inside ``with xseg.region("kv"):`` belong to tag "kv".
``xseg.pause("kv")`` gives the tag's physical memory back to the device
(``torch.cuda.mem_get_info`` shows it free, for other processes too) while
its addresses stay reserved; ``xseg.resume("kv")`` maps new memory at the
same addresses. With ``backup=True`` the bytes are copied to host memory
first and copied back on resume; without, they are lost (a KV cache is
rebuilt anyway). This is what RL post-training frameworks and inference
servers use to hand a GPU back and forth between a trainer and a rollout
engine::

    import xseg
    xseg.install()
    import torch
    with xseg.region("weights"):
        model = build_model().cuda()
    with xseg.region("kv"):
        cache = torch.empty(..., device="cuda")
    graph = capture_decode_graph(model, cache)     # outside any region
    xseg.pause("weights", backup=True)             # weights kept on the host
    xseg.pause("kv")                               # KV cache discarded
    ...                                            # the GPU is free for others
    xseg.resume()                                  # every paused tag
    graph.replay()                                 # same addresses: still valid

The names users of vLLM and torch_memory_saver know, side by side:

==============================  ===========================================  ==========================================
xseg                            vLLM (CuMemAllocator)                        torch_memory_saver
==============================  ===========================================  ==========================================
``with xseg.region(tag):``      ``with allocator.use_memory_pool(tag=tag):`` ``with torch_memory_saver.region(tag=tag):``
(also ``xseg.use_memory_pool``)
``region(tag, backup=True)``    --                                           ``region(tag, enable_cpu_backup=True)``
``xseg.pause(tag, backup)``     --                                           ``torch_memory_saver.pause(tag)``
``xseg.sleep(offload_tags)``    ``allocator.sleep(offload_tags=...)``        --
``xseg.resume(tag)``            --                                           ``torch_memory_saver.resume(tag)``
``xseg.wake_up(tags)``          ``allocator.wake_up(tags=...)``              --
``xseg.tag_stats(tag)``         --                                           --
==============================  ===========================================  ==========================================

``sleep(offload_tags)`` has vLLM's meaning: the tags named (default
``"default"``, vLLM's default tag) are paused with a backup, every other
tag without. ``pause(tag)`` without ``backup`` takes the backup chosen by
``region(tag, backup=...)``, as torch_memory_saver's ``enable_cpu_backup``
does, else none.

What happens to ...

- **Pointers**: they stay valid. Tensors keep their ``data_ptr()``; nothing
  is reallocated. But nothing may touch paused memory: pause waits for all
  work on the device first, and until resume a kernel that reads or writes
  a paused tensor faults (on CUDA an illegal address, which ends the CUDA
  context). Allocating in a paused tag raises (PausedError through
  xseg.malloc; RuntimeError "the tag is paused" from PyTorch); freeing a
  tensor of a paused tag is fine.
- **CUDA graphs**: a graph captured before the pause replays right after
  resume: every address it was captured with is mapped again. Its inputs
  that lived in a tag paused without backup hold garbage (zeros on the host
  backend): write them again before replaying. A capture keeps its own
  memory pool even inside a region; pause and resume are refused while a
  capture is underway.
- **Shared memory**: a tag holding a block shared with another process
  (xseg.share, CUDA tensors sent through torch.multiprocessing) refuses to
  pause, naming the block: the importer maps the same physical pages. Let
  the importers close and unshare first.
- **NCCL and RDMA**: the addresses stay, the physical pages do not. Memory
  registered with something that holds on to pages (``ncclCommRegister``,
  an ibverbs memory region) must be registered again after a resume:
  ``tag_stats(tag)["remaps"]`` counts the resumes, so compare it with the
  value at registration.

Regions route the allocations of the calling thread only (autograd's
backward pass runs on threads of its own), on one device (default: the
current one); they nest, the innermost wins. Without torch, or before
install(), a region routes xseg.malloc. Pause and resume are idempotent and
safe from any thread; each tag is paused or resumed wholly or not at all,
and a failed resume leaves the tag paused with its backup, to retry.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Dict, Iterable, Iterator, List, Optional, Union

from . import _lib
from ._lib import XsegError
from ._torch import _device

DEFAULT_TAG = "default"

Tags = Union[None, str, Iterable[str]]

_lock = threading.Lock()
_backup: Dict[str, bool] = {}  # tag -> backup chosen by region(tag, backup=...)


def _names(tags: Tags) -> Optional[List[str]]:
    """None, or the tags named: a str, or an iterable of str."""
    if tags is None:
        return None
    if isinstance(tags, str):
        return [tags]
    if isinstance(tags, (bytes, bytearray)):
        raise TypeError("xseg: tag names are str, not bytes")
    try:
        names = list(tags)
    except TypeError:
        raise TypeError(f"xseg: a tag name is a str, not {type(tags).__name__} ({tags!r:.60}); "
                        "tags are a name, an iterable of names, or None") from None
    for n in names:
        if not isinstance(n, str):
            raise TypeError(f"xseg: a tag name is a str, not {type(n).__name__}")
    return names


def _devices(device: Any) -> int:
    """pause and resume: None is every device (-1)."""
    return -1 if device is None else _device(device)


@contextlib.contextmanager
def region(tag: str = DEFAULT_TAG, backup: Optional[bool] = None, device: Any = None) -> Iterator[str]:
    """Allocations of this thread on device (default: the current one)
    inside the block go to tag ``tag``, made if need be: PyTorch's tensors
    once xseg is its allocator (install()), else xseg.malloc. backup, if
    given, is what ``pause(tag)`` does without a backup argument
    (torch_memory_saver's enable_cpu_backup). Regions nest: the innermost
    wins; a CUDA graph capture or torch.cuda.use_mem_pool inside keeps its
    own pool. Yields the tag's name. See the module's documentation for
    what pausing does to pointers, CUDA graphs, shared memory and NCCL."""
    dev = _device(device)
    _lib.begin_region(tag, dev)
    if backup is not None:
        with _lock:
            _backup[tag] = bool(backup)
    try:
        yield tag
    finally:
        _lib.end_region(dev)


def use_memory_pool(tag: Optional[str] = None, device: Any = None) -> Any:
    """vLLM's CuMemAllocator.use_memory_pool: region(tag), tag "default"
    when None."""
    return region(DEFAULT_TAG if tag is None else tag, device=device)


def pause(tag: Tags = None, backup: Optional[bool] = None, device: Any = None) -> None:
    """Give back the physical memory of ``tag`` (a name, several, or None:
    every tag) on device (None: every device) while every address stays
    valid. It waits for all work on the device; with backup it first
    copies the bytes of the tag's live tensors to host memory, restored by
    resume(). The pages the tag's freed tensors left go back for good:
    resume() maps only the pages its live tensors are in. backup None is
    the tag's choice in region(tag, backup=...), else False. Pausing a
    paused tag does nothing (its backup stays as it
    was). Raises XsegError (nothing of the failing tag paused) for an
    unknown tag, a tag with memory shared with another process, or during
    a CUDA graph capture. See the module's documentation."""
    names, dev = _names(tag), _devices(device)
    if backup is not None:
        for n in names if names is not None else [None]:
            _lib.pause_tag(n, bool(backup), dev)
        return
    with _lock:
        chosen = dict(_backup)
    if names is None:
        _pause_with_backup([n for n, b in chosen.items() if b], dev)
        _lib.pause_tag(None, False, dev)
        return
    for n in names:
        _lib.pause_tag(n, chosen.get(n, False), dev)


def _pause_with_backup(names: Iterable[str], dev: int) -> None:
    """Pause the tags named that exist, with backup."""
    for n in names:
        try:
            _lib.pause_tag(n, True, dev)
        except XsegError as e:
            if "no such tag" not in str(e):
                raise


def resume(tag: Tags = None, device: Any = None) -> None:
    """Map memory again, at the same addresses, for ``tag`` (a name,
    several, or None: every paused tag) on device (None: every device),
    and copy back the backup if the pause made one; without one the bytes
    are unspecified. Resuming a live tag does nothing. A failed resume
    (out of memory) raises XsegError and leaves that tag paused with its
    backup: call it again once memory is free. Each resume counts in
    tag_stats(tag)["remaps"] (re-register NCCL buffers)."""
    names, dev = _names(tag), _devices(device)
    for n in names if names is not None else [None]:
        _lib.resume_tag(n, dev)


def sleep(offload_tags: Tags = None, device: Any = None) -> None:
    """vLLM's CuMemAllocator.sleep: pause every tag, those of
    offload_tags (default: "default") with a host backup, the others
    without (their contents are discarded). Tags named that do not exist
    are skipped."""
    keep = _names(DEFAULT_TAG if offload_tags is None else offload_tags) or []
    dev = _devices(device)
    _pause_with_backup(keep, dev)
    _lib.pause_tag(None, False, dev)


def wake_up(tags: Tags = None, device: Any = None) -> None:
    """vLLM's CuMemAllocator.wake_up: resume(tags), every paused tag when
    None."""
    resume(tags, device)


def _stats(raw: Dict[str, Any]) -> Dict[str, Any]:
    out = dict(raw)
    out["id"] = tuple(out.get("id") or (0, 0))
    return out


def tag_stats(tag: str = DEFAULT_TAG, device: Any = None) -> Dict[str, Any]:
    """Statistics of ``tag`` on device (default: the current one): name,
    id (its private pool), paused, backup, reserved_bytes (mapped now, 0
    while paused), paused_bytes (given back by the current pause),
    allocated_bytes and allocations (live tensors, kept across pauses),
    backup_bytes (host memory the backup holds), pauses, and remaps (the
    resumes: re-register NCCL buffers when it moves). Raises XsegError for
    an unknown tag."""
    return _stats(_lib.raw_tag_stats(tag, _device(device)))


def tags(device: Any = None) -> Dict[str, Dict[str, Any]]:
    """tag_stats of every tag of device (default: the current one), by
    name."""
    return {t["name"]: _stats(t) for t in _lib.raw_tags(_device(device))}
