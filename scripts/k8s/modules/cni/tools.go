//go:build tools

// The CNI plugins a real node's pod network uses (a bridge with host-local addresses, and loopback);
// this file only keeps their dependencies in go.mod and go.sum.

package tools

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
)
