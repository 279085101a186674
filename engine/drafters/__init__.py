"""Drafters propose tokens for the target to verify; see `base.Drafter`."""
