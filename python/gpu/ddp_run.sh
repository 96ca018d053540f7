#!/usr/bin/env bash
# Runs on a machine with two GPUs, from anywhere in the repository, with the
# library and the test binaries built beforehand on a machine with Go:
#   CGO_ENABLED=1 go build -buildmode=c-shared -o .gpu-ddp/libxseg.so ./cmd/libxseg
#   CGO_ENABLED=1 go test -c -ldflags='-s -w' -o .gpu-ddp/xseg.test .
#   CGO_ENABLED=1 go test -c -ldflags='-s -w' -o .gpu-ddp/cuda.test ./vmm/cuda
# Steps: peer (GPU 1 reads and writes xseg memory of GPU 0 through peer
# access; the CUDA conformance subtests of access), ddp (ddp_compare.py:
# torchrun DDP of GPT-2 small over NCCL, native and with xseg). Logs go to
# $OUT (or /tmp/xseg-ddp). Usage: bash python/gpu/ddp_run.sh [peer] [ddp]
set -u
cd "$(dirname "$0")/../.."
gl=$PWD/.gpu-ddp
out=${OUT:-/tmp/xseg-ddp}
mkdir -p "$out"
# Multicast stays off (KINDS.md); keep the machine's values, default to off.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
export PYTHONUNBUFFERED=1 XSEG_REQUIRE_GPU=1
steps=${*:-peer ddp}
status=0

log() { # log NAME CMD...: run CMD, tee its output to $out/NAME.log
	local name=$1; shift
	echo "=== $name: $*"
	"$@" 2>&1 | tee -a "$out/$name.log"
	local rc=${PIPESTATUS[0]}
	[ "$rc" = 0 ] || { echo "=== $name: exit status $rc"; status=1; }
}

echo "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.log"
nvidia-smi topo -m 2>&1 | head -4 | tee -a "$out/gpu.log"
for s in $steps; do
	case $s in
	peer)
		XSEG_REQUIRE_PEERS=1 log peer timeout 120 "$gl/xseg.test" -test.run '^TestPeerAccessGPU$' -test.v
		log peer timeout 120 "$gl/cuda.test" -test.run '^TestConformance$/^(SetAccess|GetAccess|PeerAccess|CopyDtoD)$' -test.v ;;
	ddp) log ddp timeout 400 python3 python/gpu/ddp_compare.py --lib "$gl/libxseg.so" ;;
	*) echo "unknown step $s"; status=1 ;;
	esac
done
echo "=== summary"
grep -hE "^(--- |    --- |ok|PASS|FAIL)|GB/s|DDP COMPARE|^loss:|^median step|^peak reserved|^xseg counters|^CHECK|all-reduce of" "$out"/*.log
exit $status
