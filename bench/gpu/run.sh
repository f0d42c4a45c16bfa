#!/usr/bin/env bash
# The one entry for runs on the lent GPU machine (docs/development/benchmarks.md):
#
#   bash bench/gpu/run.sh NAME [ARGS...]      e.g. run.sh suite --kind layout, run.sh switch_time pair 5
#   bash bench/gpu/run.sh                     lists the runs
#
# NAME is one of the scripts beside this one that run there (each sources site.sh: the site unpacked once per
# machine, the shared vLLM environment, $out = $OUT or bench/out). Its whole output is kept in
# $out/run-NAME.log; its exit status is this script's. The scripts' own names (bash bench/gpu/suite.sh ...)
# keep working: this only gives them one door and one log.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
runs=$(grep -lE '^source .*(site|tune_env)\.sh' "$here"/*.sh | xargs -n1 basename | sed 's/\.sh$//' \
  | grep -vx -e run -e tune_env | sort)
name=${1:-}
if [ -z "$name" ] || ! grep -qx "$name" <<<"$runs"; then
  [ -n "$name" ] && echo "bench/gpu/run.sh: no run named '$name'" >&2
  echo "runs: $(echo $runs)   (bash bench/gpu/run.sh NAME [ARGS...])" >&2
  exit 2
fi
shift
source "$here/site.sh"
echo "== bench/gpu/run.sh $name $* ($(date -u +%FT%TZ), $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown))" \
  | tee -a "$out/run-$name.log"
bash "$here/$name.sh" "$@" 2>&1 | tee -a "$out/run-$name.log"
exit "${PIPESTATUS[0]}"
