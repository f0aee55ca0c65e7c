"""MIA on veRL: the Executor and Planner loops as veRL agent loops, MIA's rewards as veRL reward
functions, and veRL's data format (recipes/verl/, docs/training.md "On veRL").

The loops themselves live once, in :mod:`mia.agent` and :mod:`mia.planner`; this package only
adapts them to veRL 0.9's interfaces:

- :mod:`mia.verl.engine`: a :class:`mia.agent.TokenPolicy` engine over veRL's LLM server client
  (``generate(request_id, prompt_ids=, sampling_params=, image_data=) -> TokenOutput``) and a
  policy that keeps the conversation within veRL's prompt / response lengths;
- :mod:`mia.verl.agent_loops`: ``mia_executor`` (the Executor's tool loop with the plan, the
  judge's reflection and ``/replan_train``) and ``mia_planner`` (plan -> the frozen Executor
  over HTTP -> reflect -> replan), registered with veRL's ``register``;
- :mod:`mia.verl.rewards`: ``compute_score(data_source, solution_str, ground_truth, extra_info)``
  for veRL's reward managers, reading the record the agent loops leave in ``extra_fields``;
- :mod:`mia.verl.data`: MIA's data files -> veRL's parquet (``python -m mia.verl.data``);
- :mod:`mia.verl.ttrl`: TTRL's per-step memory hooks as a veRL trainer.

Only :mod:`mia.verl.agent_loops` and :mod:`mia.verl.ttrl` import veRL (at their top: veRL loads
them by name); importing :mod:`mia` or this package never does.
"""

from __future__ import annotations

EXECUTOR_LOOP = "mia_executor"
PLANNER_LOOP = "mia_planner"
RECORD_KEY = "mia"  # extra_fields / extra_info key of the rollout record the rewards read

__all__ = ["EXECUTOR_LOOP", "PLANNER_LOOP", "RECORD_KEY"]
