"""Values and pure decisions every other part of the package reads: the environ contract, the
error tree, ini converters, store records, bounded body reading and decoding as the receiver
decodes it, path safety, HTTP header facts and the upgrade decision, the Kubernetes request
classification, text escaping, caches, quotas, and the JSON Schemas.

Nothing here does I/O of its own or imports anything else of the package (a test enforces it).
"""
