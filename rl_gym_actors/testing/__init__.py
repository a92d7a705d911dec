"""Public test helpers shared by tests, examples and benchmarks: local Gym servers and fault injection."""
