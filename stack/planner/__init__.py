"""Fit planner: engine settings decided from the model and the hardware, with the memory budget and why."""

from stack.planner.api import plan_model, plan_profile
from stack.planner.errors import FitError, ModelShapeError
from stack.planner.plan import Decision, Plan, Request

__all__ = ["Decision", "FitError", "ModelShapeError", "Plan", "Request", "plan_model", "plan_profile"]
