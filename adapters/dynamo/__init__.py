"""The real Dynamo frontend: route extension, routing-hop adapter and discovery bridge."""
