"""The WSGI middleware layers, one module each, every one usable alone in front of any WSGI app
through the ``filter_factory`` at its bottom (PasteDeploy).
"""
