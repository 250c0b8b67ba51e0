"""What the cluster shows about a deployment's children, multi-node groups, engine builds, model fetches."""
