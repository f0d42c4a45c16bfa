"""`vstack tune`: the engine settings with the most goodput under an SLO on this machine (adr/0009, adr/0015).

Candidates per device (`candidates`, `knobs`), each measured by the load generators of stack.load (vLLM's own
`vllm bench serve`, or Locust), the goodput search (`rate_search`), the quality guard (`quality_guard`), the
choice (`choose`), the time budget (`time_budget`), the next engine started while one is measured
(`prestart`), and what the tune leaves behind (`outputs`); `run` drives them.
"""
