"""Preflight checks: one small function per failure class, one finding each."""
