"""The configuration's sections for the layers above the engine (gateway, manager and its Docker runtime).

They live with the rest of the schema so that `stack.config` imports none of its consumers.
"""
