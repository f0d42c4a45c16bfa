"""Fit planner: engine settings decided from the model and the hardware, with the memory budget and why."""
