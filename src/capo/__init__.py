"""capo: calibration-aware RL from verifiable rewards.

Layout (imports only flow downwards):

- ``capo.core``       pure tensor functions: advantages, policy losses, aggregation, masks, rewards,
                      sequence scores, calibration metrics, test-time voting. Imports only torch/numpy.
- ``capo.verify``     answer extraction and mathematical-equivalence verification (math-verify, sandboxed).
- ``capo.evaluation`` sampling, ``capo eval`` runs, plots and HTML reports.
- ``capo.tasks``      datasets and the embedded default (tiny model + verifiable task, no download).
- ``capo.trainer``    the lean single-machine / accelerate trainer and its typed config.
- ``capo.adapters``   thin bridges into TRL and verl.
- ``capo.cli``        the ``capo`` command.
"""

__version__ = "0.1.0"
