"""The public endpoint: OpenAI-compatible API, routing through LiteLLM, auth, admin API, metrics.

Import stack.gateway.app for create_app(); this package root stays light (stack.config imports settings).
"""
