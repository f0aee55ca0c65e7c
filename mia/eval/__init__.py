"""Evaluation harness (``mia eval``): memory policies over a QA set through the services.

from mia.eval import Endpoints, load_eval_config, run_eval

cfg = load_eval_config(None, ["dataset=data/world/test.jsonl", "policies=[none,mia]"])
result = run_eval(cfg, Endpoints(serve="http://127.0.0.1:5001",
                                 memory="http://127.0.0.1:5000"), "runs/eval1")
print(result.table)
"""

from __future__ import annotations

from mia.eval.config import EvalConfig, load_eval_config
from mia.eval.harness import Endpoints, EvalResult, PolicyResult, run_eval, run_policy
from mia.eval.policies import POLICIES, PolicySpec, spec

__all__ = [
    "POLICIES",
    "Endpoints",
    "EvalConfig",
    "EvalResult",
    "PolicyResult",
    "PolicySpec",
    "load_eval_config",
    "run_eval",
    "run_policy",
    "spec",
]
