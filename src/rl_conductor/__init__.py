"""rl-conductor: train a small LM with RL to orchestrate a pool of worker LLMs, and serve it.

One library, one data flow: Task -> Policy.plan -> Workflow -> execute -> Trace -> grade.
Training (GRPO reward), evaluation (metrics) and serving (answer + trace) all call the same
functions; adapters (CLI, KFP components, KServe predictor) stay thin.
"""

__version__ = "0.1.0"
