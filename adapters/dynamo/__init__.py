"""The real Dynamo 1.6.1: routing hops, its file discovery store, and the admitted view.

* ``hop``: routing hops over a Dynamo ``Client``, admitted or legacy explicit-endpoint;
* ``filestore``, ``notify`` and ``bridge``: Dynamo's file discovery store, watched with inotify
  and mirrored into the NATS bucket (the NATS writer is ``adapters.nats.bucket_writer``, the
  memory both bridges keep of the bucket is ``adapters.bucket_mirror``);
* ``view``, ``view_directory``: the admitted discovery view, the file store a frontend on
  ``--discovery-backend file`` routes from, holding the admitted workers' records only: the
  directory and a differ applying what the pure plan (``workerset_admission.view``) says.

The frontend's route extension and the thread the service runs on inside the frontend process
are a composition root, in ``workerset_admission.frontend`` (``routes``, ``host``).
"""
