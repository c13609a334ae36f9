# Purchase Relay: one static executable on a slim base image.
FROM denoland/deno:2.5.6 AS build
WORKDIR /src
COPY deno.json deno.lock ./
COPY main.ts ./
COPY src/ src/
COPY migrations/ migrations/
COPY scripts/ scripts/
ARG SERVICE_VERSION=dev
RUN deno install --frozen --entrypoint main.ts \
 && SERVICE_VERSION=${SERVICE_VERSION} deno run --allow-run=deno,git --allow-read \
      --allow-write=src/version.ts,dist --allow-env scripts/compile.ts

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/dist/purchase-relay /usr/local/bin/purchase-relay
ENV DATA_DIR=/var/lib/purchase-relay NODE_ENV=production PORT=8080
VOLUME ["/var/lib/purchase-relay"]
EXPOSE 8080
USER nonroot
ENTRYPOINT ["/usr/local/bin/purchase-relay"]
CMD ["serve"]
