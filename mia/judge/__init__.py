"""Judges: rule-based EM/F1/containment, SimpleQA-style LLM judge, the no-ground-truth panel, majority vote."""
