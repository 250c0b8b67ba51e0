"""What status says: the reducer, its conditions, and the model, router and autoscaler parts of it (pure)."""
