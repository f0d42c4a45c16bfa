"""Load tests (`vstack bench load`): scenarios (`scenario`; the shipped ones and the Locust users are in the
top-level loadtests/, run by `locust_run`), vLLM's own `vllm bench serve` (`vllm_bench`, kept up by `bench_worker`),
request records, summaries and SLO reports. stack.tune measures its candidates with these."""
