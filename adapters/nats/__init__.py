"""NATS JetStream: discovery source, worker registrar, publishers and the embedded server.

* ``source``: :class:`JetStreamDiscoverySource`, the discovery bucket as listings and live
  changes;
* ``registrar``: :class:`WorkerRegistrar`, worker registrations kept alive by a TTL heartbeat;
* ``admission_publisher``: :class:`NatsAdmissionPublisher`, what a frontend serves;
* ``buckets``: idempotent bucket creation that never changes an existing bucket;
* ``connect``: one connection function for every credential and TLS setting;
* ``embedded``: a local nats-server for setups without one.

Submodules are imported on demand so that importing the package pulls in nothing heavy.
"""
