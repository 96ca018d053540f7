"""What the GPU scripts that compare allocators share: the allocator picked
before torch is imported, and kernels timed with CUDA events."""
import os
import statistics
import sys


def choose_allocator(mode):
    """Sets PyTorch's allocator for mode, one of native, expandable and
    xseg, and puts the repository's python/ on sys.path so that the xseg
    package imports without an install. Call it before importing torch;
    under xseg the caller then installs the allocator it wants."""
    if mode == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    else:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def median_ms(torch, fn, n):
    """The median of n runs of fn, each timed by two CUDA events on the
    current stream, in milliseconds."""
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)
