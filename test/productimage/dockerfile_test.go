package productimage

import (
	"reflect"
	"strings"
	"testing"
)

// A Dockerfile of the project's shape: global ARGs, a build stage with a
// go build over several lines, a runtime stage with labels and a user.
const twoStages = `# syntax=docker/dockerfile:1
ARG GO_VERSION=1.26
# a comment between instructions
ARG VERSION=0.1.0

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
ARG LDFLAGS="-s -w -extldflags=-Wl,--unresolved-symbols=ignore-in-object-files"
RUN CGO_ENABLED=1 go build -tags grpcnotrace \
    -ldflags "${LDFLAGS}" \
    -o /out/ ./cmd/a ./cmd/b

FROM gcr.io/distroless/cc-debian12 AS runtime
ARG VERSION
LABEL org.opencontainers.image.title="app" \
      org.opencontainers.image.description="an \"app\": it runs" \
      org.opencontainers.image.version="${VERSION}" plain=$VERSION-x
COPY --from=build /out/ /usr/local/bin/
ENV MODE=prod
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/a", "--flag"]
`

func TestParseDockerfile(t *testing.T) {
	for _, tc := range []struct {
		name      string
		buildArgs map[string]string
		want      Recipe
	}{
		{"defaults", nil, Recipe{
			Base:         "gcr.io/distroless/cc-debian12",
			BuildEnv:     map[string]string{"LDFLAGS": "-s -w -extldflags=-Wl,--unresolved-symbols=ignore-in-object-files"},
			BuildCommand: `CGO_ENABLED=1 go build -tags grpcnotrace  -ldflags "${LDFLAGS}"  -o /out/ ./cmd/a ./cmd/b`,
			BuildLine:    11,
			OutDir:       "/out/",
			BinDir:       "/usr/local/bin/",
			Labels: map[string]string{
				"org.opencontainers.image.title":       "app",
				"org.opencontainers.image.description": `an "app": it runs`,
				"org.opencontainers.image.version":     "0.1.0",
				"plain":                                "0.1.0-x",
			},
			User:       "65532:65532",
			Entrypoint: []string{"/usr/local/bin/a", "--flag"},
			Env:        []string{"MODE=prod"},
		}},
		{"build args win", map[string]string{"VERSION": "9.9.9", "LDFLAGS": "-s"}, Recipe{
			Base:         "gcr.io/distroless/cc-debian12",
			BuildEnv:     map[string]string{"LDFLAGS": "-s"},
			BuildCommand: `CGO_ENABLED=1 go build -tags grpcnotrace  -ldflags "${LDFLAGS}"  -o /out/ ./cmd/a ./cmd/b`,
			BuildLine:    11,
			OutDir:       "/out/",
			BinDir:       "/usr/local/bin/",
			Labels: map[string]string{
				"org.opencontainers.image.title":       "app",
				"org.opencontainers.image.description": `an "app": it runs`,
				"org.opencontainers.image.version":     "9.9.9",
				"plain":                                "9.9.9-x",
			},
			User:       "65532:65532",
			Entrypoint: []string{"/usr/local/bin/a", "--flag"},
			Env:        []string{"MODE=prod"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseDockerfile(strings.NewReader(twoStages), tc.buildArgs)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("recipe:\n%#v\nwant:\n%#v", got, tc.want)
			}
		})
	}
}

// TestParseDockerfileRefuses: what the OCI build would not reproduce is an
// error naming the line, not an image that differs from Docker's.
func TestParseDockerfileRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, replace, with, want string
	}{
		{"a RUN in the runtime stage", "USER 65532:65532", "RUN mkdir /data", "line 22: RUN in the runtime stage: the OCI build (test/productimage) does not reproduce it"},
		{"WORKDIR in the runtime stage", "USER 65532:65532", "WORKDIR /data", "line 22: WORKDIR in the runtime stage"},
		{"shell-form entrypoint", `ENTRYPOINT ["/usr/local/bin/a", "--flag"]`, "ENTRYPOINT /usr/local/bin/a", "line 23: ENTRYPOINT /usr/local/bin/a: want the exec form"},
		{"a second go build", "RUN go mod download", "RUN go build ./...", "line 11: a second RUN ... go build in stage build (the first at line 9)"},
		{"no go build", "RUN CGO_ENABLED=1 go build", "RUN CGO_ENABLED=1 go vet", "stage build has no RUN ... go build"},
		{"copy from elsewhere", "COPY --from=build /out/ /usr/local/bin/", "COPY --from=builder /out/ /usr/local/bin/", `the runtime stage copies from "builder", which is no earlier stage`},
		{"copy with --chown", "COPY --from=build /out/ /usr/local/bin/", "COPY --from=build --chown=1:1 /out/ /usr/local/bin/", "line 20: COPY --from=build --chown=1:1 /out/ /usr/local/bin/: the runtime stage may copy once"},
		{"copy from the context", "COPY --from=build /out/ /usr/local/bin/", "COPY app /usr/local/bin/", "line 20: COPY app /usr/local/bin/: the runtime stage may copy once"},
		{"build into another directory", "-o /out/", "-o /bin/", "line 11: the go build does not write into /out/"},
		{"unterminated quote", `plain=$VERSION-x`, `plain="x`, `line 17: LABEL: "org.opencontainers.image.title=\"app\"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			df := strings.Replace(twoStages, tc.replace, tc.with, 1)
			if df == twoStages {
				t.Fatalf("%q is not in the Dockerfile", tc.replace)
			}
			_, err := ParseDockerfile(strings.NewReader(df), nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v; want one saying %q", err, tc.want)
			}
		})
	}
}

func TestShellWords(t *testing.T) {
	vars := map[string]string{"V": "1.0", "EMPTY": ""}
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{`a=b c="d e"`, []string{"a=b", "c=d e"}},
		{`a="x\"y\\z"`, []string{`a=x"y\z`}},
		{`a='$V' b="$V" c=${V}-$V`, []string{"a=$V", "b=1.0", "c=1.0-1.0"}},
		{`a=$UNSET b=$ c=$EMPTY.`, []string{"a=", "b=$", "c=."}},
		{`a=x\ y`, []string{"a=x y"}},
	} {
		got, err := shellWords(tc.in, vars)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("shellWords(%s) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}
