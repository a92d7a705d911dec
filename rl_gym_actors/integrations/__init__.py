"""Adapters that plug the orchestrator into RL trainers."""
