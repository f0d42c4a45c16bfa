"""Upgrade triage: classify upstream changes into priority buckets (rules: patches/triage-rules.yaml)."""
