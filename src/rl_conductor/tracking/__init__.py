"""Experiment tracking and the model registry (MLflow).

- ``mlflow_utils``: where runs go (sqlite under ``.conductor/`` by default, a server on a
  cluster), a run context helper and metric logging.
- ``registry``: log the Conductor as a pyfunc model, register versions, read and move the
  ``challenger`` / ``champion`` aliases, fetch a model folder back.
- ``gate``: the evaluation gate that decides whether a challenger becomes champion.

Submodules are imported explicitly (``from rl_conductor.tracking import registry``) so that
importing this package stays cheap.
"""
