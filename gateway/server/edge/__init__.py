"""The HTTP edge: app, middleware, OAuth, TLS, MCP wiring and tasks, audit proofs, GC, SIGHUP."""
