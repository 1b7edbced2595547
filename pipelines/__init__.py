"""Kubeflow pipeline definitions (``*.py``) and their compiled YAML, committed side by side."""
