# lipcast on an NVIDIA GPU.
#
#   docker build -t lipcast .
#   docker run --gpus all --network host -v "$PWD/models:/models:ro" -v "$PWD/avatars:/avatars" lipcast
#
# Base: CUDA 12.8 runtime on Ubuntu 24.04 (Python 3.12). torch comes from PyTorch's cu128 wheel index, the
# newest release in the project's range (torch>=2.4,<3) built for CUDA 12.8 (2.7 and later); those wheels
# bring their own CUDA libraries and cuDNN as pip packages, so the base needs no cuDNN (a `-cudnn-` base
# would only add a second copy). CUDA 12.8 wants a driver >= 570 (>= 525 through CUDA's minor-version
# compatibility) and is the first to cover Blackwell. For another CUDA, change both build arguments, e.g.
# --build-arg CUDA_IMAGE=nvidia/cuda:12.6.3-runtime-ubuntu24.04 --build-arg TORCH_INDEX=.../whl/cu126.
#
# WebRTC media does not use the HTTP port: aiortc sends and receives RTP on ephemeral UDP ports, and the SDP
# answer advertises the addresses the server sees. With Docker's default bridge network those are
# container-internal, so callers cannot reach them: run with --network host, or give the server a TURN
# server (LIPCAST_ICE_SERVERS, LIPCAST_ICE_USERNAME, LIPCAST_ICE_CREDENTIAL) that both sides can reach.

ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04

FROM ${CUDA_IMAGE} AS build
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
ARG TORCH_SPEC="torch>=2.7,<3"
ENV DEBIAN_FRONTEND=noninteractive
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Unpinned apt packages (DL3008): they follow the base image's Ubuntu release; exact versions would break the
# build as soon as the archive moves on.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch first and on its own layer: the largest download, and it changes least often. `pip install .` below
# keeps it, since it already meets the project's requirement. The default takes the newest release on the
# index (always resolvable); for a reproducible image pin it: --build-arg TORCH_SPEC=torch==2.9.1.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX}" "${TORCH_SPEC}"
WORKDIR /src
COPY pyproject.toml README.md ./
# lipcast/ is the import root; it links to the folders beside it (the call pages and avatar included).
COPY lipcast ./lipcast
COPY server ./server
COPY streaming ./streaming
COPY pipeline ./pipeline
COPY probe ./probe
COPY integrations ./integrations
COPY static ./static
RUN pip install --no-cache-dir . \
    && python -c "import torch, aiortc, av, cv2, webrtcvad; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

FROM ${CUDA_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
# tini: PID 1 that forwards SIGTERM (the server drains on it) and reaps children.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 tini \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --create-home --home-dir /home/lipcast --shell /usr/sbin/nologin lipcast \
    && mkdir -p /models /avatars \
    && chown lipcast:lipcast /avatars
COPY --from=build /opt/venv /opt/venv

# Every setting is also a LIPCAST_* variable (flags win); these are the image's defaults.
#   /models:  weights you supply, e.g. LIPCAST_BACKEND=wav2lip LIPCAST_CHECKPOINT=/models/wav2lip_gan.pth
#   /avatars: prepared avatars (lipcast avatar prepare ... --out /avatars), and where uploads are prepared
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    LIPCAST_HOST=0.0.0.0 \
    LIPCAST_PORT=8080 \
    LIPCAST_AVATAR_DIRS=/avatars
VOLUME ["/models", "/avatars"]
# Numeric, so that Kubernetes' runAsNonRoot can check it.
USER 10001:10001
WORKDIR /home/lipcast
# HTTP signalling and the page. Media: ephemeral UDP ports (see the top of this file).
EXPOSE 8080
# Liveness only: /healthz answers 200 as soon as the process listens, warm-up included; /readyz says whether
# it takes new calls (warm, a free slot, not draining). The start period covers importing torch and CUDA.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('LIPCAST_PORT', '8080'), timeout=4)"]
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["lipcast", "serve", "--host", "0.0.0.0"]
