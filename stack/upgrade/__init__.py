"""The upgrade gate (adr/0026): a candidate vLLM proven on this machine's profiles before it is pinned, and rolled
out on a running stack without dropping a request."""
