"""Prompt templates (files, not strings in code) shared by training, evaluation and serving."""
