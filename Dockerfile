# A static, non-root image of student-bridge. The build needs only the Go
# module proxy. The binary is built by the Makefile's image-binary target,
# the same build `make test` and `make image` run.
FROM golang:1.26 AS build
ARG COMMIT=unknown
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY Makefile ./
COPY api/ api/
COPY cmd/ cmd/
COPY deploy/embed.go deploy/embed.go
COPY deploy/crd/ deploy/crd/
COPY internal/ internal/
COPY reconciler/ reconciler/
COPY sink/ sink/
RUN make image-binary BIN=/out COMMIT=$COMMIT

FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/image/student-bridge /student-bridge
USER 65532:65532
ENTRYPOINT ["/student-bridge"]
