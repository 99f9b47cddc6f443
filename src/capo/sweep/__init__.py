"""Seed-powered comparisons of training methods: ``capo sweep run | status | prune | report``.

A sweep spec (YAML) names a preset, the methods (config overrides each), the training seeds and the held-out
evaluation. :mod:`capo.sweep.spec` reads it and lists its jobs (one per method and seed, and the base model's
evaluation draws); :mod:`capo.sweep.preflight` checks the whole spec before any job starts (the jobs' settings as
``capo train`` and ``capo eval`` check them, seeds, records, run folders, output folders);
:mod:`capo.sweep.runner` runs them resumably through ``capo train`` / ``capo eval`` subprocesses and keeps one small
record per finished run; :mod:`capo.sweep.records` reads the records back and refuses to mix
settings; :mod:`capo.sweep.analysis` computes the seed-level statistics (paired t-intervals, Holm-adjusted p-values,
power analysis, the change from the start); :mod:`capo.sweep.tables` writes them as Markdown, :mod:`capo.sweep.plots`
draws the figures and :mod:`capo.sweep.report` writes the whole report. Nothing is imported here, so that
``capo --help`` stays fast.
"""
