"""Container images of the components: the one place their names are written.

``docker/Dockerfile`` builds :data:`BASE_IMAGE` (CPU: data preparation, evaluation,
registration, promotion) and ``docker/Dockerfile.cuda`` builds :data:`CUDA_IMAGE` (the training
step, which asks for a GPU on a cluster). Both Dockerfiles carry their name in an
``io.rl-conductor.image`` label, and a test checks that labels, these constants and the
compiled pipeline agree. The tag follows the package version.

Every component is declared with :func:`base_component` or :func:`cuda_component`: its image, with
the library and kfp already in it, so nothing is installed when the step starts.
"""

from functools import partial

from kfp import dsl

REGISTRY = "ghcr.io/rl-conductor"
VERSION = "0.1.0"
BASE_IMAGE = f"{REGISTRY}/conductor:{VERSION}"
CUDA_IMAGE = f"{REGISTRY}/conductor-cuda:{VERSION}"
IMAGE_LABEL = "io.rl-conductor.image"
#: The KServe predictor (serving/Dockerfile), run by manifests/base/conductor.yaml.
SERVING_IMAGE = f"{REGISTRY}/conductor-serving:{VERSION}"
#: MLflow tracking server of the deployment (docker/Dockerfile.mlflow), tagged with MLflow's version.
MLFLOW_IMAGE = f"{REGISTRY}/mlflow:3.17.2"

#: ``@base_component``: a KFP component on :data:`BASE_IMAGE`.
base_component = partial(
    dsl.component, base_image=BASE_IMAGE, packages_to_install=[], install_kfp_package=False
)
#: ``@cuda_component``: a KFP component on :data:`CUDA_IMAGE` (the training steps).
cuda_component = partial(
    dsl.component, base_image=CUDA_IMAGE, packages_to_install=[], install_kfp_package=False
)
