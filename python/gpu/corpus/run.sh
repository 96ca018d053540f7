#!/usr/bin/env bash
# Records the trace corpus (workloads.py) and replays every trace through
# PyTorch's three allocator configurations (record_all.py), on the GPU
# machine, from anywhere:
#
#   PATH=/opt/torch/.venv/bin:$PATH PYTHONPATH=<folder holding xseg> \
#     bash python/gpu/corpus/run.sh OUTDIR [record_all.py options, e.g. --only unet_diffusion]
#
# xseg.record needs no libxseg.so: without an xseg on PYTHONPATH, python/ of
# this tree is used. OUTDIR gets <workload>.trace.gz, corpus.json,
# corpus.md (tables for bench/traces/README.md), env.log, record_all.log and
# logs/ (one log a step). The whole run keeps within $BUDGET seconds
# (default 500; each step also has its own timeout, see record_all.py), so
# it fits a 10-minute command. With XSEG_CLI=path/to/xseg set, `xseg replay
# --backend cuda --json` of the traces is added (xseg_replay.json, at most
# 60 s).
set -u
out=${1:?usage: run.sh OUTDIR [record_all.py options]}
shift
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
if ! python3 -c 'import xseg.record' 2>/dev/null; then
	export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}
fi
{
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
	python3 -c 'import sys, torch, transformers, xseg.record
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "transformers", transformers.__version__, "xseg.record", xseg.record.__file__)'
} 2>&1 | tee "$out/env.log"

python3 "$here/record_all.py" --out "$out" --budget "${BUDGET:-500}" "$@" 2>&1 | tee "$out/record_all.log"
rc=${PIPESTATUS[0]}

if [ -n "${XSEG_CLI:-}" ]; then
	timeout 60 "$XSEG_CLI" replay --backend cuda --json "$out"/*.trace.gz >"$out/xseg_replay.json" 2>"$out/logs/xseg_replay.log" ||
		{ echo "xseg replay failed: see logs/xseg_replay.log"; rc=1; }
fi
ls -l "$out"
exit "$rc"
