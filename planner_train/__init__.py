"""Planner GRPO training (``python -m planner_train``; docs/reference.md §5, §7.2, §9).

The engine (:class:`mia.rl.trainer.Trainer`) configured with
:class:`~mia.planner.episode.PlannerEpisode` (plan -> serve ``/execute`` -> reflect yes/no ->
optional replan -> serve ``/continue``; every planner generation trained, injected turns masked)
and :class:`~mia.rewards.planner.PlannerReward` (``0.7*acc2 + 0.2*acc1 + 0.05*format +
0.05*decision``). TTRL and the streaming server reuse the same episode.
"""
