"""Rate limits: GCRA buckets decided in the store, and windows decided in the process and synced."""
