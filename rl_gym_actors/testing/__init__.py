"""Public test helpers that tests, examples and benchmarks share; no production module imports
anything from here (tests/test_import_floors.py checks).

- Gym servers: :mod:`.gym_process` (our server in a subprocess or a thread, one interface),
  :mod:`.v2_server` (a v2 server in a thread), :mod:`.real_gym` (our server answering as a real
  NeMo Gym does), :mod:`.counting_agent` (a simulated agent that counts its runs),
  :mod:`.inspect_gym` (what a server holds for one key), :mod:`.loop_thread` (the thread and
  loop a stand-in proxy serves on), :mod:`.failing_agents` (user agents that fail their row,
  each in one way).
- Faults: :mod:`.store_faults` (a store whose writes fail on demand), :mod:`.chaos` (one fault
  per scenario on real processes, each a row of the chaos table); the row fields a server honours
  with ``--allow-faults`` are :mod:`rl_gym_actors.gym.agent_checkpoint.faults`'.
- Trainers and their stand-ins: :mod:`.driver` (a trainer's driver in a process of its own),
  :mod:`.asis` (the as-is baseline that never retires), :mod:`.stand_in_owner` (a rollout actor
  stand-in), :mod:`.nemo_rl_stand_in` (NeMo RL's ``nemo_gym`` module).
- :mod:`.polling`: the one wait-until-a-condition loop, with a deadline.
"""
