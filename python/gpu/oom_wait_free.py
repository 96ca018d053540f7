"""An allocation that waits for memory (oom_wait_ms) gets what another thread
frees meanwhile, under xseg.install(): PyTorch frees through xseg_free, which
parks the free in libxseg's queue. Before the queue went direct during such
waits, the parked free stayed parked and the allocation failed after the
whole wait.

    XSEG_CONF=oom_wait_ms:5000 python3 oom_wait_free.py

Prints "RESULT {json}" and exits 1 unless the waiting allocation succeeded
well before the wait's end."""
import json
import os
import sys
import threading
import time

os.environ.setdefault("XSEG_CONF", "oom_wait_ms:5000")
import torch  # noqa: E402

import xseg  # noqa: E402

xseg.install()
total = torch.cuda.mem_get_info()[1]
n = int(total * 0.55)
held = [torch.empty(n, dtype=torch.uint8, device="cuda")]
torch.cuda.synchronize()


def free_later():
    time.sleep(0.3)
    held.pop()  # the tensor's last reference: PyTorch calls xseg_free here
    freed.append(time.monotonic())


freed = []
t = threading.Thread(target=free_later)
start = time.monotonic()
t.start()
err = None
try:
    b = torch.empty(n, dtype=torch.uint8, device="cuda")  # does not fit until the free
    b.fill_(1)
    torch.cuda.synchronize()
except torch.OutOfMemoryError as e:
    err = str(e).splitlines()[0][:200]
waited = time.monotonic() - start
t.join()
res = {"conf": os.environ["XSEG_CONF"], "bytes": n, "waited_s": round(waited, 3),
       "freed_after_s": round(freed[0] - start, 3) if freed else None, "error": err}
print("RESULT " + json.dumps(res))
sys.exit(0 if err is None and waited < 2.5 else 1)
