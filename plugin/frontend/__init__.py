"""The Dynamo frontend host: the route extension that runs the service inside the frontend."""
