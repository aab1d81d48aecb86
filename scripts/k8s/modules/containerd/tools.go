//go:build tools

// The containerd commands a real node runs; this file only keeps their dependencies in go.mod and go.sum.

package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
