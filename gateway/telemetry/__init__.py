"""What the gateway tells its operator: metrics, the request log, logs, readiness, redaction."""
