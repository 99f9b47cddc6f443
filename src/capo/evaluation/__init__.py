"""Evaluation: ``capo eval`` runs (resumable), metrics, plots and HTML reports, on top of the rollout layer.

- :mod:`capo.evaluation.run`: ``EvalSettings``, ``run_eval`` (also ``--generations`` files), the run directory.
- :mod:`capo.evaluation.metrics`: ``compute_metrics`` (calibration, mean@k / pass@k, votes, counts).
- :mod:`capo.evaluation.plots` / :mod:`capo.evaluation.report`: PNG plots and self-contained HTML.
- :mod:`capo.evaluation.default_task`: the embedded default's quick measurement (``capo build-default``).
"""
