"""Fair share between users (issue 29): the limits file's settings, the counts and token buckets
the workers of one instance share, and fair queuing in each worker. The WSGI layers that apply
them are :mod:`bcs_middleware.layers.limits` and :mod:`bcs_middleware.layers.discovery_cache`.
"""
