"""Kubeflow Pipelines components of rl-conductor, one folder each (``<name>/component.py``).

Each component is a thin adapter in the kubeflow/pipelines-components style: only the standard
library and ``kfp`` are imported at module top, the library (``rl_conductor.pipeline.steps``) is
imported inside the function, inputs and outputs are typed KFP artifacts, and the container
image is explicit (``components.images``). KFP embeds each function's source in the compiled
pipeline, so a cluster needs only the image, not this folder.
"""
