#!/usr/bin/env bash
# One-shot GPU check for a session that is lent a CUDA machine (docs/emulation.md).
# Runs in one go, well under 10 minutes, and writes everything under $OUT:
#   1. the portable paged-attention tests on CUDA (torch only; runs on any torch);
#   2. if the validated stack is importable there (vllm 0.15.1 on torch 2.5.1): the
#      patch_torch251 set applied to that vLLM (graphs need torch.compile), then with
#      the real KunlunPlatform in CUDA-compatibility mode (the test-only torch_xmlir
#      reports 1 device): piecewise CUDA graphs equal eager token for token, the
#      greedy-equality e2e test, the decode benchmark (256 sequences, graphs on vs
#      off; its table in decode_cuda.md), the demo (tokens/s) and the sampler
#      benchmark on CUDA;
#   otherwise it says exactly what is missing instead. The device image has no vLLM
#   and it cannot be carried (see the message below), so part 2 runs only where the
#   stack is installed.
# At most 8 files land in $OUT (the device tool returns 8).
# Usage (device tool): run(command="bash scripts/device_check.sh", timeout_s=540)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/vllm-kunlun-device-check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0

step() { echo; echo "==> $*"; }

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$OUT/machine.txt"
"$PY" - <<'EOF' 2>&1 | tee -a "$OUT/machine.txt"
import importlib.util, sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__,
      "cuda", torch.version.cuda, "available", torch.cuda.is_available())
for name in ("vllm", "transformers", "tokenizers", "safetensors", "triton"):
    spec = importlib.util.find_spec(name)
    if spec is None:
        print(name, "MISSING")
        continue
    from importlib.metadata import version
    try:
        print(name, version(name))
    except Exception as exc:  # a package without metadata
        print(name, "importable, version unknown:", exc)
EOF

step "portable paged attention on CUDA (pytest -m device)"
# --noconftest: the shared conftest may import vLLM; these tests need torch only.
"$PY" -m pytest -q -p no:cacheprovider --noconftest -m device \
  tests/unit/ops/test_attention_paged_portable.py 2>&1 | tee "$OUT/attention.log" || status=1

if ! "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
  echo "no CUDA device visible to torch: nothing more to check" | tee "$OUT/engine_skipped.txt"
  exit 1
fi

stack_ok=$("$PY" -c 'import importlib.util, torch
print(int(importlib.util.find_spec("vllm") is not None and torch.__version__.startswith("2.5.")))' 2>/dev/null || echo 0)
if [ "$stack_ok" != "1" ]; then
  step "engine checks SKIPPED"
  msg="vllm 0.15.1 on torch 2.5.1 is not installed on this machine ($(tr '\n' ' ' < "$OUT/machine.txt")). "
  msg+="It cannot be carried: the vllm wheel is ~509 MB and torch 2.5.1+cu124 with its CUDA "
  msg+="libraries several GB, above the 64 MiB a device call may carry, and the machine has "
  msg+="no package registry. Graph capture vs eager and greedy equality with KunlunPlatform, "
  msg+="the decode benchmark (graphs on vs off), GPU tokens/s and the "
  msg+="sampler benchmark on CUDA were not run."
  echo "$msg" | tee "$OUT/engine_skipped.txt"
  exit $status
fi

step "patch_torch251 on this vLLM (CUDA graphs need torch.compile on torch 2.5.1)"
"$PY" -m vllm_kunlun.cli patch apply 2>&1 | tee -a "$OUT/machine.txt" || status=1

step "piecewise CUDA graphs equal eager; greedy equality, KunlunPlatform on CUDA (TRITON_ATTN, the portable and vendor-seam backends; Qwen3.5 hybrid with vLLM's Triton and the portable GDN kernels)"
timeout 300 "$PY" -m pytest -q -p no:cacheprovider -m device \
  tests/device/test_graphs_cuda.py tests/device/test_e2e_kunlun_cuda.py \
  tests/device/test_hybrid_cuda.py \
  2>&1 | tail -80 | tee "$OUT/e2e_cuda.log" || status=1

step "decode benchmark: 256 sequences, vocab 151,936, graphs on vs off"
timeout 180 "$PY" benchmarks/decode.py --device cuda --num-seqs 256 --output-len 64 \
  --repeats 2 --json "$OUT/decode_cuda.json" 2>&1 | tee "$OUT/decode_cuda.md" || status=1

step "demo on the GPU (tokens/s)"
PYTHONPATH="$PWD/tests/fakes:$PYTHONPATH" FAKE_XMLIR_DEVICES=1 VLLM_KUNLUN_SAMPLER=portable \
  timeout 90 "$PY" -m vllm_kunlun.cli demo -v --max-tokens 64 --json-out "$OUT/demo_cuda.json" \
  > "$OUT/demo_cuda.log" 2>&1 || status=1
tail -20 "$OUT/demo_cuda.log"

step "sampler benchmark on CUDA"
if [ -f benchmarks/sampler.py ]; then
  timeout 60 "$PY" benchmarks/sampler.py --device cuda --iters 20 \
    2>&1 | tail -20 | tee "$OUT/sampler_cuda.log" || status=1
fi
exit $status
