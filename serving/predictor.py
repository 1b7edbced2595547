"""Entry of the predictor image: ``python serving/predictor.py --model URI|DIR --pool YAML [KServe flags]``.

All logic lives in the library (``rl_conductor.serving``); this file and ``serving/Dockerfile`` are
the thin image-side adapter the design card asks for. ``conductor serve`` runs the same ``main``.
"""

from rl_conductor.loop.serving import TrafficExtension
from rl_conductor.serving.server import main

if __name__ == "__main__":
    main(extensions=(TrafficExtension(),))
