"""Container images of the components: the one place their names are written.

``docker/Dockerfile`` builds :data:`BASE_IMAGE` (CPU: data preparation, evaluation,
registration, promotion) and ``docker/Dockerfile.cuda`` builds :data:`CUDA_IMAGE` (the training
step, which asks for a GPU on a cluster). Both Dockerfiles carry their name in an
``io.rl-conductor.image`` label, and a test checks that labels, these constants and the
compiled pipeline agree. The tag follows the package version.
"""

REGISTRY = "ghcr.io/rl-conductor"
VERSION = "0.1.0"
BASE_IMAGE = f"{REGISTRY}/conductor:{VERSION}"
CUDA_IMAGE = f"{REGISTRY}/conductor-cuda:{VERSION}"
IMAGE_LABEL = "io.rl-conductor.image"
#: The KServe predictor (serving/Dockerfile), run by manifests/base/conductor.yaml.
SERVING_IMAGE = f"{REGISTRY}/conductor-serving:{VERSION}"
#: MLflow tracking server of the deployment (docker/Dockerfile.mlflow), tagged with MLflow's version.
MLFLOW_IMAGE = f"{REGISTRY}/mlflow:3.17.2"
