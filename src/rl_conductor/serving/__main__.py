"""``python -m rl_conductor.serving --pool YAML --model URI|DIR [KServe flags]``: the predictor alone.

The retraining loop's traffic log and feedback routes (``--traffic_*``) are added by the front
doors above serving (``conductor serve``, ``serving/predictor.py``), which pass the loop's
extension to :func:`~rl_conductor.serving.server.main`.
"""

from rl_conductor.serving.server import main

main()
