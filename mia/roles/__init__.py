"""What the role packages (executor_train, planner_train, ttrl, ttrl_streaming) share, so that
none of them imports another: config composition and the command-line wrapper
(:mod:`mia.roles.common`), training/test samples (:mod:`mia.roles.samples`), and TTRL's memory
hooks and journal (:mod:`mia.roles.ttrl_memory`, :mod:`mia.roles.journal`).
"""
