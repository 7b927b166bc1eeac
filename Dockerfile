# One image for every Shoal service; the command picks the service, e.g.
#   docker run shoal shoal-coordinator --listen 0.0.0.0:7000 --metrics-listen 0.0.0.0:9100 \
#     --state-dir /var/lib/shoal --tls-dir /certs/coordinator   (certificates: shoal-gen-certs)
#
# Both stages start from Docker Hub's debian:bookworm-slim and install Debian bookworm packages
# with scripts/bootstrap (the same package lists developers and CI use). Without Docker Hub,
# scripts/docker-base makes the base image and a local apt repository from Debian's archive, and
# APT_SOURCE points apt at that repository (docs/tutorials/docker-compose.md, "Without Docker Hub"):
#   docker build --network host \
#     --build-arg APT_SOURCE="deb [trusted=yes] http://127.0.0.1:PORT/ ./" -t shoal:latest .

# Build stage: the -dev packages and the four binaries.
FROM debian:bookworm-slim AS build
ARG APT_SOURCE=""
# PREBUILT: a folder of the build context that holds the four binaries and shoal-gen-certs,
# already built from this tree against Debian bookworm's packages (the container test passes the
# run's own build/bin this way); the stage then only copies them. Empty (the default): the stage
# installs the -dev packages and builds them.
ARG PREBUILT=""
WORKDIR /src
COPY scripts/bootstrap scripts/bootstrap
RUN [ -n "$PREBUILT" ] || { \
      if [ -n "$APT_SOURCE" ]; then rm -f /etc/apt/sources.list.d/*; echo "$APT_SOURCE" >/etc/apt/sources.list; fi \
      && scripts/bootstrap build \
      && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb; }
COPY . .
# The build context has no .git: `--build-arg SHOAL_COMMIT=$(git rev-parse --short=12 HEAD)`
# names the commit in every binary's --version (else "unknown").
ARG SHOAL_COMMIT=""
RUN [ -z "$PREBUILT" ] || { mkdir -p /build/bin && cp "$PREBUILT"/* /build/bin/; }
RUN [ -n "$PREBUILT" ] || cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DSHOAL_BUILD_TESTS=OFF -DSHOAL_COMMIT="$SHOAL_COMMIT"
RUN [ -n "$PREBUILT" ] || cmake --build /build --target shoal-coordinator shoal-aggregator shoal-peer shoalctl

# Runtime stage: only the shared libraries the binaries load, the data set, and the binaries.
# The services run as user shoal, uid 10001: the uid the Kubernetes manifests run them as, and
# the etcd image's (deploy/etcd/Dockerfile), which reads its key from the compose `certs` volume.
FROM debian:bookworm-slim
ARG APT_SOURCE=""
COPY scripts/bootstrap /usr/local/share/shoal/bootstrap
RUN if [ -n "$APT_SOURCE" ]; then rm -f /etc/apt/sources.list.d/*; echo "$APT_SOURCE" >/etc/apt/sources.list; fi \
 && /usr/local/share/shoal/bootstrap runtime \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \
 && useradd --system --no-log-init --uid 10001 --user-group --create-home --home-dir /var/lib/shoal shoal \
 && mkdir -p /certs /var/lib/shoal/state && chown shoal /certs /var/lib/shoal/state
COPY --from=build /build/bin/ /usr/local/bin/
COPY deploy/tasks/ /etc/shoal/tasks/
USER shoal
WORKDIR /var/lib/shoal
EXPOSE 7000 9100
# The standard gRPC health service of the default command (the coordinator); other services
# override it with their own port and certificate (docker-compose.yml does, per service).
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
  CMD ["shoalctl", "health", "--target", "127.0.0.1:7000", "--tls-dir", "/certs/coordinator", "--timeout", "3s"]
CMD ["shoal-coordinator", "--listen", "0.0.0.0:7000", "--metrics-listen", "0.0.0.0:9100", "--state-dir", "/var/lib/shoal", "--tls-dir", "/certs/coordinator"]
