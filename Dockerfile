# One image for every Shoal service; the command picks the service, e.g.
#   docker run shoal shoal-coordinator --listen 0.0.0.0:7000 --metrics-listen 0.0.0.0:9100 \
#     --state-dir /var/lib/shoal --tls-dir /certs/coordinator   (certificates: shoal-gen-certs)
# Build stage: the -dev packages, installed by the same script developers and CI use.
FROM debian:bookworm AS build
WORKDIR /src
COPY scripts/bootstrap scripts/bootstrap
RUN SHOAL_BOOTSTRAP=build scripts/bootstrap && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHOAL_BUILD_TESTS=OFF \
 && cmake --build /build --target shoal-coordinator shoal-aggregator shoal-peer shoalctl

# Runtime stage: only the shared libraries the binaries load, the data set, and the binaries.
FROM debian:bookworm
RUN apt-get update && apt-get install -y --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libabsl20220623 libtorch1.13 libprometheus-cpp-core1.0 \
      libprometheus-cpp-pull1.0 libsqlite3-0 libyaml-cpp0.7 zlib1g libxxhash0 libssl3 \
      dataset-fashion-mnist openssl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --create-home --home-dir /var/lib/shoal shoal \
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
