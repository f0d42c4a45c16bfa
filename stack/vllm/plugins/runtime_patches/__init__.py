"""Runtime patches, run inside vLLM processes by the ledger's plugin entry point (stack.patches.plugin). Each
`apply()` is idempotent and returns True when it changed something, False when there was nothing to do."""
