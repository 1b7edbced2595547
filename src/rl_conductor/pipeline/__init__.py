"""The training pipeline, library side: its steps, its report, and running it locally or on KFP.

- ``steps``: one function per pipeline step (prepare, train, evaluate, register, promote); the
  KFP components in ``components/`` are thin adapters over them.
- ``report``: the evaluation report (Markdown, HTML, Pareto PNG).
- ``runner``: :func:`run_local` (kfp's local SubprocessRunner), :func:`compile_pipeline` and
  :func:`submit` (a KFP API server); ``conductor pipeline …`` calls these.

Heavy dependencies (kfp, torch, mlflow) are imported inside functions, so importing this
package is cheap.
"""

from rl_conductor.pipeline.runner import (
    QUICK_ARGUMENTS,
    LocalRun,
    compile_pipeline,
    load_pipeline,
    pipeline_arguments,
    pipeline_parameters,
    run_local,
    submit,
)

__all__ = [
    "QUICK_ARGUMENTS",
    "LocalRun",
    "compile_pipeline",
    "load_pipeline",
    "pipeline_arguments",
    "pipeline_parameters",
    "run_local",
    "submit",
]
