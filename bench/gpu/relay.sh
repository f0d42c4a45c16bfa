#!/usr/bin/env bash
# The gateway's relay ceiling on the lent machine (issue 54: the gateway relays >= 60k streamed tokens/s, what 4
# H200s of an 8B stream, at >= 0.99x direct): bench/gateway_relay.py with stand-in engines for the GPUs (no GPU is
# used; the host's 16 cores are what is measured). 4 stand-ins share one port (SO_REUSEPORT, as vLLM's
# --api-server-count), 4 client processes hold the streams in flight, and direct / the gateway with each worker
# count alternate round by round. The verdict says first whether DIRECT reached 60k tok/s: when it did not, the
# stand-ins and clients were the limit on this machine and the gateway's rows do not measure the goal.
#
#   bash bench/gpu/relay.sh [WORKERS] [STREAMS] [CADENCE_MS]    defaults 1,4,8  512  5   (~102k tok/s offered)
#   RELAY_ARGS="--rounds 2 --standins 6" bash bench/gpu/relay.sh  any other option of bench/gateway_relay.py
#
# Device-tool calls, back to back (the site parts are the GPU suite's, bench/gpu/build_site.sh: the gateway runs
# on the site's Python packages):
#   run kind=nvidia-h200 carry=[".gpu1"] command="bash bench/gpu/suite.sh --stash"   (the same for .gpu2, .gpu3)
#   run                  carry=[".gpu4"] command="bash bench/gpu/suite.sh --stash && bash bench/gpu/relay.sh"
# (timeout_s 600). Wall time of the last call: the site's unpacking on a fresh machine (~1-2 min), then ~3 min:
# 3 gateways started, a warm-up per target, 4 targets x 3 rounds of ~12 s (8 s counted + 2.6 s ramp and drain).
# Results under $OUT: relay.log (tee'd, a line per round as it ends), relay.json (rows, verdict, args), logs/
# (the stand-ins' and gateways' own). Then: python -m bench.harness.results adopt ... (docs/development/benchmarks.md).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/site.sh"
workers=${1:-1,4,8}
streams=${2:-512}
cadence=${3:-5}
unpack_site
log="$out/relay.log"
log_device "$log"
echo "cores: $(nproc)" | tee -a "$log"
# shellcheck disable=SC2086  # RELAY_ARGS: several options, split on purpose
python3 bench/gateway_relay.py --workers "$workers" --streams "$streams" --cadence-ms "$cadence" \
  --out "$out/relay.json" --logs "$out/logs" ${RELAY_ARGS:-} 2>&1 | tee -a "$log"
exit "${PIPESTATUS[0]}"
