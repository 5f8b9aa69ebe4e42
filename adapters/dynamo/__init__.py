"""The real Dynamo 1.6.1 frontend: its route extension, routing hops and file discovery.

* ``routes``: the ``dynamo.frontend.routes`` extension (admission state over the frontend's HTTP);
* ``host``: the thread and event loop the service runs on inside the frontend process;
* ``hop``: routing hops over a Dynamo ``Client``, admitted or legacy explicit-endpoint;
* ``filestore`` and ``bridge``: Dynamo's file discovery store mirrored into the NATS bucket
  (the NATS writer is ``adapters.nats.bucket_writer``);
* ``view``: the admitted discovery view, the file store a frontend on ``--discovery-backend
  file`` routes from, holding the admitted workers' records only.
"""
