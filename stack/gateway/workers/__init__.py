"""The gateway's worker processes (gateway.workers > 1; adr/0049): N processes accept on the public port and
relay `/v1` streams, one owner decides (admission, quotas, switches, counts) and serves everything else."""
