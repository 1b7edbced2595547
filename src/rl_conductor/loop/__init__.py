"""The closed loop: served traffic and feedback retrain the Conductor, and the gate decides.

Why a package of its own: the loop connects parts that already exist (the predictor, the storage
layer, the training pipeline's steps, the registry and its gate) and must not grow a second copy
of any of them. Each module is one link:

* :mod:`.traffic` — the predictor's traffic log: one record per answered request, batched to
  storage (a local folder or ``s3://``) from a background thread, private requests kept apart;
* :mod:`.feedback` — feedback on a logged request (a score and/or a gold answer, graded with the
  project's graders), idempotent, stored beside the traffic;
* :mod:`.data` — a window of traffic + feedback as tasks and earned rewards (training data and
  the held-out recent traffic of the evaluation);
* :mod:`.retrain` — the retraining steps (collect → warm-start train → evaluate challenger vs
  champion → gate → register → promote) that ``pipelines/retrain.py`` and ``conductor retrain``
  call;
* :mod:`.pool_change` — what changed in a pool file since the champion was trained (a new,
  removed or re-priced worker), the trigger of a retrain.
"""
