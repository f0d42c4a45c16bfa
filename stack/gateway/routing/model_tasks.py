"""Which endpoints a model serves: a generating model does not embed, an embedding model does not chat.

vLLM answers such a pair with a bare 404 `{"detail": "Not Found"}` (the route is not mounted for the
model's runner); the gateway answers first, with OpenAI's error JSON naming the model's task and the fix.
The task comes from the model config (`task: generate | embed`) through the deployment's `task` label;
cloud deployments carry none and are left to their provider. Which task serves what: each endpoint's entry
(stack.gateway.endpoints).
"""

from __future__ import annotations

from stack.gateway.endpoints import BY_NAME, EMBED, paths_of, serves
from stack.gateway.openai_errors import InvalidRequest
from stack.gateway.registry import DeploymentRegistry


def task_of(registry: DeploymentRegistry, group: str) -> str | None:
    # Deployments registered by hand (/admin/deployments) carry no task: the engine decides for them.
    tasks = {d.labels.get("task") for d in registry.groups().get(group, []) if d.kind == "local"}
    return tasks.pop() if len(tasks) == 1 else None


def check_task(registry: DeploymentRegistry, group: str, endpoint: str, asked: str) -> None:
    task = task_of(registry, group)
    if task is None or endpoint in serves(task):
        return
    path = BY_NAME[endpoint].path
    if task == EMBED:
        raise InvalidRequest(
            f"`{asked}` is an embedding model (task: embed): it serves {', '.join(paths_of(EMBED))}, "
            f"not {path}. Ask a generating model.",
            param="model",
            code="model_task_mismatch",
        )
    raise InvalidRequest(
        f"`{asked}` generates text (task: {task}): it does not serve {path}. Ask a "
        "model whose config says `task: embed`.",
        param="model",
        code="model_task_mismatch",
    )
