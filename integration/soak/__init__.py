"""A seeded fault-injection soak: frontends, NATS and the bridge under churn and faults."""
