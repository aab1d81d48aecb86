//go:build tools

// helm 4, the chart tests' and the testbed's helm (scripts/k8s/build.sh builds cmd/helm); this file only
// keeps its dependencies in go.mod and go.sum.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
