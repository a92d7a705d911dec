"""The only Ray code besides the orchestrator: thin shells that run what core/ decides."""
