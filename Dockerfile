# A static, non-root image of student-bridge. The build needs only the Go
# module proxy.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY deploy/embed.go deploy/embed.go
COPY deploy/crd/ deploy/crd/
COPY internal/ internal/
COPY reconciler/ reconciler/
COPY sink/ sink/
RUN CGO_ENABLED=0 GOOS=linux go build -tags nodev -trimpath -ldflags="-s -w" -o /out/student-bridge ./cmd/student-bridge

FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/student-bridge /student-bridge
USER 65532:65532
ENTRYPOINT ["/student-bridge"]
