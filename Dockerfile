# Purchase Relay: one executable built by `deno compile`, on a distroless base image.
# Build: docker build --build-arg SERVICE_VERSION=v1.4.0 -t purchase-relay:v1.4.0 .
# Running it (environment, volume, migrations, probes, stop timeout): docs/operations.md.

# The Deno release the project is developed and tested with; the executable embeds its runtime.
ARG DENO_VERSION=2.9.6

FROM denoland/deno:${DENO_VERSION} AS build
WORKDIR /src
COPY deno.json deno.lock ./
COPY main.ts ./
COPY src/ src/
COPY migrations/ migrations/
COPY scripts/ scripts/
ARG SERVICE_VERSION=dev
RUN deno install --frozen --entrypoint main.ts \
 && SERVICE_VERSION=${SERVICE_VERSION} deno run --allow-run=deno,git --allow-read \
      --allow-write=src/version.ts,dist --allow-env scripts/compile.ts \
 && mkdir -p /state

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/dist/purchase-relay /usr/local/bin/purchase-relay
# DATA_DIR exists in the image and belongs to the nonroot user (65532), so that a new volume
# mounted on it is writable by the service; a bind mount needs `chown 65532:65532` on the host.
# The executable may write only there and read only there and in /etc/purchase-relay (its
# permissions are fixed when it is built: docs/deploy.md, "Permissions"), so keep DATA_DIR.
COPY --from=build --chown=65532:65532 /state /var/lib/purchase-relay
ENV DATA_DIR=/var/lib/purchase-relay NODE_ENV=production PORT=8080
VOLUME ["/var/lib/purchase-relay"]
EXPOSE 8080
USER nonroot
# No HEALTHCHECK: the image has no shell and no HTTP client to run one. Probe GET /health
# (liveness) and GET /ready (readiness) from the orchestrator or the load balancer instead.
# Shutdown drains for up to about 35 s with the defaults: give `docker stop` (--stop-timeout)
# or the orchestrator's grace period 60 s.
ENTRYPOINT ["/usr/local/bin/purchase-relay"]
CMD ["serve"]
