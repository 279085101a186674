"""Verifiers: what a round keeps of a proposal, given the target's logits. One signature
(`engine.round.Verifier`): exact verification (exact.py) and SPRINTER's approximate gate
(sprinter.py)."""
