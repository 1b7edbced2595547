"""``python -m rl_conductor.serving --pool YAML --model URI|DIR [KServe flags]``."""

from rl_conductor.serving.server import main

main()
