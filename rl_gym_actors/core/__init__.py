"""Pure, synchronous state machines: no Ray, no sockets, no clock reads.

- ``rollout/``: one rollout's tries on one endpoint (:class:`RolloutMachine`), its events and
  effects, its phase table and the pending control call.
- ``rollout_record.py``: what a rollout is across its rows: the one state table and its record;
  ``rollout_memory.py``: the records of every rollout id and the plan for a row.
- ``attempt_reports.py``: what an owner reports of each attempt, and the one order of attempt
  states; ``attempt_book.py``: the ledger's fold of those reports; ``prepare_plan.py``,
  ``checkpoint_report.py``: the checkpoint gate's pure decisions and what it reports.
"""
