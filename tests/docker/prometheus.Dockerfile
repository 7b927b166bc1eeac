# Prometheus for the docker test: Debian bookworm's `prometheus` package (2.42, the version
# docker-compose.yml pins for prom/prometheus) on the same base image as Shoal's, because no
# registry is reachable from the test. The test mounts its scrape config and passes the flags.
FROM debian:bookworm-slim
ARG APT_SOURCE=""
RUN if [ -n "$APT_SOURCE" ]; then rm -f /etc/apt/sources.list.d/*; echo "$APT_SOURCE" >/etc/apt/sources.list; fi \
 && apt-get update -q \
 && apt-get install -y -q --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \
 && mkdir -p /prometheus && chown prometheus /prometheus
USER prometheus
ENTRYPOINT ["/usr/bin/prometheus"]
