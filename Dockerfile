# The Stowage image: one image, every component (`stowage extender`, `stowage device-plugin`,
# `stowage exporter`, `stowage inspect`, ...); the manifests in scheduler-config/ pick the command.
#
#   docker build -t stowage:0.1.0 .
#
# The gRPC stubs are generated at build time, inside the installed package: at run time the
# package directory belongs to root and the containers run with a read-only root filesystem.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MPLCONFIGDIR=/tmp/matplotlib

WORKDIR /src
COPY . .
# Generate from / so that `stowage` is imported from site-packages, not from /src.
RUN pip install . \
 && cd / \
 && python -m stowage.genprotos \
 && rm -rf /src

# Non-root by default (the extender needs nothing more). The exporter and the device plugin talk to
# root-owned kubelet sockets; their DaemonSets set runAsUser: 0 explicitly, with no capabilities.
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin stowage
USER 10001:10001
WORKDIR /

ENTRYPOINT ["stowage"]
CMD ["--help"]
