"""Dynamo's etcd discovery store: a reader over the aetcd client, and the bridge into the bucket.

* ``client``: :class:`AetcdStoreReader` and :class:`EtcdOptions` (endpoints, TLS, user and
  password), the only module that imports ``aetcd``;
* ``bridge``: :class:`EtcdDiscoveryBridge`, list at one revision then watch, into the bucket.

Submodules are imported on demand so that importing the package pulls in nothing heavy.
"""
