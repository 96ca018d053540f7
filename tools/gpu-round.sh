#!/usr/bin/env bash
# One verification round on the GPU machine (no Go, no network there),
# after `tools/gpu-pack --bin ./cmd/xseg=xseg` and a wheel in .gpu/ here
# (python3 -m pip wheel --no-index --no-build-isolation --no-deps -w .gpu ./python).
# From the repository root there:
#
#   bash tools/gpu-round.sh PHASE [OUT]
#
# PHASE (each fits one 10-minute call):
#   go       every packed test binary with XSEG_REQUIRE_GPU=1 (tools/gpu-pack's run.sh)
#   replay   xseg replay --backend cuda on bench/traces, the default and the
#            page policy under study (POLICY), 3 variants each, alternating,
#            3 runs; and, if .gpu/before/ holds an older xseg and
#            expandable.test, those beside the current ones
#   train    GPT-2 small, 50 steps, native / xseg default / xseg with each
#            of POLICIES (NAME=XSEG_CONF ...; default policy=POLICY),
#            alternating, ROUNDS times (2): first-step time, median tokens/s
#   py       the wheel's pytest, python/gpu/dropin.py, python/gpu/graphs.py
#   corpus   python/gpu/corpus/run.sh: record the workload corpus with the
#            package's recorder and replay it under PyTorch's allocators
#   variants xseg's ratio and PyTorch's on the same perturbed variants:
#            .gpu/bin/xseg replay --backend cuda --perturb VAR_N (10)
#            --write-variants writes them, torch_replay.py replays each in a
#            fresh process for each of VAR_CONFS (expandable), VAR_PAR (4) at
#            once, and python/gpu/corpus/compare_variants.py sets them side
#            by side (VAR_TRACES: the traces, default bench/traces/*)
#   pause    python/gpu/pause_gpt2.py (GPT-2 small paused and resumed:
#            free memory, tokens, a CUDA graph) and pause_bench.py for MODES
#            (default xseg; vmm and empty_cache are the baselines: one call
#            each, 1,000 cycles of 8 GiB may take minutes a mode)
#   latency  ns per warm malloc+free pair, single and batch loops:
#            python/gpu/latency.c (xseg through the wheel's libxseg.so) and
#            python/gpu/torch_latency.cpp (PyTorch's caching allocator,
#            native and expandable_segments:True), alternating LAT_ROUNDS
#            times (default 2); with .gpu/before-lib/libxseg.so, that
#            earlier build too, as "before"
# Logs and JSON go under OUT (default $OUT, else /tmp/gpu-round), tarred
# into OUT/PHASE.tgz.
set -u
cd "$(dirname "$0")/.."
phase=${1:?phase: go, replay, train, py, corpus, variants, pause or latency}
out=${2:-${OUT:-/tmp/gpu-round}}
L=/tmp/gpu-round-$phase
rm -rf "$L"; mkdir -p "$L" "$out"
export PATH=/opt/torch/.venv/bin:$PATH PYTHONUNBUFFERED=1
POLICY=${POLICY:-large_page_mb:2,small_limit_kb:0}
[ -d .gpu/test ] || { [ -f .gpu/pack.tar.xz ] && tar -xJf .gpu/pack.tar.xz -C .gpu; }
[ -d .gpu/before ] || { [ -f .gpu/before.tar.xz ] && tar -xJf .gpu/before.tar.xz -C .gpu; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$L/gpu.txt" 2>&1
wheel() {
  rm -rf /tmp/xw
  python3 -m pip install --no-index --no-deps --target /tmp/xw .gpu/xseg-*.whl > "$L/pip.log" 2>&1
  export PYTHONPATH=/tmp/xw
  unset XSEG_LIB
}
case "$phase" in
go)
  mkdir -p "$L/go"; OUT=$L/go timeout 540 bash .gpu/run.sh > "$L/summary.txt" 2>&1; echo "go rc $?"
  echo "PASS $(cat "$L"/go/*.log | grep -c -- '--- PASS') FAIL $(cat "$L"/go/*.log | grep -c -- '--- FAIL') SKIP $(cat "$L"/go/*.log | grep -c -- '--- SKIP')"
  grep -h -E -- "--- FAIL" "$L"/go/*.log | head
  ;;
replay)
  T=$(ls bench/traces/*.trace.gz)
  for i in 1 2 3; do
    if [ -x .gpu/before/xseg ]; then
      timeout 120 .gpu/before/xseg replay --backend cuda --json $T > "$L/before-$i.json" 2>&1; echo "before $i rc $?"
    fi
    timeout 150 .gpu/bin/xseg replay --backend cuda --json --perturb 3 $T > "$L/default-$i.json" 2>&1; echo "default $i rc $?"
    timeout 150 .gpu/bin/xseg replay --backend cuda --json --perturb 3 --conf "$POLICY" $T > "$L/policy-$i.json" 2>&1; echo "policy $i rc $?"
  done
  for w in before after; do
    bin=$PWD/.gpu/test/expandable.test; [ $w = before ] && bin=$PWD/.gpu/before/expandable.test
    [ -x "$bin" ] || continue
    (cd expandable && "$bin" -test.run XXX -test.bench 'AllocFreeCached$' -test.benchtime 2000000x -test.count 5) > "$L/pair-$w.txt" 2>&1
  done
  grep -h ns/op "$L"/pair-*.txt | head -12
  ;;
train)
  wheel
  # POLICIES: space-separated NAME=XSEG_CONF pairs run beside native and
  # the default (default: one, "policy", of POLICY); ROUNDS alternations.
  POLICIES=${POLICIES:-policy=$POLICY}
  for i in $(seq "${ROUNDS:-2}"); do
    timeout 100 python3 python/gpu/train_gpt2.py native --steps 50 > "$L/native-$i.log" 2>&1; echo "native $i rc $?"
    timeout 100 python3 python/gpu/train_gpt2.py xseg --steps 50 > "$L/default-$i.log" 2>&1; echo "default $i rc $?"
    for p in $POLICIES; do
      XSEG_CONF=${p#*=} timeout 100 python3 python/gpu/train_gpt2.py xseg --steps 50 > "$L/${p%%=*}-$i.log" 2>&1; echo "${p%%=*} (${p#*=}) $i rc $?"
    done
  done
  for f in "$L"/*-[0-9]*.log; do
    grep -h '^RESULT' "$f" | sed "s|^RESULT |$(basename "$f" .log) |"
  done | python3 -c '
import json, sys
for line in sys.stdin:
    name, js = line.split(" ", 1)
    r = json.loads(js)
    print(name, "first step %.0f ms" % (8 * 1024 / r["tokens_per_s"][0] * 1e3),
          "median tokens/s %.0f" % r["median_tokens_per_s"], "peak reserved", r["peak_reserved"],
          "maps", r.get("num_maps"), "created", r.get("num_pages_created"), "set_access", r.get("num_set_access_calls"),
          "syncs", r.get("num_syncs"), "unmaps", r.get("num_unmaps"), "retired", r.get("num_pages_retired"))
    for i, s in enumerate(r.get("first_steps") or [], 1):
        print("  %s step %d: %.0f ms step, page work %.1f ms, waits %.1f ms, created %d, maps %d, syncs %d" % (
            name, i, 8 * 1024 / r["tokens_per_s"][i - 1] * 1e3, s["page_ns"], s["sync_ns"],
            s["num_pages_created"], s["num_maps"], s["num_syncs"]))'
  ;;
py)
  wheel
  XSEG_REQUIRE_GPU=1 timeout 200 python3 -m pytest -p no:cacheprovider -q python/tests > "$L/pytest.log" 2>&1; echo "pytest rc $?"; tail -1 "$L/pytest.log"
  timeout 200 python3 python/gpu/dropin.py > "$L/dropin.log" 2>&1; echo "dropin rc $?"; grep -E "^(FAIL|mp |[0-9]+ checks|all checks)" "$L/dropin.log"
  for m in native xseg; do timeout 90 python3 python/gpu/graphs.py $m > "$L/graphs-$m.log" 2>&1; echo "graphs $m rc $?"; done
  ;;
corpus)
  wheel
  BUDGET=${BUDGET:-500} bash python/gpu/corpus/run.sh "$L/corpus"; echo "corpus rc $?"
  ;;
variants)
  V=/tmp/variants; rm -rf "$V"; mkdir -p "$V" "$L/torch"
  for t in ${VAR_TRACES:-bench/traces/*.trace.gz}; do
    timeout 240 .gpu/bin/xseg replay --backend cuda --json --perturb "${VAR_N:-10}" --write-variants "$V" "$t" >> "$L/xseg.jsonl" 2>> "$L/xseg.err"
    echo "xseg $(basename "$t") rc $?"
  done
  for c in ${VAR_CONFS:-expandable}; do
    ls "$V"/*.trace.gz | xargs -P "${VAR_PAR:-4}" -I{} sh -c \
      'timeout 200 python3 python/gpu/corpus/torch_replay.py --conf '"$c"' --json "$1" > "$2/$(basename "$1" .trace.gz).'"$c"'.json" 2>&1' _ {} "$L/torch"
    echo "torch $c: $(cat "$L"/torch/*."$c".json | grep -c '^{') of $(ls "$V" | wc -l) variants replayed"
  done
  python3 python/gpu/corpus/compare_variants.py "$L/xseg.jsonl" "$L/torch" > "$L/compare.txt"; echo "compare rc $?"
  grep '^|' "$L/compare.txt"
  ;;
pause)
  wheel
  timeout 200 python3 python/gpu/pause_gpt2.py > "$L/pause_gpt2.log" 2>&1; echo "pause_gpt2 rc $?"; grep '^RESULT' "$L/pause_gpt2.log"
  timeout 360 python3 python/gpu/pause_bench.py --modes "${MODES:-xseg}" > "$L/pause_bench.log" 2>&1; echo "pause_bench rc $?"; tail -8 "$L/pause_bench.log"
  ;;
latency)
  wheel
  lib=$(python3 -c 'import importlib.util, os; print(os.path.join(os.path.dirname(importlib.util.find_spec("xseg").origin), "libxseg.so"))')
  [ -f "$lib" ] || echo "no libxseg.so in the installed package: $lib"
  T=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')
  gcc -O2 -o /tmp/xseg_latency python/gpu/latency.c -ldl > "$L/build.log" 2>&1; echo "gcc rc $?"
  g++ -O2 -std=c++17 python/gpu/torch_latency.cpp -I"$T/include" -I/usr/local/cuda/include -L"$T/lib" \
    -lc10 -lc10_cuda -Wl,-rpath,"$T/lib" -o /tmp/torch_latency >> "$L/build.log" 2>&1; echo "g++ rc $?"
  # LAT_ROUNDS alternations; with .gpu/before-lib/libxseg.so (an earlier
  # build) that library runs in each too, as "before".
  for i in $(seq "${LAT_ROUNDS:-2}"); do
    if [ -f .gpu/before-lib/libxseg.so ]; then
      timeout 120 /tmp/xseg_latency .gpu/before-lib/libxseg.so > "$L/before-$i.log" 2>&1; echo "before $i rc $?"
    fi
    timeout 120 /tmp/xseg_latency "$lib" > "$L/xseg-$i.log" 2>&1; echo "xseg $i rc $?"
    env -u PYTORCH_ALLOC_CONF -u PYTORCH_CUDA_ALLOC_CONF timeout 120 /tmp/torch_latency > "$L/native-$i.log" 2>&1; echo "native $i rc $?"
    env -u PYTORCH_ALLOC_CONF PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 120 /tmp/torch_latency > "$L/expandable-$i.log" 2>&1; echo "expandable $i rc $?"
  done
  tail -3 "$L/build.log"
  for f in "$L"/before-*.log "$L"/xseg-*.log "$L"/native-*.log "$L"/expandable-*.log; do
    [ -f "$f" ] && grep -H -E "pair:" "$f" | sed "s|^$L/||"
  done
  ;;
*) echo "unknown phase $phase" >&2; exit 2 ;;
esac
tar -czf "$out/$phase.tgz" -C /tmp "gpu-round-$phase"
