# One multi-stage build for the three binaries: static, no libc, each in its
# own minimal image (docker build --target connector|slotwatch|outbox-router).
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/ ./connector ./outbox-router ./slotwatch

FROM gcr.io/distroless/static-debian12:nonroot AS connector
COPY --from=build /out/connector /connector
EXPOSE 9189
ENTRYPOINT ["/connector"]

FROM gcr.io/distroless/static-debian12:nonroot AS slotwatch
COPY --from=build /out/slotwatch /slotwatch
EXPOSE 9188
ENTRYPOINT ["/slotwatch"]

FROM gcr.io/distroless/static-debian12:nonroot AS outbox-router
COPY --from=build /out/outbox-router /outbox-router
ENTRYPOINT ["/outbox-router"]
