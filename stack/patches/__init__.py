"""Upstream tracking: the patch ledger, applying source patches, runtime plugin patches, upgrade triage."""
