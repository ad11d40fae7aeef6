"""Evaluation: the evaluators of a run's ``evals:`` list behind one registry (:mod:`.evaluator`), run
by :mod:`.runner` — classification top-1/5, class-subset accuracy, ReaL accuracy, zero-shot,
retrieval, linear and few-shot probes on frozen features."""
