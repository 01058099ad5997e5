package realnode

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"time"
)

// ProductImage is the driver's image as make image-oci builds it: the
// archive and the reference it carries, which the chart's default image
// resolves to.
type ProductImage struct {
	Archive, Ref string
}

// ProductImageFromEnv reads the driver's image from KYB_IMAGE_ARCHIVE and
// KYB_IMAGE, as make e2e-node sets them, and checks that the archive is
// there.
func ProductImageFromEnv() (ProductImage, error) {
	img := ProductImage{Archive: os.Getenv("KYB_IMAGE_ARCHIVE"), Ref: os.Getenv("KYB_IMAGE")}
	if img.Archive == "" || img.Ref == "" {
		return img, fmt.Errorf("KYB_IMAGE_ARCHIVE and KYB_IMAGE are not set: run these tests with make e2e-node, which builds the image (make image-oci)")
	}
	if _, err := os.Stat(img.Archive); err != nil {
		return img, fmt.Errorf("the driver's image (make image-oci): %w", err)
	}
	return img, nil
}

// ImportImage imports an image archive (OCI layout or docker save) into
// the node's containerd, in the namespace of the kubelet's pods: pods
// with imagePullPolicy Never run it by the reference the archive names.
func (cd *containerd) ImportImage(archive string) error {
	if out, err := cd.ctr("images", "import", "--platform", "linux/"+runtime.GOARCH, archive); err != nil {
		return fmt.Errorf("node %s: import %s: %w\n%s", cd.node, archive, err, out)
	}
	return nil
}

// TagImage gives an image the node's containerd has a second reference,
// as a registry's new tag of the same image would: pods that name it run
// the same image.
func (cd *containerd) TagImage(ref, as string) error {
	if out, err := cd.ctr("images", "tag", "--force", ref, as); err != nil {
		return fmt.Errorf("node %s: tag %s as %s: %w\n%s", cd.node, ref, as, err, out)
	}
	return nil
}

// ImageDigest returns the digest containerd has for an image reference.
func (cd *containerd) ImageDigest(ref string) (string, error) {
	out, err := cd.ctr("images", "ls")
	if err != nil {
		return "", fmt.Errorf("node %s: ctr images ls: %w\n%s", cd.node, err, out)
	}
	// REF TYPE DIGEST SIZE PLATFORMS LABELS
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[0] == ref {
			return f[2], nil
		}
	}
	return "", fmt.Errorf("node %s: containerd has no image %s:\n%s", cd.node, ref, out)
}

// Mount is a host path bind-mounted into a container.
type Mount struct {
	Host, Container string
	ReadOnly        bool
}

// RunOptions describe a container that RunImage runs.
type RunOptions struct {
	// Args replace the image's entrypoint and command, as ctr run's
	// arguments do; empty: the image's own.
	Args   []string
	Mounts []Mount
}

var runs atomic.Int64

// RunImage runs a container of an imported image with containerd's ctr,
// without the kubelet: as the image's user, in a network namespace of its
// own, in a cgroup under the node's. It returns what the container printed
// on stdout, and on stderr (with ctr's own warnings), and an error if it
// did not exit 0.
func (cd *containerd) RunImage(ref string, opts RunOptions) (stdout, stderr string, err error) {
	id := fmt.Sprintf("kyb-run-%d-%d", time.Now().UnixNano(), runs.Add(1))
	args := []string{"--address", cd.ContainerdSocket, "--namespace", "k8s.io", "run", "--rm", "--cgroup", filepath.Join(cd.cgroupRoot, id)}
	for _, m := range opts.Mounts {
		options := "rbind:rw"
		if m.ReadOnly {
			options = "rbind:ro"
		}
		args = append(args, "--mount", fmt.Sprintf("type=bind,src=%s,dst=%s,options=%s", m.Host, m.Container, options))
	}
	args = append(append(args, ref, id), opts.Args...)
	var out, errOut bytes.Buffer
	cmd := exec.Command(cd.ctrPath, args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.String(), errOut.String(), fmt.Errorf("node %s: ctr run %s %q: %w", cd.node, ref, opts.Args, err)
	}
	return out.String(), errOut.String(), nil
}
