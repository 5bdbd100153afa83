"""Development helpers, never imported by the server: the quick-start demo and the bundled simulators."""
