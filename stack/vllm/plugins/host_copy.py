"""The host-copy protocol between the stack and the runtime patch `gpu-sleep-wake-at-bus-speed`
(stack/vllm/plugins/runtime_patches/fast_sleep_wake.py): the variable that lets a GPU engine keep its
weights' host copy between sleeps, and the collective_rpc method that stages the first sleep's host buffers.
Whether an engine may keep the copy is planned by the stack (stack.planner.keep_host_copy)."""

from __future__ import annotations

KEEP_ENV = "VSTACK_SLEEP_KEEP_HOST_COPY"
# The collective_rpc method (runtime patch) that allocates, and where kept fills, the host buffers of the first
# sleep in the background once the engine serves: the first switch then costs what later ones do.
STAGE_METHOD = "vstack_stage_host_copy"
# The collective_rpc method that answers "busy" while that staging (or a sleep or wake) runs in the engine, else
# "idle": the manager's warm hand-over (manager.warm_handoff, adr/0053) waits for it instead of blocking requests.
STAGING_METHOD = "vstack_host_copy_staging"
# The collective_rpc method that has the engine's next sleep leave its weights mapped on the GPU (only the KV cache
# is released, and handed over): the manager's choice where the weights fit beside the model woken in its place
# (manager.sleep_keeps_weights, adr/0058). The wake after it maps the KV cache alone.
KEEP_WEIGHTS_METHOD = "vstack_keep_weights_mapped"
# The collective_rpc method that has a sleeping engine whose sleep kept its weights mapped release them (copied to
# its host copy where it holds none): another model needs their memory (adr/0058). The engine stays asleep; its
# next wake maps and copies the weights as any level-1 wake does.
RELEASE_WEIGHTS_METHOD = "vstack_release_kept_weights"
