"""The pull-service process: the consumers' front (routes, pulls, sessions, locks)."""
