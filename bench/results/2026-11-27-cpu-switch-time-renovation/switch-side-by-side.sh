#!/usr/bin/env bash
# #28: the CPU switch bench, this main vs the commit before the renovation, interleaved, one lock hold.
M=$HOME/.cache/vstack/models/smollm2-135m-instruct
for round in 1 2; do
  (cd /tmp/house-base && PYTHONPATH=/tmp/house-base /work/main/.venv/bin/python bench/switch_time.py --model-a $M --model-b $M --repeat 1 --logs /tmp/sw-logs-base --out /tmp/sw-base-$round.json) > /tmp/sw-base-$round.log 2>&1
  (cd /work/main && .venv/bin/python bench/switch_time.py --model-a $M --model-b $M --repeat 1 --logs /tmp/sw-logs-main --out /tmp/sw-main-$round.json) > /tmp/sw-main-$round.log 2>&1
done
echo done
