"""The Planner's one home.

- :mod:`mia.planner.prompts` — the Planner's conversations (plan, reflection, replan) and the
  text block of retrieved memories;
- :mod:`mia.planner.flow` — the MIA protocol for one question as a state machine
  (PLAN -> EXECUTE -> REFLECT -> REPLAN -> CONTINUE -> DONE), run by evaluation, Planner GRPO,
  TTRL and the streaming server;
- :mod:`mia.planner.planners` — the Planners the flow runs (one conversation over a chat or
  token policy; memory_serve's routes; none; the rag guide);
- :mod:`mia.planner.episode` — the GRPO episode: the flow with the trainable policy as Planner;
- :mod:`mia.planner.reward` — the Planner's reward against ground truth or the reward server.
"""
