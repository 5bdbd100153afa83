"""Proposals: their flow, a human's approval steps, what they show, confirmation by elicitation."""
