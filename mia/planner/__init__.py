"""The Planner's one home.

- its text lives one layer down, in :mod:`mia.prompts.planner` (prompts, the memory block, the
  conversations, reading replies), where rewards can read it too;
- :mod:`mia.planner.flow` — the MIA protocol for one question as a state machine
  (PLAN -> EXECUTE -> REFLECT -> REPLAN -> CONTINUE -> DONE), run by evaluation, Planner GRPO,
  TTRL and the streaming server;
- :mod:`mia.planner.planners` — the Planners the flow runs (one conversation over a chat or
  token policy; memory_serve's routes; none; the rag guide);
- :mod:`mia.planner.episode` — the GRPO episode: the flow with the trainable policy as Planner;
- its reward is :mod:`mia.rewards.planner` (against ground truth or the reward server).
"""
