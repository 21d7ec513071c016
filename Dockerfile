# One multi-stage build for the four binaries: static, no libc, each in its
# own minimal image that runs as the non-root user 65532
# (docker build --target connector|slotwatch|outbox-router|maintain).
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/ ./connector ./outbox-router ./slotwatch ./maintain

FROM gcr.io/distroless/static-debian12:nonroot AS connector
COPY --from=build /out/connector /connector
USER 65532:65532
EXPOSE 9189
ENTRYPOINT ["/connector"]

FROM gcr.io/distroless/static-debian12:nonroot AS slotwatch
COPY --from=build /out/slotwatch /slotwatch
USER 65532:65532
EXPOSE 9188
ENTRYPOINT ["/slotwatch"]

FROM gcr.io/distroless/static-debian12:nonroot AS outbox-router
COPY --from=build /out/outbox-router /outbox-router
USER 65532:65532
ENTRYPOINT ["/outbox-router"]

# maintain runs once and exits (a cron job), or every MAINTAIN_INTERVAL
# until SIGTERM; it serves nothing.
FROM gcr.io/distroless/static-debian12:nonroot AS maintain
COPY --from=build /out/maintain /maintain
USER 65532:65532
ENTRYPOINT ["/maintain"]
