"""Evaluation: run policies over tasks through the one executor, summarise, tabulate, plot."""
