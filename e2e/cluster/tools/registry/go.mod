// Wrapper module pinning the CNCF Distribution registry (package main: cmd/registry), the test
// world's OCI registry (e2e/cluster/registry.py): TLS and htpasswd auth, filesystem storage.
module llmoperator.io/e2e/tools/registry

go 1.26.0

require (
	github.com/distribution/distribution/v3 v3.1.2 // indirect
	github.com/distribution/reference v0.6.0 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
)
