"""The KServe predictor of the Conductor (library side; ``serving/`` at the top level is the image).

* :mod:`.schemas` — the wire formats (v1, v2, OpenAI chat), checked before anything runs.
* :mod:`.request` — the request model (values, caps) and the response document.
* :mod:`.service` — :class:`ConductorService`: plan, execute, observe (no HTTP; retries are the live
  workers' own).
* :mod:`.server` — the ``kserve.Model`` subclass, the OpenAI routes, the request guard, ``main``.
* :mod:`.metrics` — the Prometheus metrics served on ``/metrics``.

Run it with ``conductor serve --model URI|DIR --pool YAML`` or ``python -m rl_conductor.serving``.
"""

from __future__ import annotations

from rl_conductor.serving.service import ConductorService, ServiceConfig

__all__ = ["ConductorService", "ServiceConfig"]
