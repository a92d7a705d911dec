"""Adapters that plug the orchestrator into RL trainers.

- :mod:`.nemo_rl`: NeMo RL's ``NemoGym`` environment actor replaced by one backed by the
  orchestrator, chosen with one line in the training script (its ``__init__`` lists its modules).
"""
