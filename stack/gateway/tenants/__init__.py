"""Named keys (tenants): who a request is, what it may use, how it is admitted and what it used (adr/0043).

book: the keys by their SHA-256; limits: rpm, tpm, concurrent, tokens per day, budgets; admission: the queue
in front of each model's engines (priority class, then weighted fair queueing by tokens); usage: counts per
tenant and model for /metrics, the console and exports; gate: what the dispatcher calls.
"""
