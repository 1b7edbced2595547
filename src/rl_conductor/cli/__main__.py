"""``python -m rl_conductor.cli``."""

from rl_conductor.cli import main

main()
