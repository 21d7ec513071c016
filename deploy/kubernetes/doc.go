// Package kubernetes holds the check of the kustomize base beside it: a
// test renders it with the kustomize library, as `kubectl apply -k` would,
// decodes every object strictly into the Kubernetes and Prometheus Operator
// API types, and checks it against what the binaries read and serve.
// `go test ./deploy/kubernetes -update` rewrites the base's copies of the
// rules files and dashboards (kustomize reads nothing outside its root).
package kubernetes
