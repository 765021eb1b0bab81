"""Clusters as the request path sees them: the cached directory of clusters and their
reported credentials (the one place a cluster becomes an upstream), reading objects from a
cluster's apiserver, and who may use or manage which cluster.
"""
