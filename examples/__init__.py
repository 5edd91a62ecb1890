"""Example agents: ``greeter`` (the smallest agent) and ``welcome`` (what ``sojourn demo`` runs)."""
