"""Planning: what `vstack up` decides before anything starts.

Each module is named by what it decides (adr/0045-manager-by-concern-and-names-by-what-they-decide.md):

- `stack_planner.plan_stack` -> a `StackPlan` (plans.py): every model's `ModelPlan`, the configuration
  as served, the hardware, where engines run. Built once and handed to every process.
- `model_planner.plan_model` -> one `ModelPlan`: profile, CPU KV size and dtype, serving facts
  (serving.py), fit, sleep facts (keep_host_copy.py), the exact `vllm serve` arguments.
- The fit planner: `fit_planner.fit_profile` / `fit_planner.fit_model` -> a `Fit` (decisions.py): engine
  settings sized from the model and the hardware (sizing.py), with the memory budget (memory.py) and why.
- `cluster`: replicas placed on Ray nodes.
"""

from stack.planner.decisions import Decision, Fit, Request
from stack.planner.errors import FitError, ModelShapeError
from stack.planner.fit_planner import fit_model, fit_profile

__all__ = ["Decision", "Fit", "FitError", "ModelShapeError", "Request", "fit_model", "fit_profile"]
