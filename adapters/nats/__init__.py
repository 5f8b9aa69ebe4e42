"""NATS JetStream: discovery source, publishers and the embedded server launcher."""
