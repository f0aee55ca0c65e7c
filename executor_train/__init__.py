"""Executor GRPO training (``python -m executor_train``; docs/reference.md §6, §7.1, §9).

The engine (:class:`mia.rl.trainer.Trainer`) configured with
:class:`~executor_train.episode.ExecutorEpisode` (the Executor loop with tools, one replan on
failure through memory_serve ``/replan_train``) and :class:`~executor_train.episode.ExecutorReward`
(``0.7*acc + 0.2*tool + 0.1*format``, +0.2 when right on the first attempt).
"""
