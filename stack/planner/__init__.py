"""Fit planner: engine settings decided from the model and the hardware, with the memory budget and why."""

from stack.planner.fit_model import fit_model, fit_profile
from stack.planner.errors import FitError, ModelShapeError
from stack.planner.fit import Decision, Fit, Request

__all__ = ["Decision", "FitError", "ModelShapeError", "Plan", "Request", "fit_model", "fit_profile"]
