// Command writeone writes a one-file image with package ociimage and
// imports nothing else that could register a hash: what a program using
// ociimage alone gets (TestDigestsInAProgramOfItsOwn).
package main

import (
	"fmt"
	"io"
	"os"

	v1 "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kyb-ai/kyb-dra-driver/test/ociimage"
)

func main() {
	img := ociimage.Image{
		Name:     "example.com/one:1",
		Platform: v1.Platform{OS: "linux", Architecture: "amd64"},
		Layers:   []ociimage.Layer{{CreatedBy: "one", Files: []ociimage.File{{Path: "one", Data: []byte("1"), Mode: 0o644}}}},
	}
	d, err := img.Write(io.Discard)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(d)
}
