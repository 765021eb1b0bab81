"""Admission interception: webhook definitions, the protocols, the engine, the CRUD API.

The WSGI layer lives in :mod:`bcs_middleware.layers.admission`; everything it
needs is importable from here.
"""
