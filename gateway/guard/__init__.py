"""The guard: what may happen to a call, decided from plain facts (authorization, policy, limits)."""
