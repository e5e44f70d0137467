# syntax=docker/dockerfile:1
# The shardwise image: shardwise-controller (the entrypoint), the shardwise CLI and the Argo CD
# balancer (shardwise-balancer), on a distroless runtime as a non-root user. Build with
# `make image`.

# Build stage: `make image-binaries`, which CI runs too (`make test`).
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    make image-binaries \
    && install -D -m 0755 -t /out target/release/shardwise-controller target/release/shardwise \
       target/release/shardwise-balancer

# Runtime: glibc and libgcc only (TLS is rustls), user 65532 ("nonroot").
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/shardwise-controller"]
