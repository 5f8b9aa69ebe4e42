"""The composition root: where the service is put together with the adapters it runs on.

``compose.py`` builds the source, the publishers, the view, telemetry and the trace writer
and attaches them to an :class:`~workerset_admission.service.AdmissionService`; ``serve`` and
the frontend's route extension both start the service through it.
"""
