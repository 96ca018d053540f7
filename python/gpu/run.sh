#!/usr/bin/env bash
# Runs on the GPU machine, from anywhere in the repository, with the library
# either installed from the wheel (python3 -m pip install xseg-*.whl) or
# built beforehand on a machine with Go:
#   CGO_ENABLED=1 go build -buildmode=c-shared -o .gpu-lib/libxseg.so ./cmd/libxseg
# XSEG_LIB, when set to a file, wins; else .gpu-lib/libxseg.so; else the copy
# inside the installed xseg package.
# It runs: the GPT-2 comparison (native / expandable / xseg), the two-stream
# race with and without record_stream routing, the C latency program
# (latency.c) beside PyTorch's own allocator (torch_latency.cpp, native and
# expandable_segments:True), and the replays of bench/traces' gpt2_train and
# gpt2_varlen through PyTorch's three configurations
# (corpus/torch_replay.py) and xseg. Logs go to $OUT (or /tmp/xseg-gpu), one
# per step; a summary of the key lines ends the output.
# Usage: bash python/gpu/run.sh [step ...]   (steps: gpt2 race latency replay; default all;
# also pause and pausebench, issue 18's must-shows, only when named)
set -u
cd "$(dirname "$0")/../.."
root=$PWD
gl=$root/.gpu-lib
out=${OUT:-/tmp/xseg-gpu}
mkdir -p "$out"
if [ -z "${XSEG_LIB:-}" ] || [ ! -f "$XSEG_LIB" ]; then
	if [ -f "$gl/libxseg.so" ]; then
		XSEG_LIB=$gl/libxseg.so
	else # the wheel's copy, beside xseg/__init__.py (python/xseg/_lib.py looks there)
		XSEG_LIB=$(python3 -c 'import importlib.util, os; s = importlib.util.find_spec("xseg"); print(os.path.join(os.path.dirname(s.origin), "libxseg.so") if s and s.origin else "")' 2>/dev/null)
	fi
fi
[ -f "${XSEG_LIB:-}" ] || echo "no libxseg.so: set XSEG_LIB, build .gpu-lib/libxseg.so or install the wheel"
export XSEG_LIB PYTHONUNBUFFERED=1
steps=${*:-gpt2 race latency replay}
status=0

log() { # log NAME CMD...: run CMD, tee its output to $out/NAME.log
	local name=$1; shift
	echo "=== $name: $*"
	"$@" 2>&1 | tee -a "$out/$name.log"
	local rc=${PIPESTATUS[0]}
	[ "$rc" = 0 ] || { echo "=== $name: exit status $rc"; status=1; }
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.log"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$out/gpu.log"

for s in $steps; do
	case $s in
	gpt2) log gpt2 timeout 300 python3 python/gpu/compare_gpt2.py ;;
	race)
		log race timeout 60 python3 python/gpu/race.py
		log race timeout 60 python3 python/gpu/race.py --no-route ;;
	latency)
		gcc -O2 -o /tmp/xseg_latency python/gpu/latency.c -ldl
		log latency /tmp/xseg_latency "$XSEG_LIB"
		T=$(python3 -c "import torch,os;print(os.path.dirname(torch.__file__))")
		if g++ -O2 -std=c++17 python/gpu/torch_latency.cpp -I"$T/include" -I/usr/local/cuda/include -L"$T/lib" \
			-lc10 -lc10_cuda -Wl,-rpath,"$T/lib" -o /tmp/torch_latency 2>"$out/torch_latency_build.log"; then
			log latency env -u PYTORCH_ALLOC_CONF -u PYTORCH_CUDA_ALLOC_CONF /tmp/torch_latency
			log latency env -u PYTORCH_ALLOC_CONF PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True /tmp/torch_latency
		else
			echo "torch_latency.cpp did not build:"; tail -5 "$out/torch_latency_build.log"; status=1
		fi ;;
	replay)
		for tr in gpt2_train gpt2_varlen; do
			for conf in native expandable async; do
				log replay timeout 120 python3 python/gpu/corpus/torch_replay.py --conf $conf "bench/traces/$tr.trace.gz"
			done
			log replay timeout 120 python3 python/gpu/replay_xseg.py "bench/traces/$tr.trace.gz"
		done ;;
	pause) log pause timeout 300 python3 python/gpu/pause_gpt2.py ;;
	pausebench) log pausebench timeout 3600 python3 python/gpu/pause_bench.py ;;
	*) echo "unknown step $s"; status=1 ;;
	esac
done

echo "=== summary"
grep -hE "^mem_get_info free|^greedy tokens|^graph captured|^(xseg|vmm|empty_cache) +[0-9]|GPT2 COMPARE|^loss:|tokens/s median|^peak reserved|^xseg counters|correct [0-9]|pair:|^torch stats|\] events=|^API" "$out"/*.log
exit $status
