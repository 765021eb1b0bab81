"""Terminal WSGI applications: the upstream proxy (with connection upgrades), the management REST
API, the admission-definitions API and the RBAC status.
"""
