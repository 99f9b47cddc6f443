"""Evaluation: sampling with log-probs, ``capo eval`` runs (resumable), metrics, plots and HTML reports.

- :mod:`capo.evaluation.sampling`: ``load_model``, ``render_prompt``, ``sample_batch`` (k samples per prompt with
  the raw temperature-1 log-prob of every sampled token).
- :mod:`capo.evaluation.run`: ``EvalSettings``, ``run_eval`` (also ``--generations`` files), the run directory.
- :mod:`capo.evaluation.metrics`: ``compute_metrics`` (calibration, mean@k / pass@k, votes, counts).
- :mod:`capo.evaluation.plots` / :mod:`capo.evaluation.report`: PNG plots and self-contained HTML.
"""
