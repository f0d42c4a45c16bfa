"""The gateway's routing room, its one routing brain (adr/0028): model names and the fallback plan, the choice
among ready deployments (order, cooldowns, strategy, replicas), retries and fallbacks, admission through the
model manager, engine liveness, LoRA adapters, and one attempt at a time (stack.gateway.routing.attempt)."""
