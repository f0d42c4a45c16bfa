# Prometheus from Debian's package, laid out like the official prom/prometheus image (entrypoint, config
# path, data path, user, wget for the healthcheck). For hosts that cannot pull from a registry, such as
# CI here: docker/ci-setup.sh builds it and PROMETHEUS_IMAGE=vllm-stack/local-prometheus selects it.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
SHELL ["/bin/sh", "-eu", "-c"]
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends prometheus wget \
    && rm -rf /var/lib/apt/lists/* /usr/share/doc/* \
    && test -x /bin/prometheus \
    && mkdir -p /prometheus /etc/prometheus && chown -R nobody:nogroup /prometheus /etc/prometheus
USER 65534:65534
WORKDIR /prometheus
EXPOSE 9090
VOLUME ["/prometheus"]
ENTRYPOINT ["/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
