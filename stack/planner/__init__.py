"""Planning: what `vstack up` decides before anything starts.

- `stack_planning.plan_stack` -> a `StackPlan` (stack_plan.py): every model's `ModelPlan`, the configuration
  as served, the hardware, where engines run. Built once and handed to every process.
- `model_planning.plan_model` -> one `ModelPlan`: profile, CPU KV size and dtype, serving facts
  (serving.py), fit, sleep facts (host_copy.py), the exact `vllm serve` arguments.
- The fit planner: `fitting.fit_profile` / `fitting.fit_model` -> a `Fit` (fit.py): engine settings
  decided from the model and the hardware (fit_decisions.py), with the memory budget (memory.py) and why.
- `cluster`: replicas placed on Ray nodes.
"""

from stack.planner.errors import FitError, ModelShapeError
from stack.planner.fit import Decision, Fit, Request
from stack.planner.fitting import fit_model, fit_profile

__all__ = ["Decision", "Fit", "FitError", "ModelShapeError", "Request", "fit_model", "fit_profile"]
