// Wrapper module pinning crane (go-containerregistry's cmd/crane), which pushes the OCI archives
// to a registry (scripts/push-images.py, `make images REGISTRY=...`).
module llmoperator.io/e2e/tools/crane

go 1.25.0

require github.com/google/go-containerregistry v0.22.1 // indirect
