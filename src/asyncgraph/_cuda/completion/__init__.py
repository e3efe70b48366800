"""Completion without blocking the loop: the reactor, expected ends, poll budgets, foreign work."""
